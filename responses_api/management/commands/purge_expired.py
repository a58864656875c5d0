"""`manage.py purge_expired`: delete stored responses, conversations and chat completions past METRALE_STORE_TTL."""

from django.core.management.base import BaseCommand

from responses_api import store


class Command(BaseCommand):
    help = ("Delete stored responses, conversations and chat completions older than METRALE_STORE_TTL "
            "(default 30d).")

    def handle(self, *args, **options):
        counts = store.purge_expired()
        self.stdout.write(f"deleted {counts['responses']} response(s), "
                          f"{counts['conversations']} conversation(s) and "
                          f"{counts['chat_completions']} chat completion(s)")
