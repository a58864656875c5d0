"""What METRALE_MODELS names (inference/operations/model_specs.py), Ollama's keep_alive and the budget's sizes
(model_settings.py), and the real loader's refusals (operations/runtime.ModelLoader): a corrupt or truncated GGUF,
a folder without a tokenizer, a model too big for the budget, each failing with the model's name and the cause
through a request (never a 500) while the server keeps serving."""
from __future__ import annotations

import math
import shutil

import pytest

from inference.operations.model_settings import SettingError, parse_keep_alive, parse_size
from inference.operations.model_specs import CHAT, EMBEDDING, configured_specs, spec_for
from inference.operations.registry import FAILED, serving
from inference.operations.runtime import ModelLoader, build_registry

from .fake_engine import call


@pytest.mark.parametrize("value, seconds", [
    (300, 300.0), (0, 0.0), (-1, math.inf), (1.5, 1.5), ("5m", 300.0), ("1h30m", 5400.0), ("300ms", 0.3),
    ("10s", 10.0), ("0", 0.0), ("-1", math.inf), ("-1m", math.inf), ("90", 90.0), ("1.5h", 5400.0), ("0s", 0.0),
    # Past Go's longest Duration (about 292 years): forever, as an expiry can show it.
    ("100000000h", math.inf), (1e308, math.inf), (2**62, math.inf), ("2562047h", 2562047 * 3600.0)])
def test_keep_alive_reads_as_ollama_does(value, seconds):
    assert parse_keep_alive(value) == seconds


@pytest.mark.parametrize("value", ["", "5 minutes", "m", "1d", "5mm", True, None, [], float("nan"), float("inf"),
                                   "١٢", "٥m"])
def test_keep_alive_refuses_what_ollama_does_not_read(value):
    with pytest.raises(SettingError):
        parse_keep_alive(value)


@pytest.mark.parametrize("value, size", [("4GB", 4_000_000_000), ("512MiB", 512 << 20), ("1.5gb", 1_500_000_000),
                                         (1000, 1000), ("1000", 1000), ("2 KiB", 2048)])
def test_sizes(value, size):
    assert parse_size(value) == size


@pytest.mark.parametrize("value", ["", "4 gigs", "-1GB", "0", 0, True])
def test_bad_sizes(value):
    with pytest.raises(SettingError):
        parse_size(value)


def test_the_configured_list_reads_names_folders_and_gguf_files(settings, tmp_path):
    settings.METRALE_HOME = str(tmp_path)
    (tmp_path / "models" / "all-minilm-l6-v2" / "1_Pooling").mkdir(parents=True)
    folder = tmp_path / "my-chat"
    folder.mkdir()
    specs = configured_specs({"MODELS": f"smollm2-135m-instruct, all-minilm-l6-v2,{folder}, /data/Tiny-Q4.gguf, "
                                        "gemma-3-270m,smollm2-135m-instruct"})
    assert [(s.name, s.kind) for s in specs] == [("smollm2-135m-instruct", CHAT), ("all-minilm-l6-v2", EMBEDDING),
                                                 ("my-chat", CHAT), ("tiny-q4", CHAT), ("gemma-3-270m", CHAT)]
    assert specs[0].folder == tmp_path / "models" / "smollm2-135m-instruct"
    assert specs[3].gguf is not None and specs[3].folder == tmp_path / "models" / "tiny-q4"


@pytest.mark.parametrize("pin, pinned", [(None, ["smollm2-135m-instruct"]), (["none"], []), (["NONE"], []),
                                         (["all-minilm-l6-v2", "gemma-3-270m"], ["all-minilm-l6-v2", "gemma-3-270m"])])
def test_metrale_pin_names_the_models_loaded_at_start_by_default_the_first_chat_model(settings, tmp_path, pin, pinned):
    settings.METRALE_HOME = str(tmp_path)
    registry = build_registry({"MODELS": "all-minilm-l6-v2,smollm2-135m-instruct,gemma-3-270m", "PIN": pin})
    assert [e.name for e in registry.entries.values() if e.pinned] == pinned


def test_without_a_list_metrale_model_and_the_embedding_model_are_lists_of_one(settings, tmp_path):
    settings.METRALE_HOME = str(tmp_path)
    specs = configured_specs({"MODEL": str(tmp_path / "folder-x"), "SERVED_MODEL_NAME": "served",
                              "EMBEDDING_MODEL": "all-minilm-l6-v2"})
    assert [(s.name, s.kind) for s in specs] == [("served", CHAT), ("all-minilm-l6-v2", EMBEDDING)]
    registry = build_registry({"MODEL": str(tmp_path / "folder-x"), "EMBEDDING_MODEL": "all-minilm-l6-v2",
                               "KEEP_ALIVE": "10m", "MODEL_KEEP_ALIVE": ["all-minilm-l6-v2=-1"],
                               "MEMORY_BUDGET": "4GB"})
    assert registry.default().name == "folder-x" and registry.default().pinned
    assert not registry.entries["all-minilm-l6-v2"].pinned
    assert registry.entries["folder-x"].keep_alive_s == 600.0
    assert registry.entries["all-minilm-l6-v2"].keep_alive_s == math.inf
    assert registry.budget_bytes == 4_000_000_000 and registry.loader.kv_cache_bytes() == 400_000_000


@pytest.fixture
def real_loader_registry(settings, tmp_path, smollm2_dir, raw_asgi_requests, db):
    """A registry with the real ModelLoader over broken models: a truncated GGUF, a file that is no GGUF, a folder
    without tokenizer.json, a model bigger than the budget (SmolLM2's weights)."""
    from tests.engine.conftest import write_tiny_gguf

    truncated = tmp_path / "truncated.gguf"
    write_tiny_gguf(truncated)
    whole = truncated.read_bytes()
    truncated.write_bytes(whole[:len(whole) // 2])  # a download cut off halfway
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"this is not a gguf file at all" * 10)
    no_tok = tmp_path / "no-tokenizer"
    no_tok.mkdir()
    for name in ("config.json", "generation_config.json"):
        if (smollm2_dir / name).is_file():
            shutil.copy(smollm2_dir / name, no_tok / name)
    big = tmp_path / "too-big"
    big.mkdir()
    shutil.copy(smollm2_dir / "config.json", big / "config.json")
    (big / "model.safetensors").symlink_to(next(smollm2_dir.glob("*.safetensors")))
    settings.METRALE_HOME = str(tmp_path / "home")
    metrale = {**settings.METRALE, "MODELS": [str(p) for p in (truncated, garbage, no_tok, big)],
               "MEMORY_BUDGET": "1MB", "KV_CACHE_BYTES": 1 << 16, "PIN": ["no-tokenizer"]}
    registry = build_registry(metrale)
    assert isinstance(registry.loader, ModelLoader)
    with serving(registry):
        yield registry


@pytest.mark.parametrize("model, cause", [("truncated", "not a readable GGUF file"), ("garbage", "no GGUF magic"),
                                          ("no-tokenizer", "tokenizer.json"), ("too-big", "budget")])
def test_a_model_the_real_loader_cannot_load_fails_naming_model_and_cause(real_loader_registry, model, cause):
    answer = call("POST", "/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": "hi"}]})
    assert answer.status == 503, answer.body
    error = answer.json()["error"]
    assert error["code"] == "model_load_failed" and f"'{model}'" in error["message"]
    assert cause.lower() in error["message"].lower(), error["message"]
    assert real_loader_registry.entries[model].state == FAILED
    listed = {m["id"]: m for m in call("GET", "/v1/models").json()["data"]}
    assert listed[model]["state"] == "failed"
    assert call("GET", "/health/live").status == 200


@pytest.mark.parametrize("name, hint", [("smollm2-135m-instruct", True), ("my-finetune", False)])
def test_a_missing_folder_names_pull_model_only_for_a_model_it_pulls(settings, tmp_path, name, hint):
    from inference.operations.model_specs import ModelSpec

    with pytest.raises(FileNotFoundError) as raised:
        ModelLoader(settings.METRALE).folder(ModelSpec(name, tmp_path / name, CHAT))
    assert str(tmp_path / name) in str(raised.value)
    assert ("manage.py pull_model" in str(raised.value)) == hint, raised.value


def test_a_gguf_is_imported_once_on_first_use_and_an_unsupported_tensor_type_fails_naming_it(
        settings, tmp_path, raw_asgi_requests, db):
    import numpy as np

    from tests.engine.conftest import write_tiny_gguf

    write_tiny_gguf(tmp_path / "Tiny.gguf")
    write_tiny_gguf(tmp_path / "odd.gguf", extra_tensors={"blk.0.attn_norm.weight": np.zeros(16, np.int32)})
    settings.METRALE_HOME = str(tmp_path / "home")
    registry = build_registry({**settings.METRALE, "MODELS": [str(tmp_path / "Tiny.gguf"), str(tmp_path / "odd.gguf")],
                               "KV_CACHE_BYTES": 1 << 20, "MAX_MODEL_LEN": 64, "PIN": []})
    body = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    with serving(registry):
        try:
            assert call("POST", "/v1/chat/completions", body).status == 200
            assert (tmp_path / "home" / "models" / "tiny" / "config.json").is_file()
            assert registry.unload("tiny")
            (tmp_path / "Tiny.gguf").unlink()  # the imported folder is what later loads read
            assert call("POST", "/v1/chat/completions", body).status == 200
            odd = call("POST", "/v1/chat/completions", {**body, "model": "odd"})
            assert odd.status == 503 and "'odd'" in odd.json()["error"]["message"]
            assert "I32" in odd.json()["error"]["message"]
            assert call("POST", "/v1/chat/completions", body).status == 200  # the other model still serves
        finally:
            registry.stop()
