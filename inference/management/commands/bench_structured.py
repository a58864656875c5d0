"""`manage.py bench_structured`: what structured outputs cost — schema compile times and decode tokens/s.

Prints the llguidance tokenizer's build time, the median and max compile time of the 30
acceptance schemas (inference/bench/json_schemas.py) on a cold cache, and greedy decode
tokens/s at batch 1 and 8 without a grammar and with a JSON schema (an array of records
that never completes within max_tokens, so both decode the same number of tokens), each the
best of --repeats alternating runs, with the mask's share of the decode time and the
with/without ratio. A script, not a test: the figures depend on the machine and its load.
"""
from django.conf import settings
from django.core.management.base import BaseCommand

from inference.bench.json_schemas import SCHEMAS
from inference.bench.structured import RECORDS, compile_times_s, decode_run, median_ms


class Command(BaseCommand):
    help = "Benchmark grammar compile times and constrained vs free decode tokens/s."

    def add_arguments(self, parser):
        parser.add_argument("--batches", default="1,8")
        parser.add_argument("--max-tokens", type=int, default=64)
        parser.add_argument("--repeats", type=int, default=3)

    def handle(self, *args, batches, max_tokens, repeats, **options):
        from inference.engine.config import EngineConfig
        from inference.engine.grammar import GrammarSpec, compiler_for
        from inference.engine.grammar_state import StructuredOutput
        from inference.engine.llm_engine import LLMEngine
        from inference.engine.tokenizer import Tokenizer

        out = self.stdout.write
        model = settings.METRALE["MODEL"]
        tokenizer = Tokenizer.from_folder(model)
        setup_s, times = compile_times_s(tokenizer, [s for _, s in SCHEMAS])
        out(f"llguidance tokenizer build: {setup_s * 1000:.0f} ms (once per process)")
        out(f"schema compile ({len(times)} schemas, cold cache): median {median_ms(times):.2f} ms, "
            f"max {max(times) * 1000:.2f} ms")
        engine = LLMEngine(EngineConfig(model_path=model, kv_cache_bytes=256 << 20))
        structured = StructuredOutput(compiler_for(tokenizer).compile(GrammarSpec.json_schema(RECORDS)))
        decode_run(engine, tokenizer, 1, None, 4)  # warm-up
        for batch in (int(b) for b in batches.split(",")):
            best = {}
            for _ in range(repeats):
                for grammar in (None, structured):
                    run = decode_run(engine, tokenizer, batch, grammar, max_tokens)
                    if run.constrained not in best or run.tokens_per_s > best[run.constrained].tokens_per_s:
                        best[run.constrained] = run
            free, constrained = best[False], best[True]
            out(f"batch {batch}: free {free.tokens_per_s:.1f} tok/s, with schema {constrained.tokens_per_s:.1f} tok/s "
                f"(ratio {constrained.tokens_per_s / free.tokens_per_s:.3f}); masks took "
                f"{constrained.mask_s / constrained.decode_s * 100:.1f}% of the constrained decode time "
                f"({constrained.mask_s * 1000 / max(1, max_tokens - 1):.2f} ms per step)")
