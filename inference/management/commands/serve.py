"""`manage.py serve`: run daphne on the ASGI application (the model loads as the server starts)."""
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = "Serve the OpenAI-compatible API with daphne (default 127.0.0.1:8000)."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--tool-call-parser", default=None,
                            help="tool-call parser name, or 'none' (overrides METRALE_TOOL_CALL_PARSER)")
        parser.add_argument("--reasoning-parser", default=None,
                            help="reasoning parser name, or 'none' (overrides METRALE_REASONING_PARSER)")

    def handle(self, *args, host, port, tool_call_parser, reasoning_parser, **options):
        from daphne.cli import CommandLineInterface

        from inference.serving.text_setup import check_parser_names

        # daphne runs the application in this process, so the settings set here are the ones it serves with.
        for key, value in (("TOOL_CALL_PARSER", tool_call_parser), ("REASONING_PARSER", reasoning_parser)):
            if value is not None:
                settings.METRALE[key] = value
        problems = check_parser_names()
        if problems:
            raise CommandError(" ".join(problems))
        self.stdout.write(f"Metrale serving on http://{host}:{port}/v1 (the model loads in the background; see /health)")
        CommandLineInterface().run(["-b", host, "-p", str(port), "--proxy-headers", "metrale_site.asgi:application"])
