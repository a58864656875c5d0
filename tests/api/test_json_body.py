"""The strict JSON body parser on every JSON route: deep nesting, huge integers, NaN, overflowing numbers,
lone surrogates and bad UTF-8 are each a 400 in OpenAI's shape (naming the field where a value is at fault)."""
import json

import pytest

from inference.serving.json_body import MAX_JSON_DEPTH, parse_json_body
from inference.serving.errors import ApiError

from .fake_engine import call

ROUTES = ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/conversations",
          "/v1/conversations/conv_x", "/v1/conversations/conv_x/items", "/tokenize", "/detokenize"]
SURROGATE = "\\ud800"


def error_of(path: str, raw: bytes) -> dict:
    answer = call("POST", path, raw=raw)
    assert answer.status == 400, (answer.status, answer.body[:300])
    err = answer.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    return err


@pytest.mark.parametrize("path", ROUTES)
@pytest.mark.parametrize("raw", [b"[" * 10_000 + b"]" * 10_000, b'{"a":' * 10_000 + b"1" + b"}" * 10_000,
                                 b'{"a": [' + b"[" * 200 + b"]" * 200 + b"]}"],
                         ids=["arrays", "objects", "just-past-the-limit"])
def test_it_answers_deep_nesting_with_400_invalid_json(fake_rt, path, raw):
    err = error_of(path, raw)
    assert err["code"] == "invalid_json" and "nested" in err["message"]


@pytest.mark.parametrize("path, raw, param", [
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "seed": ' + b"7" * 5000 + b"}",
     "seed"),
    ("/v1/completions", b'{"prompt": [1, ' + b"9" * 5000 + b"]}", "prompt[1]"),
    ("/v1/responses", b'{"input": "x", "metadata": {"a": ' + b"1" * 4301 + b"}}", "metadata.a"),
    ("/detokenize", b'{"tokens": [' + b"2" * 10_000 + b"]}", "tokens[0]"),
])
def test_it_names_the_field_of_an_integer_too_long_to_convert(fake_rt, path, raw, param):
    err = error_of(path, raw)
    assert err["param"] == param and "digits" in err["message"]


@pytest.mark.parametrize("path, body, param", [
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "%s"}]}', "messages[0].content"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": [{"type": "text", "text": "a%sb"}]}]}',
     "messages[0].content[0].text"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "x"}], "stop": ["ok", "%s"]}', "stop[1]"),
    ("/v1/completions", '{"prompt": "%s"}', "prompt"),
    ("/v1/completions", '{"prompt": ["x", "y%s"]}', "prompt[1]"),
    ("/v1/responses", '{"input": "%s"}', "input"),
    ("/v1/responses", '{"input": "x", "stream": true, "metadata": {"a": "%s"}}', "metadata.a"),
    ("/v1/responses", '{"input": [{"role": "user", "content": [{"type": "input_text", "text": "%s"}]}]}',
     "input[0].content[0].text"),
    ("/v1/responses", '{"input": "x", "instructions": "\\udfff%s"}', "instructions"),
    ("/v1/conversations", '{"items": [{"role": "user", "content": "%s"}]}', "items[0].content"),
    ("/v1/conversations/conv_x/items", '{"items": [{"role": "user", "content": "%s"}]}', "items[0].content"),
    ("/v1/conversations/conv_x", '{"metadata": {"k": "%s"}}', "metadata.k"),
    ("/tokenize", '{"prompt": "%s"}', "prompt"),
    ("/tokenize", '{"messages": [{"role": "user", "content": "%s"}]}', "messages[0].content"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "x"}], "metadata": {"%s": "v"}}',
     "metadata"),
])
def test_it_names_the_field_holding_a_lone_surrogate(fake_rt, path, body, param):
    err = error_of(path, (body % SURROGATE).encode())
    assert err["param"] == param and "surrogate" in err["message"]


@pytest.mark.parametrize("path, body, param", [
    ("/v1/conversations", '{"metadata": {"a": "x%sy"}}', "metadata.a"),
    ("/v1/conversations", '{"items": [{"role": "user", "content": "%s"}]}', "items[0].content"),
    ("/v1/responses", '{"input": "a%s"}', "input"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "%s"}], "store": true}',
     "messages[0].content"),
    ("/tokenize", '{"prompt": "x", "%s": 1}', None),
])
def test_it_names_the_field_holding_a_nul_which_postgresql_cannot_store(fake_rt, path, body, param):
    err = error_of(path, (body % "\\u0000").encode())
    assert err["param"] == param and "U+0000" in err["message"]


@pytest.mark.parametrize("path", ROUTES)
@pytest.mark.parametrize("raw", [b'{"x": "\xff"}', b'{"x": "\xed\xa0\x80"}', b'\xc3'])
def test_it_answers_bytes_that_are_not_utf8_with_400(fake_rt, path, raw):
    err = error_of(path, raw)
    assert err["code"] == "invalid_json" and "UTF-8" in err["message"]


@pytest.mark.parametrize("literal, why", [("NaN", "NaN"), ("-Infinity", "Infinity"), ("1e400", "too large"),
                                          ("-" + "9" * 400 + ".5", "too large")])
def test_it_names_the_field_of_a_number_that_is_not_json_or_overflows(fake_rt, literal, why):
    raw = ('{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": '
           '{"name": "f", "parameters": {"type": "number", "maximum": %s}}}]}' % literal).encode()
    err = error_of("/v1/chat/completions", raw)
    assert err["param"] == "tools[0].function.parameters.maximum" and why in err["message"]


def test_valid_pairs_deep_but_allowed_nesting_and_brackets_in_strings_parse():
    emoji = parse_json_body(b'{"a": "\\ud83d\\ude00", "b": "\\\\ud800"}')
    assert emoji == {"a": "\U0001F600", "b": "\\ud800"}
    nested = b'{"a": ' + b"[" * (MAX_JSON_DEPTH - 1) + b"]" * (MAX_JSON_DEPTH - 1) + b"}"
    assert parse_json_body(nested)["a"] is not None
    text = "[" * 1000 + '\\"{' + "\\\\"
    assert parse_json_body(json.dumps({"s": text, "t": ["]" * 500]}).encode())["s"] == text


def test_the_depth_limit_counts_the_body_object_itself():
    with pytest.raises(ApiError):
        parse_json_body(b'{"a": ' + b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH + b"}")
