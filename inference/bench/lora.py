"""The LoRA bench: 8 streams on 4 different adapters against 8 streams on the base model, interleaved in one run."""
from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path

import torch

from inference.engine.outputs import TokenEvent
from inference.engine.request import EngineRequest
from inference.engine.sampling_params import SamplingParams

from .offline import chat_prompt_ids


def make_adapters(model_dir: str, out_dir: Path, count: int, rank: int, targets: list[str]) -> list[Path]:
    """`count` random PEFT LoRA adapters of the model (rank `rank` on `targets`), written by peft."""
    import peft
    import transformers

    # An adapter needs the architecture's shapes only: built from config.json (a GGUF-blocks folder's
    # weights are not transformers'), with random LoRA weights below.
    config = transformers.AutoConfig.from_pretrained(model_dir)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    paths = []
    for i in range(count):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        peft_model = peft.get_peft_model(model, peft.LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=targets))
        g = torch.Generator().manual_seed(i)
        with torch.no_grad():
            for name, p in peft_model.named_parameters():
                if "lora_B" in name:  # PEFT starts B at zero (the identity update)
                    p.copy_(torch.randn(p.shape, generator=g) * 0.01)
        path = out_dir / f"adapter{i}"
        peft_model.save_pretrained(path)
        paths.append(path)
    return paths


def _tok_s(engine, prompts: list[list[int]], loras: list[str | None], output_tokens: int) -> float:
    """Output tokens per second of the prompts run all at once, each with its adapter (None: base)."""

    async def one(ids, lora):
        handle = engine.submit(EngineRequest(ids, SamplingParams(temperature=0, max_tokens=output_tokens,
                                                                 ignore_eos=True), lora_name=lora))
        return sum([isinstance(ev, TokenEvent) async for ev in handle])

    async def main():
        t0 = time.perf_counter()
        n = sum(await asyncio.gather(*(one(ids, lo) for ids, lo in zip(prompts, loras))))
        return n / (time.perf_counter() - t0)

    return asyncio.run(main())


def lora_vs_base(engine, tokenizer, names: list[str], streams: int = 8, rounds: int = 3,
                 output_tokens: int = 64, on_round=None) -> list[tuple[float, float]]:
    """(base tok/s, adapters tok/s) per round: the same `streams` prompts on the base model, then on
    the adapters `names` in turn (streams / len(names) each), alternating so that the machine's noise
    falls on both. The engine should run without prefix caching (each round recomputes its prompts).
    on_round(index, base, tuned) is called as each round ends."""
    texts = [f"Write a short story about a {thing}." for thing in
             ("lighthouse", "dragon", "train", "garden", "robot", "river", "violin", "comet")]
    prompts = [chat_prompt_ids(tokenizer, texts[i % len(texts)]) for i in range(streams)]
    adapters = [names[i % len(names)] for i in range(streams)]
    _tok_s(engine, prompts[:2], [None, names[0]], 4)  # warm-up
    out = []
    for _ in range(rounds):
        base = _tok_s(engine, prompts, [None] * streams, output_tokens)
        tuned = _tok_s(engine, prompts, adapters, output_tokens)
        out.append((base, tuned))
        if on_round is not None:
            on_round(len(out), base, tuned)
    return out


def round_line(index: int, base: float, tuned: float) -> str:
    return f"  round {index}: base {base:6.1f} tok/s, 4 adapters {tuned:6.1f} tok/s = {tuned / base:.2f}x"


def median_line(rows: list[tuple[float, float]]) -> str:
    """The median ratio of the rounds (target >= 0.8x)."""
    return f"  median ratio {statistics.median(t / b for b, t in rows):.2f}x (target >= 0.8x)"
