"""ModelFolder: what an HF model folder says (config.json, generation_config.json), read once per process. No torch.

The engine takes its ModelConfig and EOS ids from it, serving its sampling defaults and
model_type; `ModelFolder.read(path)` is cached, so each file is parsed once however many
places ask.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path

from .config import ConfigError, ModelConfig
from .model_cards import card_sampling

log = logging.getLogger("metrale.engine")

# generation_config.json keys that become request defaults, and the SamplingParams field each sets
# (vLLM's `--generation-config auto`).
GENERATION_CONFIG_KEYS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                          "repetition_penalty": "repetition_penalty", "max_new_tokens": "max_tokens"}


def _read_json(path: Path) -> dict | None:
    """The JSON object in `path`; None when the file is absent. Raises ConfigError when it is not
    a JSON object."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path} does not hold a JSON object")
    return data


@dataclass(frozen=True, eq=False)
class ModelFolder:
    """One HF model folder's JSON files. config: config.json's object (None when absent or
    broken; config_error then says why); generation_config: generation_config.json's ({} when
    absent or unreadable: it only refines)."""

    path: Path
    config: dict | None
    generation_config: dict = field(default_factory=dict)
    config_error: str | None = None

    @staticmethod
    def read(path: str | Path) -> ModelFolder:
        """The folder at `path`, read once per process (cached by path; `ModelFolder.forget()`
        drops the cache). Never raises: a missing or broken config.json surfaces when
        `model_config` is asked for; a broken generation_config.json is logged and ignored."""
        return _read(str(Path(path)))

    @staticmethod
    def load(path: str | Path) -> ModelFolder:
        """The folder at `path` read now, bypassing (and not filling) the cache (e.g. for a system
        check that runs before the folder exists)."""
        return _read.__wrapped__(str(Path(path)))

    @staticmethod
    def forget() -> None:
        """Drop every cached folder (a folder changed on disk, e.g. in tests)."""
        _read.cache_clear()

    @cached_property
    def model_config(self) -> ModelConfig:
        """The decoder's shape. Raises ConfigError when config.json is missing, broken or unsupported."""
        if self.config is None:
            raise ConfigError(self.config_error or f"{self.path / 'config.json'} does not exist")
        return ModelConfig.from_dict(self.config)

    @property
    def model_type(self) -> str:
        """config.json's model_type ("" when absent)."""
        value = (self.config or {}).get("model_type")
        return value if isinstance(value, str) else ""

    @cached_property
    def eos_token_ids(self) -> list[int]:
        """EOS ids: config.json's eos_token_id (int or list), then generation_config.json's."""
        ids = list(self.model_config.eos_token_ids)
        eos = self.generation_config.get("eos_token_id")
        for e in [eos] if isinstance(eos, int) else (eos if isinstance(eos, list) else []):
            if isinstance(e, int) and e not in ids:
                ids.append(e)
        return ids

    @cached_property
    def sampling_defaults(self) -> dict:
        """The folder's request defaults as SamplingParams names (numbers only): generation_config.json's
        sampling fields over the model card's settings for a catalogue model pulled by name
        (model_cards.card_sampling)."""
        out = card_sampling(self.path)
        for key, name in GENERATION_CONFIG_KEYS.items():
            value = self.generation_config.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out[name] = value
        return out


@lru_cache(maxsize=8)
def _read(path_text: str) -> ModelFolder:
    path = Path(path_text)
    config, error = None, None
    try:
        config = _read_json(path / "config.json")
    except ConfigError as exc:
        error = str(exc)
    try:
        generation = _read_json(path / "generation_config.json") or {}
    except ConfigError as exc:
        log.warning("ignoring %s", exc)
        generation = {}
    return ModelFolder(path, config, generation, error)
