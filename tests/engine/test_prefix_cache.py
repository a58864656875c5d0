"""Prefix caching: hits reuse blocks and give the same tokens; salts separate tenants; LRU eviction."""
import asyncio

import pytest
import torch

from inference.engine.async_engine import AsyncEngine
from inference.engine.block_manager import BlockManager
from inference.engine.outputs import TokenEvent
from inference.engine.sampling_params import SamplingParams
from inference.engine.sequence import Sequence
from inference.engine.request import EngineRequest

from .test_async_engine import make_engine
from .tiny_models import make_tiny_model


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return make_tiny_model("qwen2", tmp_path_factory.mktemp("tiny") / "qwen2")


async def run_one(ae, prompt, salt="", **kw):
    handle = ae.submit(EngineRequest(prompt, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, **kw), cache_salt=salt))
    tokens, end = [], None
    async for ev in handle:
        if isinstance(ev, TokenEvent):
            tokens.append(ev.token_id)
        else:
            end = ev
    return tokens, end


def test_it_reuses_a_cached_prefix_and_gives_the_same_tokens(tiny_folder):
    engine = make_engine(tiny_folder)
    ae = AsyncEngine(engine)
    prompt = torch.randint(3, 320, (70,), generator=torch.Generator().manual_seed(0)).tolist()

    async def run():
        first = await run_one(ae, prompt)
        second = await run_one(ae, prompt)
        other_tenant = await run_one(ae, prompt, salt="tenant-b")
        longer = await run_one(ae, prompt + [5, 6, 7])
        return first, second, other_tenant, longer

    first, second, other, longer = asyncio.run(run())
    assert first[1].cached_tokens == 0
    assert second[0] == first[0]
    # 4 full blocks of 16, and of the first request's last block (its prompt's 6 tokens and 7 of its 8
    # output tokens computed) all but the prompt's last token, which is computed again.
    assert second[1].cached_tokens == 69
    assert other[1].cached_tokens == 0 and other[0] == first[0]
    # The longer prompt's block 4 starts with the 6 prompt tokens, then 5, 6, 7: the tail covers what it shares.
    shared = 6 + next((i for i, (a, b) in enumerate(zip(first[0], [5, 6])) if a != b), 2)
    assert longer[1].cached_tokens == 64 + shared
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    ae.stop()


def test_the_next_turn_of_a_conversation_reuses_the_last_turns_partial_block_and_gives_the_same_tokens(tiny_folder):
    """A prompt that continues the previous request's prompt and output computes only what follows its K/V
    (full blocks and the tail), and answers as an engine without a prefix cache does."""
    cached, plain = AsyncEngine(make_engine(tiny_folder)), AsyncEngine(make_engine(tiny_folder, enable_prefix_caching=False))
    prompt = torch.randint(3, 320, (37,), generator=torch.Generator().manual_seed(4)).tolist()

    async def conversation(ae):
        first = await run_one(ae, prompt)
        second = await run_one(ae, prompt + first[0] + [5, 6, 7])
        third = await run_one(ae, prompt + first[0] + [5, 6, 7] + second[0] + [9])
        return first, second, third

    try:
        ours, theirs = asyncio.run(conversation(cached)), asyncio.run(conversation(plain))
    finally:
        cached.stop()
        plain.stop()
    assert [r[0] for r in ours] == [r[0] for r in theirs]
    # First turn: 37 + 7 tokens computed (the 8th output token never is): 2 full blocks and 12 tokens of a
    # third, all reused by the second turn; the second turn's 48 + 7 computed give the third 55.
    assert [r[1].cached_tokens for r in ours] == [0, 44, 55]
    assert all(r[1].cached_tokens == 0 for r in theirs)


def finish(bm, s):
    """`s` computed whole, then freed as a sequence that finished."""
    bm.allocate(s, len(s.token_ids))
    s.num_computed_tokens = len(s.token_ids)
    bm.cache_full_blocks(s)
    bm.free(s, keep_tail=True)


def tails(bm):
    return {b.block_id: b.token_ids for b in bm.blocks if b.tail_key is not None}


def test_a_finished_sequences_partial_block_serves_prompts_that_start_with_its_tokens():
    bm = BlockManager(8, 4)
    finish(bm, seq(range(10, 20)))  # 2 full blocks, then 18 and 19 in a third
    [(tail, toks)] = tails(bm).items()
    assert toks == (18, 19)
    again = seq(range(10, 20))
    assert bm.match_prefix(again) == 9  # its last token (19) is computed again
    assert bm.take_copies() == [(tail, again.block_table[2])] and again.num_hashed_blocks == 2
    bm.free(again)
    longer = seq(range(10, 22))
    assert bm.match_prefix(longer) == 10
    bm.free(longer)
    assert bm.take_copies() == []  # a sequence that never ran drops its copy with its blocks
    assert bm.match_prefix(seq(range(10, 20), salt="t2")) == 0 and bm.take_copies() == []
    assert bm.match_prefix(seq([*range(10, 18), 99, 19])) == 8


def test_the_cached_block_holding_a_prompts_last_token_gives_the_tokens_before_it():
    bm = BlockManager(8, 4)
    finish(bm, seq(range(10, 18)))  # two full blocks, no tail
    assert tails(bm) == {}
    again = seq(range(10, 18))
    assert bm.match_prefix(again) == 7
    [(source, destination)] = bm.take_copies()
    assert bm.blocks[source].token_ids == (14, 15, 16, 17) and destination == again.block_table[1] != source


def test_tails_are_kept_once_replaced_by_longer_ones_evicted_and_reset():
    bm = BlockManager(6, 4)
    finish(bm, seq(range(10, 19)))
    finish(bm, seq(range(10, 19)))  # the same tail again: kept once
    assert list(tails(bm).values()) == [(18,)]
    finish(bm, seq(range(10, 21)))  # (18, 19, 20) extends it: the shorter one is dropped
    assert list(tails(bm).values()) == [(18, 19, 20)]
    finish(bm, seq(range(10, 20)))  # (18, 19) is covered by the longer one
    assert list(tails(bm).values()) == [(18, 19, 20)]
    assert bm.reset_prefix_cache() == 2 and tails(bm) == {} and bm.tails == {}
    finish(bm, seq(range(10, 19)))
    hog = seq(range(500, 524))  # every block of the pool: the tail's is handed out, and forgotten
    bm.allocate(hog, 24)
    assert tails(bm) == {} and bm.tails == {}


def test_a_sequence_that_failed_or_shares_its_last_block_leaves_no_tail():
    bm = BlockManager(8, 4)
    s = seq(range(10, 19))
    bm.allocate(s, 9)
    s.num_computed_tokens = 9
    bm.free(s)  # keep_tail is the scheduler's word for a sequence that finished whole
    assert tails(bm) == {}
    parent, child = seq(range(10, 19)), seq(range(10, 19))
    bm.allocate(parent, 9)
    parent.num_computed_tokens = 9
    bm.fork(parent, child)
    bm.free(parent, keep_tail=True)
    assert tails(bm) == {}


def test_the_hybrid_pools_keep_no_tails():
    from inference.engine.hybrid_block_manager import HybridBlockManager

    hybrid = HybridBlockManager(BlockManager(8, 4), BlockManager(8, 4, table="window_table",
                                                                  hashed="num_window_hashed_blocks"), 8)
    assert not hybrid.full.tail_cache and not hybrid.window.tail_cache


def test_it_shares_the_prompt_between_simultaneous_identical_requests(tiny_folder):
    engine = make_engine(tiny_folder)
    ae = AsyncEngine(engine)
    prompt = torch.randint(3, 320, (50,), generator=torch.Generator().manual_seed(1)).tolist()

    async def run():
        return await asyncio.gather(*(run_one(ae, prompt, seed=i) for i in range(3)))

    results = asyncio.run(run())
    assert sorted(r[1].cached_tokens for r in results) == [0, 48, 48]
    assert len({tuple(r[0]) for r in results}) == 1
    ae.stop()


def seq(tokens, salt=""):
    return Sequence("r", list(tokens), SamplingParams(), cache_salt=salt)


def compute_all(bm, s):
    bm.allocate(s, len(s.token_ids))
    s.num_computed_tokens = len(s.token_ids)
    bm.cache_full_blocks(s)


def test_it_evicts_the_least_recently_used_cached_block_first():
    bm = BlockManager(4, 4)
    a, b = seq(range(100, 109)), seq(range(200, 209))  # 2 full blocks + 1 partial each
    compute_all(bm, a)
    bm.free(a)
    compute_all(bm, b)  # a's uncached partial first, then the never-used block, then a's LRU cached block
    bm.free(b)
    c = seq(range(100, 109))
    # a's blocks were freed last-first, so its second block was the least recently used and went
    # to b; its first block still hits.
    assert bm.match_prefix(c) == 4
    bm.free(c)
    # b's two full blocks were cached last, so they survive; a fresh copy of b hits both.
    d = seq(range(200, 209))
    assert bm.match_prefix(d) == 8


def test_it_never_hits_on_different_tokens_or_salts():
    bm = BlockManager(8, 4)
    a = seq(range(10, 19), salt="t1")
    compute_all(bm, a)
    assert bm.match_prefix(seq(range(10, 19), salt="t2")) == 0
    assert bm.match_prefix(seq([10, 11, 12, 99, 14, 15, 16, 17, 18], salt="t1")) == 0
    hit = seq([10, 11, 12, 13, 99, 15, 16, 17, 18], salt="t1")
    assert bm.match_prefix(hit) == 4


def test_a_block_is_hashed_once_however_often_its_prefix_is_looked_up(monkeypatch):
    from inference.engine import block_manager

    calls = []
    real = block_manager.block_hash
    monkeypatch.setattr(block_manager, "block_hash", lambda *a: calls.append(a) or real(*a))
    bm = BlockManager(16, 4)
    s = seq(range(10, 51))  # 41 tokens: 10 full blocks
    for _ in range(5):
        assert bm.next_uncached_hash(s) is not None
    assert bm.match_prefix(s) == 0 and len(calls) == 10
    compute_all(bm, s)
    s.token_ids.extend([7, 8, 9])  # 44 tokens: the 11th block fills
    bm.allocate(s, len(s.token_ids))
    s.num_computed_tokens = len(s.token_ids)
    bm.cache_full_blocks(s)
    assert len(calls) == 11
    assert bm.match_prefix(seq(range(10, 51))) == 40  # the hashes kept are the chain's
