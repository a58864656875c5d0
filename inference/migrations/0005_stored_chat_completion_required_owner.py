"""A stored chat completion's tenant and expiry are required; lists read them by (tenant, created_at, id)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("inference", "0004_stored_chat_completion_owner"),
    ]

    operations = [
        migrations.AlterField(
            model_name="storedchatcompletion",
            name="tenant",
            field=models.ForeignKey(help_text="The tenant whose key created it; only that tenant can reach it.",
                                    on_delete=django.db.models.deletion.CASCADE,
                                    to="inference.tenant"),
        ),
        migrations.AlterField(
            model_name="storedchatcompletion",
            name="expires_at",
            field=models.DateTimeField(db_index=True),
        ),
        migrations.AddIndex(
            model_name="storedchatcompletion",
            index=models.Index(fields=["tenant", "created_at", "id"], name="chat_tenant_created"),
        ),
    ]
