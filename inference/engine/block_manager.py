"""KV block pool bookkeeping and the prefix cache: which blocks are free, shared or cached (never tensors).

Prefix caching (vLLM's automatic prefix caching; nano-vllm's layout): a full block
is identified by a chained hash of (parent block's hash, its token ids, the cache
salt). A hit re-checks the tokens. The block holding the last prompt token is never
taken from the cache, so at least one token is always computed. Freed blocks keep
their contents and stay reusable until evicted, least recently used first. The
salt (the tenant) keeps one tenant's cached blocks from ever serving another.

With a KVEventRecorder (kv_events.py), every block that enters the cache, every cached block
evicted and a reset of the cache (`reset_prefix_cache`) are reported to it, as vLLM's KV cache events
describe them.

Partial blocks (the tail cache, the token-granular reuse of SGLang's radix cache and llama.cpp's
slots, at a block copy's cost): when a sequence finishes, its last block's computed tokens that do not
fill it stay reusable too, keyed by (the chained hash of the block before, the salt). A prompt whose
first uncached block starts with some of those tokens, or with some of a cached full block's (the one
holding its last token), gets a fresh block with that block's K/V copied in (a pending copy, below)
and computes only the rest: a repeated prompt or the next turn of a conversation computes its last
token or its new text, not up to a block more. A tail is one more unreferenced block in the least
recently used order; kv_events never hears of it (vLLM's events describe full blocks only).

Copy-on-write (beam search's forks): `fork` gives a child its parent's whole block table
(refcounts + 1). A block is written only by a sequence that holds it alone: `allocate`
first replaces every shared block in the range a sequence is about to write by a fresh one
and records (source, destination) in `pending_copies`; the model runner copies those
blocks' K/V before the step's forward (ModelRunner.copy_blocks).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from .kv_events import KVEventRecorder
from .sequence import Sequence


@dataclass(slots=True)
class Block:
    """One KV block: how many sequences use it, and its hash and tokens once full and cached."""

    block_id: int
    ref_count: int = 0
    block_hash: int | None = None
    token_ids: tuple[int, ...] = ()  # a cached full block's tokens, or a tail's computed ones
    tail_key: tuple | None = None  # a tail's (parent block hash, salt): BlockManager.tails


def block_hash(parent: int | None, token_ids: tuple[int, ...], salt: str) -> int:
    """The chained hash of a full block (64-bit Python hash; hits re-check the tokens)."""
    return hash((parent, token_ids, salt))


class BlockManager:
    """Hands out fixed-size KV blocks (block_size tokens each) from a pool of num_blocks.

    Invariant: a block is in `free_list` (ref_count 0, possibly still cached) or referenced
    by ref_count sequences' block tables. `num_free_blocks` counts both never-used and
    cached-but-unreferenced blocks: all of them can be handed out.
    """

    # A block table entry whose block was released while the table still covers its tokens (a
    # sliding-window layer group's blocks that fell out of the window: hybrid_block_manager.py).
    NO_BLOCK = -1

    # The most tails kept under one key (the oldest dropped first): a prompt's match scans them all.
    MAX_TAILS_PER_KEY = 16

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 table: str = "block_table", hashed: str = "num_hashed_blocks",
                 kv_events: KVEventRecorder | None = None, tail_cache: bool = True):
        """table, hashed: the Sequence attributes holding this pool's block table and the count of its
        leading blocks registered in the prefix cache (a second pool keeps its own pair). kv_events: told of
        every block cached and every cached block evicted (None: nobody listens). tail_cache: keep finished
        sequences' partial last blocks for reuse (the module's rule; only with prefix caching; a pool whose
        hits must agree with another's, hybrid_block_manager's, keeps none)."""
        self.kv_events = kv_events
        self.table = table
        self.hashed = hashed
        if num_blocks <= 0:
            raise ValueError("the KV pool needs at least one block")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Unreferenced blocks, least recently used first (evicted from the front).
        self.free_list: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.cached: dict[int, int] = {}  # block hash -> block id
        self.tail_cache = tail_cache and enable_prefix_caching
        self.tails: dict[tuple, dict[int, None]] = {}  # (parent hash, salt) -> tail block ids, oldest first
        self.num_cache_hits = 0  # tokens
        # (source block, destination block) K/V copies of copy-on-write, for the next forward (take_copies).
        self.pending_copies: list[tuple[int, int]] = []

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_list)

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """Extra blocks `seq` needs to hold its first `num_tokens` tokens' K/V: new ones past its block
        table, and a copy of each shared block it would write (positions num_computed_tokens onwards)."""
        total = -(-num_tokens // self.block_size)
        return max(0, total - len(self.table_of(seq))) + len(self._shared_in_write_range(seq, num_tokens))

    def table_of(self, seq: Sequence) -> list[int]:
        """`seq`'s block table in this pool."""
        return getattr(seq, self.table)

    def _shared_in_write_range(self, seq: Sequence, num_tokens: int) -> list[int]:
        """Indices into seq.block_table of blocks other sequences also hold that `seq` would write to
        compute its tokens up to `num_tokens`."""
        table = self.table_of(seq)
        first = seq.num_computed_tokens // self.block_size
        last = min(len(table), -(-num_tokens // self.block_size))
        return [b for b in range(first, last) if table[b] != self.NO_BLOCK and self.blocks[table[b]].ref_count > 1]

    def can_allocate(self, seq: Sequence, num_tokens: int) -> bool:
        return self.blocks_needed(seq, num_tokens) <= len(self.free_list)

    def _take_free(self) -> int:
        block_id, _ = self.free_list.popitem(last=False)
        block = self.blocks[block_id]
        self._drop_tail(block)
        if block.block_hash is not None:
            if self.cached.get(block.block_hash) == block_id:
                del self.cached[block.block_hash]
                if self.kv_events is not None:
                    self.kv_events.removed(block.block_hash)
            block.block_hash = None
            block.token_ids = ()
        block.ref_count = 1
        return block_id

    def allocate(self, seq: Sequence, num_tokens: int) -> None:
        """Grow `seq.block_table` to cover `num_tokens` tokens. Raises RuntimeError when the pool is short."""
        need = self.blocks_needed(seq, num_tokens)
        if need > len(self.free_list):
            raise RuntimeError(f"KV pool exhausted: need {need} blocks, {len(self.free_list)} free")
        table = self.table_of(seq)
        for b in self._shared_in_write_range(seq, num_tokens):
            src = table[b]
            dst = self._take_free()
            self.blocks[src].ref_count -= 1  # still held by others (ref_count was > 1)
            table[b] = dst
            self.pending_copies.append((src, dst))
        for _ in range(-(-num_tokens // self.block_size) - len(table)):
            table.append(self._take_free())

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Give `child` (a new sequence holding no blocks) all of `parent`'s blocks and their state: block
        table shared (each refcount + 1), computed tokens and hashed blocks. Its first write into a
        shared block copies it (allocate)."""
        setattr(child, self.table, list(self.table_of(parent)))
        for bid in self.table_of(child):
            if bid != self.NO_BLOCK:
                self.blocks[bid].ref_count += 1
        child.num_computed_tokens = parent.num_computed_tokens
        setattr(child, self.hashed, getattr(parent, self.hashed))
        child.full_blocks = list(parent.full_blocks)

    def take_window_copies(self) -> list[tuple[int, int]]:
        """A second pool's copies (hybrid_block_manager.py); one pool has none."""
        return []

    def take_copies(self) -> list[tuple[int, int]]:
        """The copy-on-write K/V copies (source, destination) recorded since the last call, in order,
        without those whose destination was freed again meanwhile."""
        copies = [(src, dst) for src, dst in self.pending_copies if self.blocks[dst].ref_count > 0]
        self.pending_copies = []
        return copies

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        """Shrink `seq.block_table` to the blocks its first `num_tokens` tokens need (rejected drafts'
        blocks go back to the pool). Blocks past the sequence's computed tokens are never cached."""
        keep = -(-num_tokens // self.block_size)
        table = self.table_of(seq)
        while len(table) > keep:
            self._release(table.pop())

    def release_before(self, seq: Sequence, first: int) -> None:
        """Release `seq`'s blocks before index `first` of its table (their entries become NO_BLOCK):
        no query to come reads them (a sliding window passed them). Cached ones stay reusable."""
        table = self.table_of(seq)
        for b in range(min(first, len(table))):
            if table[b] != self.NO_BLOCK:
                self._release(table[b])
                table[b] = self.NO_BLOCK

    def _release(self, bid: int) -> None:
        """Drop one reference to block `bid`; unreferenced, it joins the free list (uncached ones first)."""
        if bid == self.NO_BLOCK:
            return
        block = self.blocks[bid]
        block.ref_count -= 1
        if block.ref_count == 0:
            self.free_list[bid] = None
            if block.block_hash is None and block.tail_key is None:
                self.free_list.move_to_end(bid, last=False)

    def full_blocks(self, seq: Sequence) -> list[tuple[int, tuple[int, ...]]]:
        """`seq`'s full blocks of known tokens as (chained hash, token ids), in order.

        Kept on the sequence (`Sequence.full_blocks`): each block is hashed once, the first time
        this is asked after it fills; token ids only grow, so earlier entries stay true.
        """
        blocks = seq.full_blocks
        bs = self.block_size
        tokens = seq.token_ids
        parent = blocks[-1][0] if blocks else None
        for b in range(len(blocks), len(tokens) // bs):
            toks = tuple(tokens[b * bs:(b + 1) * bs])
            parent = block_hash(parent, toks, seq.cache_salt)
            blocks.append((parent, toks))
        return blocks

    def _prompt_blocks(self, seq: Sequence) -> list[tuple[int, tuple[int, ...]]]:
        """The full blocks that may come from the cache: never the one holding the last token."""
        return self.full_blocks(seq)[:(len(seq.token_ids) - 1) // self.block_size]

    def _is_cached(self, h: int, toks: tuple[int, ...]) -> int | None:
        """The cached block with hash `h` whose tokens are `toks` (a hit re-checks them), or None."""
        bid = self.cached.get(h)
        return bid if bid is not None and self.blocks[bid].token_ids == toks else None

    def block_hash_at(self, seq: Sequence, index: int) -> int:
        """The chained hash of `seq`'s block `index` (its tokens must be known)."""
        return self.full_blocks(seq)[index][0]

    def next_uncached_hash(self, seq: Sequence) -> int | None:
        """The hash of the first full prompt block not in the cache (None if none), for deferring
        a sequence whose prefix another sequence is computing this very step."""
        if not self.enable_prefix_caching or seq.params.prompt_logprobs is not None:
            return None
        for h, toks in self._prompt_blocks(seq):
            if self._is_cached(h, toks) is None:
                return h
        return None

    def match_prefix(self, seq: Sequence) -> int:
        """At admission: take the longest cached chain of full blocks for `seq` (never the block of its
        last token). Sets block_table and num_computed_tokens; returns the tokens reused."""
        if not self.enable_prefix_caching or self.table_of(seq) or seq.params.prompt_logprobs is not None:
            return 0
        table = self.table_of(seq)
        for h, toks in self._prompt_blocks(seq):
            bid = self._is_cached(h, toks)
            if bid is None:
                break
            self.take_cached(bid)
            table.append(bid)
        reused = len(table) * self.block_size
        setattr(seq, self.hashed, len(table))
        if self.tail_cache:
            reused += self._copy_tail(seq)
        seq.num_computed_tokens = reused
        self.num_cache_hits += reused
        return reused

    def _tail_key(self, seq: Sequence, index: int) -> tuple:
        """The tail key of `seq`'s block `index`: the chained hash of the block before (its tokens known), the salt."""
        return (self.block_hash_at(seq, index - 1) if index else None, seq.cache_salt)

    def _copy_tail(self, seq: Sequence) -> int:
        """After match_prefix's full blocks: the longest start of `seq`'s next block that a tail or the cached
        full block holding its last prompt token has computed, short of that last token, copied into a
        fresh block appended to its table (a pending copy). Returns the tokens it covers (0: none)."""
        bs, table = self.block_size, self.table_of(seq)
        index = len(table)
        start = index * bs
        wanted = tuple(seq.token_ids[start:min(start + bs, len(seq.token_ids) - 1)])
        if not wanted:
            return 0
        candidates = list(self.tails.get(self._tail_key(seq, index), ()))
        full = self.full_blocks(seq)
        if index < len(full):
            bid = self._is_cached(*full[index])
            if bid is not None:
                candidates.append(bid)
        best, source = 0, None
        for bid in candidates:
            toks = self.blocks[bid].token_ids
            n = 0
            for a, b in zip(toks, wanted):
                if a != b:
                    break
                n += 1
            if n > best:
                best, source = n, bid
        if source is None:
            return 0
        self.take_cached(source)  # held, so that the destination cannot be the source itself
        if not self.free_list:
            self._release(source)
            return 0
        destination = self._take_free()
        self._release(source)  # unreferenced again, now the most recently used
        table.append(destination)
        self.pending_copies.append((source, destination))
        return best

    def _keep_tail(self, seq: Sequence) -> None:
        """Before a finished `seq`'s blocks are released: its last block's computed tokens that do not fill it
        become a tail (the module's rule), unless a kept tail under the same key already covers them (one that
        they extend is dropped instead). A block other sequences share (a beam's) is not kept."""
        bs, table = self.block_size, self.table_of(seq)
        computed = seq.num_computed_tokens
        index, count = divmod(computed, bs)
        if not count or index >= len(table) or table[index] == self.NO_BLOCK:
            return
        block = self.blocks[table[index]]
        if block.ref_count != 1 or block.block_hash is not None or block.tail_key is not None:
            return
        key = self._tail_key(seq, index)
        toks = tuple(seq.token_ids[index * bs:computed])
        for bid in list(self.tails.get(key, ())):
            other = self.blocks[bid].token_ids
            if other[:len(toks)] == toks:
                return
            if toks[:len(other)] == other:
                self._drop_tail(self.blocks[bid])
        kept = self.tails.setdefault(key, {})
        while len(kept) >= self.MAX_TAILS_PER_KEY:  # never empties it: the key stays
            self._drop_tail(self.blocks[next(iter(kept))])
        block.tail_key, block.token_ids = key, toks
        kept[block.block_id] = None

    def _drop_tail(self, block: Block) -> None:
        """Forget `block` as a tail (its tokens no longer reusable); a no-op for any other block."""
        if block.tail_key is None:
            return
        kept = self.tails.get(block.tail_key)
        if kept is not None:
            kept.pop(block.block_id, None)
            if not kept:
                del self.tails[block.tail_key]
        block.tail_key, block.token_ids = None, ()

    def take_cached(self, bid: int) -> None:
        """Add a reference to cached block `bid` (out of the free list if it was unreferenced)."""
        block = self.blocks[bid]
        if block.ref_count == 0:
            del self.free_list[bid]
        block.ref_count += 1

    def cached_block(self, seq: Sequence, index: int) -> int | None:
        """The cached block holding `seq`'s full block `index` (its tokens known), or None."""
        h, toks = self.full_blocks(seq)[index]
        return self._is_cached(h, toks)

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Register `seq`'s newly computed full blocks in the prefix cache (call after each step)."""
        if not self.enable_prefix_caching:
            return
        n_full = seq.num_computed_tokens // self.block_size
        start = getattr(seq, self.hashed)
        if n_full <= start:
            return
        full = self.full_blocks(seq)
        table = self.table_of(seq)
        run: list[int] = []  # indices of blocks newly cached in a row (reported as one event)
        for b in range(start, n_full):
            if table[b] == self.NO_BLOCK:
                continue
            block = self.blocks[table[b]]
            if block.block_hash is None:
                h, toks = full[b]
                block.block_hash, block.token_ids = h, toks
                if self.cached.setdefault(h, block.block_id) == block.block_id and self.kv_events is not None:
                    if run and run[-1] != b - 1:
                        self._report_stored(seq, full, run)
                        run = []
                    run.append(b)
        if run:
            self._report_stored(seq, full, run)
        setattr(seq, self.hashed, n_full)

    def _report_stored(self, seq: Sequence, full: list[tuple[int, tuple[int, ...]]], run: list[int]) -> None:
        """Tell kv_events that `seq`'s blocks `run` (consecutive indices) entered the cache."""
        parent = full[run[0] - 1][0] if run[0] else None
        lora = getattr(seq.lora, "name", None)
        self.kv_events.stored(full[run[0]:run[-1] + 1], parent, self.block_size, seq.cache_salt, lora)

    def reset_prefix_cache(self) -> int:
        """Forget every cached block no sequence holds (vLLM's reset_prefix_cache and SGLang's flush_cache,
        as far as running requests allow): it stays in the free list as an uncached block, never matched
        again. Blocks that running sequences hold stay cached (their K/V is in use, and the requests' later
        blocks chain onto them). Returns how many cached blocks were forgotten.

        kv_events hears AllBlocksCleared when nothing is cached afterwards (the cache really is empty: every
        block it was told of is gone), else one BlockRemoved listing the forgotten blocks (the held ones
        stay announced). Call between steps only (on the engine's thread)."""
        dropped: list[int] = []
        for bid in self.free_list:
            block = self.blocks[bid]
            self._drop_tail(block)
            if block.block_hash is None:
                continue
            if self.cached.get(block.block_hash) == bid:
                del self.cached[block.block_hash]
                dropped.append(block.block_hash)
            block.block_hash = None
            block.token_ids = ()
        if self.kv_events is not None:
            if not self.cached:
                self.kv_events.cleared()
            else:
                for h in dropped:
                    self.kv_events.removed(h)
        return len(dropped)

    def free(self, seq: Sequence, keep_tail: bool = False) -> None:
        """Drop `seq`'s references; unreferenced cached blocks stay reusable (most recent last),
        uncached ones go to the front to be reused first. keep_tail: `seq` finished with its K/V whole
        (every computed token's written): its partial last block becomes a tail (the module's rule).
        Copies still pending into its blocks are dropped (it never ran with them)."""
        if keep_tail and self.tail_cache:
            self._keep_tail(seq)
        table = self.table_of(seq)
        if self.pending_copies:
            mine = set(table)
            self.pending_copies = [(src, dst) for src, dst in self.pending_copies
                                   if dst not in mine or self.blocks[dst].ref_count > 1]
        for bid in reversed(table):
            self._release(bid)
        setattr(seq, self.table, [])
        seq.num_computed_tokens = 0
        setattr(seq, self.hashed, 0)
