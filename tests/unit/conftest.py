import pytest

from bench.common import PortReservation


@pytest.fixture
def listen():
    """Reserve a loopback address for a node this test runs in its own process: the port (and
    the binary client port derived from it) is held until the test ends (bench.common
    PortReservation), so no other process is handed it meanwhile; the node still listens on it."""
    held: list[PortReservation] = []

    def reserve() -> str:
        r = PortReservation()
        held.append(r)
        return f"127.0.0.1:{r.port}"
    yield reserve
    for r in held:
        r.close()
