"""The live servers these tests call (metrale_server, auth_server, openai_client, tenant_client) are
tests/live_servers.py's, shared with tests/browser."""
from tests.live_servers import manage  # noqa: F401  (for tests that run manage.py against a server)
