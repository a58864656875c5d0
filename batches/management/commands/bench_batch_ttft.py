"""`manage.py bench_batch_ttft`: an interactive stream's TTFT on an idle server vs while a batch runs (embedded).

Starts a daphne server (no broker: its batch thread runs the batch on the same engine),
measures the time to the first content token of --samples streamed chat completions (each a
fresh ~--prompt-tokens prompt, so no prefix-cache hit; max_tokens 4) on the idle server, then
creates a --lines batch (each line --line-tokens of prompt and --line-output tokens out) and,
once lines are running, measures the same streams again; then idle once more (to see drift),
and cancels the batch. Prints the medians and the ratio busy / idle. A script, not a test: the
figure depends on the machine and on what else runs there.
"""
import io
import json
import logging
import random
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import openai
from django.conf import settings
from django.core.management.base import BaseCommand

from inference.bench.http_streams import stream_chat
from inference.bench.live_server import LiveServer
from inference.bench.workload import make_text
from inference.engine.tokenizer import Tokenizer


class Command(BaseCommand):
    help = "Interactive TTFT while a batch runs vs on an idle server (embedded batch runner)."

    def add_arguments(self, parser):
        parser.add_argument("--lines", type=int, default=200)
        parser.add_argument("--line-tokens", type=int, default=128)
        parser.add_argument("--line-output", type=int, default=64)
        parser.add_argument("--prompt-tokens", type=int, default=256)
        parser.add_argument("--samples", type=int, default=7)

    def handle(self, *args, lines, line_tokens, line_output, prompt_tokens, samples, **options):
        for name in ("httpx", "httpx2"):
            logging.getLogger(name).setLevel(logging.WARNING)
        model = settings.METRALE["MODEL"]
        tok = Tokenizer.from_folder(Path(model))
        rng = random.Random(0)
        with tempfile.TemporaryDirectory() as tmp, \
                LiveServer({"METRALE_MODEL": model, "METRALE_FILES_DIR": f"{tmp}/files"}, Path(tmp)) as server, \
                httpx.Client(timeout=300) as http:
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0, timeout=300)

            def ttfts(n):
                return [stream_chat(http, server.url, [{"role": "user", "content": make_text(tok, prompt_tokens, rng)}],
                                    4).ttft_s for _ in range(n)]

            ttfts(2)  # warm-up
            idle = ttfts(samples)
            rows = [{"custom_id": f"l{i}", "method": "POST", "url": "/v1/chat/completions",
                     "body": {"model": "smollm2-135m-instruct", "max_tokens": line_output, "ignore_eos": True, "temperature": 0,
                              "messages": [{"role": "user", "content": make_text(tok, line_tokens, rng)}]}}
                    for i in range(lines)]
            data = "".join(json.dumps(r) + "\n" for r in rows).encode()
            file = client.files.create(file=("bench.jsonl", io.BytesIO(data)), purpose="batch")
            batch = client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions",
                                          completion_window="24h")
            while client.batches.retrieve(batch.id).status != "in_progress":
                time.sleep(0.2)
            time.sleep(2)  # batch lines prefilling and decoding
            busy = ttfts(samples)
            done = client.batches.retrieve(batch.id).request_counts.completed
            client.batches.cancel(batch.id)
            while client.batches.retrieve(batch.id).status != "cancelled":
                time.sleep(0.2)
            idle_after = ttfts(samples)
        base = statistics.median(idle + idle_after)
        self.stdout.write(f"TTFT of a {prompt_tokens}-token streamed chat (median of {samples} each, ms):")
        self.stdout.write(f"  idle before {statistics.median(idle) * 1000:8.1f}   idle after "
                          f"{statistics.median(idle_after) * 1000:8.1f}")
        self.stdout.write(f"  while a {lines}-line batch runs ({line_tokens} in / {line_output} out, {done} lines "
                          f"done meanwhile) {statistics.median(busy) * 1000:8.1f}")
        self.stdout.write(f"  ratio busy / idle: {statistics.median(busy) / base:.2f}")
