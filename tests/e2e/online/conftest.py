import pytest

from ci.matrix import TEST_WATCHDOG
from engine.serve.launcher import RemoteServer
from tests.helpers.online import client_for


@pytest.fixture(scope="session")
def server(cell, platform, profile_name):
    """One server per matrix cell, shared by every online test of that cell, on the lane's profile."""
    args = ["--platform", platform, "--profile", profile_name]
    for o in TEST_WATCHDOG + cell.overrides:
        args += ["--set", o]
    with RemoteServer(args) as srv:
        yield srv


@pytest.fixture(scope="session")
def client(server):
    return client_for(server)


