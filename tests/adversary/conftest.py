from tests.integration.conftest import procs  # noqa: F401  (every started process is killed after the test)
