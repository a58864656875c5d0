"""`manage.py bench_speculative` (part of `make bench`): speculative decoding's speed-up, and its cost where it cannot help.

Workloads (inference/bench/speculative.py), greedy, at batch 1 and 8 streams: editing a
~300-token code file with the file as the prediction, and summarising a prompt (prompt
lookup), each with speculation "on" and "off"; plain chat with "auto" and "off". Runs are
interleaved (on, off, on, off ...) in one process and the medians compared; the outputs of
the two modes must be identical (checked). A script, not a test: figures depend on the machine
and its load.
"""
from dataclasses import replace

from django.core.management.base import BaseCommand

from inference.bench.speculative import compare, editing, median_tok_s, plain_chat, summarise


class Command(BaseCommand):
    help = "Benchmark speculative decoding (editing with a prediction, prompt lookup, plain chat) on vs off."

    def add_arguments(self, parser):
        parser.add_argument("--batches", default="1,8")
        parser.add_argument("--repeats", type=int, default=3)
        parser.add_argument("--workloads", default="editing,summarise,plain")

    def handle(self, *args, batches, repeats, workloads, **options):
        import torch

        from inference.engine.kernels.build import cpuinfo_field
        from inference.engine.llm_engine import LLMEngine
        from inference.engine.tokenizer import Tokenizer
        from inference.runtime import engine_config

        base = replace(engine_config(), kv_cache_bytes=256 << 20, max_model_len=2048)
        tokenizer = Tokenizer.from_folder(base.model_path)
        out = self.stdout.write
        out(f"CPU {cpuinfo_field('model name') or 'unknown'}; torch threads {torch.get_num_threads()}; "
            f"draft tokens {base.speculative_draft_tokens}")
        engines = {mode: LLMEngine(replace(base, speculative=mode)) for mode in ("on", "auto", "off")}
        makers = {"editing": (editing, ("on", "off")), "summarise": (summarise, ("on", "off")),
                  "plain": (plain_chat, ("auto", "off"))}
        for name in workloads.split(","):
            make, modes = makers[name]
            for batch in (int(b) for b in batches.split(",")):
                work = make(tokenizer, batch)
                runs = compare({m: engines[m] for m in modes}, work, repeats)
                a, b = (median_tok_s(runs[m]) for m in modes)
                spec = runs[modes[0]][-1]
                rate = spec.accepted / spec.drafted if spec.drafted else 0.0
                out(f"{work.name:<10} batch {batch}: {modes[0]} {a:.1f} tok/s, {modes[1]} {b:.1f} tok/s, "
                    f"ratio {a / b:.2f} (median of {repeats} interleaved runs; {spec.tokens} tokens per run, "
                    f"{spec.drafted} drafted, {rate:.0%} accepted; outputs identical)")
