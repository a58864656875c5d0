"""The tenant foreign key replaces `tenant_key`: required, and in the (tenant, -created_at) indexes."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("responses_api", "0003_tenant_from_tenant_key"),
    ]

    operations = [
        migrations.RemoveIndex(model_name="storedresponse", name="resp_tenant_created"),
        migrations.RemoveIndex(model_name="conversation", name="conv_tenant_created"),
        migrations.RemoveField(model_name="storedresponse", name="tenant_key"),
        migrations.RemoveField(model_name="conversation", name="tenant_key"),
        migrations.AlterField(
            model_name="storedresponse",
            name="tenant",
            field=models.ForeignKey(help_text="The tenant whose key created it; only that tenant can reach it.",
                                    on_delete=django.db.models.deletion.CASCADE,
                                    to="inference.tenant"),
        ),
        migrations.AlterField(
            model_name="conversation",
            name="tenant",
            field=models.ForeignKey(help_text="The tenant whose key created it; only that tenant can reach it.",
                                    on_delete=django.db.models.deletion.CASCADE,
                                    to="inference.tenant"),
        ),
        migrations.AddIndex(
            model_name="storedresponse",
            index=models.Index(fields=["tenant", "-created_at"], name="resp_tenant_created"),
        ),
        migrations.AddIndex(
            model_name="conversation",
            index=models.Index(fields=["tenant", "-created_at"], name="conv_tenant_created"),
        ),
    ]
