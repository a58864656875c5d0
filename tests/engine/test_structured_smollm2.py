"""Constrained decoding on SmolLM2-135M, in-process on the engine (the acceptance runs of issue 6).

Every request here runs through LLMEngine.step directly (no HTTP), many at once, on the served
default: the pulled folder's GGUF blocks with weights="auto" (int8 activation blocks). The grammar
masks do not depend on the weight format; float32 weights (weights="model") cost the thirty
schemas' 90 rows about ten times the CPU on the 2-vCPU AVX2 EPYC for the same outcome (all 90
valid, every one ended by "stop").
"""
import json
import re

import jsonschema
import pytest

from inference.bench.json_schemas import SCHEMAS
from inference.engine.config import EngineConfig
from inference.engine.grammar import GrammarCompiler, GrammarSpec
from inference.engine.grammar_state import StructuredOutput
from inference.engine.llm_engine import LLMEngine
from inference.engine.sampling_params import SamplingParams
from inference.engine.tokenizer import Tokenizer
from inference.engine.request import EngineRequest
from inference.serving.tool_grammar import tool_call_grammar
from inference.serving.tool_parsers import make_tool_parser

pytestmark = pytest.mark.slow

SEEDS = (1, 2, 3)


@pytest.fixture(scope="module")
def tok(smollm2_blocks_dir):
    return Tokenizer.from_folder(smollm2_blocks_dir)


@pytest.fixture(scope="module")
def engine(smollm2_blocks_dir):
    return LLMEngine(EngineConfig(model_path=str(smollm2_blocks_dir), kv_cache_bytes=512 << 20, max_num_seqs=96))


@pytest.fixture(scope="module")
def compiler(tok):
    return GrammarCompiler(tok)


def ask(tok, text: str, system: str | None = None) -> list[int]:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    return tok.encode_chat(messages)


def run(engine, requests: list[tuple[list[int], SamplingParams]]) -> list:
    """Run every (prompt ids, params) to its end together; returns their sequences in order."""
    seqs = [engine.add_request(EngineRequest(prompt, params, request_id=f"t{i}")) for i, (prompt, params) in enumerate(requests)]
    while engine.has_work():
        engine.step()
    return seqs


def text_of(tok, seq) -> str:
    return tok.decode(seq.output_token_ids)


def test_thirty_schemas_three_seeds_all_validate(engine, tok, compiler):
    requests, expected = [], []
    for desc, schema in SCHEMAS:
        structured = StructuredOutput(compiler.compile(GrammarSpec.json_schema(schema)))
        prompt = ask(tok, f"Give me {desc} as a JSON object.")
        for seed in SEEDS:
            requests.append((prompt, SamplingParams(temperature=0.7, seed=seed, max_tokens=256,
                                                    structured=structured)))
            expected.append((desc, schema))
    seqs = run(engine, requests)
    failures = []
    for (desc, schema), seq in zip(expected, seqs):
        text = text_of(tok, seq)
        try:
            jsonschema.validate(json.loads(text), schema, format_checker=jsonschema.FormatChecker())
        except (ValueError, jsonschema.ValidationError) as exc:
            failures.append(f"{desc} ({seq.finish_reason}): {text!r}: {str(exc)[:120]}")
    passed = len(seqs) - len(failures)
    print(f"\nstructured outputs: {passed}/{len(seqs)} outputs parse and validate "
          f"({len(SCHEMAS)} schemas x {len(SEEDS)} seeds, temperature 0.7)")
    assert not failures, "\n".join(failures)
    assert all(s.finish_reason == "stop" for s in seqs)
    assert all(s.grammar is None for s in seqs)  # freed with the request
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_regex_and_choice_give_only_matching_outputs(engine, tok, compiler):
    phone = r"\(\d{3}\) \d{3}-\d{4}"
    regex = StructuredOutput(compiler.compile(GrammarSpec("regex", phone)))
    options = ["positive", "negative", "neutral"]
    choice = StructuredOutput(compiler.compile(GrammarSpec.choice(options)))
    requests = [(ask(tok, "What is the phone number of the pizza place?"),
                 SamplingParams(temperature=0.9, seed=s, max_tokens=30, structured=regex)) for s in SEEDS]
    requests += [(ask(tok, "Is 'I loved this film' positive, negative or neutral?"),
                  SamplingParams(temperature=0.9, seed=s, max_tokens=10, structured=choice)) for s in SEEDS]
    seqs = run(engine, requests)
    texts = [text_of(tok, s) for s in seqs]
    assert all(re.fullmatch(phone, t) for t in texts[:3]), texts
    assert all(t in options for t in texts[3:]), texts
    assert all(s.finish_reason == "stop" for s in seqs)


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string", "maxLength": 30},
                                          "unit": {"enum": ["celsius", "fahrenheit"]}},
                                          "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "add", "description": "Add two integers",
                                      "parameters": {"type": "object", "properties": {
                                          "a": {"type": "integer", "minimum": -1000, "maximum": 1000},
                                          "b": {"type": "integer", "minimum": -1000, "maximum": 1000}},
                                          "required": ["a", "b"], "additionalProperties": False}}},
]


@pytest.mark.parametrize("tool_format", ["hermes", "llama3_json"])
def test_tool_choice_required_gives_only_valid_calls(engine, tok, compiler, tool_format):
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    lark = tool_call_grammar(tool_format, TOOLS, tuple(schemas), parallel=False)
    structured = StructuredOutput(compiler.compile(GrammarSpec("lark", lark)))
    questions = ["What is the weather in Paris?", "What is 12 plus 30?", "Tell me a joke."]
    requests = [(tok.encode(tok.apply_chat_template([{"role": "user", "content": q}], tools=TOOLS)),
                 SamplingParams(temperature=0.7, seed=s, max_tokens=80, structured=structured))
                for q in questions for s in SEEDS]
    seqs = run(engine, requests)
    for seq in seqs:
        text = text_of(tok, seq)
        parser = make_tool_parser(tool_format, TOOLS, tool_choice="required")
        parser.feed(text)
        parser.finish()
        assert seq.finish_reason == "stop" and len(parser.calls) == 1, (text, parser.rejected)
        call = parser.calls[0]
        jsonschema.validate(json.loads(call["arguments"]), schemas[call["name"]])


CLOSED = {"additionalProperties": False}
SCHEMA_A = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"],
            **CLOSED}
SCHEMA_B = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 999}},
            "required": ["n"], **CLOSED}
SCHEMA_C = {"type": "object", "properties": {"ok": {"type": "boolean"}, "why": {"type": "string", "maxLength": 30}},
            "required": ["ok", "why"], **CLOSED}
SCHEMA_D = {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 2, "maxItems": 3}


def test_a_mixed_batch_gives_each_request_its_output_alone(engine, tok, compiler):
    """Greedy: 4 constrained (different schemas) + 4 unconstrained requests, together and one by one."""
    prompts = ["Name a city in France.", "Pick a number.", "Is the sky blue?", "List some colors.",
               "Name a city in Spain.", "Say hello.", "What is 2+2?", "Write a short poem."]
    structured = [StructuredOutput(compiler.compile(GrammarSpec.json_schema(s)))
                  for s in (SCHEMA_A, SCHEMA_B, SCHEMA_C, SCHEMA_D)] + [None] * 4
    requests = [(ask(tok, p), SamplingParams(temperature=0, max_tokens=24, structured=s))
                for p, s in zip(prompts, structured)]
    alone = [text_of(tok, run(engine, [r])[0]) for r in requests]
    together = [text_of(tok, s) for s in run(engine, requests)]
    assert together == alone
    for text, schema in zip(alone[:4], (SCHEMA_A, SCHEMA_B, SCHEMA_C, SCHEMA_D)):
        jsonschema.validate(json.loads(text), schema)


def test_max_tokens_still_ends_a_constrained_request(engine, tok, compiler):
    structured = StructuredOutput(compiler.compile(GrammarSpec.json_schema(
        {"type": "object", "properties": {"story": {"type": "string"}}, "required": ["story"]})))
    (seq,) = run(engine, [(ask(tok, "Tell me a long story as JSON."),
                           SamplingParams(temperature=0, max_tokens=5, structured=structured))])
    assert seq.finish_reason == "length" and seq.num_output_tokens == 5
    assert text_of(tok, seq).startswith('{"story": "')


def test_a_dead_end_ends_the_request_with_stop_and_a_warning(engine, tok, compiler, caplog):
    """The grammar allows only "7" and min_tokens bans it (a stop token): nothing can be drawn."""
    seven = tok.encode("7")[0]
    structured = StructuredOutput(compiler.compile(GrammarSpec.choice(["7"])))
    params = SamplingParams(temperature=0, max_tokens=20, min_tokens=1, stop_token_ids=[seven],
                            structured=structured)
    with caplog.at_level("WARNING", logger="metrale.engine"):
        (seq,) = run(engine, [(ask(tok, "Pick a number."), params)])
    assert seq.finish_reason == "stop" and seq.num_output_tokens == 0
    assert "no allowed token" in caplog.text


def test_a_complete_grammar_stops_without_waiting_for_eos(engine, tok, compiler):
    structured = StructuredOutput(compiler.compile(GrammarSpec("regex", "[0-9]{2}")))
    (seq,) = run(engine, [(ask(tok, "Pick a number."),
                           SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, structured=structured))])
    assert seq.finish_reason == "stop" and re.fullmatch("[0-9]{2}", text_of(tok, seq))
