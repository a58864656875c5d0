"""IncrementalDetokenizer: pieces add up to the full decode and never split a UTF-8 character."""

import random

import pytest

from inference.engine.detokenizer import IncrementalDetokenizer
from inference.engine.tokenizer import Tokenizer

TEXTS = [
    "Hello, world! Plain ASCII streams token by token.",
    "Accents: café naïve résumé Ångström Dvořák señor Über",
    "日本語のテキスト、中文文本，한국어 텍스트",
    "Emoji: 👍🏽 🙂 👨‍👩‍👧 🇫🇷 ❤️ 🤖🤖🤖",
    "mixed ñ 中 🙂 end, then code:\n    x = {'ключ': 'значение'}\n",
    "math ∑ ∫ √ ≠ ≤ ≥ ∞ and arrows → ← ↔",
    "é" * 40 + "🙂" * 30 + "漢" * 30,
]


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    return Tokenizer.from_folder(smollm2_dir)


def stream(tokenizer, ids, **kwargs):
    detok = IncrementalDetokenizer(tokenizer, **kwargs)
    pieces = [detok.add(i) for i in ids]
    return pieces, detok.flush()


@pytest.mark.parametrize("text", TEXTS)
def test_it_streams_the_exact_decode_without_broken_characters(text, tokenizer):
    ids = tokenizer.encode(text)
    pieces, tail = stream(
        tokenizer, ids, prompt_ids=tokenizer.encode_chat([{"role": "user", "content": "hi"}])
    )
    assert "".join(pieces) + tail == tokenizer.decode(ids) == text
    assert not any("\ufffd" in p for p in pieces)
    assert tail == ""


def test_it_emits_ascii_as_soon_as_each_token_arrives(tokenizer):
    ids = tokenizer.encode("The quick brown fox jumps over the lazy dog")
    pieces, _ = stream(tokenizer, ids)
    assert all(pieces) and pieces == [tokenizer.decode([i]) for i in ids]


def test_it_holds_back_a_partial_character_until_it_completes(tokenizer):
    ids = tokenizer.encode("🙂")
    assert len(ids) > 1  # byte-level pieces of one character
    pieces, _ = stream(tokenizer, ids)
    assert pieces[:-1] == [""] * (len(ids) - 1) and pieces[-1] == "🙂"


def test_it_flushes_a_character_cut_off_at_the_end(tokenizer):
    ids = tokenizer.encode("ok") + tokenizer.encode("🙂")[:-1]
    pieces, tail = stream(tokenizer, ids)
    assert "".join(pieces) == "ok"
    assert "".join(pieces) + tail == tokenizer.decode(ids)
    assert tail.endswith("\ufffd")


def test_it_skips_special_tokens_or_keeps_them(tokenizer):
    ids = (
        tokenizer.encode_chat([{"role": "user", "content": "café"}]) + tokenizer.encode("olé") + [2]
    )
    pieces, tail = stream(tokenizer, ids)
    assert "".join(pieces) + tail == tokenizer.decode(ids)
    assert "<|im_end|>" not in "".join(pieces)
    pieces, tail = stream(tokenizer, ids, skip_special_tokens=False)
    assert "".join(pieces) + tail == tokenizer.decode(ids, skip_special_tokens=False)
    assert "".join(pieces).endswith("olé<|im_end|>")


def test_it_matches_the_full_decode_on_random_token_streams(tokenizer):
    rng = random.Random(0)
    for _ in range(20):
        ids = [rng.randrange(tokenizer.vocab_size) for _ in range(rng.randrange(1, 300))]
        pieces, tail = stream(tokenizer, ids)
        assert "".join(pieces) + tail == tokenizer.decode(ids)
