"""The engine's live state as plain data, for the operators' dashboard: requests, KV blocks, settings.

Built on the engine thread between steps (AsyncEngine.snapshot), so every field of one
snapshot describes the same moment. Never any prompt or output text: counts and times only.
The dashboard's message schema is in ARCHITECTURE.md ("The live dashboard's websocket").
"""
from __future__ import annotations

import time

# Engine settings shown with every snapshot (EngineConfig field names).
SHOWN_SETTINGS = ("device", "dtype", "kv_cache_dtype", "block_size", "max_num_seqs", "max_num_batched_tokens",
                  "max_waiting_requests", "enable_prefix_caching", "weights", "prefill_weights",
                  "num_threads")


def request_view(seq, state: str, timing, now: float) -> dict:
    """One request as the dashboard shows it: ids, token counts, prefill progress (0-1), decode
    rate in tokens per second since its first token, and age in seconds since it arrived."""
    prompt = seq.num_prompt_tokens
    done = min(seq.num_computed_tokens, prompt)
    generated = seq.num_output_tokens
    first = timing.first_token if timing is not None else None
    rate = generated / (now - first) if first is not None and generated > 1 and now > first else None
    arrival = timing.arrival if timing is not None else seq.arrival_time
    return {"request_id": seq.request_id, "state": state, "prompt_tokens": prompt,
            "prefill_tokens_done": done, "prefill_progress": done / prompt if prompt else 1.0,
            "cached_tokens": seq.num_cached_tokens, "generated_tokens": generated,
            "max_tokens": seq.params.max_tokens, "tokens_per_s": rate, "age_s": now - arrival}


def kv_view(block_manager) -> dict:
    """KV blocks: used (referenced by a request), cached (unreferenced, holding a reusable prefix
    block), free (holding nothing); used + cached + free = total; usage = used / total (vLLM's
    kv_cache_usage_perc)."""
    total = block_manager.num_blocks
    blocks = block_manager.blocks
    free_ids = list(block_manager.free_list)
    cached = sum(1 for bid in free_ids if blocks[bid].block_hash is not None)
    used = total - len(free_ids)
    return {"blocks_total": total, "blocks_used": used, "blocks_cached": cached,
            "blocks_free": len(free_ids) - cached, "block_size": block_manager.block_size,
            "usage": used / total}


def engine_snapshot(engine, num_queued: int = 0) -> dict:
    """The LLMEngine's state now (call on its thread): {"engine", "kv", "running", "waiting",
    "series", "max_model_len"}. num_queued: submissions not yet admitted (counted into
    engine["queued"])."""
    now = time.monotonic()
    stats = engine.stats
    scheduler = engine.scheduler
    running = []
    for seq in scheduler.running:
        state = "prefill" if seq.num_uncomputed_tokens > 1 or seq.num_output_tokens == 0 else "decode"
        running.append(request_view(seq, state, stats.live_timing(seq), now))
    waiting = [request_view(seq, "waiting", stats.live_timing(seq), now) for seq in scheduler.waiting]
    config = engine.config
    settings = {name: getattr(config, name) for name in SHOWN_SETTINGS}
    settings.update(device=str(engine.device), dtype=str(engine.dtype).removeprefix("torch."),
                    kv_cache_dtype=str(engine.kv_dtype).removeprefix("torch."),
                    steps=engine.num_steps, preemptions=scheduler.num_preemptions, queued=num_queued)
    return {"engine": settings, "kv": kv_view(engine.block_manager), "running": running, "waiting": waiting,
            "series": stats.series_view(), "max_model_len": engine.max_model_len}
