"""`manage.py serve`: run daphne on the ASGI application (the model loads as the server starts)."""
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Serve the OpenAI-compatible API with daphne (default 127.0.0.1:8000)."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)

    def handle(self, *args, host, port, **options):
        from daphne.cli import CommandLineInterface

        self.stdout.write(f"Metrale serving on http://{host}:{port}/v1 (the model loads in the background; see /health)")
        CommandLineInterface().run(["-b", host, "-p", str(port), "--proxy-headers", "metrale_site.asgi:application"])
