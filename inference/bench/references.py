"""Reference figures measured in the same run: HF transformers `generate` and the memory-bandwidth floor."""
from __future__ import annotations

import time
from pathlib import Path

import torch


def copy_bandwidth_gb_s(n_bytes: int = 256 << 20, repeats: int = 5) -> float:
    """Memory bandwidth from tensor copies: (read + write) bytes / seconds, best of `repeats`, in GB/s."""
    src = torch.ones(n_bytes // 4)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t)
    return 2 * n_bytes / best / 1e9


def hf_generate_tok_s(model_dir: str | Path, dtype: torch.dtype, batch: int, prompt_tokens: int = 128,
                      new_tokens: int = 64) -> float:
    """transformers' `generate` (greedy, left-padded batch of random prompts): output tokens/s.

    transformers is a test-only dependency; it is imported here, in the benchmark, never by the server.
    """
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 40000, (batch, prompt_tokens), generator=g)
    mask = torch.ones_like(ids)
    for i in range(1, batch):  # ragged lengths, left-padded as HF expects for decoder-only models
        pad = (i * 7) % (prompt_tokens // 2)
        mask[i, :pad] = 0
        ids[i, :pad] = model.config.eos_token_id if isinstance(model.config.eos_token_id, int) else 0
    kw = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    with torch.inference_mode():
        model.generate(ids[:, :16], attention_mask=mask[:, :16], max_new_tokens=4, do_sample=False, pad_token_id=0)
        t = time.perf_counter()
        model.generate(ids, attention_mask=mask, **kw)
        wall = time.perf_counter() - t
    return batch * new_tokens / wall


def weight_bytes(model) -> int:
    """Bytes the decode step reads per token: every parameter and fused weight of the model."""
    seen = set()
    total = 0
    for t in list(model.parameters()) + [getattr(m, a) for m in model.modules()
                                         for a in ("qkv_weight", "gate_up_weight") if getattr(m, a, None) is not None]:
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total
