"""The raw ASGI helper (asgi_client.serve): its requests' database work runs in the test's own transaction."""
from django.db import connection

from inference.models import StoredChatCompletion

from .fake_engine import call


def test_a_raw_asgi_request_reads_and_writes_inside_the_tests_transaction(fake_rt, as_tenant):
    tc = as_tenant()  # the tenant and its key exist only in this test's open transaction
    answer = call("POST", "/v1/chat/completions", {"model": "smollm2-135m-instruct", "store": True,
                                                   "messages": [{"role": "user", "content": "Hi"}]},
                  headers=tc.headers)
    assert answer.status == 200, answer.body  # the key was found: the same connection as the test's
    assert connection.in_atomic_block  # still the test's transaction, rolled back after it
    assert StoredChatCompletion.objects.filter(tenant=tc.tenant).count() == 1
