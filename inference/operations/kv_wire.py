"""vLLM's KV cache events on the wire (msgpack, its KVEventBatch layout) and each tenant's namespace block.

Layout (contracts-wave4 section 2.4; vllm/distributed/kv_events.py since PR #42892): a batch is a
positional array `[ts (epoch seconds, float), events, data_parallel_rank]`; each event a map tagged by
"type" with vLLM's field names. BlockStored always carries block_hashes, parent_block_hash,
token_ids, block_size, lora_id, medium and lora_name (nil where unset); BlockRemoved block_hashes and
medium; AllBlocksCleared nothing. No other keys: vllm-router 0.1.17 refuses a batch with a key it does
not know or an `extra_keys` entry (reason ExtraKeys: the whole batch is dropped). Hashes are unsigned
64-bit ints (the router refuses negative ones); `medium` is "GPU", vLLM's name for the engine's own
KV cache on every device (CPU names an offload tier, which routers credit less).

Tenants. The engine salts every cached block with its tenant (engine/block_manager.py), so one
tenant's blocks never serve another. vLLM announces a salted block with the salt in `extra_keys`,
which vllm-router refuses: it keys blocks by their token ids alone (and the adapter's name). Here a
tenant's chains hang instead under a namespace block of their own: `block_size` pseudo token ids
and a hash derived from the tenant's salt, announced as the first block of every chain that starts at
a sequence's block 0. The routes routers tokenize requests through (http/worker_views.py: vLLM's
/v1/chat/completions/render and /v1/completions/render, which vllm-router calls with the client's
key) put the caller's namespace block before the prompt's ids. So a router's prefix match runs
through the namespace block first: one tenant's prompt matches its own cached blocks and never
another tenant's, and a router that tokenizes on its own (without the render routes) matches none. Blocks
computed with a LoRA adapter carry its `lora_name`, which vllm-router folds into its block keys: they never
match a base-model prompt (and in vllm-router 0.1.17 a request naming the adapter got no credit for them either).
"""
from __future__ import annotations

import hashlib
from functools import lru_cache

import msgpack

from inference.engine.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent

MEDIUM = "GPU"
MASK64 = (1 << 64) - 1


def unsigned(block_hash: int) -> int:
    """An engine block hash (Python's signed 64-bit hash) as the unsigned 64-bit int on the wire."""
    return block_hash & MASK64


@lru_cache(maxsize=4096)
def namespace_block(cache_salt: str, block_size: int, vocab_size: int) -> tuple[int, tuple[int, ...]]:
    """The namespace block of a tenant (`cache_salt`: its prefix-cache salt): (its hash, an unsigned 64-bit
    int; its `block_size` token ids, each in [0, vocab_size)), both from SHA-256 of the salt, the same in
    every process that shares the salt (SECRET_KEY)."""
    seed = hashlib.sha256(b"metrale-kv-namespace\x00" + cache_salt.encode()).digest()
    ids: list[int] = []
    counter = 0
    while len(ids) < block_size:
        digest = hashlib.sha256(seed + counter.to_bytes(4, "big")).digest()
        ids += [int.from_bytes(digest[i:i + 4], "big") % vocab_size for i in range(0, 32, 4)]
        counter += 1
    return int.from_bytes(seed[:8], "big"), tuple(ids[:block_size])


def routing_token_ids(cache_salt: str, prompt_ids: list[int], block_size: int, vocab_size: int) -> list[int]:
    """The token ids a router scores a prompt by: the tenant's namespace block, then the prompt's ids."""
    return [*namespace_block(cache_salt, block_size, vocab_size)[1], *prompt_ids]


def wire_event(event: KVCacheEvent, vocab_size: int) -> dict:
    """One engine event (engine/kv_events.py) as vLLM's tagged map; a chain from a sequence's block 0
    starts with its tenant's namespace block (module doc)."""
    if isinstance(event, BlockStored):
        hashes = [unsigned(h) for h in event.block_hashes]
        token_ids = list(event.token_ids)
        parent = None if event.parent_block_hash is None else unsigned(event.parent_block_hash)
        if parent is None:
            root, root_ids = namespace_block(event.cache_salt, event.block_size, vocab_size)
            hashes.insert(0, root)
            token_ids[:0] = root_ids
        return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": token_ids,
                "block_size": event.block_size, "lora_id": None, "medium": MEDIUM, "lora_name": event.lora_name}
    if isinstance(event, BlockRemoved):
        return {"type": "BlockRemoved", "block_hashes": [unsigned(h) for h in event.block_hashes], "medium": MEDIUM}
    if isinstance(event, AllBlocksCleared):
        return {"type": "AllBlocksCleared"}
    raise TypeError(f"not a KV cache event: {event!r}")


def encode_batch(ts: float, events: list[dict], data_parallel_rank: int = 0) -> bytes:
    """A KVEventBatch's msgpack bytes: [ts, events, data_parallel_rank] (bytes packed as bin)."""
    return msgpack.packb([ts, events, data_parallel_rank], use_bin_type=True)
