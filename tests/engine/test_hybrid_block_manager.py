"""HybridBlockManager: the window pool releases blocks the window has passed, a prefix hit is the longest
one whose window the window pool still holds, and both pools come back whole."""
from inference.engine.block_manager import BlockManager
from inference.engine.hybrid_block_manager import HybridBlockManager
from inference.engine.sampling_params import SamplingParams
from inference.engine.sequence import Sequence

NO = BlockManager.NO_BLOCK


def manager(full=32, window=8, window_tokens=10, bs=4):
    return HybridBlockManager(BlockManager(full, bs),
                              BlockManager(window, bs, table="window_table", hashed="num_window_hashed_blocks"),
                              window_tokens)


def seq(tokens):
    return Sequence("r", list(tokens), SamplingParams())


def compute(bm, s, upto):
    bm.allocate(s, upto)
    s.num_computed_tokens = upto
    bm.cache_full_blocks(s)


def whole(bm):
    return all(p.num_free_blocks == p.num_blocks for p in (bm.full, bm.window))


def test_the_window_pool_releases_what_the_window_passed():
    bm = manager()
    s = seq(range(100, 130))
    compute(bm, s, 20)  # the next query (position 20) reads 11..20: blocks 2 onwards
    assert len(s.block_table) == 5
    assert s.window_table[:2] == [NO, NO] and NO not in s.window_table[2:]
    assert bm.window.num_blocks - bm.window.num_free_blocks == 3
    compute(bm, s, 29)  # reads 20..29: blocks 5 onwards
    assert s.window_table[:5] == [NO] * 5 and len(s.window_table) == 8
    bm.free(s)
    assert whole(bm)


def test_a_prefix_hit_needs_the_window_of_its_end():
    bm = manager(window=8)
    tokens = list(range(100, 125))
    first = seq(tokens)
    compute(bm, first, 25)
    bm.free(first)
    again = seq(tokens)
    # The full pool holds blocks 0..5 (24 tokens, never the block of the last token); the window of
    # position 24 is 15..24: blocks 3..5, still cached in the window pool.
    assert bm.match_prefix(again) == 24
    assert again.window_table[:3] == [NO] * 3 and NO not in again.window_table[3:]
    bm.free(again)
    # Other tokens take the window pool's blocks, evicting the cached ones.
    other = seq(range(500, 532))
    compute(bm, other, 32)
    bm.free(other)
    third = seq(tokens)
    reused = bm.match_prefix(third)
    assert reused < 24 and third.num_computed_tokens == reused
    assert len(third.block_table) == reused // 4 and bm.full.num_cache_hits == 24 + reused
    bm.free(third)
    assert whole(bm)


def test_a_fork_shares_both_tables_and_copies_on_write():
    bm = manager()
    parent = seq(range(100, 118))
    compute(bm, parent, 18)
    child = seq([])
    child.token_ids = list(parent.token_ids)
    bm.fork(parent, child)
    assert child.window_table == parent.window_table and child.block_table == parent.block_table
    parent.token_ids.append(7)
    child.token_ids.append(8)
    bm.allocate(parent, 19)
    bm.allocate(child, 19)  # block 4 (tokens 16..19) is shared: each writer gets its own in both pools
    assert bm.take_copies() and bm.take_window_copies()
    assert parent.block_table[4] != child.block_table[4] and parent.window_table[4] != child.window_table[4]
    bm.free(parent)
    bm.free(child)
    assert whole(bm)
