"""Hostile /v1/embeddings bodies through the whole ASGI stack with all-MiniLM-L6-v2 beside the real SmolLM2
engine: every `input` form and its wrong neighbours (nested too deep, mixed kinds, booleans, floats, huge and
negative ids, ids past the vocabulary, empty items, NUL, lone surrogates, over-length texts), wrong
encoding_format / dimensions / truncate_prompt_tokens, `model` values of every kind (the chat model's, unknown
ones, adapter forms, paths, a GGUF file name). No answer is a 5xx, every error is OpenAI's shape
naming a field of the body, and afterwards an ordinary request gets the vector it got before."""
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.api.conftest import EMBEDDING_MODEL, embed_rt, minilm_model, smollm2_engine  # noqa: F401
from tests.api.fake_engine import call

from .checks import check_error, root
from .conftest import EXAMPLES, FIGURES
from .strategies import VALID_BY_NAME

ids = st.one_of(st.integers(0, 30521), st.integers(30522, 2**63), st.integers(-(2**63), -1),
                st.sampled_from([2**64, 10**30]), st.booleans(), st.floats(allow_nan=False), st.none())
texts = st.one_of(st.text(max_size=40), st.sampled_from(["", "\x00", "word " * 400, "\U0001F642" * 300]),
                  st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=8))
inputs = st.one_of(texts, st.lists(texts, max_size=6), st.lists(ids, max_size=8),
                   st.lists(st.lists(ids, max_size=6), max_size=4), st.lists(st.one_of(texts, ids), max_size=4),
                   st.recursive(st.lists(ids, max_size=3), lambda inner: st.lists(inner, max_size=3), max_leaves=8),
                   st.dictionaries(st.text(max_size=4), ids, max_size=2), ids)
extras = st.fixed_dictionaries({}, optional={
    "encoding_format": st.one_of(st.sampled_from(["float", "base64", "int8", ""]), ids),
    "dimensions": st.one_of(st.integers(-2, 1000), st.none(), st.text(max_size=3)),
    "truncate_prompt_tokens": st.one_of(st.integers(-3, 300), st.none(), st.floats(allow_nan=False)),
    "user": st.one_of(st.text(max_size=8), ids),
    "model": st.one_of(st.just(EMBEDDING_MODEL), VALID_BY_NAME["model"])})  # every kind of `model`


def answer_of(body: dict):
    raw = json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass")
    return call("POST", "/v1/embeddings", raw=raw, headers={"content-type": "application/json"})


def test_hostile_embedding_bodies_get_no_5xx_and_errors_name_a_field(embed_rt):  # noqa: F811
    before = answer_of({"model": EMBEDDING_MODEL, "input": "an ordinary sentence"}).json()["data"][0]["embedding"]

    @settings(settings.get_profile("metrale-fuzz"), max_examples=min(EXAMPLES, 150))
    @given(input_=inputs, extra=extras)
    def one(input_, extra):
        body = {"model": EMBEDDING_MODEL, "input": input_, **extra}
        answer = answer_of(body)
        FIGURES[("/v1/embeddings", answer.status)] += 1
        where = f"{body!r:.300} -> {answer.status} {answer.body[:300]!r}"
        assert answer.status < 500, where
        err = answer.json().get("error")
        if answer.status >= 400:
            check_error(err, where)
            if answer.status == 400 and err["code"] != "invalid_json":
                assert err["param"] is not None and root(err["param"]) in body, where
        else:
            data = answer.json()["data"]
            assert data and all(len(d["embedding"]) == 384 or isinstance(d["embedding"], str) for d in data), where

    one()
    after = answer_of({"model": EMBEDDING_MODEL, "input": "an ordinary sentence"}).json()["data"][0]["embedding"]
    assert after == pytest.approx(before, abs=1e-6)
