"""manage.py revoke_api_key PREFIX: revoke a key by its shown prefix (or the full key)."""
from django.core.management.base import BaseCommand, CommandError

from inference.tenancy import apikeys
from inference.models import ApiKey


class Command(BaseCommand):
    help = "Revoke an API key, named by its prefix (mk-xxxxxxxx) or the whole key."

    def add_arguments(self, parser):
        parser.add_argument("prefix")

    def handle(self, *args, prefix, **options):
        try:
            key = ApiKey.objects.get(prefix=apikeys.key_prefix(prefix.strip()))
        except ApiKey.DoesNotExist:
            raise CommandError(f"No API key with prefix {prefix!r}.")
        if key.revoked:
            self.stdout.write(f"Key {key.prefix}… was already revoked at {key.revoked_at}.")
            return
        key.revoked = True
        key.save(update_fields=["revoked", "revoked_at"])
        self.stdout.write(f"Revoked key {key.prefix}… of tenant {key.tenant}.")
