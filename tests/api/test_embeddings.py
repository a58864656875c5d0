"""POST /v1/embeddings in-process: OpenAI's input forms and errors, /v1/models, rate limits charged the
inputs' tokens, the request log and vLLM's series, with all-MiniLM-L6-v2 beside the real SmolLM2 engine."""
import base64
import struct

import pytest
import torch
import torch.nn.functional as F

from inference.engine.embedding_model import EmbeddingModel

from .conftest import EMBEDDING_MODEL as NAME
from .observed import call, scrape, value
from .test_request_log import log_file  # noqa: F401


def embed(body, headers=None):
    return call("POST", "/v1/embeddings", {"model": NAME, **body}, headers)


def direct(model, texts):
    return model.embed([model.truncate(ids, model.max_input_tokens, True) for ids in model.tokenize(texts)])


def test_it_embeds_strings_as_the_model_does(embed_rt, minilm_model):
    texts = ["The cat sat on the mat.", "A dog in the park", "word " * 250]
    answer = embed({"input": texts})
    assert answer.status == 200, answer.body
    body = answer.json()
    assert body["object"] == "list" and body["model"] == NAME
    assert [d["index"] for d in body["data"]] == [0, 1, 2] and {d["object"] for d in body["data"]} == {"embedding"}
    ours = torch.tensor([d["embedding"] for d in body["data"]])
    torch.testing.assert_close(ours, direct(minilm_model, texts), atol=2e-6, rtol=1e-5)
    tokens = sum(min(len(ids), 256) for ids in minilm_model.tokenize(texts))
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}


def test_one_string_base64_and_token_ids_give_the_same_vector(embed_rt, minilm_model):
    text = "Retrieval-augmented generation"
    floats = embed({"input": text}).json()["data"][0]["embedding"]
    b64 = embed({"input": text, "encoding_format": "base64"}).json()["data"][0]["embedding"]
    raw = base64.b64decode(b64)
    # Each float is written as the shortest decimal of its float32: read back and cast, the same bits.
    assert struct.pack(f"<{len(floats)}f", *floats) == raw and len(floats) == 384
    assert max(len(repr(x)) for x in floats) <= 16, "a float32 needs at most 9 significant digits"
    ids = minilm_model.tokenize([text])[0]
    by_ids = embed({"input": ids}).json()
    assert by_ids["data"][0]["embedding"] == pytest.approx(floats, abs=1e-6)
    assert by_ids["usage"]["prompt_tokens"] == len(ids)
    two = embed({"input": [ids, ids[:3]]}).json()
    assert len(two["data"]) == 2 and two["usage"]["prompt_tokens"] == len(ids) + 3


@pytest.mark.parametrize("body,param,words", [
    ({"input": "x", "dimensions": 128}, "dimensions", "Matryoshka"),
    ({"input": ["ok", ""]}, "input[1]", "empty"),
    ({"input": [[1, 2], []]}, "input[1]", "empty"),
    ({"input": ["fine", "word " * 300]}, "input[1]", "limit of 256"),
    ({"input": [[101] * 257]}, "input[0]", "limit of 256"),
    ({"input": [[5, 30522]]}, "input[0]", "vocabulary"),
    ({"input": ["a"] * 2049}, "input", "2048"),
    ({"input": [], }, "input", "not empty"),
    ({"input": ["a", 1]}, "input", "mix"),
    ({"input": [[1, "2"]]}, "input", "input[0]"),
    ({"input": 5}, "input", "string"),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format", "base64"),
    ({"input": "x", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens", "-1"),
    ({"input": [[7] * 250] * 1201}, "input", "300000"),
])
def test_bad_input_is_a_400_naming_the_field(embed_rt, body, param, words):
    answer = embed(body)
    assert answer.status == 400, answer.body
    error = answer.json()["error"]
    assert error["param"] == param and words in error["message"], error
    assert error["type"] == "invalid_request_error"


def test_truncate_prompt_tokens_cuts_instead(embed_rt, minilm_model):
    long = "word " * 300
    answer = embed({"input": [long, long], "truncate_prompt_tokens": -1}).json()
    assert answer["usage"]["prompt_tokens"] == 512
    ours = torch.tensor(answer["data"][0]["embedding"])
    assert F.cosine_similarity(ours, direct(minilm_model, [long])[0], dim=0) > 0.99999
    assert embed({"input": long, "truncate_prompt_tokens": 10}).json()["usage"]["prompt_tokens"] == 10
    assert embed({"input": [list(range(1000, 1300))], "truncate_prompt_tokens": 8}).json()["usage"][
        "prompt_tokens"] == 8


def test_model_names(embed_rt):
    assert embed({"input": "x", "model": "smollm2-135m-instruct"}).status == 400
    missing = embed({"input": "x", "model": "text-embedding-3-small"})
    assert missing.status == 404 and missing.json()["error"]["code"] == "model_not_found"
    assert call("POST", "/v1/embeddings", {"input": "x"}).status == 200  # no model: the embedding model
    ids = [m["id"] for m in call("GET", "/v1/models").json()["data"]]
    assert ids == ["smollm2-135m-instruct", NAME]
    card = call("GET", f"/v1/models/{NAME}").json()
    assert card["id"] == NAME and card["max_model_len"] == 256


def test_without_an_embedding_model_it_is_a_404(real_rt):
    answer = call("POST", "/v1/embeddings", {"input": "x", "model": NAME})
    assert answer.status == 404 and "METRALE_EMBEDDING_MODEL" in answer.json()["error"]["message"]


def test_metrics_count_pooling_requests_under_the_embedding_models_name(embed_rt):
    labels = {"model_name": NAME, "engine": "0"}
    before = scrape()
    before_tokens = value(before, "vllm:prompt_tokens_total", **labels) or 0
    before_ok = value(before, "vllm:request_success_total", finished_reason="stop", **labels) or 0
    usage = embed({"input": ["one", "two three"]}).json()["usage"]
    after = scrape()
    assert value(after, "vllm:prompt_tokens_total", **labels) == before_tokens + usage["prompt_tokens"]
    assert value(after, "vllm:request_success_total", finished_reason="stop", **labels) == before_ok + 1
    assert value(after, "vllm:e2e_request_latency_seconds_count", **labels) >= 1


def test_rate_limits_are_charged_the_inputs_tokens(embed_rt, client, require_auth, make_tenant, make_key,
                                                  frozen_clock):
    from .tenant_client import TenantClient

    tenant = make_tenant("acme", tokens_per_minute=40)
    _, key = make_key(tenant)
    as_acme = TenantClient(client, tenant, key)
    first = as_acme.post("/v1/embeddings", {"model": NAME, "input": "word " * 30})  # 32 tokens
    assert first.status_code == 200, first.content
    assert int(first.headers["x-ratelimit-remaining-tokens"]) <= 40 - 32
    refused = as_acme.post("/v1/embeddings", {"model": NAME, "input": "word " * 30})
    assert refused.status_code == 429 and refused.headers.get("retry-after")



def test_the_request_log_line_names_the_embedding_model_and_its_tokens(embed_rt, log_file):
    from .test_request_log import flush, lines

    path, configure = log_file
    writer = configure()
    usage = embed({"input": ["one", "two"]}, {"x-request-id": "req_embedded"}).json()["usage"]
    flush(writer)
    (line,) = lines(path)
    assert line["request_id"] == "req_embedded" and line["route"] == "v1/embeddings" and line["status"] == 200
    assert line["model"] == NAME and line["prompt_tokens"] == usage["prompt_tokens"]


def test_an_unloaded_embedding_model_leaves_the_chat_engine_that_ran_its_passes(embed_rt):
    from inference.operations.registry import process_registry
    from inference.operations.runtime import release_embeddings

    runner = process_registry().runtime(NAME).runner
    assert runner.host is embed_rt.engine
    release_embeddings(runner)  # what the registry calls when it unloads the model
    assert runner.host is None and embed_rt.engine._embeddings is None
    assert real_chat_still_answers(embed_rt)


def real_chat_still_answers(rt) -> bool:
    answer = call("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    return answer.status == 200
