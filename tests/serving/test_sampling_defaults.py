"""Request -> SamplingParams: request values, then generation_config.json, then the server's settings."""
import json

import pytest

from inference.engine.tokenizer import Tokenizer
from inference.serving.errors import ApiError
from inference.engine.model_folder import ModelFolder
from inference.serving.sampling import defaults_for, resolve_max_tokens, sampling_params


@pytest.fixture(scope="module")
def tok(smollm2_dir):
    return Tokenizer.from_folder(smollm2_dir)


def test_generation_config_then_settings_then_openai_defaults(tmp_path, settings, tok):
    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"temperature": 0.3, "top_k": 20, "do_sample": True, "max_new_tokens": 64, "eos_token_id": 2}))
    settings.METRALE = {**settings.METRALE, "SAMPLING_DEFAULTS": {"temperature": 0.9, "top_p": 0.8, "bogus": 1}}
    defaults = defaults_for(ModelFolder.load(tmp_path))
    assert defaults == {"temperature": 0.3, "top_p": 0.8, "top_k": 20, "max_tokens": 64}
    p = sampling_params({}, max_tokens=10, tokenizer=tok, defaults=defaults)
    assert (p.temperature, p.top_p, p.top_k, p.min_p, p.presence_penalty) == (0.3, 0.8, 20, 0.0, 0.0)
    p = sampling_params({"temperature": 0, "top_p": 0.5}, max_tokens=10, tokenizer=tok, defaults=defaults)
    assert (p.temperature, p.top_p, p.top_k) == (0, 0.5, 20)
    assert sampling_params({}, max_tokens=10, tokenizer=tok, defaults={}).temperature == 1.0


def test_missing_or_broken_generation_config_gives_no_defaults(tmp_path):
    assert ModelFolder.load(tmp_path).sampling_defaults == {}
    (tmp_path / "generation_config.json").write_text("{nope")
    assert ModelFolder.load(tmp_path).sampling_defaults == {}


def test_max_tokens_resolution():
    assert resolve_max_tokens(None, None, prompt_tokens=10, limit=100) == 90
    assert resolve_max_tokens(None, 16, prompt_tokens=10, limit=100) == 16
    assert resolve_max_tokens(None, 500, prompt_tokens=10, limit=100) == 90
    assert resolve_max_tokens(90, None, prompt_tokens=10, limit=100) == 90
    with pytest.raises(ApiError) as exc:
        resolve_max_tokens(91, None, prompt_tokens=10, limit=100)
    assert exc.value.status == 400 and exc.value.code == "context_length_exceeded"
    assert "100" in exc.value.message and "101" in exc.value.message
    with pytest.raises(ApiError):
        resolve_max_tokens(None, None, prompt_tokens=100, limit=100)


def test_top_k_minus_one_means_off_and_seed_offsets(tok):
    p = sampling_params({"top_k": -1, "seed": 9}, max_tokens=5, tokenizer=tok, defaults={}, seed_offset=2)
    assert p.top_k == 0 and p.seed == 11


def test_a_vanishing_temperature_means_greedy(tok):
    assert sampling_params({"temperature": 1e-9}, max_tokens=5, tokenizer=tok, defaults={}).temperature == 0.0
    assert sampling_params({"temperature": 1e-3}, max_tokens=5, tokenizer=tok, defaults={}).temperature == 1e-3


def test_every_catalogue_chat_model_has_its_cards_sampling():
    from inference.engine.model_cards import CARD_SAMPLING
    from inference.management.commands.pull_model import ASSEMBLED_MODELS, PULLABLE_MODELS

    chat = {name for name, (_, member) in PULLABLE_MODELS.items() if member.endswith(".gguf")} | set(ASSEMBLED_MODELS)
    assert set(CARD_SAMPLING) == chat
    assert CARD_SAMPLING["smollm2-135m-instruct"] == {"temperature": 0.2, "top_p": 0.9}


def test_a_pulled_catalogue_model_samples_as_its_card_says_and_the_request_wins(tmp_path, monkeypatch, settings, tok):
    monkeypatch.setenv("METRALE_HOME", str(tmp_path / "home"))
    folder = tmp_path / "home" / "models" / "smollm2-135m-instruct"
    folder.mkdir(parents=True)
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    settings.METRALE = {**settings.METRALE, "SAMPLING_DEFAULTS": {"temperature": 0.9, "top_k": 7}}
    defaults = defaults_for(ModelFolder.load(folder))
    assert defaults == {"temperature": 0.2, "top_p": 0.9, "top_k": 7}
    p = sampling_params({}, max_tokens=10, tokenizer=tok, defaults=defaults)
    assert (p.temperature, p.top_p, p.top_k) == (0.2, 0.9, 7)
    p = sampling_params({"temperature": 0.7, "top_p": 1.0}, max_tokens=10, tokenizer=tok, defaults=defaults)
    assert (p.temperature, p.top_p) == (0.7, 1.0)
    # the folder's own generation_config.json wins over the card
    (folder / "generation_config.json").write_text(json.dumps({"top_p": 0.5}))
    assert ModelFolder.load(folder).sampling_defaults == {"temperature": 0.2, "top_p": 0.5}


def test_the_card_applies_only_where_pulling_puts_the_model(tmp_path, monkeypatch):
    monkeypatch.setenv("METRALE_HOME", str(tmp_path / "home"))
    elsewhere = tmp_path / "imports" / "smollm2-135m-instruct"  # a float import of the same GGUF, say
    elsewhere.mkdir(parents=True)
    assert ModelFolder.load(elsewhere).sampling_defaults == {}
