"""`manage.py purge_expired`: delete stored responses and conversations past METRALE_STORE_TTL."""

from django.core.management.base import BaseCommand

from responses_api import store


class Command(BaseCommand):
    help = "Delete stored responses and conversations older than METRALE_STORE_TTL (default 30d)."

    def handle(self, *args, **options):
        counts = store.purge_expired()
        self.stdout.write(f"deleted {counts['responses']} response(s) and "
                          f"{counts['conversations']} conversation(s)")
