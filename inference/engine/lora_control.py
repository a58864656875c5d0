"""Loading and unloading LoRA adapters of a running AsyncEngine: files read off the engine thread, slots changed on it."""
from __future__ import annotations

import asyncio
import concurrent.futures

from .lora import LoraAdapter, load_adapter


def read_adapter(engine, name: str, path: str) -> LoraAdapter:
    """The adapter folder read and checked for the engine's model (lora.load_adapter; raises its
    LoraNotFound / LoraError). `engine`: an AsyncEngine."""
    llm = engine.engine
    return load_adapter(name, path, llm.model_config, llm.config.model_path, llm.config.max_lora_rank)


def install(engine, adapter: LoraAdapter, replace: bool = False) -> concurrent.futures.Future:
    """Make `adapter` resident at the engine thread's next step boundary (LLMEngine.add_lora); the
    future raises its ValueError when the name is taken (and not `replace`) or no slot is free."""
    return engine.call(lambda llm: llm.add_lora(adapter, replace))


async def load_lora(engine, name: str, path: str, replace: bool = False) -> LoraAdapter:
    """Read the folder (on a worker thread), then install it; returns once its weights are resident.
    Raises LoraNotFound, LoraError or ValueError (see read_adapter and install)."""
    adapter = await asyncio.to_thread(read_adapter, engine, name, path)
    await asyncio.wrap_future(install(engine, adapter, replace))
    return adapter


async def unload_lora(engine, name: str) -> None:
    """New requests can no longer name `name`; its requests in flight finish on it, then its slot is
    freed for good (LLMEngine.remove_lora). Raises KeyError for a name that is not loaded."""
    await asyncio.wrap_future(engine.call(lambda llm: llm.remove_lora(name)))


def loaded_loras(engine) -> dict[str, LoraAdapter]:
    """The adapters new requests may name, by name (a snapshot; empty when adapters are off)."""
    slots = engine.engine.loras
    return dict(slots.by_name) if slots is not None else {}
