"""A tiny gemma3 GGUF, written as llama.cpp's convert_hf_to_gguf.py writes one (its tensor names, every
`*norm.weight` plus one, the SentencePiece vocabulary with scores and no merges, no chat template),
imports to the folder it came from: the same weights, a config the engine reads, the same logits,
Gemma's turn format and llama.cpp's tokenization."""
import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from inference.engine.checkpoints import import_gguf
from inference.engine.config import ModelConfig
from inference.engine.tokenizer import Tokenizer

from .spm_reference import SpmReference
from .test_gemma3_tokenizer import tiny_vocab
from .test_model_parity import run_ours
from .tiny_models import make_tiny_model

GGUF_LAYER = {  # HF name -> llama.cpp's gemma3 tensor name (gguf-py constants, MODEL_ARCH.GEMMA3)
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
}


def vocab320():
    tokens, scores, types = tiny_vocab()
    pad = 320 - len(tokens)
    return (tokens + [f"<unused{i}>" for i in range(pad)], scores + [0.0] * pad, types + [3] * pad)


def gguf_name(hf: str) -> str:
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    _, _, i, rest = hf.split(".", 3)
    return f"blk.{i}.{GGUF_LAYER[rest.removesuffix('.weight')]}.weight"


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """(the tiny HF Gemma 3 folder, the GGUF written from it)."""
    import gguf

    tmp = tmp_path_factory.mktemp("gemma3-gguf")
    folder = make_tiny_model("gemma3", tmp / "hf")
    cfg = json.loads((folder / "config.json").read_text())
    weights = load_file(folder / "model.safetensors")
    path = tmp / "tiny-gemma3.gguf"
    w = gguf.GGUFWriter(str(path), arch="gemma3")
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(1_000_000.0)
    w.add_sliding_window(cfg["sliding_window"])
    w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
    # The tiny model's layers are local, local, full, local: one flag per layer (true = sliding).
    w.add_array("gemma3.attention.sliding_window_pattern", [t == "sliding_attention" for t in cfg["layer_types"]])
    tokens, scores, types = vocab320()
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_pad_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_space_prefix(False)
    for name, tensor in weights.items():
        if name == "lm_head.weight":
            continue
        value = tensor.float().numpy()
        if name.endswith("norm.weight"):
            value = value + 1  # Gemma3Model.norm_shift
        w.add_tensor(gguf_name(name), np.ascontiguousarray(value, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return folder, path


def test_it_recovers_the_hf_weights(converted, tmp_path):
    folder, path = converted
    out = import_gguf(path, tmp_path / "model", progress=False)
    ours = load_file(out / "model.safetensors")
    hf = {k: v for k, v in load_file(folder / "model.safetensors").items() if k != "lm_head.weight"}
    assert set(ours) == set(hf)
    for name, tensor in hf.items():
        np.testing.assert_allclose(ours[name].numpy(), tensor.numpy(), rtol=0, atol=1e-6, err_msg=name)


def test_it_writes_a_gemma3_config_the_engine_reads(converted, tmp_path):
    _, path = converted
    cfg = ModelConfig.from_folder(import_gguf(path, tmp_path / "model", progress=False))
    assert cfg.architecture == "Gemma3ForCausalLM" and cfg.tie_word_embeddings
    assert cfg.layer_types == ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]
    assert (cfg.sliding_window, cfg.rope_theta, cfg.rope_local_theta) == (24, 1_000_000.0, 10_000.0)
    assert cfg.query_pre_attn_scalar == cfg.head_dim == 16  # llama.cpp scales by head_dim ** -0.5
    assert cfg.final_logit_softcapping == 30.0 and cfg.hidden_activation == "gelu_pytorch_tanh"
    assert (cfg.bos_token_id, cfg.eos_token_ids) == (2, [1])


def test_it_gives_the_logits_of_the_folder_it_came_from(converted, tmp_path):
    folder, path = converted
    out = import_gguf(path, tmp_path / "model", progress=False)
    # The GGUF implies llama.cpp's attention scale (head_dim); give the original folder the same one.
    cfg = json.loads((folder / "config.json").read_text())
    same = tmp_path / "hf-same-scale"
    same.mkdir()
    for f in folder.iterdir():
        (same / f.name).write_bytes(f.read_bytes())
    (same / "config.json").write_text(json.dumps({**cfg, "query_pre_attn_scalar": cfg["head_dim"]}))
    prompt = torch.randint(7, 300, (40,), generator=torch.Generator().manual_seed(5)).tolist()
    ours = run_ours(out, prompt, [9, 10, 11])
    ref = run_ours(same, prompt, [9, 10, 11])
    assert (ours - ref).abs().max().item() <= 1e-5


def test_it_writes_gemmas_turn_format_and_llama_cpp_tokenization(converted, tmp_path):
    _, path = converted
    tok = Tokenizer.from_folder(import_gguf(path, tmp_path / "model", progress=False))
    text = tok.apply_chat_template([{"role": "system", "content": "Be brief."},
                                    {"role": "user", "content": "hello there"},
                                    {"role": "assistant", "content": "the world"},
                                    {"role": "user", "content": "in"}])
    assert text == ("<bos><start_of_turn>user\nBe brief.\n\nhello there<end_of_turn>\n<start_of_turn>model\n"
                    "the world<end_of_turn>\n<start_of_turn>user\nin<end_of_turn>\n<start_of_turn>model\n")
    ref = SpmReference(*vocab320())
    assert tok.encode(text) == ref.encode(text)
    assert tok.encode("hello", add_special_tokens=True)[0] == 2
    assert tok.eos_token_ids == [1, 5]  # <eos> and <end_of_turn>
