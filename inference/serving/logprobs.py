"""Logprobs in OpenAI's two wire shapes: chat's per-token entries and legacy completions' parallel lists.

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


def _top(spell: TokenSpelling, token_id: int, logprob: float) -> dict:
    text, raw = spell(token_id)
    return {"token": text, "logprob": logprob, "bytes": list(raw)}


def chat_entry(spell: TokenSpelling, token_id: int, logprobs: tuple | None) -> dict:
    """One token's chat logprob entry from the engine's (sampled logprob, [(id, logprob)] top-N) tuple.

    With no tuple (a prompt token without a logprob), logprob and top_logprobs are None.
    """
    entry = _top(spell, token_id, None)
    if logprobs is None:
        entry["top_logprobs"] = None
        return entry
    sampled, tops = logprobs
    entry["logprob"] = sampled
    entry["top_logprobs"] = [_top(spell, t, lp) for t, lp in tops]
    return entry


def prompt_entries(spell: TokenSpelling, prompt_ids: list[int], prompt_logprobs: list | None) -> list[dict]:
    """Chat-shape entries for the prompt's tokens; logprob None where the engine gave none (always the
    first token, or all of them while the engine does not compute prompt logprobs)."""
    lps = prompt_logprobs if prompt_logprobs is not None and len(prompt_logprobs) == len(prompt_ids) else None
    return [chat_entry(spell, t, lps[i] if lps else None) for i, t in enumerate(prompt_ids)]


class LegacyLogprobs:
    """Builds legacy completions `logprobs` objects from chat-shape entries, keeping text offsets.

    text_offset counts characters of the decoded text before each token, starting at
    `start_offset` (the echoed prompt's length when the prompt is echoed before the completion).
    """

    def __init__(self, start_offset: int = 0):
        self.offset = start_offset
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def extend(self, entries: list[dict]) -> dict:
        """The legacy object for `entries` (the next tokens, in order)."""
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for e in entries:
            out["tokens"].append(e["token"])
            out["token_logprobs"].append(e["logprob"])
            out["text_offset"].append(self.offset)
            if e["top_logprobs"] is None:
                out["top_logprobs"].append(None)
            else:
                tops = {t["token"]: t["logprob"] for t in e["top_logprobs"]}
                tops.setdefault(e["token"], e["logprob"])
                out["top_logprobs"].append(tops)
            self.offset += len(self._utf8.decode(bytes(e["bytes"] or b"")))
        return out

    def restart(self, offset: int) -> None:
        """Continue counting from `offset` characters (e.g. after an echoed prompt), with no partial bytes."""
        self.offset = offset
        self._utf8.reset()


def merge_legacy(parts: list[dict]) -> dict:
    """Concatenate legacy objects (e.g. the echoed prompt's and the completion's)."""
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for part in parts:
        for key in out:
            out[key].extend(part[key])
    return out
