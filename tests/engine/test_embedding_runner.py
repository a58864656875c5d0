"""EmbeddingRunner: requests packed into token-budget passes give the vectors of one forward each, a pass
runs in bounded units (one at a time when its host's slice is spent), and a failing pass fails only its own
requests."""
import asyncio

import pytest
import torch

from inference.engine.embedding_model import EmbeddingModel
from inference.engine.embedding_runner import EmbeddingRunner
from tests.conftest import pulled_minilm


@pytest.fixture(scope="module")
def model():
    return EmbeddingModel(pulled_minilm(), "float32")


def vectors(raw: list[bytes]) -> torch.Tensor:
    return torch.stack([torch.frombuffer(bytearray(r), dtype=torch.float32) for r in raw])


def test_concurrent_requests_share_passes_and_get_their_own_vectors(model):
    runner = EmbeddingRunner(model, max_batch_tokens=256)
    texts = [["a short one", "a second, somewhat longer text about retrieval"], ["word " * 240], ["x", "y", "z"]]
    seqs = [model.tokenize(t) for t in texts]

    async def run():
        futures = [runner.submit(s) for s in seqs]  # queued before the runner starts: packed together
        runner.start_thread()
        return await asyncio.gather(*futures)

    try:
        results = asyncio.run(run())
    finally:
        runner.stop()
    for s, raw in zip(seqs, results):
        torch.testing.assert_close(vectors(raw), model.embed(s), atol=2e-6, rtol=1e-5)
    assert runner.stats.passes == 2  # the first request's 15 tokens, then 242 + 9: passes of at most 256
    assert runner.stats.requests_finished == 3 and runner.stats.prompt_tokens == sum(len(x) for s in seqs for x in s)


def test_a_slice_runs_one_bounded_unit_when_its_budget_is_spent(model):
    runner = EmbeddingRunner(model, busy_chunk_rows=16, idle_chunk_rows=4096)
    seq = model.tokenize(["word " * 60])  # 62 tokens

    async def run():
        future = runner.submit(seq)
        units = 0
        while not future.done():
            runner.run_for(0.0, busy=True)
            units += 1
            await asyncio.sleep(0)
        return units, await future

    units, raw = asyncio.run(run())
    # The embeddings, then per layer 4 row chunks of QKV, one attention unit (one 62-token sequence) and 4
    # row chunks of the rest: 55 units, one a slice; the 56th slice ends the pass.
    assert units == 1 + 6 * (4 + 1 + 4) + 1
    torch.testing.assert_close(vectors(raw), model.embed(seq), atol=2e-6, rtol=1e-5)


def test_a_failing_pass_fails_its_requests_and_the_next_runs(model, monkeypatch):
    runner = EmbeddingRunner(model)
    real_units = model.encoder.units
    poison = model.tokenize(["poison"])[0]

    def units(batch, chunk_rows):
        if batch.input_ids.tolist() == poison:
            raise RuntimeError("a kernel fault")
        return (yield from real_units(batch, chunk_rows))

    monkeypatch.setattr(model.encoder, "units", units)

    async def run():
        bad = runner.submit([poison])
        while runner.has_work():
            runner.run_for(1.0, busy=False)
        good = runner.submit(model.tokenize(["fine"]))
        while runner.has_work():
            runner.run_for(1.0, busy=False)
        return await asyncio.gather(bad, good, return_exceptions=True)

    bad, good = asyncio.run(run())
    assert isinstance(bad, RuntimeError) and "kernel fault" in str(bad)
    assert len(good) == 1 and runner.stats.requests_failed == 1


def test_it_refuses_inputs_outside_the_model(model):
    runner = EmbeddingRunner(model)

    async def run(seqs):
        return runner.submit(seqs)

    for seqs in ([[]], [[1] * 257], [[30522]], [[-1]]):
        with pytest.raises(ValueError):
            asyncio.run(run(seqs))


class Team:
    """Stands in for the host's core_share.ThreadTeam: records each unit's `alone`."""

    def __init__(self):
        self.alone: list[bool] = []

    def adjust(self, stepping: bool = True, alone: bool = False) -> int:
        self.alone.append(alone)
        return 1 if alone else 2


def test_a_pass_of_few_rows_runs_alone_and_a_larger_one_on_the_team(model):
    runner = EmbeddingRunner(model, solo_rows=64)
    small, large = model.tokenize(["a short text"]), model.tokenize(["word " * 100])  # 5 and 102 rows

    async def run(seqs, busy: bool) -> list[bool]:
        team = Team()
        future = runner.submit(seqs)
        while not future.done():
            runner.run_for(1.0, busy=busy, team=team)
            await asyncio.sleep(0)
        return team.alone

    assert set(asyncio.run(run(small, busy=False))) == {True}
    assert set(asyncio.run(run(large, busy=False))) == {False}
    assert asyncio.run(run(small, busy=True)) == []  # beside chat: on the threads of the step before
