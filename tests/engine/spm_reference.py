"""A plain-Python SentencePiece-BPE tokenizer following llama.cpp's rules (src/llama-vocab.cpp:
`tokenizer_st_partition`, `llm_tokenizer_spm_session`), the reference the engine's
tokenizers-built one (checkpoints/gguf_tokenizer.build_spm_tokenizer) is tested against.

- CONTROL tokens (when parse_special) and USER_DEFINED tokens are cut out of the raw text first,
  the longest token text first, each over every fragment left, left to right;
- in the rest, " " becomes "▁" (one "▁" put in front when add_space_prefix);
- symbols start as the UTF-8 characters; the adjacent pair whose concatenation is a token with
  the highest score merges first (ties: the leftmost), until no pair is a token;
- a symbol that is no token becomes its bytes' <0xXX> tokens.
"""
from __future__ import annotations

import heapq

CONTROL, USER_DEFINED = 3, 4
SPACE = "\u2581"


class SpmReference:
    def __init__(self, tokens: list[str], scores: list[float], types: list[int], add_space_prefix: bool = False):
        self.ids: dict[str, int] = {}
        for i, tok in enumerate(tokens):
            self.ids.setdefault(tok, i)
        self.scores = scores
        self.control = sorted({t for t, k in zip(tokens, types) if k == CONTROL}, key=len, reverse=True)
        self.user = sorted({t for t, k in zip(tokens, types) if k == USER_DEFINED}, key=len, reverse=True)
        self.add_space_prefix = add_space_prefix

    def encode(self, text: str, parse_special: bool = True) -> list[int]:
        specials = sorted((self.control if parse_special else []) + self.user, key=len, reverse=True)
        fragments: list[tuple[str, bool]] = [(text, False)]
        for tok in specials:
            out = []
            for frag, is_token in fragments:
                if is_token or tok not in frag:
                    out.append((frag, is_token))
                    continue
                parts = frag.split(tok)
                for j, part in enumerate(parts):
                    if part:
                        out.append((part, False))
                    if j < len(parts) - 1:
                        out.append((tok, True))
            fragments = out
        ids: list[int] = []
        for frag, is_token in fragments:
            ids.extend([self.ids[frag]] if is_token else self._bpe(frag))
        return ids

    def _bpe(self, text: str) -> list[int]:
        text = text.replace(" ", SPACE)
        if self.add_space_prefix:
            text = SPACE + text
        if not text:
            return []
        syms = list(text)
        prev = list(range(-1, len(syms) - 1))
        nxt = list(range(1, len(syms) + 1))
        nxt[-1] = -1
        heap: list[tuple[float, int, int, str]] = []

        def push(left: int) -> None:
            right = nxt[left]
            if right == -1:
                return
            merged = syms[left] + syms[right]
            tid = self.ids.get(merged)
            if tid is not None:
                heapq.heappush(heap, (-self.scores[tid], left, right, merged))

        for i in range(len(syms) - 1):
            push(i)
        while heap:
            _, left, right, merged = heapq.heappop(heap)
            # Stale: either side changed since this pair was queued.
            if syms[left] is None or syms[right] is None or nxt[left] != right or syms[left] + syms[right] != merged:
                continue
            syms[left] = merged
            syms[right] = None
            nxt[left] = nxt[right]
            if nxt[right] != -1:
                prev[nxt[right]] = left
            if prev[left] != -1:
                push(prev[left])
            push(left)
        ids = []
        for sym in syms:
            if sym is None:
                continue
            if sym in self.ids:
                ids.append(self.ids[sym])
            else:
                ids.extend(self.ids[f"<0x{b:02X}>"] for b in sym.encode("utf-8"))
        return ids
