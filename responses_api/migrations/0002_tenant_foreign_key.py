"""Stored responses and conversations get a foreign key to their Tenant (filled in by 0003)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("inference", "0001_initial"),
        ("responses_api", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="storedresponse",
            name="tenant",
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.CASCADE,
                                    to="inference.tenant"),
        ),
        migrations.AddField(
            model_name="conversation",
            name="tenant",
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.CASCADE,
                                    to="inference.tenant"),
        ),
    ]
