from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('adapters', '0001_initial'),
    ]

    operations = [
        migrations.AddField(
            model_name='servedmodel',
            name='configured',
            field=models.CharField(blank=True, help_text='The configured default chat model (its source) this swap replaces: a server configured with another default serves its configuration and ignores this swap (logged).', max_length=1000),
        ),
        migrations.CreateModel(
            name='ModelSetting',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(help_text="The model's served name.", max_length=200, unique=True)),
                ('pinned', models.BooleanField(blank=True, help_text='Blank: as configured (METRALE_PIN).', null=True)),
                ('keep_alive', models.CharField(blank=True, help_text='Ollama\'s keep_alive: "5m", seconds, 0 (unload once idle), -1 (never). Blank: as configured.', max_length=40)),
                ('updated', models.DateTimeField(auto_now=True)),
                ('command', models.CharField(blank=True, choices=[('load', 'load'), ('unload', 'unload')], max_length=10)),
                ('state', models.CharField(blank=True, help_text='As the last server to report saw it.', max_length=20)),
                ('error', models.TextField(blank=True)),
                ('resident_bytes', models.BigIntegerField(blank=True, null=True)),
                ('reported', models.DateTimeField(blank=True, null=True)),
            ],
            options={
                'verbose_name': 'model',
                'ordering': ['name'],
            },
        ),
    ]
