"""Incremental detokenization: text as tokens arrive, never half a UTF-8 character.

The algorithm is vLLM's (`detokenize_incrementally`, prefix_offset / read_offset):
decode a small window of recent token strings twice, once up to the last
emitted token and once up to the new one, and emit the difference unless it
ends in U+FFFD (a byte-level token that stops inside a multi-byte character).
Decoding a window rather than one token keeps decoders that look at
neighbours (SentencePiece's leading space) right.
"""

from __future__ import annotations

from .tokenizer import Tokenizer

# How many prompt tokens seed the window, as in vLLM.
INITIAL_OFFSET = 5
# Drop token strings before the window once this many have piled up.
_TRIM_AT = 64


class IncrementalDetokenizer:
    """Turns one request's generated token ids into text pieces.

    prompt_ids: the prompt's token ids (only the last few are used, as decoder
    context). skip_special_tokens: special tokens (e.g. <|im_end|>) produce no
    text. Concatenating every `add()` result and `flush()` gives
    `tokenizer.decode(generated_ids, skip_special_tokens)`.
    """

    __slots__ = ("_prefix_offset", "_read_offset", "_skip", "_tokenizer", "_tokens")

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_ids: list[int] | None = None,
        skip_special_tokens: bool = True,
    ):
        self._tokenizer = tokenizer
        self._skip = tokenizer.special_ids if skip_special_tokens else frozenset()
        tail = list(prompt_ids[-(INITIAL_OFFSET + 2) :]) if prompt_ids else []
        self._tokens = tokenizer.convert_ids_to_tokens(
            tail, skip_special_tokens=skip_special_tokens
        )
        self._read_offset = len(self._tokens)
        self._prefix_offset = max(self._read_offset - INITIAL_OFFSET, 0)

    def add(self, token_id: int) -> str:
        """The new text that `token_id` completes; "" while a character is still incomplete."""
        if token_id in self._skip:
            return ""
        token = self._tokenizer.id_to_token(token_id)
        if token is None:
            return ""
        self._tokens.append(token)
        return self._emit(final=False)

    def flush(self) -> str:
        """The text still held back, at the end of generation (U+FFFD for a cut-off character)."""
        return self._emit(final=True)

    def _emit(self, final: bool) -> str:
        to_string = self._tokenizer.convert_tokens_to_string
        tokens, prefix, read = self._tokens, self._prefix_offset, self._read_offset
        if read == len(tokens):
            return ""
        prefix_text = to_string(tokens[prefix:read])
        new_text = to_string(tokens[prefix:])
        if len(new_text) <= len(prefix_text) or (not final and new_text.endswith("\ufffd")):
            return ""
        self._prefix_offset, self._read_offset = read, len(tokens)
        if self._prefix_offset > _TRIM_AT:
            del tokens[: self._prefix_offset]
            self._read_offset -= self._prefix_offset
            self._prefix_offset = 0
        return new_text[len(prefix_text) :]
