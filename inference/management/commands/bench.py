"""`manage.py bench`: decode throughput of the served model through HTTP, float32 and bfloat16.

Prints single-stream decode tokens/s and the aggregate tokens/s of 8 concurrent
streams, each the median of --repeats runs, measured against a daphne server this
command starts. A script, not a test: figures vary with the machine.
"""
import statistics
import tempfile
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand

from inference.bench.http_streams import concurrent, stream_once
from inference.bench.live_server import LiveServer

PROMPTS = ["Tell me a story about a dragon.", "Explain how rain forms.", "Describe the city of Paris.",
           "Write a poem about autumn.", "What makes a good friend?", "How do airplanes fly?",
           "Give advice to a new programmer.", "Describe a walk in the forest."]


class Command(BaseCommand):
    help = "Benchmark decode throughput through HTTP (single stream and 8 concurrent), fp32 and bf16."

    def add_arguments(self, parser):
        parser.add_argument("--dtypes", default="float32,bfloat16")
        parser.add_argument("--repeats", type=int, default=3)
        parser.add_argument("--max-tokens", type=int, default=128)
        parser.add_argument("--concurrency", type=int, default=8)

    def handle(self, *args, dtypes, repeats, max_tokens, concurrency, **options):
        model = settings.METRALE["MODEL"]
        rows = []
        for dtype in dtypes.split(","):
            with tempfile.TemporaryDirectory() as tmp, LiveServer(
                    {"METRALE_MODEL": model, "METRALE_DTYPE": dtype}, Path(tmp)) as server:
                stream_once(server.url, "Hello", 8)  # warm-up
                single = [stream_once(server.url, PROMPTS[0], max_tokens)["decode_tok_s"] for _ in range(repeats)]
                prompts = (PROMPTS * (concurrency // len(PROMPTS) + 1))[:concurrency]
                agg = [concurrent(server.url, prompts, max_tokens)["aggregate_tok_s"] for _ in range(repeats)]
            rows.append((dtype, statistics.median(single), statistics.median(agg)))
            self.stdout.write(f"{dtype}: single-stream decode {rows[-1][1]:.1f} tok/s, "
                              f"{concurrency} concurrent streams {rows[-1][2]:.1f} tok/s aggregate")
        self.stdout.write("")
        self.stdout.write(f"{'dtype':<10} {'1 stream tok/s':>15} {f'{concurrency} streams tok/s':>18}  (median of {repeats}, "
                          f"{max_tokens} tokens each, greedy, ignore_eos, through HTTP)")
        for dtype, s, a in rows:
            self.stdout.write(f"{dtype:<10} {s:>15.1f} {a:>18.1f}")
