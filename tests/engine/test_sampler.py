"""The batched sampler equals a plain one-row-at-a-time reference, control by control."""
import math
import random

import pytest
import torch

from inference.engine.penalties import dry_penalties
from inference.engine.sampler import Sampler, argmax_rows
from inference.engine.sampling_params import SamplingParams
from inference.engine.sequence import Sequence

V = 64
EOS = [2]


def seq_with(params, prompt, output):
    s = Sequence("r", list(prompt), params)
    s.token_ids.extend(output)
    return s


def brute_dry(tokens, mult, base, allowed, breakers=()):
    """O(n^2) DRY: for each earlier end position, count the common suffix directly."""
    n = len(tokens)
    out = {}
    limit = next((j for j, t in enumerate(reversed(tokens)) if t in breakers), n)
    for end in range(n - 1):
        length = 0
        while length <= end and tokens[end - length] == tokens[n - 1 - length]:
            length += 1
        length = min(length, limit)
        nxt = tokens[end + 1]
        if length >= allowed and nxt not in breakers:
            out[nxt] = max(out.get(nxt, 0.0), mult * base ** (length - allowed))
    return out


def reference_row(logits, s: Sequence):
    """Every control on one row with plain Python/torch, in the documented order."""
    p = s.params
    x = logits.clone().tolist()
    for t, b in (p.logit_bias or {}).items():
        x[t] += b
    if s.num_output_tokens < p.min_tokens:
        for t in (EOS if not p.ignore_eos else []) + p.stop_token_ids:
            x[t] = -math.inf
    out = s.output_token_ids
    seen = set(out) | (set(s.prompt_token_ids) if p.repetition_penalty != 1.0 else set())
    for t in range(V):
        if t in seen and p.repetition_penalty != 1.0:
            x[t] = x[t] / p.repetition_penalty if x[t] > 0 else x[t] * p.repetition_penalty
        c = out.count(t)
        x[t] -= p.frequency_penalty * c + p.presence_penalty * (1 if c else 0)
    if p.dry_multiplier > 0:
        ctx = s.token_ids if p.dry_penalty_last_n <= 0 else s.token_ids[-p.dry_penalty_last_n:]
        for t, pen in brute_dry(ctx, p.dry_multiplier, p.dry_base, p.dry_allowed_length).items():
            x[t] -= pen
    if p.greedy:
        return torch.tensor(x)
    x = [v / p.temperature for v in x]
    order = sorted(range(V), key=lambda t: -x[t])
    keep = set(order[: p.top_k] if p.top_k > 0 else order)
    finite = [t for t in order if t in keep]
    m = max(x[t] for t in finite)
    z = sum(math.exp(x[t] - m) for t in finite)
    cum, nucleus = 0.0, set()
    for t in finite:
        if p.top_p < 1.0 and cum >= p.top_p and nucleus:
            break
        nucleus.add(t)
        cum += math.exp(x[t] - m) / z
    x = [x[t] if t in nucleus else -math.inf for t in range(V)]
    if p.min_p > 0:
        m = max(x)
        z = sum(math.exp(v - m) for v in x if v > -math.inf)
        pmax = 1.0 / z
        x = [v if v > -math.inf and math.exp(v - m) / z >= p.min_p * pmax else -math.inf for v in x]
    if p.top_n_sigma > 0:
        fin = [v for v in x if v > -math.inf]
        mean = sum(fin) / len(fin)
        sd = math.sqrt(sum((v - mean) ** 2 for v in fin) / len(fin))
        thr = max(fin) - p.top_n_sigma * sd
        x = [v if v >= thr else -math.inf for v in x]
    return torch.tensor(x)


def random_params(rng: random.Random) -> SamplingParams:
    greedy = rng.random() < 0.3
    return SamplingParams(
        temperature=0.0 if greedy else rng.choice([0.5, 1.0, 1.7]),
        top_k=rng.choice([0, 0, 5, 20]), top_p=rng.choice([1.0, 0.9, 0.5]), min_p=rng.choice([0.0, 0.0, 0.1]),
        top_n_sigma=rng.choice([0.0, 0.0, 1.5]),
        repetition_penalty=rng.choice([1.0, 1.3, 0.8]), presence_penalty=rng.choice([0.0, 0.5, -1.0]),
        frequency_penalty=rng.choice([0.0, 0.7]),
        logit_bias=rng.choice([None, {3: 5.0, 7: -100.0}]), min_tokens=rng.choice([0, 20]),
        stop_token_ids=rng.choice([[], [9]]),
        dry_multiplier=rng.choice([0.0, 0.8]), dry_base=1.75, dry_allowed_length=2,
        dry_penalty_last_n=rng.choice([-1, 12]), max_tokens=100, seed=rng.choice([None, 7]),
        logprobs=rng.choice([None, 0, 3]))


def test_it_equals_the_per_row_reference_for_random_mixed_batches():
    rng = random.Random(0)
    sampler = Sampler(EOS, seed=0)
    for trial in range(20):
        b = rng.randint(1, 8)
        seqs = []
        for _ in range(b):
            prompt = [rng.randrange(V) for _ in range(rng.randint(1, 10))]
            output = [rng.choice([1, 4, 5, 6]) for _ in range(rng.randint(0, 15))]
            seqs.append(seq_with(random_params(rng), prompt, output))
        logits = torch.randn(b, V, generator=torch.Generator().manual_seed(trial)) * 3
        batched = sampler.process(logits, seqs)
        for i, s in enumerate(seqs):
            ref = reference_row(logits[i], s)
            assert torch.equal(torch.isinf(batched[i]), torch.isinf(ref)), (trial, i, s.params)
            fin = torch.isfinite(ref)
            assert torch.allclose(batched[i][fin], ref[fin], atol=1e-4), (trial, i, s.params)


def test_argmax_rows_is_tensor_argmax_first_index_on_ties_and_nan():
    g = torch.Generator().manual_seed(3)
    x = torch.randint(-2, 3, (64, 500), generator=g).float()  # many ties
    x[0] = float("-inf")
    x[1, 7] = x[1, 9] = float("inf")
    x[2, 4] = x[2, 5] = float("nan")
    assert torch.equal(argmax_rows(x), x.argmax(-1))
    assert argmax_rows(x)[:3].tolist() == [0, 7, 4]


def test_it_makes_greedy_rows_take_the_argmax_and_respects_logit_bias():
    logits = torch.zeros(2, V)
    logits[:, 10] = 5.0
    seqs = [seq_with(SamplingParams(temperature=0), [1], []),
            seq_with(SamplingParams(temperature=0, logit_bias={11: 100.0}), [1], [])]
    assert Sampler(EOS).__call__(logits, seqs).token_ids == [10, 11]


def test_it_never_samples_eos_before_min_tokens():
    logits = torch.full((1, V), -5.0)
    logits[0, EOS[0]] = 10.0
    s = seq_with(SamplingParams(temperature=1.0, min_tokens=3), [1], [4])
    assert all(Sampler(EOS, seed=i)(logits, [s]).token_ids[0] != EOS[0] for i in range(20))


def test_it_gives_a_seeded_row_the_same_tokens_whatever_its_neighbours():
    logits = torch.randn(4, V, generator=torch.Generator().manual_seed(3))

    def draw(rows):
        seqs = []
        for r in rows:
            s = seq_with(SamplingParams(temperature=1.0, seed=42 if r == 0 else None), [1], [])
            s.generator = torch.Generator().manual_seed(42) if r == 0 else None
            seqs.append(s)
        return [Sampler(EOS)(logits[rows], seqs).token_ids[0] for _ in range(1)][0]

    firsts = set()
    for rows in ([0], [0, 1], [0, 2, 3], [0, 3, 1, 2]):
        firsts.add(draw(rows))
    assert len(firsts) == 1


def test_it_returns_sorted_nonpositive_top_logprobs():
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(5))
    seqs = [seq_with(SamplingParams(temperature=t, logprobs=5), [1], []) for t in (0.0, 0.7, 1.0)]
    res = Sampler(EOS, seed=1)(logits, seqs)
    for (chosen_lp, tops), tok in zip(res.logprobs, res.token_ids):
        vals = [lp for _, lp in tops]
        assert len(tops) == 5 and vals == sorted(vals, reverse=True) and all(v <= 0 for v in vals)
        assert chosen_lp <= 0


@pytest.mark.parametrize("seed", range(30))
def test_it_computes_dry_like_the_brute_force_definition(seed):
    rng = random.Random(seed)
    tokens = [rng.choice([1, 2, 3]) for _ in range(rng.randint(2, 40))]
    breakers = {3} if seed % 2 else set()
    assert dry_penalties(tokens, 0.8, 1.75, 2, breakers) == pytest.approx(brute_dry(tokens, 0.8, 1.75, 2, breakers))


def test_it_caps_dry_penalties_instead_of_overflowing_on_long_repeats():
    tokens = [1, 2] * 2000
    pens = dry_penalties(tokens, 0.8, 1.75, 2)
    assert pens[1] == pytest.approx(0.8 * math.exp(50.0))


def test_penalty_counts_kept_as_a_sequence_grows_equal_the_reference_at_every_step():
    rng = random.Random(4)
    sampler = Sampler(EOS, seed=0)
    params = SamplingParams(temperature=0, repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.7)
    s = seq_with(params, [rng.randrange(V) for _ in range(8)], [])
    for step in range(30):
        logits = torch.randn(1, V, generator=torch.Generator().manual_seed(step)) * 3
        row = sampler.process(logits, [s])[0]
        assert torch.allclose(row, reference_row(logits[0], s), atol=1e-4), step
        s.token_ids.append(rng.choice([1, 4, 5, 6, rng.randrange(V)]))
    counts = s.penalty_counts
    assert counts.num_counted == 29 and counts.counts.sum().item() == 29  # each token folded in once
