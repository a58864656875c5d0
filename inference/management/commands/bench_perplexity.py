"""`manage.py bench_perplexity` (part of `make bench`): the served path's perplexity over a text, beside llama.cpp's.

The engine of the server's settings (METRALE_WEIGHTS, the KV cache dtype, the kernels) scores the
text by llama-perplexity's rule (inference/bench/perplexity.py), and so does the exact path
(float weights as loaded, float32 KV) for reference; with `--llama-perplexity` (a llama.cpp
llama-perplexity binary) and `--gguf` (the GGUF the model folder was imported from) the same
text through llama.cpp, side by side. Fidelity is held to: the served path within 0.5% of
llama-perplexity on the same GGUF. A script, not a test (tests/engine/test_perplexity.py bounds
the served path against the exact one).
"""
import re
import subprocess
import time
from dataclasses import replace
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

DEFAULT_TEXT = "/usr/share/common-licenses/GPL-3"  # on every Debian machine (base-files)


class Command(BaseCommand):
    help = "Perplexity of a text through the served path (and the exact path, and llama-perplexity)."

    def add_arguments(self, parser):
        parser.add_argument("--text", default=DEFAULT_TEXT, help="a UTF-8 text file")
        parser.add_argument("--n-ctx", type=int, default=512, help="tokens a chunk (llama-perplexity's -c)")
        parser.add_argument("--chunks", type=int, default=None, help="at most this many chunks")
        parser.add_argument("--skip-exact", action="store_true", help="skip the exact path's reference")
        parser.add_argument("--llama-perplexity", default="", help="a llama.cpp llama-perplexity binary")
        parser.add_argument("--gguf", default="", help="the GGUF file for --llama-perplexity")

    def handle(self, *args, text, n_ctx, chunks, skip_exact, llama_perplexity, gguf, **options):
        from inference.bench.perplexity import chunk_bos, engine_perplexity
        from inference.engine.kernels.build import cpuinfo_field
        from inference.engine.llm_engine import LLMEngine
        from inference.engine.tokenizer import Tokenizer
        from inference.operations.runtime import engine_config

        path = Path(text)
        if not path.is_file():
            raise CommandError(f"{text} is not a file")
        base = replace(engine_config(), speculative="off", enable_prefix_caching=False, max_num_seqs=8,
                       kv_cache_bytes=256 << 20)
        tokenizer = Tokenizer.from_folder(base.model_path)
        tokens = tokenizer.encode(path.read_text(), add_special_tokens=True)
        bos_id = chunk_bos(tokens, tokenizer.bos_token_id)  # Gemma scores a chunk without BOS 46% worse
        out = self.stdout.write
        out(f"{path} ({len(tokens)} tokens), chunks of {n_ctx}, the second half of each scored; CPU "
            f"{cpuinfo_field('model name') or 'unknown'}")
        runs = [("served path", base)]
        if not skip_exact:
            runs.append(("exact path", replace(base, weights="model", prefill_weights="same", kv_cache_dtype="float32")))
        figures = {}
        for label, config in runs:
            t0 = time.perf_counter()
            engine = LLMEngine(config)
            result = engine_perplexity(engine, tokens, n_ctx, bos_id, max_chunks=chunks)
            figures[label] = result.value
            out(f"{label:<12} (weights {config.weights}, KV {config.kv_cache_dtype}): PPL {result.value:.4f} over "
                f"{result.scored} tokens in {result.chunks} chunks ({time.perf_counter() - t0:.0f} s)")
            del engine
        if llama_perplexity:
            if not gguf:
                raise CommandError("--llama-perplexity needs --gguf")
            argv = [llama_perplexity, "-m", gguf, "-f", str(path), "-c", str(n_ctx), "-t", "2", "-b", str(n_ctx)]
            if chunks:
                argv += ["--chunks", str(chunks)]
            proc = subprocess.run(argv, capture_output=True, text=True)
            found = re.search(r"Final estimate: PPL = ([0-9.]+)", proc.stdout + proc.stderr)
            if not found:
                raise CommandError(f"llama-perplexity printed no estimate: {(proc.stdout + proc.stderr)[-2000:]}")
            theirs = float(found.group(1))
            ours = figures["served path"]
            out(f"llama-perplexity: PPL {theirs:.4f}; served path / llama-perplexity = {ours / theirs:.4f} "
                f"({abs(ours / theirs - 1) * 100:.2f}% apart; held to 0.5%)")
