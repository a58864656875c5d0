"""The prefix cache's changes as KV cache events: stores in chain order, evictions, salts kept apart, a reset of
the cache, one batch a step."""
import asyncio

import pytest
import torch

from inference.engine.async_engine import AsyncEngine
from inference.engine.block_manager import BlockManager
from inference.engine.config import EngineConfig
from inference.engine.hybrid_block_manager import HybridBlockManager
from inference.engine.kv_events import (AllBlocksCleared, BlockRemoved, BlockStored, KVEventRecorder, sequence_salt,
                                           tenant_salt)
from inference.engine.outputs import Finished
from inference.engine.request import EngineRequest
from inference.engine.sampling_params import SamplingParams
from inference.engine.sequence import Sequence

from .tiny_models import make_tiny_model


def seq(tokens, salt=""):
    return Sequence("r", list(tokens), SamplingParams(), cache_salt=salt)


def compute(bm, s, upto=None):
    upto = len(s.token_ids) if upto is None else upto
    bm.allocate(s, upto)
    s.num_computed_tokens = upto
    bm.cache_full_blocks(s)


def test_it_reports_each_run_of_newly_cached_blocks_after_its_parent():
    recorder = KVEventRecorder()
    bm = BlockManager(8, 4, kv_events=recorder)
    a = seq(range(100, 111), salt="tenant-a")  # 2 full blocks and a partial one
    compute(bm, a, upto=4)
    compute(bm, a)
    first, second = recorder.take()
    hashes = [h for h, _ in bm.full_blocks(a)]
    assert first == BlockStored([hashes[0]], None, [100, 101, 102, 103], 4, "tenant-a", None)
    assert second == BlockStored([hashes[1]], hashes[0], [104, 105, 106, 107], 4, "tenant-a", None)
    assert recorder.take() == []

    # The same prompt again hits the cache: nothing new is stored. A longer one stores only its new blocks.
    b = seq(list(range(100, 111)) + [7, 8, 9, 10])
    b.cache_salt = "tenant-a"
    assert bm.match_prefix(b) == 8
    compute(bm, b)
    (stored,) = recorder.take()
    assert stored.parent_block_hash == hashes[1] and stored.token_ids == [108, 109, 110, 7]


def test_it_reports_an_eviction_only_when_a_cached_block_is_reused():
    recorder = KVEventRecorder()
    bm = BlockManager(2, 4, kv_events=recorder)
    a = seq(range(10, 18))  # exactly two full blocks
    compute(bm, a)
    stored = recorder.take()
    bm.free(a)
    assert recorder.take() == []  # freed, still cached: nothing to say
    b = seq(range(50, 54))
    compute(bm, b)  # takes the least recently used cached block: a's second (freed last-first)
    events = recorder.take()
    assert events[0] == BlockRemoved([stored[0].block_hashes[1]])
    assert events[1].token_ids == [50, 51, 52, 53]


def test_two_tenants_get_different_hashes_for_the_same_tokens_and_their_salts_kept():
    recorder = KVEventRecorder()
    bm = BlockManager(8, 4, kv_events=recorder)
    compute(bm, seq(range(10, 14), salt="t1"))
    compute(bm, seq(range(10, 14), salt=sequence_salt("t2", 7)))
    one, two = recorder.take()
    assert one.token_ids == two.token_ids and one.block_hashes != two.block_hashes
    assert (one.cache_salt, two.cache_salt) == ("t1", "t2")
    assert tenant_salt(sequence_salt("t2", 7)) == "t2" and sequence_salt("t2", None) == "t2"


def test_a_reset_forgets_the_blocks_no_sequence_holds_and_says_which():
    recorder = KVEventRecorder()
    bm = BlockManager(8, 4, kv_events=recorder)
    running, done = seq(range(10, 19)), seq(range(50, 59))  # two full blocks each
    compute(bm, running)
    compute(bm, done)
    bm.free(done)
    recorder.take()
    freed = [h for h, _ in bm.full_blocks(done)]

    assert bm.reset_prefix_cache() == 2
    (removed,) = recorder.take()  # the running sequence's blocks stay cached (and announced)
    assert isinstance(removed, BlockRemoved) and sorted(removed.block_hashes) == sorted(freed)
    again = seq(range(50, 59))
    assert bm.match_prefix(again) == 0
    shared = seq(range(10, 19))
    assert bm.match_prefix(shared) == 8  # a held block still serves a hit
    assert bm.num_free_blocks == bm.num_blocks - 3  # running's 3 blocks (shared's hit is two of them)

    for s in (running, shared, again):
        bm.free(s)
    assert bm.reset_prefix_cache() == 2
    assert recorder.take() == [AllBlocksCleared()]  # nothing is cached any more
    assert bm.reset_prefix_cache() == 0 and recorder.take() == [AllBlocksCleared()]
    assert bm.num_free_blocks == bm.num_blocks and not bm.cached


def test_a_reset_empties_both_pools_of_a_hybrid_manager():
    recorder = KVEventRecorder()
    bm = HybridBlockManager(BlockManager(16, 4, kv_events=recorder),
                            BlockManager(8, 4, table="window_table", hashed="num_window_hashed_blocks"), 8)
    s = seq(range(100, 113))
    bm.allocate(s, 13)
    s.num_computed_tokens = 13
    bm.cache_full_blocks(s)
    bm.free(s)
    assert bm.reset_prefix_cache() == 3
    assert recorder.take()[-1] == AllBlocksCleared() and not bm.full.cached and not bm.window.cached
    assert bm.match_prefix(seq(range(100, 113))) == 0


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return make_tiny_model("llama", tmp_path_factory.mktemp("tiny") / "llama")


def test_the_engine_hands_out_each_steps_events_once_and_only_when_there_are_some(tiny_folder):
    batches = []
    config = EngineConfig(model_path=str(tiny_folder), kv_cache_bytes=4 << 20, weights="model")
    ae = AsyncEngine(config=config, kv_events=batches.append)
    prompt = torch.randint(3, 320, (40,), generator=torch.Generator().manual_seed(0)).tolist()

    async def run(salt):
        handle = ae.submit(EngineRequest(prompt, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True),
                                         cache_salt=salt))
        return [ev async for ev in handle if isinstance(ev, Finished)][0]

    try:
        first = asyncio.run(run("t1"))
        again = asyncio.run(run("t1"))
    finally:
        ae.stop()
    assert first.cached_tokens == 0 and again.cached_tokens == 39  # 2 full blocks, 7 tokens of the tail
    assert len(batches) == 1  # the first prefill's step; decode steps that fill no block publish nothing
    stored = [e for batch in batches for e in batch if isinstance(e, BlockStored)]
    # The prompt's two full blocks in one event from the sequence's start; the hit stored nothing new.
    assert stored[0].parent_block_hash is None and stored[0].token_ids == prompt[:32]
    assert sum(len(e.block_hashes) for e in stored) == 2 and all(e.cache_salt == "t1" for e in stored)
