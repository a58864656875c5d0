"""Where Metrale keeps its files, read before Django starts (settings.py and the `metrale` command ask here).

- METRALE_HOME (default ~/.cache/metrale): models/, wheels/ (pull_model's downloads) and kernels/ (the compiled
  CPU kernels, inference/engine/kernels/build.py), in a checkout and an installed package alike.
- The data directory: the SQLite database (metrale.sqlite3), the collected static files (static/), uploaded and
  batch files (files/) and the request log's default file (requests.jsonl). A source checkout (manage.py beside
  the packages: `make serve`, `make test`, each worktree its own) keeps them in its var/ folder; an installed
  package keeps them in METRALE_HOME, created on first run.

No Django import: settings.py reads these while it is being imported.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

from inference.engine.home import metrale_home

__all__ = ["PACKAGES_DIR", "DataDirError", "checkout", "data_dir", "metrale_home", "writable_dir"]

# The folder holding the packages (metrale_site/, inference/, ...): a checkout's root, or site-packages.
PACKAGES_DIR = Path(__file__).resolve().parent.parent


def checkout() -> Path | None:
    """The source checkout these packages run from (its manage.py beside them), or None for an installed package."""
    return PACKAGES_DIR if (PACKAGES_DIR / "manage.py").is_file() else None


def data_dir() -> Path:
    """The data directory: a checkout's var/, else METRALE_HOME (see the module doc). Not created here."""
    root = checkout()
    return root / "var" if root is not None else metrale_home()


class DataDirError(OSError):
    """A folder Metrale must write to cannot be created or written; str() names it and what to do."""


def writable_dir(path: Path, setting: str = "METRALE_HOME") -> Path:
    """`path`, created when missing, after proving a file can be written in it.

    Raises DataDirError naming the path (and `setting`, the variable that moves it) when the folder cannot be
    created or written (read-only file system, permissions, a file in its place)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise DataDirError(f"the data directory {path} is not writable ({exc.strerror or exc}); "
                           f"set {setting} to a writable folder") from exc
    return path
