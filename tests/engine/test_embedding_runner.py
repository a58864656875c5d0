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


def test_on_a_thread_of_its_own_it_steps_under_the_process_s_thread_team(model, monkeypatch):
    """With no chat engine hosting its passes, the runner's thread is one of the process's stepping engines
    (core_share.ThreadTeam): its team shares the cores with a chat engine's that steps (an equal share), takes
    them all when that engine is idle, applies its size with torch.set_num_threads on its own thread before
    every unit, and leaves the process's teams when the thread ends."""
    import threading

    from inference.engine.core_share import ThreadTeam, cpu_cap

    peers, now = set(), [100.0]
    chat = ThreadTeam(2, adaptive=False, clock=lambda: now[0], apply=lambda n: None, peers=peers)
    runner = EmbeddingRunner(model, idle_chunk_rows=16, solo_rows=0,  # every pass on the team
                             team=lambda: ThreadTeam(2, adaptive=False, clock=lambda: now[0], peers=peers))
    real_units, seen = model.encoder.units, []

    def units(batch, chunk_rows):  # what each unit runs under, read as it starts
        inner = real_units(batch, chunk_rows)
        while True:
            seen.append((threading.get_ident(), torch.get_num_threads(), runner.team.size))
            try:
                next(inner)
            except StopIteration as done:
                return done.value
            yield

    monkeypatch.setattr(model.encoder, "units", units)
    seq = model.tokenize(["word " * 60])
    cap = cpu_cap(2).cpus

    async def embed():
        return await runner.submit(seq)

    try:
        chat.adjust()  # a chat engine stepping now: the runner's team gets an equal share
        runner.start_thread()
        asyncio.run(embed())
        shared = list(seen)
        seen.clear()
        now[0] += 1.0  # the chat engine has not stepped since: the runner's team takes every core
        asyncio.run(embed())
        assert runner.team in peers and chat.adjust() == max(1, cap // 2)  # and the chat engine sees it
        thread = runner._thread.ident
    finally:
        runner.stop()
    assert len(shared) == len(seen) == 56  # every unit of a 62-token pass in 16-row chunks, and its end
    assert {(t, n, size) for t, n, size in shared} == {(thread, max(1, cap // 2), max(1, cap // 2))}
    assert {(t, n, size) for t, n, size in seen} == {(thread, cap, cap)}
    assert runner.team is None and len(peers) == 1 and chat.adjust() == cap  # it left with its thread


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
