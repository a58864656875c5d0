"""Fixtures for the in-process Responses and Conversations API tests: the scripted engine installed as
the process runtime (fake_rt; it answers "Hello there." unless a test scripts other text), and the
test client calling as tenant "acme" with a real API key."""

import pytest

from ..fake_engine import reply


@pytest.fixture
def engine(fake_rt):
    """The FakeEngine behind every request; set `engine.script` (fake_engine.reply) to script text."""
    fake_rt.engine.script = reply(fake_rt.tokenizer, "Hello there.")
    return fake_rt.engine


@pytest.fixture
def api(engine, as_tenant):
    """The test client calling as tenant "acme" (tests/api/tenant_client.TenantClient)."""
    return as_tenant("acme")
