"""The compiled temperature draw (kernels/sample.c) against the torch rules and the inverse CDF.

The kernel keeps the tokens `Sampler.process` keeps (temperature, top_k, top_p, min_p), with the
same processed logits, and draws the token the inverse CDF of that distribution gives for the same
uniform number; every instruction-set build of this machine draws the same tokens.
"""
import ctypes
import math
import random

import pytest
import torch

from inference.engine import kernels
from inference.engine.kernels.build import build
from inference.engine.sampler import Sampler, _temperature_and_truncation, draw_inverse_cdf
from inference.engine.sampling_params import SamplingParams
from inference.engine.sequence import Sequence
from .isa_builds import narrower_builds as _narrower_builds

pytestmark = pytest.mark.skipif(not kernels.available(), reason="the compiled CPU kernels are unavailable")


def params_of(rng: random.Random) -> SamplingParams:
    return SamplingParams(temperature=rng.choice([0.3, 0.8, 1.0, 1.7]), top_k=rng.choice([0, 0, 1, 5, 40, 300]),
                          top_p=rng.choice([1.0, 1.0, 0.95, 0.5, 0.1]), min_p=rng.choice([0.0, 0.0, 0.05, 0.3]))


def kernel_draw(logits: torch.Tensor, params: list[SamplingParams], u: torch.Tensor):
    """(tokens int64 [B], processed logits [B, V]) of kernels.sample for these rows' params."""
    v = logits.shape[1]
    tokens, processed = kernels.sample(logits, [p.temperature for p in params],
                                       [p.top_k if 0 < p.top_k < v else 0 for p in params],
                                       [p.top_p for p in params], [p.min_p for p in params], u.tolist(),
                                       [True] * len(params))
    return torch.tensor(tokens), processed


def cdf_steps(processed_row: torch.Tensor) -> torch.Tensor:
    """The inverse CDF's step positions (float64, normalised) of one processed row."""
    p = processed_row.double().softmax(-1)
    return p.cumsum(-1)


@pytest.mark.parametrize("vocab", [64, 1000, 49152])
def test_it_keeps_what_the_torch_rules_keep_with_the_same_processed_logits(vocab):
    rng = random.Random(vocab)
    g = torch.Generator().manual_seed(vocab)
    for trial in range(12):
        b = rng.randint(1, 6)
        params = [params_of(rng) for _ in range(b)]
        logits = torch.randn(b, vocab, generator=g) * rng.choice([1.0, 3.0, 8.0])
        _, processed = kernel_draw(logits, params, torch.rand(b, dtype=torch.float64, generator=g))
        ref = _temperature_and_truncation(logits.clone(), params)
        for i, p in enumerate(params):
            kept, ref_kept = torch.isfinite(processed[i]), torch.isfinite(ref[i])
            # A nucleus boundary sits where float32 and float64 cumulative sums could disagree only
            # within rounding of top_p: no such case here, so the sets must be equal.
            assert torch.equal(kept, ref_kept), (vocab, trial, i, p, int(kept.sum()), int(ref_kept.sum()))
            assert torch.equal(processed[i][kept], ref[i][kept])


@pytest.mark.parametrize("vocab", [64, 49152])
def test_its_token_is_the_inverse_cdf_of_the_kept_distribution(vocab):
    """For uniform numbers away from a step of the CDF (farther than float32 rounding of the weights),
    the token is exactly the inverse CDF's; near a step it is one of the two tokens beside it."""
    rng = random.Random(1)
    g = torch.Generator().manual_seed(2)
    for trial in range(8):
        params = [params_of(rng) for _ in range(4)]
        logits = torch.randn(4, vocab, generator=g) * 3
        for _ in range(25):
            u = torch.rand(4, dtype=torch.float64, generator=g)
            tokens, processed = kernel_draw(logits, params, u)
            for i in range(4):
                steps = cdf_steps(processed[i])
                expected = int(torch.searchsorted(steps, u[i:i + 1] * steps[-1], right=True).clamp(max=vocab - 1))
                torch_token = int(draw_inverse_cdf(processed[i:i + 1], u[i:i + 1])[0])
                for token in (int(tokens[i]), torch_token):
                    assert math.isfinite(processed[i][token].item()), "a removed token was drawn"
                target = float(u[i] * steps[-1])
                if abs(float(steps[expected]) - target) > 1e-5 and (
                        expected == 0 or abs(float(steps[expected - 1]) - target) > 1e-5):
                    assert int(tokens[i]) == expected == torch_token, (trial, i, params[i])
                else:  # beside a step: the kept token on either side of it
                    kept = torch.isfinite(processed[i]).nonzero().squeeze(1).tolist()
                    at = kept.index(expected)
                    assert int(tokens[i]) in kept[max(0, at - 1):at + 2], (trial, i, params[i])


def test_drawn_frequencies_follow_the_distribution():
    """20,000 draws from one row at temperature 0.7, top_p 0.9: total variation from the kept
    distribution under 0.02 (its sampling noise over 12 outcomes is about 0.01)."""
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(1, 40, generator=g) * 2
    p = SamplingParams(temperature=0.7, top_p=0.9)
    n = 20000
    u = torch.rand(n, dtype=torch.float64, generator=g)
    tokens, _ = kernels.sample(logits.expand(n, 40).contiguous(), [0.7] * n, [0] * n, [0.9] * n, [0.0] * n, u.tolist())
    tokens = torch.tensor(tokens)
    probs = _temperature_and_truncation(logits.clone(), [p])[0].softmax(-1)
    counts = torch.bincount(tokens, minlength=40).double() / n
    assert float(counts[probs == 0].sum()) == 0.0
    assert 0.5 * float((counts - probs.double()).abs().sum()) < 0.02


def test_ties_at_the_top_k_and_nucleus_boundaries_keep_the_lower_ids():
    v = 49152
    flat = torch.zeros(1, v)
    _, processed = kernel_draw(flat, [SamplingParams(temperature=1.0, top_p=0.5)], torch.tensor([0.3], dtype=torch.float64))
    kept = torch.isfinite(processed[0]).nonzero().squeeze(1)
    assert kept.tolist() == list(range(v // 2))  # every token before the median holds less than half the mass
    _, processed = kernel_draw(flat, [SamplingParams(temperature=1.0, top_k=7)], torch.tensor([0.3], dtype=torch.float64))
    assert torch.isfinite(processed[0]).nonzero().squeeze(1).tolist() == list(range(7))


def test_rows_without_a_distribution_take_the_argmax_rule():
    v = 100
    rows = torch.full((3, v), float("-inf"))
    rows[1, 7] = float("nan")
    rows[2, 11] = float("inf")
    rows[2, 30] = 1.0
    tokens, _ = kernel_draw(rows, [SamplingParams(temperature=0.8)] * 3, torch.full((3,), 0.5, dtype=torch.float64))
    assert tokens.tolist() == [0, 7, 11]


def test_a_row_draws_the_same_token_alone_and_in_any_batch():
    g = torch.Generator().manual_seed(9)
    rng = random.Random(9)
    logits = torch.randn(16, 5000, generator=g) * 3
    params = [params_of(rng) for _ in range(16)]
    u = torch.rand(16, dtype=torch.float64, generator=g)
    together, _ = kernel_draw(logits, params, u)
    for i in range(16):
        alone, _ = kernel_draw(logits[i:i + 1], params[i:i + 1], u[i:i + 1])
        assert int(alone[0]) == int(together[i])




@pytest.mark.parametrize("extra", _narrower_builds() or [pytest.param((), marks=pytest.mark.skip(
    reason="this CPU has neither AVX2 nor AVX-512: the portable path is the only one and is tested above"))])
def test_every_instruction_set_path_draws_the_same_tokens(extra):
    """The AVX-512, AVX2 and portable builds compute the same weights and sums (exp16, exp8, exp1 take
    the same steps): a seeded request draws the same tokens on every CI machine."""
    lib = ctypes.CDLL(str(build(extra)))
    lib.metrale_sample.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long] + [ctypes.c_void_p] * 8 + [ctypes.c_int]
    g = torch.Generator().manual_seed(4)
    rng = random.Random(4)
    for vocab in (49152, 1000, 77):
        b = 8
        params = [params_of(rng) for _ in range(b)]
        logits = torch.randn(b, vocab, generator=g) * 4
        u = torch.rand(b, dtype=torch.float64, generator=g)
        expected, processed = kernel_draw(logits, params, u)
        tokens = torch.empty(b, dtype=torch.int64)
        out = torch.empty_like(logits)
        args = [torch.tensor([p.temperature for p in params]),
                torch.tensor([p.top_k if p.top_k < vocab else 0 for p in params], dtype=torch.int32),
                torch.tensor([p.top_p for p in params]), torch.tensor([p.min_p for p in params]), u,
                torch.ones(b, dtype=torch.uint8)]
        lib.metrale_sample(logits.data_ptr(), b, vocab, *(t.data_ptr() for t in args[:5]), out.data_ptr(),
                           args[5].data_ptr(), tokens.data_ptr(), 2)
        assert torch.equal(tokens, expected), (extra, vocab)
        assert torch.equal(out, processed)


@pytest.mark.parametrize("mode", ["raw_logprobs", "processed_logprobs"])
def test_the_sampler_gives_logprobs_of_the_model_or_of_the_distribution_it_drew_from(mode):
    g = torch.Generator().manual_seed(11)
    logits = torch.randn(2, 300, generator=g) * 3
    seqs = [Sequence("r", [1], SamplingParams(temperature=0.8, top_k=20, logprobs=3, logit_bias={5: 4.0})),
            Sequence("s", [1], SamplingParams(temperature=1.2, top_p=0.6, min_p=0.05, logprobs=0))]
    res = Sampler([2], seed=3, logprobs_mode=mode)(logits, seqs)
    drawn_from = logits.clone()
    drawn_from[0, 5] += 4.0
    drawn_from = _temperature_and_truncation(drawn_from, [s.params for s in seqs])
    # raw: the model's own distribution, whatever the temperature, truncation and logit_bias (vLLM's default).
    ref = (logits if mode == "raw_logprobs" else drawn_from).log_softmax(-1)
    for i, (chosen, tops) in enumerate(res.logprobs):
        assert chosen == pytest.approx(float(ref[i, res.token_ids[i]]), abs=1e-5)
        assert [t for t, _ in tops] == ref[i].topk(len(tops)).indices.tolist()
        assert drawn_from[i, res.token_ids[i]] > float("-inf")  # drawn from what was kept
