"""system_fingerprint: which model (folder contents and engine settings, plus any adapter) produced a response.

OpenAI's `system_fingerprint` identifies the backend configuration a response came from, so a
client can tell when the model behind a name changed. Here it is a digest of every file of the
model folder (names and contents), the engine settings, and for an adapter its folder's digest
too: a swapped model or a reloaded adapter answers with another fingerprint, the same folder and
settings with the same one in every process. No torch.
"""
from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

_CHUNK = 1 << 20
_cache: dict[tuple, str] = {}
_lock = threading.Lock()


def folder_digest(path: str | Path) -> str:
    """SHA-256 (hex) of the regular files directly in `path`: each file's name, size and contents, in
    name order. Cached per process by (name, size, mtime) of the files. Raises OSError when unreadable."""
    folder = Path(path)
    files = sorted(p for p in folder.iterdir() if p.is_file())
    key = (str(folder.resolve()), *((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files))
    with _lock:
        if key in _cache:
            return _cache[key]
    h = hashlib.sha256()
    for p in files:
        h.update(f"{p.name}\0{p.stat().st_size}\0".encode())
        with open(p, "rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
    digest = h.hexdigest()
    with _lock:
        _cache[key] = digest
    return digest


def model_fingerprint(path: str | Path, engine_settings: dict) -> str:
    """`fp_` + 12 hex digits of the folder's digest and the engine settings (JSON, keys sorted; the
    folder's own path left out, so a copy of the folder elsewhere has the same fingerprint)."""
    settings = {k: v for k, v in engine_settings.items() if k != "model_path"}
    text = folder_digest(path) + json.dumps(settings, sort_keys=True, default=str)
    return "fp_" + hashlib.sha256(text.encode()).hexdigest()[:12]


def combine_fingerprint(base: str, adapter_digest: str) -> str:
    """The fingerprint of an adapter's responses: the base model's combined with the adapter folder's digest."""
    return "fp_" + hashlib.sha256(f"{base}\0{adapter_digest}".encode()).hexdigest()[:12]
