"""GGUF import on tiny synthetic files: names, Q/K un-permute, configs, tokenizer, errors."""

import json

import numpy as np
import pytest
import torch
from django.core.management import CommandError, call_command
from safetensors.torch import load_file

from inference.engine.checkpoints import GGUFImportError, import_gguf
from inference.engine.config import ModelConfig
from inference.engine.tokenizer import Tokenizer

from .conftest import TINY, tiny_vocab, write_tiny_gguf


def _leftovers(parent, name):
    return [p.name for p in parent.iterdir() if p.name.startswith(f".{name}")]


def test_it_recovers_hf_weights_with_qk_unpermuted(tmp_path):
    hf = write_tiny_gguf(tmp_path / "tiny.gguf")
    out = import_gguf(tmp_path / "tiny.gguf", tmp_path / "model", progress=False)
    weights = load_file(out / "model.safetensors")
    assert set(weights) == set(hf)
    for name, expected in hf.items():
        assert weights[name].dtype == torch.float32
        np.testing.assert_array_equal(weights[name].numpy(), expected, err_msg=name)


def test_it_writes_a_config_the_engine_reads(tmp_path):
    write_tiny_gguf(tmp_path / "tiny.gguf")
    out = import_gguf(tmp_path / "tiny.gguf", tmp_path / "model", progress=False)
    cfg = ModelConfig.from_folder(out)
    assert cfg.architecture == "LlamaForCausalLM"
    assert (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads) == (
        TINY["hidden"],
        TINY["heads"],
        TINY["kv_heads"],
    )
    assert (cfg.num_hidden_layers, cfg.intermediate_size) == (TINY["layers"], TINY["ffn"])
    assert cfg.vocab_size == len(tiny_vocab()[0])
    assert cfg.rms_norm_eps == pytest.approx(1e-5)
    assert cfg.rope_theta == 10000.0 and cfg.max_position_embeddings == 128
    assert cfg.tie_word_embeddings is False
    assert cfg.bos_token_id == 1 and cfg.eos_token_ids == [2]
    assert json.loads((out / "generation_config.json").read_text()) == {
        "bos_token_id": 1,
        "eos_token_id": 2,
    }


def test_it_ties_embeddings_when_there_is_no_output_tensor(tmp_path):
    write_tiny_gguf(tmp_path / "tiny.gguf", tied=True)
    out = import_gguf(tmp_path / "tiny.gguf", tmp_path / "model", dtype="bfloat16", progress=False)
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is True
    weights = load_file(out / "model.safetensors")
    assert "lm_head.weight" not in weights
    assert weights["model.embed_tokens.weight"].dtype == torch.bfloat16


def test_it_writes_the_tokenizer_and_its_special_tokens(tmp_path):
    write_tiny_gguf(tmp_path / "tiny.gguf")
    tok = Tokenizer.from_folder(
        import_gguf(tmp_path / "tiny.gguf", tmp_path / "model", progress=False)
    )
    assert tok.encode(" hi") == [tok.token_to_id("Ġhi")]
    assert tok.encode("<|im_start|>hi<|im_end|>")[0] == 1
    assert (tok.bos_token, tok.eos_token, tok.eos_token_ids) == ("<|im_start|>", "<|im_end|>", [2])
    assert tok.special_ids == {0, 1, 2}
    assert tok.apply_chat_template([{"role": "user", "content": "x"}]) == "<|im_start|>x<|im_end|>"


def test_it_rejects_an_architecture_other_than_llama(tmp_path):
    write_tiny_gguf(tmp_path / "tiny.gguf", arch="gpt2")
    with pytest.raises(GGUFImportError, match="architecture 'gpt2'"):
        import_gguf(tmp_path / "tiny.gguf", tmp_path / "model", progress=False)
    assert not (tmp_path / "model").exists()


def test_it_rejects_an_unsupported_tensor_type(tmp_path):
    write_tiny_gguf(
        tmp_path / "tiny.gguf", extra_tensors={"blk.0.attn_norm.weight": np.zeros(16, np.int32)}
    )
    with pytest.raises(GGUFImportError, match="I32"):
        import_gguf(tmp_path / "tiny.gguf", tmp_path / "model", progress=False)


def test_it_rejects_an_unknown_tensor(tmp_path):
    write_tiny_gguf(
        tmp_path / "tiny.gguf",
        extra_tensors={"blk.0.ffn_gate_exps.weight": np.zeros(4, np.float32)},
    )
    with pytest.raises(GGUFImportError, match="ffn_gate_exps"):
        import_gguf(tmp_path / "tiny.gguf", tmp_path / "model", progress=False)


def test_it_rejects_a_file_missing_a_layer_tensor(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, drop=("blk.1.ffn_up.weight",))
    with pytest.raises(GGUFImportError, match="model.layers.1.mlp.up_proj.weight"):
        import_gguf(path, tmp_path / "model", progress=False)


def test_it_refuses_to_overwrite_unless_forced(tmp_path):
    write_tiny_gguf(tmp_path / "tiny.gguf", seed=1)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "stale.txt").write_text("old")
    with pytest.raises(CommandError, match="already exists"):
        call_command(
            "import_model", str(tmp_path / "tiny.gguf"), str(tmp_path / "model"), verbosity=0
        )
    call_command(
        "import_model", str(tmp_path / "tiny.gguf"), str(tmp_path / "model"), "--force", verbosity=0
    )
    assert (tmp_path / "model" / "config.json").is_file()
    assert not (tmp_path / "model" / "stale.txt").exists()
    assert _leftovers(tmp_path, "model") == []


def test_it_maps_a_missing_file_to_command_error(tmp_path):
    with pytest.raises(CommandError, match="does not exist"):
        call_command(
            "import_model", str(tmp_path / "nope.gguf"), str(tmp_path / "model"), verbosity=0
        )
    assert not (tmp_path / "model").exists()


def test_it_maps_a_non_gguf_file_to_command_error(tmp_path):
    (tmp_path / "fake.gguf").write_bytes(b"PK\x03\x04 definitely not a gguf" * 10)
    with pytest.raises(CommandError, match="not a GGUF file"):
        call_command(
            "import_model", str(tmp_path / "fake.gguf"), str(tmp_path / "model"), verbosity=0
        )
    assert not (tmp_path / "model").exists()
    assert _leftovers(tmp_path, "model") == []


def test_it_leaves_no_half_written_folder_when_conversion_fails(tmp_path, monkeypatch):
    from inference.engine.checkpoints import gguf as gguf_module

    write_tiny_gguf(tmp_path / "tiny.gguf")

    def explode(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(gguf_module, "save_file", explode)
    with pytest.raises(RuntimeError, match="disk full"):
        import_gguf(tmp_path / "tiny.gguf", tmp_path / "model", progress=False)
    assert not (tmp_path / "model").exists()
    assert _leftovers(tmp_path, "model") == []


def test_pull_model_rejects_an_unknown_name():
    with pytest.raises(CommandError, match="smollm2-135m-instruct"):
        call_command("pull_model", "gpt-17")


def test_pull_model_is_idempotent(smollm2_dir, capsys):
    call_command("pull_model", "smollm2-135m-instruct")
    assert "already" in capsys.readouterr().out
