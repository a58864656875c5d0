"""Logprobs: exact bytes of byte-level tokens, `bytes:` spelling of partial characters, the IR entry, and
its chat and legacy wire shapes (legacy offsets count characters)."""
import pytest

from inference.engine.tokenizer import Tokenizer
from inference.serving.logprobs import (LegacyLogprobs, chat_logprobs, merge_legacy, prompt_logprobs, spelling_for,
                                        token_logprob)


@pytest.fixture(scope="module")
def tok(smollm2_dir):
    return Tokenizer.from_folder(smollm2_dir)


def test_token_bytes_concatenate_to_the_text(tok):
    text = "Hi 你好 😀 héllo\n\tend"
    spell = spelling_for(tok)
    ids = tok.encode(text)
    assert b"".join(spell(i)[1] for i in ids).decode() == text
    for i in ids:
        token, raw = spell(i)
        try:
            assert token == raw.decode("utf-8")
        except UnicodeDecodeError:
            assert token == "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


def test_special_tokens_are_spelled_as_written(tok):
    end = tok.token_to_id("<|im_end|>")
    assert spelling_for(tok)(end) == ("<|im_end|>", b"<|im_end|>")


def test_chat_entry_shape(tok):
    hello = tok.encode("Hello")[0]
    entry = token_logprob(spelling_for(tok), hello, (-0.5, [(hello, -0.5), (0, -3.0)]))
    assert (entry.token_id, entry.token, entry.bytes, entry.logprob) == (hello, "Hello", b"Hello", -0.5)
    assert chat_logprobs([entry]) == [{
        "token": "Hello", "logprob": -0.5, "bytes": list(b"Hello"),
        "top_logprobs": [{"token": "Hello", "logprob": -0.5, "bytes": list(b"Hello")},
                         {"token": "<|endoftext|>", "logprob": -3.0, "bytes": list(b"<|endoftext|>")}]}]
    unscored = token_logprob(spelling_for(tok), hello, None)
    assert unscored.logprob is None and chat_logprobs([unscored])[0]["top_logprobs"] is None


def test_legacy_offsets_count_characters_not_bytes(tok):
    text = "a你好b"
    ids = tok.encode(text)
    entries = [token_logprob(spelling_for(tok), i, (-1.0, [])) for i in ids]
    legacy = LegacyLogprobs(start_offset=4).extend(entries)
    assert legacy["text_offset"][0] == 4 and legacy["text_offset"][-1] == 4 + text.index("b")
    assert legacy["top_logprobs"][0] == {legacy["tokens"][0]: -1.0}  # the sampled token is always listed


def test_prompt_entries_without_engine_logprobs_are_null(tok):
    ids = tok.encode("The cat")
    entries = prompt_logprobs(spelling_for(tok), ids, None)
    assert [e.logprob for e in entries] == [None, None]
    merged = merge_legacy([LegacyLogprobs().extend(entries), LegacyLogprobs(7).extend(entries[:1])])
    assert merged["tokens"] == ["The", " cat", "The"] and merged["text_offset"] == [0, 3, 7]
