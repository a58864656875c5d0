"""`manage.py bench_speculative` (part of `make bench`): speculative decoding's speed-up, and its cost where it cannot help.

Workloads (inference/bench/speculative.py), greedy, at batch 1 and 8 streams: editing a
~300-token code file with the file as the prediction (`editing`: the 135M model rewrites parts of
it), the same request predicted by the model's own answer with one line changed (`edit1`),
summarising a prompt (prompt lookup), and plain chat, each with speculation "on", "auto" and "off",
and "off" again on a second engine (the two "off" engines' ratio is the run's noise). Runs are
interleaved (on, auto, off, off, on, ...) in one process and the medians compared with "off"; the
outputs of the modes must be identical (checked). Each line ends with the auto engine's step-cost fit (its gate's
view of a decode step: fixed ms + ms per row). A script, not a test: figures depend on the machine
and its load.
"""
from dataclasses import replace

from django.core.management.base import BaseCommand

from inference.bench.speculative import compare, editing, editing_one_line, median_tok_s, plain_chat, summarise


class Command(BaseCommand):
    help = "Benchmark speculative decoding (editing with a prediction, prompt lookup, plain chat) on vs off."

    def add_arguments(self, parser):
        parser.add_argument("--batches", default="1,8")
        parser.add_argument("--repeats", type=int, default=3)
        parser.add_argument("--workloads", default="editing,edit1,summarise,plain")

    def handle(self, *args, batches, repeats, workloads, **options):
        import torch

        from inference.engine.kernels.build import cpuinfo_field
        from inference.engine.llm_engine import LLMEngine
        from inference.engine.tokenizer import Tokenizer
        from inference.operations.runtime import engine_config

        base = replace(engine_config(), kv_cache_bytes=256 << 20, max_model_len=2048)
        tokenizer = Tokenizer.from_folder(base.model_path)
        out = self.stdout.write
        engines = {mode: LLMEngine(replace(base, speculative=mode.rstrip("2")))
                   for mode in ("on", "auto", "off", "off2")}
        out(f"CPU {cpuinfo_field('model name') or 'unknown'}; torch threads {torch.get_num_threads()}; "
            f"draft tokens {base.speculative_draft_tokens}; weights {base.weights}")
        makers = {"editing": editing, "summarise": summarise, "plain": plain_chat,
                  "edit1": lambda tok, n: editing_one_line(tok, n, engines["off"])}
        for name in workloads.split(","):
            for batch in (int(b) for b in batches.split(",")):
                work = makers[name](tokenizer, batch)
                runs = compare(engines, work, repeats)
                off = median_tok_s(runs["off"])
                parts = []
                for mode in ("on", "auto"):
                    last = runs[mode][-1]
                    rate = last.accepted / last.drafted if last.drafted else 0.0
                    parts.append(f"{mode} {median_tok_s(runs[mode]):.1f} tok/s (x{median_tok_s(runs[mode]) / off:.2f}, "
                                 f"{last.drafted} drafted, {rate:.0%} accepted)")
                noise = median_tok_s(runs["off2"]) / off
                cost = engines["auto"].speculator.cost_for(batch)
                fit = (f"auto's fit: a decode step {cost.fixed_s * 1e3:.2f} ms + {cost.row_s * 1e3:.3f} ms a row"
                       if cost.fitted else "auto's fit: none yet (prior)")
                out(f"{work.name:<10} batch {batch}: off {off:.1f} tok/s; " + "; ".join(parts)
                    + f"; a second off engine x{noise:.2f}"
                    + f" [median of {repeats} interleaved runs, {runs['off'][-1].tokens} tokens each;"
                    f" outputs identical; {fit}]")
