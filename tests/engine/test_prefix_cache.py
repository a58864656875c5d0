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
    assert second[1].cached_tokens == 64  # 4 full blocks of 16; the block of the last token is computed
    assert other[1].cached_tokens == 0 and other[0] == first[0]
    assert longer[1].cached_tokens == 64
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    ae.stop()


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
