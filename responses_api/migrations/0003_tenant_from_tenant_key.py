"""Set each stored response's and conversation's tenant from its old `tenant_key`.

The key was `str(tenant.pk)`, or "default" for the built-in tenant named "default" (auth off).
Rows whose key names no tenant (it was deleted; its keys can no longer authenticate, so no one
could reach them) are deleted, as deleting a tenant now deletes what it owns.
"""

from django.db import migrations

DEFAULT_TENANT_KEY = "default"
MODELS = ("StoredResponse", "Conversation")


def _tenant_for_key(Tenant, key: str):
    if key == DEFAULT_TENANT_KEY:
        return Tenant.objects.get_or_create(name=DEFAULT_TENANT_KEY)[0]
    if key.isdigit():
        return Tenant.objects.filter(pk=int(key)).first()
    return None


def tenant_from_key(apps, schema_editor):
    Tenant = apps.get_model("inference", "Tenant")
    for name in MODELS:
        model = apps.get_model("responses_api", name)
        keys = model.objects.order_by().values_list("tenant_key", flat=True).distinct()
        for key in list(keys):
            rows = model.objects.filter(tenant_key=key)
            tenant = _tenant_for_key(Tenant, key)
            if tenant is None:
                rows.delete()
            else:
                rows.update(tenant=tenant)


def key_from_tenant(apps, schema_editor):
    for name in MODELS:
        model = apps.get_model("responses_api", name)
        for row in model.objects.select_related("tenant").only("pk", "tenant__name"):
            key = (DEFAULT_TENANT_KEY if row.tenant.name == DEFAULT_TENANT_KEY
                   else str(row.tenant_id))
            model.objects.filter(pk=row.pk).update(tenant_key=key)


class Migration(migrations.Migration):

    dependencies = [
        ("responses_api", "0002_tenant_foreign_key"),
    ]

    operations = [
        migrations.RunPython(tenant_from_key, key_from_tenant),
    ]
