"""`manage.py bench_embeddings` (part of `make bench`): /v1/embeddings side by side, in one run.

Ours (a live daphne serving the chat model with the embedding model beside it) against
sentence-transformers' `encode` in this process at its best (the whole corpus in one `encode`, so its own
length sorting applies, the fastest of batch sizes 32, 64 and 256) and, with `--llama-server` (a llama.cpp
llama-server binary) and `--gguf` (the same folder converted by llama.cpp's convert_hf_to_gguf.py),
llama-server `--embeddings --pooling mean`. Two text mixes, each reported: "tokens" (8-256 tokens,
uniform) and "words" (4-180 random words, uniform); 1 and 32 concurrent clients, 1 and 64 texts a
request, rounds interleaved (ours, llama-server, ours, ...), texts per second and the median request
latency. Then an interactive stream's TPOT idle and while a 10,000-text embedding job runs. Targets
(issues 31, 46): >= 2x sentence-transformers' best at 32 clients of one text a request on both mixes,
>= 1.5x llama-server; TPOT under the job <= 1.5x idle. A script, not a test.
"""
from __future__ import annotations

import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
from django.core.management.base import BaseCommand, CommandError

LEVELS = [(1, 1), (1, 64), (32, 1), (32, 64)]  # (clients, texts a request)


class Command(BaseCommand):
    help = "Embeddings: ours vs sentence-transformers' encode vs llama-server, and TPOT under an embedding job."

    def add_arguments(self, parser):
        parser.add_argument("--embedding-model", default="all-minilm-l6-v2", help="folder or pulled name")
        parser.add_argument("--texts", type=int, default=512, help="texts a round")
        parser.add_argument("--rounds", type=int, default=2)
        parser.add_argument("--llama-server", default="", help="a llama.cpp llama-server binary")
        parser.add_argument("--gguf", default="", help="the embedding model as GGUF for --llama-server")
        parser.add_argument("--job-texts", type=int, default=10_000, help="texts of the job beside the stream")
        parser.add_argument("--skip-tpot", action="store_true")

    def handle(self, *args, embedding_model, texts, rounds, llama_server, gguf, job_texts, skip_tpot, **options):
        import torch
        import torch.nn.functional as F

        from inference.bench.embeddings import bench_texts, post_embeddings, random_word_texts, tpot_during_job
        from inference.bench.live_server import LiveServer, free_port, stop_process
        from inference.engine.embedding_model import EmbeddingModel
        from inference.engine.kernels.build import cpuinfo_field
        from inference.operations.model_specs import spec_for

        folder = spec_for(embedding_model).folder
        if not (folder / "config.json").is_file():
            raise CommandError(f"no embedding model at {folder}; run `manage.py pull_model all-minilm-l6-v2`")
        if bool(llama_server) != bool(gguf):
            raise CommandError("--llama-server and --gguf go together")
        out = self.stdout.write
        model = EmbeddingModel(folder, "float32")
        mixes = {"tokens": bench_texts(lambda t: model.tokenize([t])[0], texts),
                 "words": random_word_texts(texts, 4, 180, seed=46)}
        out(f"embeddings: {folder.name}, {texts} texts a round, {rounds} rounds; CPU "
            f"{cpuinfo_field('model name') or 'unknown'}, {torch.get_num_threads()} threads")
        for mix, corpus in mixes.items():
            lens = [len(ids) for ids in model.tokenize(corpus)]
            out(f"  mix {mix!r}: {min(lens)}-{max(lens)} tokens (mean {statistics.mean(lens):.0f})")

        from sentence_transformers import SentenceTransformer

        st = SentenceTransformer(str(folder), device="cpu")
        work = Path(tempfile.mkdtemp(prefix="bench-embeddings-"))
        ours = LiveServer({"METRALE_EMBEDDING_MODEL": str(folder), "METRALE_KV_CACHE_BYTES": str(64 << 20)},
                          work / "ours")
        peer = None
        try:
            ours.wait_ready()
            servers = {"ours": (ours.url, folder.name)}
            if llama_server:
                port = free_port()
                log = open(work / "llama-server.log", "w")
                peer = subprocess.Popen([llama_server, "-m", gguf, "--embeddings", "--pooling", "mean", "-t", "2",
                                         "-tb", "2", "-np", "32", "-c", str(32 * 256), "-b", "8192", "-ub", "8192",
                                         "--host", "127.0.0.1", "--port", str(port)], stdout=log,
                                        stderr=subprocess.STDOUT)
                _wait_llama(f"http://127.0.0.1:{port}", peer)
                servers["llama-server"] = (f"http://127.0.0.1:{port}", None)
            sample = mixes["tokens"][:16]
            ref = torch.tensor(st.encode(sample))
            for name, (url, name_sent) in servers.items():
                got = F.normalize(torch.tensor(post_embeddings(url, sample, name_sent)), dim=1)
                out(f"  {name}: min cosine to sentence-transformers over 16 texts "
                    f"{F.cosine_similarity(got, ref).min().item():.6f}")
            for mix, corpus in mixes.items():
                self._mix(mix, corpus, servers, st, rounds)
            if not skip_tpot:
                job = bench_texts(lambda t: model.tokenize([t])[0], job_texts, seed=1)
                idle, busy, done = tpot_during_job(ours.url, job, folder.name)
                out(f"\nTPOT of a chat stream (64 tokens, greedy): idle {idle * 1000:.2f} ms, while a {job_texts}-text "
                    f"embedding job runs {busy * 1000:.2f} ms ({busy / idle:.2f}x; target <= 1.5x); {done} texts "
                    "embedded meanwhile")
        finally:
            ours.stop()
            if peer is not None:
                stop_process(peer)

    def _mix(self, mix: str, corpus: list[str], servers: dict, st, rounds: int) -> None:
        """One text mix: every server at every level, rounds interleaved, then sentence-transformers' best;
        the table and the 32-client lines against that best."""
        from inference.bench.embeddings import run_clients, sentence_transformers_best

        out = self.stdout.write
        results: dict[tuple[str, int, int], list] = {}
        for level in LEVELS:
            for _ in range(rounds):
                for name, (url, name_sent) in servers.items():
                    results.setdefault((name, *level), []).append(run_clients(url, corpus, level[0], level[1], name_sent))
        st_run, st_batch = sentence_transformers_best(st, corpus, rounds)
        st_best = st_run.texts_per_s
        out(f"\nmix {mix!r}: sentence-transformers' best, the corpus in one encode: {st_best:.1f} texts/s "
            f"(batch_size {st_batch})")
        out(f"{'side':<24}{'clients':>8}{'texts/req':>10}{'texts/s':>10}{'p50 ms':>10}{'/ST best':>9}")
        best = {key: max(r.texts_per_s for r in runs) for key, runs in results.items()}
        for name in servers:
            for clients, per in LEVELS:
                runs = results[(name, clients, per)]
                p50 = statistics.median(r.p50_ms for r in runs)
                out(f"{name:<24}{clients:>8}{per:>10}{best[(name, clients, per)]:>10.1f}{p50:>10.1f}"
                    f"{best[(name, clients, per)] / st_best:>8.2f}x")
        for per in (1, 64):
            line = f"{mix}: at 32 clients, {per} texts a request: ours {best[('ours', 32, per)]:.1f} texts/s"
            line += f", {best[('ours', 32, per)] / st_best:.2f}x sentence-transformers' best"
            if per == 1:
                line += " (target >= 2x)"
            if ("llama-server", 32, per) in best:
                line += f", {best[('ours', 32, per)] / best[('llama-server', 32, per)]:.2f}x llama-server"
            out(line)


def _wait_llama(url: str, proc, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise CommandError(f"llama-server exited with status {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise CommandError("llama-server did not become ready")
