"""Stored chat completions get their Tenant and an expiry (filled in by 0004)."""

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("inference", "0002_stored_chat_completions"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="storedchatcompletion",
            options={"ordering": ["-created_at"], "verbose_name": "stored chat completion"},
        ),
        migrations.AlterField(
            model_name="storedchatcompletion",
            name="created_at",
            field=models.DateTimeField(db_index=True, default=django.utils.timezone.now),
        ),
        migrations.AddField(
            model_name="storedchatcompletion",
            name="tenant",
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.CASCADE,
                                    to="inference.tenant"),
        ),
        migrations.AddField(
            model_name="storedchatcompletion",
            name="expires_at",
            field=models.DateTimeField(db_index=True, null=True),
        ),
    ]
