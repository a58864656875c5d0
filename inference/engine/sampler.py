"""The batched sampler: one pass over [batch, vocab] logits, rows with different settings together.

Order (vLLM's): temperature, top_k, top_p, min_p, then the draw. Greedy rows
(temperature 0) take the argmax. The draw is the exponential-race form of
categorical sampling (argmax of p / E with E ~ Exp(1), as gpt-fast does, no host
sync); a request with a seed draws its noise from its own torch.Generator, so its
tokens do not depend on what else is in the batch.
Logprobs are log-softmax of the final processed distribution (after temperature
and truncation; the raw distribution for greedy rows), with -inf reported as -9999.0.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .sampling_params import SamplingParams

NEG_INF_LOGPROB = -9999.0


@dataclass(slots=True)
class SampleResult:
    """token_ids: int64 [B]. logprobs[i]: None, or (sampled logprob, [(token id, logprob)] top-k sorted desc)."""

    token_ids: list[int]
    logprobs: list[tuple[float, list[tuple[int, float]]] | None]


class Sampler:
    """Samples one token per row. `generators[i]` is row i's own generator, or None for the shared one."""

    def __init__(self, seed: int | None = None):
        self.shared_generator = torch.Generator()
        if seed is not None:
            self.shared_generator.manual_seed(seed)
        else:
            self.shared_generator.seed()

    def __call__(
        self,
        logits: torch.Tensor,
        params: list[SamplingParams],
        generators: list[torch.Generator | None],
    ) -> SampleResult:
        """logits: float32 [B, V] on the model's device. Returns one token per row."""
        logits = logits.float()
        b, v = logits.shape
        device = logits.device
        greedy = torch.tensor([p.greedy for p in params], device=device)
        temps = torch.tensor([p.temperature if p.temperature > 0 else 1.0 for p in params], device=device)
        processed = logits / temps.unsqueeze(1)

        top_k = [p.top_k if 0 < p.top_k < v else 0 for p in params]
        top_p = [p.top_p for p in params]
        min_p = [p.min_p for p in params]
        sampled_rows = [i for i, p in enumerate(params) if not p.greedy]
        if sampled_rows and (any(top_k) or any(x < 1.0 for x in top_p)):
            processed = _truncate_top_k_top_p(processed, top_k, top_p)
        if sampled_rows and any(x > 0 for x in min_p):
            probs = processed.softmax(-1)
            mp = torch.tensor(min_p, device=device).unsqueeze(1)
            processed = processed.masked_fill(probs < mp * probs.max(-1, keepdim=True).values, float("-inf"))
        # Greedy rows keep the raw logits (and their logprobs).
        processed = torch.where(greedy.unsqueeze(1), logits, processed)

        tokens = processed.argmax(-1)
        if sampled_rows:
            probs = processed.softmax(-1)
            noise = torch.empty(b, v, device=device)
            shared_rows = [i for i in sampled_rows if generators[i] is None]
            if shared_rows:
                noise[shared_rows] = torch.empty(len(shared_rows), v).exponential_(
                    generator=self.shared_generator).to(device)
            for i in sampled_rows:
                if generators[i] is not None:
                    noise[i] = torch.empty(v).exponential_(generator=generators[i]).to(device)
            drawn = (probs / noise).argmax(-1)
            tokens = torch.where(greedy, tokens, drawn)

        token_list = tokens.tolist()
        logprob_out: list = [None] * b
        want = [i for i, p in enumerate(params) if p.logprobs is not None]
        if want:
            lp = processed[want].log_softmax(-1)
            k = max(params[i].logprobs for i in want)
            top_vals, top_ids = lp.topk(max(k, 1), dim=-1) if k else (None, None)
            for row, i in enumerate(want):
                chosen = float(lp[row, token_list[i]])
                n = params[i].logprobs
                tops = []
                if n:
                    tops = [(int(t), _finite(float(x))) for t, x in zip(top_ids[row, :n], top_vals[row, :n])]
                logprob_out[i] = (_finite(chosen), tops)
        return SampleResult(token_list, logprob_out)


def _finite(x: float) -> float:
    return x if x > NEG_INF_LOGPROB else NEG_INF_LOGPROB


def _truncate_top_k_top_p(logits: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
    """Mask tokens outside each row's top_k (0 = off) and top_p nucleus (1.0 = off) with -inf.

    The nucleus keeps the smallest set of most likely tokens whose probability
    reaches top_p (Holtzman et al. 2019); the most likely token is always kept.
    """
    b, v = logits.shape
    sorted_logits, sorted_idx = logits.sort(dim=-1, descending=True)
    ks = torch.tensor([k if k > 0 else v for k in top_k], device=logits.device)
    ranks = torch.arange(v, device=logits.device).unsqueeze(0)
    remove = ranks >= ks.unsqueeze(1)
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    ps = torch.tensor(top_p, device=logits.device).unsqueeze(1)
    probs = sorted_logits.softmax(-1)
    cum_before = probs.cumsum(-1) - probs
    remove = cum_before >= ps
    remove[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(1, sorted_idx, sorted_logits)
