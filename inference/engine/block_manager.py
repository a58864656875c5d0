"""KV block pool bookkeeping: which blocks are free, which a sequence owns (never tensors)."""
from __future__ import annotations

from collections import deque

from .sequence import Sequence


class BlockManager:
    """Hands out fixed-size KV blocks (block_size tokens each) from a pool of num_blocks.

    A sequence's block_table grows as its tokens are computed; `free` returns its
    blocks to the pool. Invariant: every block is either free or in exactly one
    sequence's table.
    """

    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks <= 0:
            raise ValueError("the KV pool needs at least one block")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.free_blocks: deque[int] = deque(range(num_blocks))

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """Extra blocks `seq` needs to hold its first `num_tokens` tokens' K/V."""
        total = -(-num_tokens // self.block_size)
        return max(0, total - len(seq.block_table))

    def can_allocate(self, seq: Sequence, num_tokens: int) -> bool:
        return self.blocks_needed(seq, num_tokens) <= len(self.free_blocks)

    def allocate(self, seq: Sequence, num_tokens: int) -> None:
        """Grow `seq.block_table` to cover `num_tokens` tokens. Raises RuntimeError when the pool is short."""
        need = self.blocks_needed(seq, num_tokens)
        if need > len(self.free_blocks):
            raise RuntimeError(f"KV pool exhausted: need {need} blocks, {len(self.free_blocks)} free")
        for _ in range(need):
            seq.block_table.append(self.free_blocks.popleft())

    def free(self, seq: Sequence) -> None:
        """Return all of `seq`'s blocks to the pool and forget its cached progress."""
        self.free_blocks.extend(seq.block_table)
        seq.block_table = []
        seq.num_computed_tokens = 0
