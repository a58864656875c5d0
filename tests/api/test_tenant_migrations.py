"""The migrations to tenant foreign keys: stored rows keyed by the old `tenant_key` get their Tenant, rows
of a tenant that no longer exists are deleted, stored chat completions made before tenancy go to the
built-in "default" tenant with an expiry, and the way back restores the keys."""
from datetime import timedelta

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

BEFORE = [("inference", "0002_stored_chat_completions"), ("responses_api", "0001_initial")]


def migrate(targets):
    """Migrate to `targets` (None: the latest) and return the apps of that state."""
    executor = MigrationExecutor(connection)
    targets = targets or executor.loader.graph.leaf_nodes()
    executor.migrate(targets)
    return MigrationExecutor(connection).loader.project_state(targets).apps


@pytest.mark.django_db(transaction=True)
def test_rows_keyed_by_tenant_key_get_their_tenant_and_come_back(settings):
    old = migrate(BEFORE)
    tenants = old.get_model("inference", "Tenant")
    # (the default tenant may exist already: requests of earlier tests made it)
    default = tenants.objects.get_or_create(name="default")[0]
    acme = tenants.objects.create(name="acme-migrated")
    now = timezone.now()
    responses = old.get_model("responses_api", "StoredResponse")
    conversations = old.get_model("responses_api", "Conversation")
    for rid, key in (("resp_d", "default"), ("resp_a", str(acme.pk)), ("resp_gone", "99999"),
                     ("resp_junk", "a")):
        responses.objects.create(id=rid, tenant_key=key, model="smollm2-135m-instruct", created_at=now, expires_at=now)
    old.get_model("responses_api", "ResponseItem").objects.create(
        response_id="resp_gone", position=0, direction="input", item_id="msg_1", type="message", data={})
    for cid, key in (("conv_a", str(acme.pk)), ("conv_gone", "99999")):
        conversations.objects.create(id=cid, tenant_key=key, created_at=now, expires_at=now)
    old.get_model("inference", "StoredChatCompletion").objects.create(
        id="chatcmpl-old", model="smollm2-135m-instruct", response={"id": "chatcmpl-old"})

    new = migrate(None)
    responses = new.get_model("responses_api", "StoredResponse").objects.filter(
        pk__in=["resp_d", "resp_a", "resp_gone", "resp_junk"])  # (other tests' rows may be there too)
    assert dict(responses.values_list("pk", "tenant_id")) == {"resp_d": default.pk, "resp_a": acme.pk}
    assert not new.get_model("responses_api", "ResponseItem").objects.filter(response_id="resp_gone").exists()
    conversations = new.get_model("responses_api", "Conversation").objects.filter(pk__in=["conv_a", "conv_gone"])
    assert dict(conversations.values_list("pk", "tenant_id")) == {"conv_a": acme.pk}
    chat = new.get_model("inference", "StoredChatCompletion").objects.get(pk="chatcmpl-old")
    assert chat.tenant_id == default.pk
    assert chat.expires_at - chat.created_at == timedelta(seconds=settings.METRALE["STORE_TTL_S"])

    back = migrate(BEFORE)
    rows = back.get_model("responses_api", "StoredResponse").objects.filter(pk__in=["resp_d", "resp_a"])
    assert dict(rows.values_list("pk", "tenant_key")) == {"resp_d": "default", "resp_a": str(acme.pk)}
    rows = back.get_model("responses_api", "Conversation").objects.filter(pk="conv_a")
    assert dict(rows.values_list("pk", "tenant_key")) == {"conv_a": str(acme.pk)}
    migrate(None)
