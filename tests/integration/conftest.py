import pytest

from tests.integration.harness import ReplogProcess


@pytest.fixture
def procs():
    """Every ReplogProcess a test registers here is stopped at the end (its reserved port
    released), logs printed on failure."""
    started: list[ReplogProcess] = []
    yield started
    for p in started:
        p.kill9()
        p.release_port()
