"""CI APIs (Buildkite- or GitHub-shaped) and an object store, served from 127.0.0.1 for the tests of
their clients (tests/helpers/fake_ci.py)."""
import pytest

from tests.helpers.fake_ci import Routes, serve


@pytest.fixture
def api():
    routes = Routes()
    server, base = serve(routes)
    yield base, routes
    server.shutdown()
    server.server_close()


@pytest.fixture
def object_store():
    """A second host, like the object store artifact downloads redirect to: it refuses any request
    that carries an Authorization header, as S3 does with a pre-signed URL."""
    routes = Routes(auth=False, refuse_auth=True)
    server, base = serve(routes)
    yield base, routes
    server.shutdown()
    server.server_close()


