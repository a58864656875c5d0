"""Grammar compilation, per-sequence grammar state and the sampler's mask, on SmolLM2's tokenizer (no model)."""
import logging

import numpy as np
import pytest
import torch

from inference.engine.grammar import GrammarCompiler, GrammarError, GrammarSpec
from inference.engine.grammar_state import GrammarState, StructuredOutput
from inference.engine.reasoning import ReasoningSpec, ReasoningTracker
from inference.engine.sampler import Sampler
from inference.engine.sampling_params import SamplingParams
from inference.engine.sequence import Sequence
from inference.engine.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tok(smollm2_dir):
    return Tokenizer.from_folder(smollm2_dir)


@pytest.fixture(scope="module")
def compiler(tok):
    return GrammarCompiler(tok)


def walk(state: GrammarState, tok, text: str, then: tuple[int, ...] = ()) -> bool:
    out: list[int] = []
    for t in [*tok.encode(text), *then]:
        if not state.accept(t, out):
            return False
        out.append(t)
    return True


def test_it_caches_a_compiled_grammar_by_spec(compiler):
    a = compiler.compile(GrammarSpec.json_schema({"type": "object", "properties": {"x": {"type": "integer"}}}))
    b = compiler.compile(GrammarSpec.json_schema({"type": "object", "properties": {"x": {"type": "integer"}}}))
    c = compiler.compile(GrammarSpec.json_schema({"type": "object", "properties": {"y": {"type": "integer"}}}))
    assert a is b and a is not c
    assert a.compile_s > 0 and a.mask_words == (49152 + 31) // 32


@pytest.mark.parametrize("spec, words", [
    (GrammarSpec.json_schema({"type": "strin"}), "Invalid type"),
    (GrammarSpec.json_schema({"type": "array", "uniqueItems": True}), "uniqueItems"),
    (GrammarSpec.json_schema({"$ref": "#/$defs/nope"}), "nope"),
    (GrammarSpec.json_schema({"type": "string", "format": "zzz"}), "zzz"),
    (GrammarSpec("regex", "(("), "unclosed group"),
    (GrammarSpec("lark", "start: missing_rule"), "missing_rule"),
    (GrammarSpec("ebnf", "root ::= ("), ""),
    # An object that requires itself: its first forced token already passes the parser's limits (every request
    # ended at its first token with an empty answer).
    (GrammarSpec.json_schema({"type": "object", "properties": {"x": {"$ref": "#"}}, "required": ["x"]}),
     "cannot be followed from its start: parser error: Too many items"),
])
def test_it_refuses_what_it_cannot_enforce_naming_the_problem(compiler, spec, words):
    with pytest.raises(GrammarError) as info:
        compiler.compile(spec)
    assert words in str(info.value) and "<state>" not in str(info.value)
    with pytest.raises(GrammarError):  # a failure is cached too
        compiler.compile(spec)


def test_a_grammar_that_forces_its_start_still_compiles_and_follows_it(compiler, tok):
    # The start probe follows the forced tokens on a copy: the compiled grammar's own matcher is untouched.
    spec = GrammarSpec.json_schema({"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"],
                                    "additionalProperties": False})
    grammar = compiler.compile(spec)
    for _ in range(2):  # a second sequence starts where the first did
        state = GrammarState(StructuredOutput(grammar))
        assert walk(state, tok, '{"name": "Ada"}') and state.finished and not state.dead_end


def test_a_state_follows_valid_tokens_and_finishes_when_complete(compiler, tok):
    g = compiler.compile(GrammarSpec.choice(["yes", "no"]))
    state = GrammarState(StructuredOutput(g))
    assert walk(state, tok, "yes") and state.finished
    state = GrammarState(StructuredOutput(g))
    assert walk(state, tok, "ye") is True and not state.finished


def test_a_refused_token_is_a_logged_dead_end(compiler, tok, caplog):
    state = GrammarState(StructuredOutput(compiler.compile(GrammarSpec("regex", "[0-9]+"))), "req-7")
    with caplog.at_level(logging.WARNING, logger="metrale.engine"):
        assert state.accept(tok.encode("x")[0], []) is False
    assert state.dead_end and not state.masks
    assert "req-7" in caplog.text and "finish_reason stop" in caplog.text


def test_the_grammar_waits_for_the_reasoning_close_tag(compiler, tok):
    g = compiler.compile(GrammarSpec("regex", "[0-9]+"))
    end = tuple(tok.encode("</think>"))
    state = GrammarState(StructuredOutput(g), reasoning=ReasoningTracker(ReasoningSpec(
        end_ids=end, starts_in_reasoning=True)))
    assert not state.masks
    assert walk(state, tok, "Let me think: 1 2 x", then=end)
    assert state.gate == "on" and state.masks
    assert walk(state, tok, "42") and not walk(state, tok, "x")


def test_a_model_may_open_reasoning_with_its_first_token(compiler, tok):
    g = compiler.compile(GrammarSpec("regex", "[0-9]+"))
    start = tok.encode("<|im_start|>")[0]  # a single-token tag stands in for <think>
    end = tuple(tok.encode("</think>"))
    spec = ReasoningSpec((start,), end, output_may_open=True)
    opened = GrammarState(StructuredOutput(g), reasoning=ReasoningTracker(spec))
    row = np.zeros(g.mask_words, dtype=np.uint32)
    opened.fill_mask(row)
    assert row[start // 32] >> (start % 32) & 1
    assert opened.accept(start, []) and opened.gate == "reasoning"
    direct = GrammarState(StructuredOutput(g), reasoning=ReasoningTracker(spec))
    assert walk(direct, tok, "7") and direct.gate == "on"


def test_one_tracker_feeds_the_budget_and_the_grammar(compiler, tok):
    """The budget closes the block the prompt opened; the grammar waits for that close, then constrains."""
    g = compiler.compile(GrammarSpec("regex", "[0-9]+"))
    end = tuple(tok.encode("</think>"))
    spec = ReasoningSpec(end_ids=end, starts_in_reasoning=True, budget_tokens=2)
    params = SamplingParams(temperature=0, structured=StructuredOutput(g), reasoning=spec)
    s = Sequence("r", [5, 6, 7], params)
    s.reasoning = ReasoningTracker(spec)
    s.grammar = GrammarState(params.structured, reasoning=s.reasoning)
    x, digit = tok.encode("x")[0], tok.encode("7")[0]
    logits = torch.zeros(1, 49152)
    logits[0, x], logits[0, digit] = 50.0, 5.0  # the unconstrained favourite is not a digit
    sampler = Sampler([2])
    for _ in range(2 + len(end) + 3):
        token = sampler(logits, [s]).token_ids[0]
        assert s.grammar.accept(token, s.output_token_ids)
        s.token_ids.append(token)
    out = s.output_token_ids
    assert out[:2] == [x, x]  # reasoning is free text
    assert tuple(out[2:2 + len(end)]) == end  # closed by the budget
    assert out[2 + len(end):] == [digit] * 3  # then the grammar applies
    assert s.reasoning.used == 2 and not s.reasoning.in_reasoning


def seq(params, prompt=(5, 6, 7), output=(), request_id="r"):
    s = Sequence(request_id, list(prompt), params)
    s.token_ids.extend(output)
    if params.structured is not None:
        s.grammar = GrammarState(params.structured)
    return s


def test_the_mask_touches_only_constrained_rows(compiler, tok):
    g = compiler.compile(GrammarSpec.choice(["yes", "no"]))
    v = 49152 + 64  # a padded embedding: ids past the tokenizer's vocabulary are never allowed
    logits = torch.randn(3, v, generator=torch.Generator().manual_seed(0))
    plain = SamplingParams(temperature=0)
    constrained = SamplingParams(temperature=0, structured=StructuredOutput(g))
    seqs = [seq(plain), seq(constrained), seq(plain)]
    out = Sampler([2]).process(logits, seqs)
    assert torch.equal(out[0], logits[0]) and torch.equal(out[2], logits[2])
    allowed = set(torch.isfinite(out[1]).nonzero().flatten().tolist())
    assert allowed and all(("yes".startswith(tok.decode([t])) or "no".startswith(tok.decode([t])))
                           for t in allowed)
    assert not any(t >= 49152 for t in allowed)


def test_truncation_chooses_among_allowed_tokens_only(compiler, tok):
    """The mask comes before top_k / top_p: top_k=1 of a masked row is its best allowed token."""
    g = compiler.compile(GrammarSpec("regex", "[0-9]"))
    logits = torch.zeros(2, 49152)
    logits[:, tok.encode("x")[0]] = 50.0  # the unconstrained favourite, forbidden by the grammar
    digit = tok.encode("7")[0]
    logits[:, digit] = 5.0
    params = SamplingParams(temperature=1.0, top_k=1, seed=3, structured=StructuredOutput(g))
    seqs = [seq(params), seq(SamplingParams(temperature=0, structured=StructuredOutput(g)))]
    result = Sampler([2]).__call__(logits, seqs)
    assert result.token_ids == [digit, digit]


def test_eos_is_allowed_only_once_the_grammar_is_complete(compiler, tok):
    g = compiler.compile(GrammarSpec("regex", "[0-9]+"))
    s = seq(SamplingParams(temperature=0, structured=StructuredOutput(g)))
    row = Sampler([2]).process(torch.zeros(1, 49152), [s])[0]
    assert not torch.isfinite(row[2])
    assert walk(s.grammar, tok, "1") and not s.grammar.finished
    row = Sampler([2]).process(torch.zeros(1, 49152), [s])[0]
    assert torch.isfinite(row[2]) and torch.isfinite(row[tok.encode("5")[0]])


def test_a_cancelled_or_crashed_compile_is_not_cached(tok, monkeypatch):
    compiler = GrammarCompiler(tok)
    spec = GrammarSpec("regex", "[a-c]+")
    calls = []

    def crash(s):
        calls.append(s)
        raise RuntimeError("out of memory")

    monkeypatch.setattr(compiler, "_compile", crash)
    with pytest.raises(RuntimeError):
        compiler.compile(spec)
    monkeypatch.undo()
    assert compiler.compile(spec).spec == spec and calls == [spec]
