"""The sampling settings each catalogue chat model's card recommends, as that model's request defaults.

A model pulled by name (`manage.py pull_model NAME`, `metrale pull NAME`: METRALE_HOME/models/NAME) samples as
its authors recommend when a request leaves a field out: ModelFolder.sampling_defaults lays the folder's
generation_config.json over these (the file's own values win), and serving/sampling.py lays the request's
fields over both. Without them a GGUF import (whose generation_config.json carries only token ids) samples at
OpenAI's temperature 1.0, and SmolLM2-135M at 1.0 wanders until its 8,192-token context is full.

Sources: HuggingFaceTB/SmolLM2-135M-Instruct's model card (temperature 0.2, top_p 0.9 in its examples); Google's
recommended settings for Gemma 3 (temperature 1.0, top_k 64, top_p 0.95). Embedding models sample nothing.
"""
from __future__ import annotations

from pathlib import Path

from .home import metrale_home

# catalogue name (pull_model's) -> SamplingParams field -> value
CARD_SAMPLING: dict[str, dict[str, float | int]] = {
    "smollm2-135m-instruct": {"temperature": 0.2, "top_p": 0.9},
    "gemma-3-270m": {"temperature": 1.0, "top_k": 64, "top_p": 0.95},
}


def card_sampling(folder: Path) -> dict[str, float | int]:
    """The card's sampling defaults for the model folder `folder` when it is a catalogue model where pulling puts
    it (METRALE_HOME/models/NAME, NAME in CARD_SAMPLING), else {}. A copy: callers may change it."""
    folder = Path(folder)
    card = CARD_SAMPLING.get(folder.name)
    if card is None:
        return {}
    try:
        pulled = folder.resolve().parent == (metrale_home() / "models").resolve()
    except OSError:
        return {}
    return dict(card) if pulled else {}
