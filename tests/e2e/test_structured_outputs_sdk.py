"""Structured outputs through the official openai SDK against a live daphne serving SmolLM2."""
import json
import re

import jsonschema
import openai
import pytest
from pydantic import BaseModel

pytestmark = pytest.mark.e2e

MODEL = "smollm2-135m-instruct"
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 20},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 3}},
    "required": ["name", "age", "tags"], "additionalProperties": False}
ASK = [{"role": "user", "content": "Describe a person as JSON."}]


def test_streamed_and_blocking_give_the_same_json(openai_client):
    kw = dict(model=MODEL, messages=ASK, max_tokens=80, temperature=0.7, seed=5,
              response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA,
                                                                      "strict": True}})
    blocking = openai_client.chat.completions.create(**kw)
    streamed = "".join(c.choices[0].delta.content or "" for c in openai_client.chat.completions.create(**kw, stream=True)
                       if c.choices)
    assert streamed == blocking.choices[0].message.content
    assert blocking.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(streamed), SCHEMA)


class City(BaseModel):
    name: str
    country: str


def test_the_sdks_parse_helper_gets_a_valid_object(openai_client):
    done = openai_client.chat.completions.parse(model=MODEL, max_tokens=60, temperature=0, response_format=City,
                                                messages=[{"role": "user", "content": "Name a city."}])
    assert isinstance(done.choices[0].message.parsed, City)


def test_completions_with_a_regex_and_a_choice(openai_client):
    out = openai_client.completions.create(model=MODEL, prompt="My phone number is", max_tokens=20, temperature=1,
                                           seed=2, n=2, extra_body={"structured_outputs": {"regex": r"\d{3}-\d{4}"}})
    assert all(re.fullmatch(r"\d{3}-\d{4}", c.text) for c in out.choices)
    chat = openai_client.chat.completions.create(
        model=MODEL, max_tokens=5, temperature=1, seed=3, messages=[{"role": "user", "content": "Yes or no?"}],
        extra_body={"structured_outputs": {"choice": ["yes", "no"]}})
    assert chat.choices[0].message.content in ("yes", "no")


def test_responses_text_format_json_schema(openai_client):
    r = openai_client.responses.create(model=MODEL, input="Describe a person as JSON.", max_output_tokens=80,
                                       temperature=0, text={"format": {"type": "json_schema", "name": "person",
                                                                       "schema": SCHEMA, "strict": True}})
    jsonschema.validate(json.loads(r.output_text), SCHEMA)


def test_a_bad_schema_is_a_bad_request(openai_client):
    with pytest.raises(openai.BadRequestError) as info:
        openai_client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=5, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "not": {}}}})
    assert info.value.body["param"] == "response_format.json_schema.schema"
    assert "not" in info.value.body["message"]


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city.",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string", "maxLength": 30},
                                          "unit": {"enum": ["celsius", "fahrenheit"]}},
                                          "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "add", "description": "Add two integers.",
                                      "parameters": {"type": "object", "properties": {
                                          "a": {"type": "integer", "minimum": -1000, "maximum": 1000},
                                          "b": {"type": "integer", "minimum": -1000, "maximum": 1000}},
                                          "required": ["a", "b"], "additionalProperties": False}}},
]


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "add"}}])
def test_a_forced_tool_choice_always_gives_a_valid_call(openai_client, tool_choice):
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for seed, question in enumerate(["What is the weather in Paris?", "What is 12 plus 30?", "Tell me a joke."]):
        out = openai_client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": question}], tools=TOOLS, tool_choice=tool_choice,
            max_tokens=80, temperature=0.7, seed=seed, parallel_tool_calls=False)
        choice = out.choices[0]
        # One call forced (parallel calls off), so the grammar ends the output after it: never cut by max_tokens
        # (a generation cut inside a call answers "length", the truth about the limit).
        assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1, choice
        for call in choice.message.tool_calls:
            if isinstance(tool_choice, dict):
                assert call.function.name == "add"
            jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
