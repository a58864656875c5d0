"""The routes around generation: models, tokenize, 501/404/405 fallbacks, x-request-id, processing time, 413."""
import pytest

from .fake_engine import call

ERROR_KEYS = {"message", "type", "param", "code"}


def test_it_retrieves_the_model_by_id_or_alias_even_with_slashes(fake_rt, settings):
    settings.METRALE = {**settings.METRALE, "MODEL_ALIASES": ["HuggingFaceTB/SmolLM2-135M-Instruct"]}
    served = call("GET", "/v1/models/smollm2-135m-instruct").json()
    assert served["id"] == "smollm2-135m-instruct" and served["object"] == "model"
    alias = call("GET", "/v1/models/HuggingFaceTB/SmolLM2-135M-Instruct")
    assert alias.status == 200 and alias.json()["id"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    missing = call("GET", "/v1/models/org/other")
    assert missing.status == 404 and missing.json()["error"]["code"] == "model_not_found"


def test_tokenize_a_prompt_or_messages_and_detokenize(fake_rt):
    tok = fake_rt.tokenizer
    body = call("POST", "/tokenize", {"prompt": "Hello world", "return_token_strs": True}).json()
    assert body == {"tokens": tok.encode("Hello world", add_special_tokens=True), "count": 2,
                    "max_model_len": 2048, "token_strs": ["Hello", "Ġworld"]}
    messages = [{"role": "user", "content": "hi"}]
    chat = call("POST", "/tokenize", {"messages": messages}).json()
    assert chat["tokens"] == tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True))
    assert chat["count"] == len(chat["tokens"])
    text = call("POST", "/detokenize", {"tokens": chat["tokens"]}).json()["prompt"]
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    for path, body, param in (("/tokenize", {}, "prompt"), ("/tokenize", {"prompt": 5}, "prompt"),
                              ("/detokenize", {"tokens": [10**9]}, "tokens"), ("/detokenize", {"tokens": "a"}, "tokens")):
        answer = call("POST", path, body)
        assert answer.status == 400 and answer.json()["error"]["param"] == param


@pytest.mark.parametrize("method, path", [
    ("POST", "/v1/moderations"), ("POST", "/v1/audio/speech"),
    ("POST", "/v1/audio/transcriptions"), ("POST", "/v1/images/generations"),
])
def test_openai_endpoints_not_implemented_are_501_in_the_error_shape(fake_rt, method, path):
    answer = call(method, path, {})
    assert answer.status == 501
    err = answer.json()["error"]
    assert set(err) == ERROR_KEYS and "does not implement" in err["message"] and err["code"] == "not_implemented"
    assert answer.headers["x-should-retry"] == "false"


def test_unknown_v1_paths_are_404_and_wrong_methods_405_in_the_error_shape(fake_rt):
    missing = call("GET", "/v1/nothing/here")
    assert missing.status == 404 and set(missing.json()["error"]) == ERROR_KEYS
    wrong = call("PUT", "/v1/chat/completions")
    assert wrong.status == 405 and wrong.headers["allow"] == "GET, POST"
    assert set(wrong.json()["error"]) == ERROR_KEYS


@pytest.mark.parametrize("method, path, body", [
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ("POST", "/v1/chat/completions", {"messages": []}),
    ("POST", "/v1/completions", {"prompt": "x", "stream": True}),
    ("GET", "/v1/models", None), ("GET", "/v1/models/nope", None), ("POST", "/v1/embeddings", {}),
    ("GET", "/v1/unknown", None), ("POST", "/tokenize", {"prompt": "x"}),
])
def test_every_api_response_has_a_request_id_and_processing_time(fake_rt, method, path, body):
    answer = call(method, path, body)
    assert answer.headers["x-request-id"].startswith("req_")
    assert int(answer.headers["openai-processing-ms"]) >= 0
    mine = call(method, path, body, headers={"x-request-id": "client-chosen-42"})
    assert mine.headers["x-request-id"] == "client-chosen-42"


def test_a_request_id_reaches_the_engine(fake_rt):
    call("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 2},
         headers={"x-request-id": "abc"})
    assert [s.request_id for s in fake_rt.engine.submissions] == ["abc-0", "abc-1"]


def test_bodies_over_the_limit_are_413(fake_rt, settings):
    settings.METRALE = {**settings.METRALE, "MAX_REQUEST_BYTES": 1000}
    big = {"messages": [{"role": "user", "content": "x" * 2000}]}
    answer = call("POST", "/v1/chat/completions", big)
    assert answer.status == 413
    assert set(answer.json()["error"]) == ERROR_KEYS and "1000" in answer.json()["error"]["message"]
    assert answer.headers["x-request-id"]
    assert call("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}).status == 200


def test_the_default_limit_is_32_mib(settings):
    assert settings.METRALE["MAX_REQUEST_BYTES"] == 32 << 20
