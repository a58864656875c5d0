"""Repetition, presence, frequency and DRY penalties over a batch of logits rows (in place).

Repetition penalty (Keskar et al. 2019, as vLLM applies it): over tokens in the
prompt or the output, positive logits are divided by it and negative ones multiplied.
Presence / frequency (OpenAI's definition): logit -= frequency * count + presence *
(count > 0), counting output tokens only. DRY ("Don't Repeat Yourself", llama.cpp's
definition): a token that would extend a repetition of length n >= allowed_length of
an earlier part of the context gets -= multiplier * base ** (n - allowed_length).
"""
from __future__ import annotations

import math

import torch

from .sequence import Sequence


def apply_penalties(logits: torch.Tensor, seqs: list[Sequence]) -> None:
    """logits float32 [B, V], modified in place for the rows whose penalties are on."""
    v = logits.shape[1]
    rows = [i for i, s in enumerate(seqs) if s.params.repetition_penalty != 1.0 or s.params.presence_penalty
            or s.params.frequency_penalty]
    if not rows:
        return
    device = logits.device
    counts = torch.zeros(len(rows), v, device=device)
    seen = torch.zeros(len(rows), v, dtype=torch.bool, device=device)
    for r, i in enumerate(rows):
        out = [t for t in seqs[i].output_token_ids if t < v]
        if out:
            counts[r].index_add_(0, torch.tensor(out, device=device), torch.ones(len(out), device=device))
        if seqs[i].params.repetition_penalty != 1.0:
            prompt = [t for t in seqs[i].prompt_token_ids if t < v]
            if prompt:
                seen[r, prompt] = True
    seen |= counts > 0
    sub = logits[rows]
    rep = torch.tensor([seqs[i].params.repetition_penalty for i in rows], device=device).unsqueeze(1)
    penalised = torch.where(sub > 0, sub / rep, sub * rep)
    sub = torch.where(seen, penalised, sub)
    freq = torch.tensor([seqs[i].params.frequency_penalty for i in rows], device=device).unsqueeze(1)
    pres = torch.tensor([seqs[i].params.presence_penalty for i in rows], device=device).unsqueeze(1)
    sub = sub - freq * counts - pres * (counts > 0).float()
    logits[rows] = sub


def dry_penalties(tokens: list[int], multiplier: float, base: float, allowed_length: int,
                  breakers: frozenset[int] | set[int] = frozenset()) -> dict[int, float]:
    """DRY penalty per candidate next token, for one context `tokens` (llama.cpp's rule).

    For each earlier position i, the match length is the number of tokens ending at i
    that equal the tokens ending at the context's end (not crossing a sequence-breaker
    token); the token that followed i would repeat that match, so it is penalised
    multiplier * base ** (length - allowed_length) when length >= allowed_length.
    Returns {token id: penalty}, using the longest match per token. O(n) with the
    Z-algorithm over the reversed context.
    """
    n = len(tokens)
    if n < 2 or multiplier <= 0:
        return {}
    rev = tokens[::-1]
    # z[k]: length of the longest common prefix of rev and rev[k:], i.e. the common suffix of
    # tokens[:n-k] and tokens (a match ending at position n-1-k).
    z = [0] * n
    lo = hi = 0
    for k in range(1, n):
        if k < hi:
            z[k] = min(hi - k, z[k - lo])
        while k + z[k] < n and rev[z[k]] == rev[k + z[k]]:
            z[k] += 1
        if k + z[k] > hi:
            lo, hi = k, k + z[k]
    # Matching stops at a breaker: cap by the distance to the nearest breaker in the suffix.
    limit = n
    for j, t in enumerate(rev):
        if t in breakers:
            limit = j
            break
    out: dict[int, float] = {}
    for k in range(1, n):
        length = min(z[k], limit)
        end = n - 1 - k  # the match ends at tokens[end]; tokens[end + 1] would repeat it
        if length >= allowed_length and end + 1 < n:
            nxt = tokens[end + 1]
            if nxt in breakers:
                continue
            # Capped exponent: base ** n overflows a float for long repeats; e**50 already bans a token.
            pen = multiplier * math.exp(min((length - allowed_length) * math.log(base), 50.0))
            if pen > out.get(nxt, 0.0):
                out[nxt] = pen
    return out


def apply_dry(logits: torch.Tensor, seqs: list[Sequence]) -> None:
    """Subtract DRY penalties in place for rows with dry_multiplier > 0 (context: prompt + output,
    the last dry_penalty_last_n tokens when that is > 0)."""
    v = logits.shape[1]
    for i, s in enumerate(seqs):
        p = s.params
        if p.dry_multiplier <= 0:
            continue
        ctx = s.token_ids if p.dry_penalty_last_n <= 0 else s.token_ids[-p.dry_penalty_last_n:]
        pens = dry_penalties(ctx, p.dry_multiplier, p.dry_base, p.dry_allowed_length,
                             frozenset(p.dry_sequence_breaker_ids or ()))
        for tok, pen in pens.items():
            if tok < v:
                logits[i, tok] -= pen
