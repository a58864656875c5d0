"""Fixtures of the fault tests: the API tests' raw ASGI requests (for the in-process soak)."""
from tests.api.conftest import raw_asgi_requests  # noqa: F401
