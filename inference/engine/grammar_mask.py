"""The sampler's grammar step: each constrained row's logits keep only the tokens its grammar allows.

Applied to the raw logits, before every other control (as vLLM applies its grammar
bitmask), so top_k, top_p, min_p and top-nσ choose among allowed tokens only and a
constrained row never ends up with nothing to draw. Rows without a grammar, or whose
grammar waits for the reasoning block to close, are untouched.
"""
from __future__ import annotations

import numpy as np
import torch

from .grammar_state import fill_masks


def apply_grammar_masks(logits: torch.Tensor, seqs) -> None:
    """In place on logits float32 [B, V] (row i for seqs[i]): -inf where the row's grammar forbids.

    Tokens past the grammar tokenizer's vocabulary (a padded embedding) are forbidden too.
    """
    rows = [i for i, s in enumerate(seqs) if s.grammar is not None and s.grammar.masks]
    if not rows:
        return
    states = [seqs[i].grammar for i in rows]
    words = max(s.structured.grammar.mask_words for s in states)
    bits = fill_masks(states, words)
    # Bit t of the little-endian words is token t; unpacked 0/1 bytes are valid torch bools.
    forbid_bytes = np.unpackbits((~bits).view(np.uint8), axis=1, bitorder="little")
    v = logits.shape[1]
    width = min(v, forbid_bytes.shape[1])
    forbid = torch.from_numpy(forbid_bytes[:, :width]).view(torch.bool).to(logits.device)
    for r, i in enumerate(rows):  # in place, row by row: no gather / scatter copies of [rows, V]
        logits[i, :width].masked_fill_(forbid[r], float("-inf"))
        if width < v:
            logits[i, width:] = float("-inf")
