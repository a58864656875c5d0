"""Repetition, presence, frequency and DRY penalties over a batch of logits rows (in place).

Repetition penalty (Keskar et al. 2019, as vLLM applies it): over tokens in the
prompt or the output, positive logits are divided by it and negative ones multiplied.
Presence / frequency (OpenAI's definition): logit -= frequency * count + presence *
(count > 0), counting output tokens only. The counts are kept per sequence as it grows
(PenaltyCounts). DRY ("Don't Repeat Yourself", llama.cpp's
definition): a token that would extend a repetition of length n >= allowed_length of
an earlier part of the context gets -= multiplier * base ** (n - allowed_length).
"""
from __future__ import annotations

import math

import torch

from .sequence import Sequence


class PenaltyCounts:
    """One sequence's counts for the repetition, presence and frequency penalties, kept as it grows.

    counts: float32 [V], how often each token occurs in the output. seen: bool [V], the tokens of
    the output and, when the repetition penalty is on, of the prompt. Output tokens are folded in
    once each (`catch_up`), never recounted from the whole output.
    """

    __slots__ = ("counts", "seen", "num_counted")

    def __init__(self, seq: Sequence, vocab_size: int, device: torch.device):
        self.counts = torch.zeros(vocab_size, device=device)
        self.seen = torch.zeros(vocab_size, dtype=torch.bool, device=device)
        if seq.params.repetition_penalty != 1.0:
            prompt = [t for t in seq.prompt_token_ids if t < vocab_size]
            if prompt:
                self.seen[prompt] = True
        self.num_counted = 0  # output tokens folded in so far

    def catch_up(self, seq: Sequence) -> None:
        """Fold in the output tokens generated since the last call (ids >= V are not counted)."""
        start = seq.num_prompt_tokens + self.num_counted
        if start >= len(seq.token_ids):
            return
        new = seq.token_ids[start:]
        self.num_counted += len(new)
        v = self.counts.shape[0]
        ids = [t for t in new if t < v]
        if ids:
            index = torch.tensor(ids, device=self.counts.device)
            self.counts.index_add_(0, index, torch.ones(len(ids), device=index.device))
            self.seen[index] = True


def penalties_on(params) -> bool:
    """Whether a repetition, presence or frequency penalty applies to a request's SamplingParams."""
    return params.repetition_penalty != 1.0 or bool(params.presence_penalty) or bool(params.frequency_penalty)


def apply_penalties(logits: torch.Tensor, seqs: list[Sequence]) -> None:
    """logits float32 [B, V], modified in place for the rows whose penalties are on."""
    rows = [i for i, s in enumerate(seqs) if penalties_on(s.params)]
    if not rows:
        return
    device = logits.device
    for i in rows:
        s = seqs[i]
        if s.penalty_counts is None:
            s.penalty_counts = PenaltyCounts(s, logits.shape[1], device)
        s.penalty_counts.catch_up(s)
    counts = torch.stack([seqs[i].penalty_counts.counts for i in rows])
    seen = torch.stack([seqs[i].penalty_counts.seen for i in rows])
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
