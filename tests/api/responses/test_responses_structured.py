"""/v1/responses with text.format json_schema / json_object: compiled before the run, handed to the engine
and echoed."""
from inference.engine.grammar import GrammarSpec


SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
          "additionalProperties": False}


def test_responses_text_format_is_compiled_and_echoed(api, engine):
    fmt = {"type": "json_schema", "name": "place", "schema": SCHEMA, "strict": True}
    r = api.post("/v1/responses", {"input": "hi", "text": {"format": fmt}})
    assert r.status_code == 200, r.content
    assert r.json()["text"]["format"] == fmt
    assert engine.submissions[0].params.structured.grammar.spec == GrammarSpec.json_schema(SCHEMA)
    r = api.post("/v1/responses", {"input": "hi", "text": {"format": {"type": "json_object"}}})
    assert r.status_code == 200
    assert engine.submissions[1].params.structured.grammar.spec == GrammarSpec.json_schema({"type": "object"})
