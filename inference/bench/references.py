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
        model.generate(ids[:, -16:], attention_mask=mask[:, -16:], max_new_tokens=4, do_sample=False, pad_token_id=0)
        t = time.perf_counter()
        model.generate(ids, attention_mask=mask, **kw)
        wall = time.perf_counter() - t
    return batch * new_tokens / wall


def weight_bytes(model) -> int:
    """Resident bytes of the model's weights in the forms it keeps (LlamaForCausalLM.weight_bytes):
    what one batch-1 decode step reads, the embedding aside when it is not the LM head's."""
    return model.weight_bytes()


def hf_same_prompts(model_dir: str | Path, dtype: torch.dtype, prompts: list[list[int]], outputs: list[int]) -> dict:
    """transformers' `generate` on the workload's own prompts, as one left-padded static batch.

    prompts: the templated token ids of the requests; outputs: the tokens each asked for.
    A static batch runs until its longest request is done, so every row generates
    max(outputs) tokens; `goodput_tok_s` counts only the tokens the requests asked for
    (what a padded-batch server delivers), `raw_tok_s` every generated token.
    With one prompt, `decode_tok_s` is the decode-only rate, (N - 1) / (t(N) - t(1)),
    comparable with our 1 / TPOT. Returns a dict of those floats (tokens per second).
    """
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).eval()
    width = max(len(p) for p in prompts)
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    new = max(outputs)

    def timed(n: int) -> float:
        t = time.perf_counter()
        model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
        return time.perf_counter() - t

    with torch.inference_mode():
        timed(2)  # warm-up
        wall = timed(new)
        out = {"goodput_tok_s": sum(outputs) / wall, "raw_tok_s": len(prompts) * new / wall}
        if len(prompts) == 1:
            out["decode_tok_s"] = (new - 1) / max(wall - timed(1), 1e-9)
    return out
