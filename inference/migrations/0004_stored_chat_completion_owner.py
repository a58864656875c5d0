"""Stored chat completions made before tenancy: owned by the built-in "default" tenant (they were
saved without an owner, and with auth off every request runs as that tenant), expiring
METRALE["STORE_TTL_S"] after they were made."""

from datetime import timedelta

from django.conf import settings
from django.db import migrations


def assign_owner(apps, schema_editor):
    Tenant = apps.get_model("inference", "Tenant")
    StoredChatCompletion = apps.get_model("inference", "StoredChatCompletion")
    unowned = StoredChatCompletion.objects.filter(tenant__isnull=True)
    if not unowned.exists():
        return
    default, _ = Tenant.objects.get_or_create(name="default")
    ttl = timedelta(seconds=settings.METRALE["STORE_TTL_S"])
    for row in unowned.only("pk", "created_at"):
        StoredChatCompletion.objects.filter(pk=row.pk).update(tenant=default,
                                                              expires_at=row.created_at + ttl)


class Migration(migrations.Migration):

    dependencies = [
        ("inference", "0003_stored_chat_completion_tenant"),
    ]

    operations = [
        migrations.RunPython(assign_owner, migrations.RunPython.noop),
    ]
