"""Shared fixtures."""
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The imported SmolLM2-135M-Instruct folder, imported first if missing (`make test` pulls it)."""
    from django.conf import settings
    from django.core.management import call_command

    path = Path(settings.METRALE_HOME) / "models" / "smollm2-135m-instruct"
    if not (path / "config.json").is_file():
        call_command("pull_model", "smollm2-135m-instruct")
    return path
