from tests.integration.conftest import procs  # noqa: F401  (real processes, killed at the end)
