"""Tiny random-weight checkpoints of each supported architecture, written with transformers."""
from __future__ import annotations

from pathlib import Path

import torch

COMMON = dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
              rms_norm_eps=1e-5, eos_token_id=2, bos_token_id=1)


def make_tiny_model(arch: str, folder: Path, **overrides) -> Path:
    """Save a tiny random model of `arch` (llama, llama3, mistral, qwen2, qwen3, gemma3) as an HF folder;
    returns it. gemma3: 4 layers (local, local, full, local), a 24-token sliding window, logits capped at 30."""
    import transformers

    torch.manual_seed(0)
    if arch == "llama":
        cfg = transformers.LlamaConfig(**COMMON, rope_theta=10000.0, tie_word_embeddings=False, **overrides)
        cls = transformers.LlamaForCausalLM
    elif arch == "llama3":
        cfg = transformers.LlamaConfig(**COMMON, rope_theta=500000.0, tie_word_embeddings=True,
                                       rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
                                       **overrides)
        cls = transformers.LlamaForCausalLM
    elif arch == "mistral":
        cfg = transformers.MistralConfig(**COMMON, sliding_window=None, **overrides)
        cls = transformers.MistralForCausalLM
    elif arch == "qwen2":
        cfg = transformers.Qwen2Config(**COMMON, tie_word_embeddings=True, **overrides)
        cls = transformers.Qwen2ForCausalLM
    elif arch == "qwen3":
        cfg = transformers.Qwen3Config(**COMMON, head_dim=32, tie_word_embeddings=False, **overrides)
        cls = transformers.Qwen3ForCausalLM
    elif arch == "gemma3":
        cfg = transformers.Gemma3TextConfig(**{
            **COMMON, "num_hidden_layers": 4, "head_dim": 16, "query_pre_attn_scalar": 24, "sliding_window": 24,
            "layer_types": ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
            "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}},
            "final_logit_softcapping": 30.0, "tie_word_embeddings": True, "pad_token_id": 0, **overrides})
        cfg.architectures = ["Gemma3ForCausalLM"]
        cls = transformers.Gemma3ForCausalLM
    else:
        raise ValueError(arch)
    model = cls(cfg).eval()
    # Random init leaves norms at 1 and biases at 0; perturb them so parity covers them.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "bias" in name:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(folder, safe_serialization=True)
    return folder
