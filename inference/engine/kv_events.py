"""The prefix cache's changes as vLLM's KV cache events (BlockStored, BlockRemoved, AllBlocksCleared), collected per step.

The block manager reports each change to a `KVEventRecorder` (when one is attached: the server
publishes events only with METRALE_KV_EVENTS); the engine takes the step's events once the step
ends and hands them to its sink (operations/kv_events.KVEventPublisher: one batch per step, only
when there are events; vLLM's rule, vllm/distributed/kv_events.py). Plain data, no torch.

The semantics are vLLM's (contracts-wave4 section 2.4): BlockStored when full blocks enter the
prefix cache (here once their K/V is computed, after the step), listing one sequence's newly
cached blocks in order with the hash of the block before the first (None at the sequence's
start); BlockRemoved when a cached block is evicted (reused for other tokens) or forgotten by a
cache reset that running requests outlive, never when it is merely freed; AllBlocksCleared when the
cache is dropped whole (the engine attaches to or leaves the publisher, or a reset leaves nothing
cached: block_manager.BlockManager.reset_prefix_cache).

Every cached block is salted (block_manager.block_hash): the event keeps the salt's tenant part
and the LoRA adapter apart (`cache_salt`, `lora_name`), which the publisher turns into what
routers can keep apart (operations/kv_wire.py).
"""
from __future__ import annotations

from dataclasses import dataclass

# How an adapter's load joins the tenant's salt in a sequence's prefix-cache salt (llm_engine._admit).
LORA_SALT_SEPARATOR = "\x00lora:"


def sequence_salt(cache_salt: str, lora_uid: int | None) -> str:
    """The prefix-cache salt of a sequence: its request's (the tenant's) salt, and the adapter's load
    (`lora_uid`, LoraAdapter.uid; None for the base model), so KV computed with one adapter never serves
    another or the base model."""
    return cache_salt if lora_uid is None else f"{cache_salt}{LORA_SALT_SEPARATOR}{lora_uid}"


def tenant_salt(salt: str) -> str:
    """The request's (tenant's) part of a sequence's salt (`sequence_salt`'s first argument)."""
    return salt.partition(LORA_SALT_SEPARATOR)[0]


@dataclass(slots=True)
class BlockStored:
    """Full blocks newly in the prefix cache, one sequence's, in order.

    block_hashes: each block's chained hash (block_manager.block_hash, a signed 64-bit int);
    parent_block_hash: the hash of the block before the first (None: the first is the sequence's
    block 0); token_ids: the blocks' tokens, block_size each, concatenated; block_size in tokens;
    cache_salt: the tenant's salt (tenant_salt); lora_name: the adapter the blocks were computed
    with, or None."""

    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    cache_salt: str = ""
    lora_name: str | None = None


@dataclass(slots=True)
class BlockRemoved:
    """Cached blocks evicted (their hashes, as BlockStored listed them)."""

    block_hashes: list[int]


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """Every block this engine published is gone."""


KVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventRecorder:
    """One step's prefix-cache events, in the order they happened; consecutive removals join into one
    BlockRemoved."""

    __slots__ = ("events",)

    def __init__(self):
        self.events: list[KVCacheEvent] = []

    def stored(self, blocks: list[tuple[int, tuple[int, ...]]], parent: int | None, block_size: int, salt: str,
               lora_name: str | None) -> None:
        """A run of one sequence's blocks entered the cache: `blocks` (hash, token ids) in order, after block
        `parent` (None: the run starts at the sequence's block 0); `salt`: the sequence's (sequence_salt)."""
        self.events.append(BlockStored([h for h, _ in blocks], parent, [t for _, toks in blocks for t in toks],
                                       block_size, tenant_salt(salt), lora_name))

    def removed(self, block_hash: int) -> None:
        """Cached block `block_hash` was evicted."""
        last = self.events[-1] if self.events else None
        if isinstance(last, BlockRemoved):
            last.block_hashes.append(block_hash)
        else:
            self.events.append(BlockRemoved([block_hash]))

    def cleared(self) -> None:
        """No block is cached any more (a reset of the whole prefix cache)."""
        self.events.append(AllBlocksCleared())

    def take(self) -> list[KVCacheEvent]:
        """The events recorded since the last call, oldest first."""
        events, self.events = self.events, []
        return events
