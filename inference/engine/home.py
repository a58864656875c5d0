"""METRALE_HOME: where models (models/NAME), pulled wheels (wheels/) and the compiled kernels (kernels/) live.

The one reading of the variable and its default for the engine, the project's settings (metrale_site/paths.py)
and the `metrale` command. No Django, no torch.
"""
from __future__ import annotations

import os
from pathlib import Path


def metrale_home() -> Path:
    """$METRALE_HOME, default ~/.cache/metrale (user-expanded; not created here)."""
    return Path(os.environ.get("METRALE_HOME") or Path.home() / ".cache" / "metrale").expanduser()
