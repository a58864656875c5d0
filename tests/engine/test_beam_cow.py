"""Beam search's copy-on-write forks of KV blocks: the bookkeeping, the K/V copy, and a whole pool afterwards."""
import pytest
import torch

from inference.engine.beam_search import BeamSpec
from inference.engine.block_manager import BlockManager
from inference.engine.sampling_params import SamplingParams
from inference.engine.sequence import Sequence
from inference.serving.beam_search import beam_request

from .test_async_engine import make_engine, prompts
from .tiny_models import make_tiny_model


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return make_tiny_model("llama", tmp_path_factory.mktemp("tiny") / "llama")


def pool_is_whole(engine) -> bool:
    bm = engine.block_manager
    return (bm.num_free_blocks == bm.num_blocks and all(b.ref_count == 0 for b in bm.blocks)
            and not engine.scheduler.running and not engine.scheduler.waiting)


def test_a_fork_shares_every_block_and_copies_a_shared_block_before_writing_it():
    bm = BlockManager(8, 4)
    parent = Sequence("p", list(range(10, 16)), SamplingParams())  # 6 tokens: one full block, one partial
    bm.allocate(parent, 6)
    parent.num_computed_tokens = 6
    child = Sequence("c", parent.prompt_token_ids, parent.params, token_ids=parent.token_ids + [99])
    bm.fork(parent, child)
    assert child.block_table == parent.block_table and child.num_computed_tokens == 6
    assert [bm.blocks[b].ref_count for b in parent.block_table] == [2, 2]
    assert bm.blocks_needed(child, 7) == 1  # the partial block it writes (the full one is only read)
    bm.allocate(child, 7)
    full, partial = parent.block_table
    assert child.block_table[0] == full and child.block_table[1] != partial
    assert bm.take_copies() == [(partial, child.block_table[1])] and bm.take_copies() == []
    assert bm.blocks[partial].ref_count == 1 and bm.blocks[full].ref_count == 2
    parent.token_ids.append(7)  # the parent now holds its partial block alone: written in place
    bm.allocate(parent, 7)
    assert parent.block_table == [full, partial] and bm.take_copies() == []
    bm.free(child)
    bm.free(parent)
    assert bm.num_free_blocks == 8 and all(b.ref_count == 0 for b in bm.blocks)


def test_a_cow_fork_copies_the_partial_block_and_leaves_the_parents_kv_unchanged(tiny_folder):
    engine = make_engine(tiny_folder)
    prompt = prompts(1, seed=3)[0]  # 20 tokens, blocks of 16: the prompt's last block holds 4
    root = engine.add_request(beam_request(prompt, BeamSpec(2, 2), 4, [2]))
    engine.step()  # the prompt's prefill gives the root's candidates; two children fork from it
    a, b = root.beam.seqs
    assert a.block_table == b.block_table and not root.block_table
    shared = a.block_table[-1]
    kv = engine.runner.kv_caches
    before = [(k[shared].clone(), v[shared].clone()) for k, v in kv]
    assert engine.block_manager.blocks[shared].ref_count == 2
    tables = []  # the parents' block tables as each selection releases them
    release = engine.scheduler.replace_beams
    engine.scheduler.replace_beams = lambda parents, children: (
        tables.append([list(p.block_table) for p in parents]), release(parents, children))
    engine.step()  # both decode their token at position 20, in the shared block: one copies it first
    table_a, table_b = tables[-1]
    last_a, last_b = table_a[-1], table_b[-1]
    assert shared in (last_a, last_b) and last_a != last_b
    assert table_a[:-1] == table_b[:-1]  # the full block stays shared
    for (k, v), (k0, v0) in zip(kv, before):
        for block in (last_a, last_b):
            assert torch.equal(k[block][:4], k0[:4]) and torch.equal(v[block][:4], v0[:4])
        assert not torch.equal(k[last_a][4], k[last_b][4])  # each child's own token at position 20
    while engine.has_work():
        engine.step()
    assert root.is_finished and pool_is_whole(engine)


def test_the_pool_is_whole_after_a_search_and_after_an_aborted_one(tiny_folder):
    engine = make_engine(tiny_folder)
    prompt = prompts(1, seed=4)[0]
    done = engine.add_request(beam_request(prompt, BeamSpec(3, 2), 5, [2]))
    outputs = []
    while engine.has_work():
        outputs += engine.step()
    (seq, events), = outputs
    assert seq is done and len(events[-1].beams) == 2 and pool_is_whole(engine)
    aborted = engine.add_request(beam_request(prompt, BeamSpec(4, 4), 8, [2]))
    for _ in range(3):
        engine.step()
    assert len(aborted.beam.seqs) == 4
    engine.abort(aborted, "cancelled")
    assert pool_is_whole(engine)
    end = aborted.finished_output()
    assert end.reason == "cancelled" and len(end.beams) == 4  # the best beams so far


def test_a_pool_too_small_for_every_beam_parks_and_recomputes_them_to_the_same_result(tiny_folder):
    prompt = prompts(1, seed=5)[0]
    spec = BeamSpec(4, 3)
    results = []
    roomy = 4 << 20
    for kv_bytes in (roomy, None):
        if kv_bytes is None:  # nine blocks of 4 tokens for four beams of up to 26 tokens
            kv_bytes = 9 * roomy // engine.block_manager.num_blocks
        engine = make_engine(tiny_folder, block_size=4, kv_cache_bytes=kv_bytes)
        root = engine.add_request(beam_request(prompt, spec, 6, [2]))
        while engine.has_work():
            engine.step()
        assert pool_is_whole(engine)
        results.append([(b.output, round(b.cum_logprob, 3)) for b in root.finished_output().beams])
    assert engine.block_manager.num_blocks == 9 and engine.scheduler.num_preemptions > 0
    assert results[0] == results[1]


def test_a_beam_request_the_engine_cannot_run_is_refused(tiny_folder):
    from inference.engine.outputs import RequestRejected
    from inference.engine.request import EngineRequest

    engine = make_engine(tiny_folder, max_num_seqs=4)
    prompt = prompts(1)[0]
    for request in (EngineRequest(prompt, SamplingParams(temperature=0, max_tokens=3), beam=BeamSpec(2, 2)),
                    beam_request(prompt, BeamSpec(2, 3), 3, [2]), beam_request(prompt, BeamSpec(5, 1), 3, [2])):
        with pytest.raises(RequestRejected):
            engine.add_request(request)
    assert not engine.scheduler.waiting


def test_a_search_whose_selection_raises_fails_alone_and_frees_its_blocks(tiny_folder, monkeypatch):
    from inference.engine.beam_search import BeamSearch
    from inference.engine.outputs import Failed, Finished
    from inference.engine.request import EngineRequest

    engine = make_engine(tiny_folder)
    prompt = prompts(1, seed=6)[0]
    other = engine.add_request(EngineRequest(prompt, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)))
    broken = engine.add_request(beam_request(prompt, BeamSpec(2, 2), 4, [2]))
    calls = []
    real = BeamSearch.advance

    def advance(self, tops):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("broken selection")
        return real(self, tops)
    monkeypatch.setattr(BeamSearch, "advance", advance)
    ends = {}
    while engine.has_work():
        for seq, events in engine.step():
            ends.update({id(seq): e for e in events if isinstance(e, (Failed, Finished))})
    assert isinstance(ends[id(broken)], Failed) and "broken selection" in ends[id(broken)].message
    assert isinstance(ends[id(other)], Finished) and other.num_output_tokens == 4
    assert pool_is_whole(engine)


def test_a_search_is_one_running_request_and_every_beams_tokens_count_as_generated(tiny_folder):
    engine = make_engine(tiny_folder)
    prompt = prompts(1, seed=5)[0]
    engine.add_request(beam_request(prompt, BeamSpec(3, 2), 6, [2]))
    plain = engine.add_request(make_plain_request(prompt))
    schedule, rows = engine.scheduler.schedule, []

    def counting_schedule():
        batch = schedule()
        rows.append(sum(1 for seq, _ in batch.items if seq.beam is not None))  # a beam's row: one candidate set
        return batch

    engine.scheduler.schedule = counting_schedule
    seen_two = False
    while engine.has_work():
        if any(s.beam is not None for s in engine.scheduler.running) and plain in engine.scheduler.running:
            assert engine.scheduler.num_running_requests() == 2  # 1 to 3 live beams, and the plain request
            seen_two = True
        engine.step()
    assert seen_two and max(rows) == 3
    # every beam row a generated token, beside the plain request's own; each request's first token once
    assert engine.stats.generation_tokens == sum(rows) + plain.num_output_tokens
    assert engine.stats.ttft_s.count == 2


def make_plain_request(prompt):
    from inference.engine.request import EngineRequest
    return EngineRequest(prompt, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
