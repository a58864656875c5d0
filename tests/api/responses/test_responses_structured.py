"""/v1/responses with text.format json_schema / json_object: compiled before the run and echoed."""
from inference.engine.grammar import GrammarSpec

from .support import post

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
          "additionalProperties": False}


def test_responses_text_format_is_compiled_and_echoed(client, script):
    fmt = {"type": "json_schema", "name": "place", "schema": SCHEMA, "strict": True}
    r = post(client, "/v1/responses", {"input": "hi", "text": {"format": fmt}})
    assert r.status_code == 200, r.content
    assert r.json()["text"]["format"] == fmt
    assert script.gens[0].params.structured.grammar.spec == GrammarSpec.json_schema(SCHEMA)
    r = post(client, "/v1/responses", {"input": "hi", "text": {"format": {"type": "json_object"}}})
    assert r.status_code == 200
    assert script.gens[1].params.structured.grammar.spec == GrammarSpec.json_schema({"type": "object"})
