"""`manage.py serve`: run daphne on the ASGI application (the model loads as the server starts),
in a server process that is started again when it dies, unless --no-restart.

The server process exits non-zero when it cannot go on (the engine thread died, a crash, a
kill); this command then starts a new one after a backoff (RESTART_BACKOFF_S, doubling up to
RESTART_BACKOFF_MAX_S, back to the start once a process has run STABLE_AFTER_S). SIGTERM or
SIGINT are passed on to the server process, which drains (metrale_site/drain.py); the command
exits 0 once it has. A server process that outlives its drain by KILL_MARGIN_S is killed, so the
command never hangs. With --no-restart, daphne runs in this process.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

RESTART_BACKOFF_S = 1.0
RESTART_BACKOFF_MAX_S = 30.0
STABLE_AFTER_S = 60.0
# Past its drain (SHUTDOWN_GRACE_S + drain.SETTLE_S), a server process gets this long to exit.
KILL_MARGIN_S = 20.0


class Command(BaseCommand):
    help = "Serve the OpenAI-compatible API with daphne (default 127.0.0.1:8000)."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--tool-call-parser", default=None,
                            help="tool-call parser name, or 'none' (overrides METRALE_TOOL_CALL_PARSER)")
        parser.add_argument("--reasoning-parser", default=None,
                            help="reasoning parser name, or 'none' (overrides METRALE_REASONING_PARSER)")
        parser.add_argument("--request-log", nargs="?", const="", default=None, metavar="PATH",
                            help="append one JSON line per API request to PATH (without PATH: requests.jsonl in "
                                 "the data directory; overrides METRALE_REQUEST_LOG)")
        parser.add_argument("--lora", action="append", default=[], metavar="NAME=PATH",
                            help="a LoRA adapter to load at startup (repeatable; added to METRALE_LORA_ADAPTERS)")
        parser.add_argument("--embedding-model", default=None, metavar="PATH_OR_NAME",
                            help="an embedding model to serve beside the chat model on /v1/embeddings: a "
                                 "sentence-transformers folder or a pulled name (overrides METRALE_EMBEDDING_MODEL)")
        parser.add_argument("--no-restart", action="store_true",
                            help="serve in this process; do not start it again when it dies")

    def handle(self, *args, host, port, tool_call_parser, reasoning_parser, request_log, no_restart, lora,
               embedding_model=None, **options):
        overrides = {f"METRALE_{key}": value for key, value in (("TOOL_CALL_PARSER", tool_call_parser),
                                                                ("REASONING_PARSER", reasoning_parser))
                     if value is not None}
        if request_log is not None:
            overrides["METRALE_REQUEST_LOG"] = str(Path(request_log).resolve() if request_log
                                                   else Path(settings.DATA_DIR) / "requests.jsonl")
        if embedding_model is not None:
            overrides["METRALE_EMBEDDING_MODEL"] = embedding_model
        for item in lora:
            if "=" not in item or not item.partition("=")[0].strip() or not item.partition("=")[2].strip():
                raise CommandError(f"--lora {item!r} is not NAME=PATH")
        if lora:
            overrides["METRALE_LORA_ADAPTERS"] = ",".join([*settings.METRALE.get("LORA_ADAPTERS", []), *lora])
        argv = [sys.executable, *entry_command(), "serve", "--host", host, "--port", str(port)]
        if no_restart:
            argv.append("--no-restart")
        if overrides:
            from inference.serving.text_setup import check_parser_names

            problems = check_parser_names({key.removeprefix("METRALE_"): value for key, value in overrides.items()})
            if problems:
                raise CommandError(" ".join(problems))
            # Settings are read once, when a process starts: the parser flags reach the server as
            # the environment variables they stand for, in this command started afresh (whose
            # system checks then refuse an unknown name, metrale.E001).
            os.execve(sys.executable, argv, {**os.environ, **overrides})
        if no_restart:
            from daphne.cli import CommandLineInterface

            self.stdout.write(f"Metrale serving on http://{host}:{port}/v1 (the model loads in the background; see /health)")
            self.stdout.flush()
            cli = CommandLineInterface()
            cli.run(["-b", host, "-p", str(port), "--proxy-headers", "metrale_site.asgi:application"])
            if not cli.server.listening_addresses:  # daphne logs why and returns as if all went well
                raise CommandError(f"Could not listen on {host}:{port}.")
            return
        code = Supervisor([*argv, "--no-restart"], self.stderr).run()
        if code:
            raise SystemExit(code)


def entry_command() -> list[str]:
    """How to start this program again (after sys.executable): the script this process runs (manage.py, or
    the `metrale` console script, whose `serve` takes the same flags), or where that is a module of a package
    (`python -m django`, `python -m metrale_site.cli`: run as a script, its folder would shadow top-level
    packages) the `metrale` command's module and its `manage` passthrough."""
    script = Path(sys.argv[0]).resolve()
    if script.is_file() and not (script.parent / "__init__.py").is_file():
        return [str(script)]
    return ["-m", "metrale_site.cli", "manage"]


class Supervisor:
    """Runs `argv` as the server process until asked to stop (see the module doc).

    `run()` returns the exit status for this command: 0 once the server process stopped when
    asked (or of its own accord with status 0), 1 when it had to be killed.
    """

    def __init__(self, argv: list[str], log):
        self.argv = argv
        self.log = log
        self.stopping = False
        self.child: subprocess.Popen | None = None

    def _on_signal(self, signum, _frame) -> None:
        self.stopping = True
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signal.SIGTERM)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        failures = 0
        while not self.stopping:
            started = time.monotonic()
            self.child = subprocess.Popen(self.argv)
            if self.stopping:  # a signal came before there was a child to pass it to
                self.child.send_signal(signal.SIGTERM)
            code = self._wait()
            if self.stopping or code == 0:
                return 0 if code == 0 else 1
            failures = 0 if time.monotonic() - started >= STABLE_AFTER_S else failures
            delay = min(RESTART_BACKOFF_MAX_S, RESTART_BACKOFF_S * 2 ** failures)
            failures += 1
            how = f"signal {-code}" if code < 0 else f"status {code}"
            self.log.write(f"The server process {self.child.pid} exited with {how}; starting "
                           f"it again in {delay:.0f} s.")
            self._sleep(delay)
        return 0

    def _wait(self) -> int:
        """The child's exit status; once stopping, kill it if it outlives its drain."""
        deadline = None
        while True:
            try:
                return self.child.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                pass
            if self.stopping and deadline is None:
                from metrale_site.drain import SETTLE_S

                deadline = time.monotonic() + settings.METRALE["SHUTDOWN_GRACE_S"] + SETTLE_S \
                    + KILL_MARGIN_S
            if deadline is not None and time.monotonic() > deadline:
                self.log.write(f"The server process {self.child.pid} did not stop; killing it.")
                self.child.kill()
                self.child.wait()
                return -signal.SIGKILL

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while not self.stopping and time.monotonic() < end:
            time.sleep(min(0.1, end - time.monotonic()))
