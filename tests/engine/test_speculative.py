"""Speculative decoding: token-for-token the output of decoding without drafts, greedy and seeded, in mixed
batches, with predictions exact, partial and junk; the KV pool whole after rejections, preemption and
cancels; the sampled distribution unchanged; the drafters and the gate."""
import collections

import pytest
import torch

from inference.engine.outputs import TokenEvent
from inference.engine.request import EngineRequest
from inference.engine.sampling_params import SamplingParams
from inference.engine.sequence import Sequence
from inference.engine.speculative import (NgramIndex, PredictionDraft, PredictionMatch, SpeculativeConfig, Speculator,
                                         SpecState, StepCost, common_suffix)

from .test_async_engine import LLMEngine_block_bytes, make_engine, prompts
from .tiny_models import make_tiny_model


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return make_tiny_model("llama", tmp_path_factory.mktemp("tiny") / "llama")


def spec_engine(folder, mode, **kw):
    """int8 weights: the compiled decode layers, where drafts are verified bitwise."""
    return make_engine(folder, weights="int8", speculative=mode, **kw)


def drive(engine, requests, abort_after: dict | None = None):
    """Run every request to its end; per request (token ids, logprobs, finish_reason, its TokenEvents).
    abort_after: request index -> abort it once it has at least that many tokens."""
    seqs = [engine.add_request(r) for r in requests]
    events = {id(s): [] for s in seqs}
    while engine.has_work():
        for seq, evs in engine.step():
            events[id(seq)].extend(evs)
        for i, n in (abort_after or {}).items():
            seq = seqs[i]
            if not seq.is_finished and sum(isinstance(e, TokenEvent) for e in events[id(seq)]) >= n:
                engine.abort(seq)
    out = []
    for s in seqs:
        toks = [e for e in events[id(s)] if isinstance(e, TokenEvent)]
        out.append(([e.token_id for e in toks], [e.logprobs for e in toks], s.finish_reason, toks))
    return out


def assert_pool_whole(engine):
    bm = engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks
    assert all(b.ref_count == 0 for b in bm.blocks)
    assert not engine.scheduler.running and not engine.scheduler.waiting


def corpus():
    """Prompts of random tokens, prompts that repeat themselves (prompt lookup finds them) and one long one."""
    base = prompts(5, seed=3)
    return base + [base[0] * 3, base[1][:10] * 6, (base[2] * 12)[:230]]


GREEDY = dict(temperature=0, max_tokens=24, ignore_eos=True)


@pytest.mark.parametrize("logprobs", [2, None])  # None: draft rows take their logits' argmax (verify.argmax_only)
def test_greedy_output_is_identical_with_speculation_on_and_off_over_a_corpus(tiny_folder, logprobs):
    reqs = lambda: [EngineRequest(p, SamplingParams(**GREEDY, logprobs=logprobs)) for p in corpus()]  # noqa: E731
    off = drive(spec_engine(tiny_folder, "off"), reqs())
    engine = spec_engine(tiny_folder, "on")
    on = drive(engine, reqs())
    assert [r[:3] for r in on] == [r[:3] for r in off]
    assert engine.speculator.num_accepted_tokens > 0  # drafts were verified and some accepted
    assert engine.speculator.num_drafted_tokens > engine.speculator.num_accepted_tokens  # and some rejected
    assert_pool_whole(engine)
    # The metrics' counters (vLLM's spec_decode_* names) are the speculator's.
    assert engine.stats.spec_decode_num_draft_tokens == engine.speculator.num_drafted_tokens
    assert engine.stats.spec_decode_num_accepted_tokens == engine.speculator.num_accepted_tokens
    assert engine.stats.generation_tokens == sum(len(r[0]) for r in on)


def test_tokens_accepted_together_are_one_inter_token_latency_sample(tiny_folder):
    """vLLM's rule: one ITL sample per request and step that emitted tokens (not a 0 s sample for each
    accepted draft token after the first)."""
    engine = spec_engine(tiny_folder, "on")
    seq = engine.add_request(EngineRequest(corpus()[5], SamplingParams(**GREEDY)))
    steps_with_tokens, tokens = 0, 0
    while engine.has_work():
        for s, evs in engine.step():
            n = sum(isinstance(e, TokenEvent) for e in evs)
            steps_with_tokens += s is seq and n > 0
            tokens += n
    assert engine.speculator.num_accepted_tokens > 0 and tokens == 24 > steps_with_tokens
    assert engine.stats.generation_tokens == 24
    assert engine.stats.ttft_s.count == 1 and engine.stats.itl_s.count == steps_with_tokens - 1


def mixed_requests(corpus_prompts, greedy_out):
    """Speculating rows (predictions exact, partial, junk; prompt lookup) and plain sampled ones in one batch,
    with the controls whose state advances per token: penalties, DRY, min_tokens, bias, stop ids, logprobs."""
    junk = torch.randint(3, 320, (30,), generator=torch.Generator().manual_seed(5)).tolist()
    exact = greedy_out[0]
    partial = exact[:8] + junk[:5] + exact[10:]
    return [
        EngineRequest(corpus_prompts[0], SamplingParams(**GREEDY), prediction_token_ids=exact),
        EngineRequest(corpus_prompts[0], SamplingParams(**GREEDY), prediction_token_ids=partial),
        EngineRequest(corpus_prompts[0], SamplingParams(**GREEDY), prediction_token_ids=junk),
        EngineRequest(corpus_prompts[5], SamplingParams(temperature=0.8, seed=1, max_tokens=24, ignore_eos=True,
                                                        logprobs=1)),
        EngineRequest(corpus_prompts[5], SamplingParams(temperature=1.0, top_p=0.9, seed=2, max_tokens=24,
                                                        presence_penalty=0.4, frequency_penalty=0.2)),
        EngineRequest(corpus_prompts[6], SamplingParams(temperature=0, max_tokens=24, repetition_penalty=1.3,
                                                        min_tokens=10, stop_token_ids=[7, 9])),
        EngineRequest(corpus_prompts[6], SamplingParams(temperature=0.7, seed=3, max_tokens=24, dry_multiplier=0.8,
                                                        dry_allowed_length=2, logit_bias={11: 3.0})),
        EngineRequest(corpus_prompts[7], SamplingParams(temperature=1.2, top_k=20, seed=4, max_tokens=24,
                                                        min_p=0.05), prediction_token_ids=exact),
        EngineRequest(corpus_prompts[1], SamplingParams(**GREEDY)),
    ]


def test_mixed_batches_of_speculating_and_plain_rows_seeded_and_greedy_are_identical(tiny_folder):
    greedy_out = [r[0] for r in drive(spec_engine(tiny_folder, "off"), [EngineRequest(corpus()[0],
                                                                                      SamplingParams(**GREEDY))])]
    c = corpus()
    off = drive(spec_engine(tiny_folder, "off"), mixed_requests(c, greedy_out))
    engine = spec_engine(tiny_folder, "on")
    on = drive(engine, mixed_requests(c, greedy_out))
    assert [r[:3] for r in on] == [r[:3] for r in off]
    assert engine.speculator.num_drafted_tokens > engine.speculator.num_accepted_tokens > 20
    assert_pool_whole(engine)


def test_the_kv_pool_comes_back_whole_after_rejections_preemption_and_cancels(tiny_folder):
    """A pool of 10 blocks of 16 tokens for 7 sequences growing to ~70 tokens: the scheduler preempts; two are
    cancelled part-way."""
    c = corpus()
    batch = prompts(5, length=30, seed=3) + [c[5][:40], c[6][:40]]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    engine = spec_engine(tiny_folder, "on", kv_cache_bytes=10 * LLMEngine_block_bytes(tiny_folder))
    assert engine.block_manager.num_blocks == 10
    on = drive(engine, [EngineRequest(p, params) for p in batch], abort_after={1: 5, 4: 9})
    assert engine.scheduler.num_preemptions > 0 and engine.speculator.num_drafted_tokens > 0
    assert engine.speculator.num_drafted_tokens > engine.speculator.num_accepted_tokens > 0
    assert on[1][2] == "cancelled" and on[4][2] == "cancelled"
    assert_pool_whole(engine)
    assert all(len(r[0]) == 40 and r[2] == "length" for i, r in enumerate(on) if i not in (1, 4))


def test_a_seeded_request_draws_the_same_tokens_alone_with_and_without_drafts(tiny_folder):
    c = corpus()
    params = [SamplingParams(temperature=t, seed=s, max_tokens=30, ignore_eos=True, top_k=k)
              for t, s, k in ((0.5, 1, 0), (0.9, 2, 10), (1.5, 3, 40), (0.3, 4, 3))]
    for p in params:
        req = lambda: [EngineRequest(c[5], p)]  # noqa: E731
        assert drive(spec_engine(tiny_folder, "on"), req())[0][:3] == drive(spec_engine(tiny_folder, "off"),
                                                                             req())[0][:3]


def test_rejection_sampling_leaves_the_output_distribution_that_of_plain_sampling(tiny_folder):
    """Draws from the engine's shared generator (no per-request seed; the generator seeded once per engine,
    so the test is the same every run) at temperature 1, top_k 2, over 500 requests each way,
    every one with the greedy output as its prediction, so positions 1 and 2 come from verified draft rows.
    Statistic: the total variation distance between the empirical distributions of the first two and the
    first three tokens (at most 4 and 8 outcomes). Tolerance 0.1: the sampling noise of two 500-sample
    histograms over 8 outcomes is about 0.05; a verifier that kept a draft more often than its probability
    shifts the mass of the drafted path by that excess."""
    prompt = corpus()[0]
    greedy = drive(spec_engine(tiny_folder, "off"), [EngineRequest(prompt, SamplingParams(**GREEDY))])[0][0]
    params = SamplingParams(temperature=1.0, top_k=2, max_tokens=3, ignore_eos=True)
    n = 500

    def histograms(mode):
        engine = spec_engine(tiny_folder, mode, max_num_seqs=128)
        # Fixed seeds, a different one each way: two independent samples, the same every run (sample-and-
        # compare draws in plain sampling's order, so one seed for both would make them equal, not alike).
        engine.runner.sampler.shared_generator.manual_seed({"on": 1, "off": 2}[mode])
        out = drive(engine, [EngineRequest(prompt, params, prediction_token_ids=greedy) for _ in range(n)])
        if mode == "on":
            assert engine.speculator.num_accepted_tokens > 0
            assert engine.speculator.num_drafted_tokens > engine.speculator.num_accepted_tokens
        return [collections.Counter(tuple(r[0][:k]) for r in out) for k in (2, 3)]

    for on, off in zip(histograms("on"), histograms("off")):
        tv = 0.5 * sum(abs(on[t] - off[t]) for t in set(on) | set(off)) / n
        assert len(on) > 2 and tv < 0.1, (tv, on, off)


def lookup_draft(index: NgramIndex, tokens: list[int], k: int) -> list[int]:
    """Up to k tokens that followed the index's best earlier match of the tokens' end ([] when none)."""
    start, _ = index.lookup(tokens)
    return [] if start is None else tokens[start:start + k]


def test_prompt_lookup_proposes_what_followed_the_last_ngram():
    index = NgramIndex(2, 3)
    tokens = [5, 6, 7, 8, 9, 1, 6, 7]
    assert lookup_draft(index, tokens, 3) == [8, 9, 1]
    assert lookup_draft(index, tokens + [4], 3) == []  # [7, 4] never occurred
    index = NgramIndex(2, 3)
    assert lookup_draft(index, [1, 2, 1, 2], 4) == [1, 2]  # the suffix itself is no match; the earlier one is


def test_prompt_lookup_takes_the_occurrence_whose_context_matches_longest():
    # [7, 8] occurs twice before the end: after [1, 2] (which the tokens end with) and later after [3, 4].
    tokens = [1, 2, 7, 8, 5, 3, 4, 7, 8, 6, 0, 1, 2, 7, 8]
    index = NgramIndex(2, 2)
    assert index.lookup(tokens) == (4, 4)  # [1, 2, 7, 8] matched, continuing with 5
    assert lookup_draft(index, tokens, 2) == [5, 3]
    tied = [3, 4, 7, 8, 1, 3, 4, 7, 8, 2, 3, 4, 7, 8]
    assert NgramIndex(2, 2).lookup(tied) == (9, 4)  # both match 4 tokens: the latest
    assert NgramIndex(2, 2).lookup([1, 2, 3]) == (None, 0)


def test_common_suffix_counts_matching_tokens_up_to_a_bound():
    a = list(range(40))
    assert common_suffix(a, 40, a, 40, 64) == 40
    assert common_suffix(a, 40, a, 40, 17) == 17
    b = [99] + a[1:]
    assert common_suffix(a, 40, b, 40, 64) == 39
    assert common_suffix(a, 30, b, 40, 64) == 0
    assert common_suffix(a, 0, b, 40, 64) == 0


def test_an_output_repeating_its_own_text_drafts_from_it_over_the_prediction():
    cfg = SpeculativeConfig("on", 4, 3, 2, 8, 0.3)
    prediction = [10, 11, 12, 13, 14, 15]
    state = SpecState(cfg, prediction)
    prompt = [1, 2]
    # The output's last token (11) is in the prediction, matched there over 1 token; the output's own
    # earlier text matches 4 (more than 1 + PREDICTION_LEAD): that text's continuation drafts.
    assert SpecState.PREDICTION_LEAD == 2
    own = [5, 6, 7, 11, 30, 31, 5, 6, 7, 11]
    assert state.propose(prompt + own, len(prompt), 3) == [30, 31, 5] and not state.from_prediction
    # Its own text matching 3 (no more than 1 + 2): the prediction.
    state = SpecState(cfg, prediction)
    assert state.propose(prompt + [0, 6, 7, 11, 30, 31, 5, 6, 7, 11], len(prompt), 3) == [12, 13, 14]
    assert state.from_prediction


def test_a_prediction_is_aligned_again_after_an_edit():
    pred = PredictionDraft([10, 11, 12, 13, 14, 15, 16])
    assert pred.propose([10], 3) == (1, [11, 12, 13])
    pred.pointer = 4  # 10 11 12 13 accepted
    assert pred.propose([10, 11, 12, 13], 2) == (4, [14, 15])
    # The model wrote 99 instead of 14, then 15: aligned on 15.
    assert pred.propose([10, 11, 12, 13, 99, 15], 2) == (6, [16])
    assert pred.propose([10, 11, 12, 13, 99, 98], 2) == (None, [])


def test_the_gate_pauses_a_sequence_whose_drafts_are_refused():
    cfg = SpeculativeConfig(mode="auto", num_draft_tokens=8, ngram_max=4, ngram_min=2, max_batch=8,
                            min_acceptance=0.3)
    state = SpecState(cfg, None)
    assert state.acceptance == 0.5  # prompt lookup's prior (a prediction's is 0.75)
    state.record(cfg, 1, 1)
    assert state.acceptance == pytest.approx(1.9 / 2.8)  # hits 0.9 + 1, misses 0.9
    for _ in range(4):
        state.record(cfg, 2, 0)
    assert state.pause > 0 and state.acceptance == pytest.approx(cfg.min_acceptance)  # retried at the floor
    assert SpecState(cfg, [1, 2, 3]).acceptance == 0.75
    with pytest.raises(ValueError):
        SpeculativeConfig("sometimes", 8, 4, 2, 8, 0.3)


def test_the_step_cost_fit_recovers_fixed_and_row_costs_and_holds_without_spread_in_rows():
    cost = StepCost()
    assert cost.row_s / cost.fixed_s == pytest.approx(1 / 16)  # the prior before any fit
    for i in range(40):
        rows = 1 + i % 9
        cost.observe(rows, 0.010 + 0.002 * rows)
    assert cost.fitted and cost.fixed_s == pytest.approx(0.010) and cost.row_s == pytest.approx(0.002)
    for _ in range(100):  # more steps of the same costs at one size: the fit holds
        cost.observe(8, 0.026)
    assert cost.row_s == pytest.approx(0.002) and cost.fixed_s == pytest.approx(0.010)
    flat = StepCost()
    for _ in range(50):  # steps all of one size say nothing of a row's cost: no fit, the prior stands
        flat.observe(8, 0.5)
    assert not flat.fitted and flat.row_s / flat.fixed_s == pytest.approx(1 / 16)


def test_an_interrupted_step_is_clipped_and_a_lasting_change_still_moves_the_fit():
    cost = StepCost()
    for i in range(60):
        cost.observe(1 + i % 9, 0.010 + 0.002 * (1 + i % 9))
    cost.observe(9, 0.500)  # the machine stopped the process for half a second in a 9-row step
    assert cost.row_s == pytest.approx(0.002, rel=0.05) and cost.fixed_s == pytest.approx(0.010, rel=0.05)
    for i in range(600):  # every step twice as dear from now on: the fit follows
        cost.observe(1 + i % 9, 2 * (0.010 + 0.002 * (1 + i % 9)))
    assert cost.row_s == pytest.approx(0.004, rel=0.05) and cost.fixed_s == pytest.approx(0.020, rel=0.05)


def test_each_batch_size_has_its_own_step_cost_fit():
    clock = ScriptedClock()
    spec = Speculator(AUTO, exact=True, clock=clock)
    for i in range(200):
        for decodes, fixed_s, row_s in ((1, 0.010, 0.002), (8, 0.004, 0.003)):
            rows = decodes + i % 9
            spec.start_step()
            clock.now += fixed_s + row_s * rows
            spec.end_step(rows, decodes)
    one, eight = spec.cost_for(1), spec.cost_for(8)
    assert (one.fixed_s, one.row_s) == (pytest.approx(0.010, rel=1e-3), pytest.approx(0.002, rel=1e-3))
    assert (eight.fixed_s, eight.row_s) == (pytest.approx(0.004, rel=1e-3), pytest.approx(0.003, rel=1e-3))
    assert spec.cost_for(3) is one and spec.cost_for(6) is eight  # the nearest fitted size
    spec.start_step()
    spec.end_step(40, 20)  # past max_batch: auto never drafts there, nothing to fit
    assert set(spec.costs) == {1, 8}


def test_the_draft_length_is_the_one_that_gives_the_step_the_most_tokens_per_second():
    cost = StepCost()
    for i in range(40):
        cost.observe(1 + i % 9, 0.010 + 0.002 * (1 + i % 9))  # 10 ms + 2 ms a row
    # Alone (1 row, 12 ms), accepting 90% a token: k tokens add 0.9 + ... + 0.9^k for 2 ms each;
    # (1 + gain(k)) / (12 + 2k) ms peaks at k = 7 (0.2190 tokens/ms against 0.2188 at 8, 0.1357 at 1).
    assert cost.best_draft(0.9, 1, 1, 8) == 7
    assert cost.best_draft(0.9, 1, 1, 4) == 4  # within the most allowed
    assert cost.best_draft(1.0, 1, 1, 16) == 16  # every token accepted: always one more
    # At 8 decodes (8 tokens in 26 ms) one more row pays only above 2 * 8 / 26 = 0.615 acceptance.
    assert cost.best_draft(0.6, 8, 8, 8) == 0
    assert cost.best_draft(0.65, 8, 8, 8) >= 1
    assert cost.best_draft(0.0, 1, 1, 8) == 0


def test_a_fit_that_makes_rows_dearer_than_the_weights_read_is_bounded_and_a_stale_fit_gives_way_to_the_prior():
    cost = StepCost(stale_after=64)
    cost.observe(1, 0.005)
    cost.observe(1, 0.005)
    cost.observe(9, 0.300)  # a first verify step's warm-up: alone it would say a row costs ~37 ms, the step nothing
    assert cost.fitted and cost.row_s == pytest.approx(cost.fixed_s)  # bounded at the fixed part
    assert cost.fixed_s * (1 + cost.sx / cost.w) == pytest.approx(cost.sy / cost.w)  # the mean step time kept
    refits = []
    for _ in range(200):  # nobody drafts any more: one-row steps only; the 9-row step's weight decays away
        cost.observe(1, 0.005)
        refits.append(cost.since_fit == 0)
    last_refit = max(i for i, r in enumerate(refits) if r)
    assert last_refit < 200 - 64  # then 64 steps without a refit, and the fit is dropped
    assert not cost.fitted and cost.row_s / cost.fixed_s == pytest.approx(1 / 16)


class ScriptedClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


AUTO = SpeculativeConfig(mode="auto", num_draft_tokens=4, ngram_max=4, ngram_min=2, max_batch=8, min_acceptance=0.3)


def timed_steps(spec, clock, fixed_s, row_s, n=900):
    """n decode steps of 1..9 rows, each taking fixed_s + row_s * rows on the scripted clock."""
    for i in range(n):
        rows = 1 + i % 9
        spec.start_step()
        clock.now += fixed_s + row_s * rows
        spec.end_step(rows)


def set_acceptance(state, acceptance):
    state.hits, state.misses = 10 * acceptance, 10 * (1 - acceptance)


def planned(spec, seqs):
    """The drafts Speculator.plan gives each of `seqs` decoding together in one step."""
    spec.begin_plan(len(seqs))
    return [spec.plan(s, len(seqs), 512, None) for s in seqs]


def test_the_auto_gate_drafts_while_rows_are_cheap_stops_when_they_cost_more_than_acceptance_earns_and_resumes():
    clock = ScriptedClock()
    spec = Speculator(AUTO, exact=True, clock=clock)
    params = SamplingParams(temperature=0, max_tokens=100)
    seqs = []
    for i in range(8):
        seq = Sequence(f"r{i}", [5 + i, 6, 7, 8, 9] * 4, params)  # the prompt's tail occurred before: drafts exist
        seq.spec = spec.state_for(None)
        seqs.append(seq)
    one = seqs[:1]
    # A step's fixed cost dominates (10 ms, 0.1 ms a row): a lone stream drafts, and keeps drafting while accepted.
    timed_steps(spec, clock, 0.010, 0.0001)
    for _ in range(3):
        draft, = planned(spec, one)
        assert len(draft) == AUTO.num_draft_tokens  # cheap rows: the longest draft
        spec.record(one[0], len(draft), len(draft))
    # Half of each draft token accepted: still worth a row at 8 streams while a row is cheap...
    for seq in seqs:
        set_acceptance(seq.spec, 0.5)
    assert all(planned(spec, seqs))
    # ...but not once a row costs as much as a step's fixed cost (1 ms + 1 ms a row: at 8 streams a
    # row pays above 8/9 acceptance).
    timed_steps(spec, clock, 0.001, 0.001)
    cost = spec.cost_for(8)  # the only fitted size (1 decode): the nearest for every other
    assert cost is spec.costs[1] and cost.fixed_s == pytest.approx(0.001, rel=0.02)
    assert cost.row_s == pytest.approx(0.001, rel=0.02)
    assert not any(planned(spec, seqs))
    # Alone, a row's share is 1/2: a stream accepting 40% stops, one accepting 90% drafts.
    set_acceptance(one[0].spec, 0.4)
    assert planned(spec, one) == [[]]
    set_acceptance(one[0].spec, 0.9)
    assert planned(spec, one)[0]
    # Rows cheap again: every stream drafts again at 8 (the acceptance each had is kept while it did not draft).
    timed_steps(spec, clock, 0.010, 0.0001)
    assert all(planned(spec, seqs[1:]))
    # "on" ignores the cost; "off" never drafts.
    on = Speculator(SpeculativeConfig("on", 4, 4, 2, 8, 0.3), exact=True, clock=clock)
    timed_steps(on, clock, 0.001, 0.001)
    seqs[0].spec = on.state_for(None)
    set_acceptance(seqs[0].spec, 0.1)
    assert planned(on, seqs[:1])[0]
    assert Speculator(SpeculativeConfig("off", 4, 4, 2, 8, 0.3), exact=True).state_for(None) is None


def test_auto_output_is_that_of_off_and_the_engine_fits_its_decode_steps(tiny_folder):
    reqs = lambda: [EngineRequest(p, SamplingParams(**GREEDY)) for p in corpus()[5:8]]  # noqa: E731
    off = drive(spec_engine(tiny_folder, "off"), reqs())
    engine = spec_engine(tiny_folder, "auto")
    auto = drive(engine, reqs())
    assert [r[:3] for r in auto] == [r[:3] for r in off]
    assert engine.speculator.num_drafted_tokens > 0
    assert any(c.w > 0 for c in engine.speculator.costs.values())  # decode steps were timed


def test_a_prediction_with_nothing_to_offer_falls_back_to_prompt_lookup():
    cfg = SpeculativeConfig("on", 4, 3, 2, 8, 0.3)
    state = SpecState(cfg, [40, 41, 42])
    prompt = [1, 2, 3, 4, 5, 6]
    # The output's last token (2) is not in the prediction: prompt lookup drafts what followed [1, 2].
    assert state.propose(prompt + [9, 1, 2], len(prompt), 4) == [3, 4, 5, 6] and not state.from_prediction
    state.record(cfg, 4, 1)
    # Aligned on the prediction: its tokens.
    assert state.propose(prompt + [40], len(prompt), 4) == [41, 42] and state.from_prediction
    state.record(cfg, 2, 1)
    assert state.prediction.pointer == 3  # 41 accepted, the model's token stands in for 42
    # Used up (its last token is the output's): prompt lookup again.
    assert state.propose(prompt + [40, 41, 42], len(prompt), 4) == [] and not state.from_prediction
    assert state.propose(prompt + [40, 41, 42, 1, 2], len(prompt), 4) == [3, 4, 5, 6] and not state.from_prediction
    state.record(cfg, 4, 0)
    assert state.propose(prompt + [40, 41, 42, 1, 2, 40], len(prompt), 4) == [41, 42]
    state.record(cfg, 2, 2)
    assert (state.drafted, state.accepted) == (12, 4)


def usage_of(prediction, output):
    """(accepted, rejected) prediction tokens of `output` (token ids) for `prediction`."""
    match = PredictionMatch(prediction)
    for token in output:
        match.feed(token)
    return match.accepted, match.rejected


def test_usage_counts_the_prediction_tokens_the_completion_holds_in_order_each_once():
    p = [1, 2, 3, 4, 5]
    assert usage_of(p, p) == (5, 0)
    assert usage_of(p, [1, 2, 9, 4, 5]) == (4, 1)  # one token substituted
    assert usage_of(p, [1, 2, 7, 3, 4, 5]) == (4, 1)  # one inserted: 3 is found again one token late
    assert usage_of(p, [1, 2, 4, 5]) == (3, 2)  # one deleted: realigned on 5 (after 4)
    assert usage_of(p, [1, 2]) == (2, 3)  # the completion stopped early
    assert usage_of(p, [9, 8, 7]) == (0, 5)  # nothing in common
    assert usage_of([1, 2, 3], [1, 2, 3, 1, 2, 3]) == (3, 0)  # repeated: each position counted once
    assert usage_of(p, []) == (0, 5)


def test_prompt_lookup_drafts_after_the_prediction_and_usage_counts_prediction_tokens_only(tiny_folder):
    prompt = corpus()[5]  # a prompt that repeats itself: prompt lookup finds drafts
    greedy = drive(spec_engine(tiny_folder, "off"), [EngineRequest(prompt, SamplingParams(**GREEDY))])[0][0]
    never = next(t for t in range(3, 320) if t not in greedy and t not in prompt)
    # A prediction of the output's first 5 tokens (used up early), and one whose tokens never occur.
    for prediction in (greedy[:5], [never] * 3):
        engine = spec_engine(tiny_folder, "on")
        on = drive(engine, [EngineRequest(prompt, SamplingParams(**GREEDY), prediction_token_ids=prediction)])
        assert on[0][0] == greedy
        # Usage: the prediction's tokens the completion holds (all 5, or none), whatever was drafted.
        assert usage_of(prediction, on[0][0]) == ((5, 0) if prediction[0] != never else (0, 3))
        assert engine.speculator.num_drafted_tokens > 4  # prompt lookup drafted after (or instead of) it
        assert engine.speculator.num_accepted_tokens > 4
        assert_pool_whole(engine)


def test_auto_drafts_nothing_for_a_batch_past_max_batch(tiny_folder):
    engine = spec_engine(tiny_folder, "auto", speculative_max_batch=2)
    c = corpus()
    drive(engine, [EngineRequest(p, SamplingParams(**GREEDY)) for p in c[5:8] * 2])
    assert engine.speculator.num_drafted_tokens == 0
    engine = spec_engine(tiny_folder, "auto", speculative_max_batch=8)
    drive(engine, [EngineRequest(c[5], SamplingParams(**GREEDY))])
    assert engine.speculator.num_drafted_tokens > 0


def test_without_the_compiled_decode_layers_nothing_is_drafted(tiny_folder):
    engine = make_engine(tiny_folder, speculative="on")  # float decode weights: torch rows, not batch-invariant
    out = drive(engine, [EngineRequest(corpus()[5], SamplingParams(**GREEDY))])
    assert len(out[0][0]) == 24 and engine.speculator.num_drafted_tokens == 0


def test_a_request_finishes_inside_its_drafts_at_max_tokens_and_at_eos(tiny_folder):
    greedy = drive(spec_engine(tiny_folder, "off"), [EngineRequest(corpus()[0], SamplingParams(**GREEDY))])[0][0]
    for max_tokens in (1, 2, 5, 9):
        p = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        engine = spec_engine(tiny_folder, "on")
        out = drive(engine, [EngineRequest(corpus()[0], p, prediction_token_ids=greedy)])
        assert out[0][0] == greedy[:max_tokens] and out[0][2] == "length"
        assert_pool_whole(engine)
    stop = greedy[6]
    p = SamplingParams(temperature=0, max_tokens=24, stop_token_ids=[stop])
    on = drive(spec_engine(tiny_folder, "on"), [EngineRequest(corpus()[0], p, prediction_token_ids=greedy)])
    off = drive(spec_engine(tiny_folder, "off"), [EngineRequest(corpus()[0], p)])
    assert on[0][:3] == off[0][:3] and on[0][0][-1] == stop and on[0][2] == "stop"


def test_grammar_penalties_and_min_tokens_keep_their_state_through_verified_drafts_on_smollm2(smollm2_dir):
    """SmolLM2 (compact weights), a JSON-schema grammar, penalties and min_tokens, each with the unconstrained
    greedy output as its prediction: identical with drafting and without, and drafts were accepted."""
    from inference.engine.config import EngineConfig
    from inference.engine.grammar import GrammarCompiler, GrammarSpec
    from inference.engine.grammar_state import StructuredOutput
    from inference.engine.llm_engine import LLMEngine
    from inference.engine.tokenizer import Tokenizer

    tok = Tokenizer.from_folder(smollm2_dir)
    engine = LLMEngine(EngineConfig(model_path=str(smollm2_dir), kv_cache_bytes=64 << 20, speculative="on"))
    prompt = tok.encode_chat([{"role": "user", "content": 'Repeat exactly: {"name": "Ada", "age": 36, '
                                                          '"tags": ["math", "engines", "notes"]}'}])
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                               "tags": {"type": "array", "items": {"type": "string"}}},
              "required": ["name", "age", "tags"]}
    compiled = GrammarCompiler(tok).compile(GrammarSpec.json_schema(schema))

    def requests(prediction):
        return [EngineRequest(prompt, SamplingParams(temperature=0, max_tokens=40, structured=StructuredOutput(
                    compiled)), prediction_token_ids=prediction),
                EngineRequest(prompt, SamplingParams(temperature=0, max_tokens=40, repetition_penalty=1.1,
                                                     min_tokens=30), prediction_token_ids=prediction),
                EngineRequest(prompt, SamplingParams(temperature=0.8, seed=5, max_tokens=40, dry_multiplier=0.5),
                              prediction_token_ids=prediction)]

    engine.speculator.enabled = False
    off = drive(engine, requests(None))
    engine.speculator.enabled = True
    on = drive(engine, requests(off[0][0]))
    assert [r[:3] for r in on] == [r[:3] for r in off]
    assert engine.speculator.num_accepted_tokens > 5
    assert_pool_whole(engine)


def test_model_weights_on_a_block_folder_draft_through_the_exact_block_kernels_and_change_nothing(tmp_path):
    """METRALE_WEIGHTS=model on a folder of GGUF blocks: its decode rows run the compiled layers on the blocks
    with float32 activations (row-independent), so it speculates; greedy output identical on and off."""
    from inference.engine.checkpoints import import_gguf

    from .test_block_weights import MIXED, write_block_gguf

    write_block_gguf(tmp_path / "m.gguf", MIXED)
    folder = import_gguf(tmp_path / "m.gguf", tmp_path / "blocks", progress=False)
    prompts_ = [[3 + t % 255 for t in p[:90]] for p in corpus()[5:8]]  # the folder's context is 128 tokens
    off = drive(make_engine(folder, weights="model", speculative="off"),
                [EngineRequest(p, SamplingParams(**GREEDY)) for p in prompts_])
    # Predictions: the first output exactly, the second's with its middle changed, none for the third.
    partial = off[1][0][:6] + [t % 250 + 4 for t in off[1][0][6:12]] + off[1][0][12:]
    engine = make_engine(folder, weights="model", speculative="on")
    assert engine.speculator.enabled
    on = drive(engine, [EngineRequest(p, SamplingParams(**GREEDY), prediction_token_ids=pred)
                        for p, pred in zip(prompts_, (off[0][0], partial, None))])
    assert [r[:3] for r in on] == [r[:3] for r in off]
    assert engine.speculator.num_drafted_tokens > engine.speculator.num_accepted_tokens > 0
    assert_pool_whole(engine)
