"""Logprobs: token spellings, the IR's TokenLogprob entries, and OpenAI's two wire shapes of them.

Chat (OpenAI API reference, "The chat completion object", choices[].logprobs.content):
`{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}` per token.
Legacy (OpenAI "Create completion", logprobs): `{"tokens", "token_logprobs", "top_logprobs",
"text_offset"}`, where top_logprobs[i] maps token text -> logprob and also holds the sampled
token (as vLLM and OpenAI do), and text_offset[i] is the character offset of token i in the
returned text. A token that is only part of a UTF-8 character is spelled `bytes:\\xNN...`, as
OpenAI does; its `bytes` are exact.
"""
from __future__ import annotations

import codecs
import re
from functools import lru_cache

from .deltas import TokenLogprob, TopLogprob

_SPM_BYTE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@lru_cache(maxsize=1)
def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's byte <-> printable-character table, reversed (character -> byte)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, n = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars)}


class TokenSpelling:
    """Token id -> (text for the `token` field, exact bytes), cached. Knows byte-level BPE and SentencePiece."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        decoder = tokenizer.backend.decoder
        self.byte_level = decoder is not None and "ByteLevel" in repr(decoder)
        self._cache: dict[int, tuple[str, bytes]] = {}

    def __call__(self, token_id: int) -> tuple[str, bytes]:
        hit = self._cache.get(token_id)
        if hit is None:
            raw = self._bytes(token_id)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
            hit = self._cache[token_id] = (text, raw)
        return hit

    def _bytes(self, token_id: int) -> bytes:
        tok = self.tokenizer.id_to_token(token_id)
        if tok is None:
            return b""
        if token_id in self.tokenizer.special_ids:
            return tok.encode()
        if self.byte_level:
            table = _byte_level_decoder()
            if all(c in table for c in tok):
                return bytes(table[c] for c in tok)
        m = _SPM_BYTE.match(tok)
        if m:
            return bytes([int(m.group(1), 16)])
        if "\u2581" in tok:
            return tok.replace("\u2581", " ").encode()
        return self.tokenizer.decode([token_id], skip_special_tokens=False).encode()


@lru_cache(maxsize=4)
def spelling_for(tokenizer) -> TokenSpelling:
    """The shared TokenSpelling of a tokenizer."""
    return TokenSpelling(tokenizer)


def token_logprob(spell: TokenSpelling, token_id: int, logprobs: tuple | None) -> TokenLogprob:
    """One token's IR entry from the engine's (sampled logprob, [(id, logprob)] top-N) tuple.

    With no tuple (a prompt token the engine scored nothing for), logprob and top are None.
    """
    text, raw = spell(token_id)
    if logprobs is None:
        return TokenLogprob(token_id, text, raw, None, None)
    sampled, tops = logprobs
    return TokenLogprob(token_id, text, raw, sampled,
                        tuple(TopLogprob(t, *spell(t), lp) for t, lp in tops))


def prompt_logprobs(spell: TokenSpelling, prompt_ids: list[int], engine_logprobs: list | None) -> list[TokenLogprob]:
    """IR entries for the prompt's tokens; logprob None where the engine gave none (always the first
    token, or all of them when the engine computed none)."""
    lps = engine_logprobs if engine_logprobs is not None and len(engine_logprobs) == len(prompt_ids) else None
    return [token_logprob(spell, t, lps[i] if lps else None) for i, t in enumerate(prompt_ids)]


def chat_logprobs(entries: list[TokenLogprob]) -> list[dict]:
    """Chat's `logprobs.content` entries: {token, logprob, bytes, top_logprobs: [{token, logprob,
    bytes}]} per token (top_logprobs null where the engine gave none)."""
    return [{"token": e.token, "logprob": e.logprob, "bytes": list(e.bytes),
             "top_logprobs": None if e.top is None else
             [{"token": t.token, "logprob": t.logprob, "bytes": list(t.bytes)} for t in e.top]}
            for e in entries]


class LegacyLogprobs:
    """Builds legacy completions `logprobs` objects from IR entries, keeping text offsets.

    text_offset counts characters of the decoded text before each token, starting at
    `start_offset` (the echoed prompt's length when the prompt is echoed before the completion).
    """

    def __init__(self, start_offset: int = 0):
        self.offset = start_offset
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def extend(self, entries: list[TokenLogprob]) -> dict:
        """The legacy object for `entries` (the next tokens, in order)."""
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for e in entries:
            out["tokens"].append(e.token)
            out["token_logprobs"].append(e.logprob)
            out["text_offset"].append(self.offset)
            if e.top is None:
                out["top_logprobs"].append(None)
            else:
                tops = {t.token: t.logprob for t in e.top}
                tops.setdefault(e.token, e.logprob)
                out["top_logprobs"].append(tops)
            self.offset += len(self._utf8.decode(e.bytes))
        return out


def merge_legacy(parts: list[dict]) -> dict:
    """Concatenate legacy objects (e.g. the echoed prompt's and the completion's)."""
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for part in parts:
        for key in out:
            out[key].extend(part[key])
    return out
