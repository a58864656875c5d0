"""Two KV block pools for a model with sliding-window layers beside full-attention ones (Gemma 3):
the full layers keep every block of a sequence, the window layers only the blocks their window
still reaches (vLLM's hybrid KV cache manager: one block table per layer group).

The full pool is the sequence's `block_table`; the window pool its `window_table`, indexed the same
way (entry b holds tokens b * block_size onwards), whose entries before the window are
released (BlockManager.NO_BLOCK) as the sequence advances: after a step, a query at position p
reads positions p - window + 1 .. p, so blocks wholly before num_computed_tokens - window + 1
are no longer read. Both pools hash their full blocks by the same chained hashes, so a prefix
hit is the longest prefix the full pool holds whose last `window` positions the window pool
holds too. Allocation, copy-on-write forks, truncation and freeing apply to both; a sequence
runs only where both have room (so preemption also frees window blocks).
"""
from __future__ import annotations

from .block_manager import BlockManager
from .sequence import Sequence


class HybridBlockManager:
    """BlockManager's interface over a full pool and a window pool.

    full: the full-attention layers' pool (block_table); window: the window layers' pool
    (window_table); window_tokens: the sliding window (config sliding_window). The scheduler,
    snapshot and metrics see the full pool's figures (num_blocks, blocks, free_list, ...); the
    window pool's copy-on-write copies come from take_window_copies.
    """

    def __init__(self, full: BlockManager, window: BlockManager, window_tokens: int):
        if full.block_size != window.block_size:
            raise ValueError("both pools need the same block size")
        self.full = full
        self.window = window
        self.window_tokens = window_tokens
        full.tail_cache = window.tail_cache = False  # a tail hit in one pool could not be matched in the other

    # The full pool's figures stand for the manager's.
    @property
    def num_blocks(self) -> int:
        return self.full.num_blocks

    @property
    def block_size(self) -> int:
        return self.full.block_size

    @property
    def enable_prefix_caching(self) -> bool:
        return self.full.enable_prefix_caching

    @property
    def blocks(self):
        return self.full.blocks

    @property
    def free_list(self):
        return self.full.free_list

    @property
    def num_free_blocks(self) -> int:
        return self.full.num_free_blocks

    @property
    def num_cache_hits(self) -> int:
        return self.full.num_cache_hits

    def first_needed(self, next_position: int) -> int:
        """The first window-table index a query at `next_position` or later reads."""
        return max(0, next_position - self.window_tokens + 1) // self.block_size

    def can_allocate(self, seq: Sequence, num_tokens: int) -> bool:
        return self.full.can_allocate(seq, num_tokens) and self.window.can_allocate(seq, num_tokens)

    def allocate(self, seq: Sequence, num_tokens: int) -> None:
        """Grow both tables to cover `num_tokens` tokens. Raises RuntimeError when a pool is short."""
        if not self.can_allocate(seq, num_tokens):
            raise RuntimeError("KV pool exhausted")
        self.full.allocate(seq, num_tokens)
        self.window.allocate(seq, num_tokens)

    def fork(self, parent: Sequence, child: Sequence) -> None:
        self.full.fork(parent, child)
        self.window.fork(parent, child)

    def take_copies(self) -> list[tuple[int, int]]:
        """The full pool's copy-on-write copies (source, destination), as BlockManager.take_copies."""
        return self.full.take_copies()

    def take_window_copies(self) -> list[tuple[int, int]]:
        """The window pool's copy-on-write copies, for the window layers' caches."""
        return self.window.take_copies()

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        self.full.truncate(seq, num_tokens)
        self.window.truncate(seq, num_tokens)

    def free(self, seq: Sequence, keep_tail: bool = False) -> None:
        """Release both tables (the pools keep no tails: a tail hit in one could not be matched in the other)."""
        self.window.free(seq)
        self.full.free(seq)

    def reset_prefix_cache(self) -> int:
        """Forget both pools' cached blocks no sequence holds (BlockManager.reset_prefix_cache; only the full
        pool reports KV events). Returns how many full-pool blocks were forgotten."""
        self.window.reset_prefix_cache()
        return self.full.reset_prefix_cache()

    def next_uncached_hash(self, seq: Sequence) -> int | None:
        return self.full.next_uncached_hash(seq)

    def block_hash_at(self, seq: Sequence, index: int) -> int:
        return self.full.block_hash_at(seq, index)

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Register newly computed full blocks in both caches, then release the window blocks no
        query to come reads (call after each step, as BlockManager.cache_full_blocks)."""
        self.full.cache_full_blocks(seq)
        self.window.cache_full_blocks(seq)
        self.window.release_before(seq, self.first_needed(seq.num_computed_tokens))

    def match_prefix(self, seq: Sequence) -> int:
        """At admission: the longest cached prefix (whole blocks) the full pool holds whose window the
        window pool holds too (the blocks from first_needed(hit) to the hit). Sets both tables and
        num_computed_tokens; returns the tokens reused."""
        reused = self.full.match_prefix(seq)
        if not reused:
            return 0
        bs = self.block_size
        hit = reused // bs
        while hit:
            first = self.first_needed(hit * bs)
            found = [self.window.cached_block(seq, b) for b in range(first, hit)]
            if all(bid is not None for bid in found):
                break
            hit -= 1
        table = self.full.table_of(seq)
        if hit < len(table):  # the full pool's longer hit is given back
            self.full.num_cache_hits -= (len(table) - hit) * bs
            self.full.truncate(seq, hit * bs)
            seq.num_hashed_blocks = hit
        seq.num_computed_tokens = hit * bs
        if not hit:
            return 0
        first = self.first_needed(hit * bs)
        for bid in found:
            self.window.take_cached(bid)
        seq.window_table = [BlockManager.NO_BLOCK] * first + found
        seq.num_window_hashed_blocks = hit
        return hit * bs
