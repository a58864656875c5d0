"""`manage.py bench` (`make bench`): throughput, latency and the ratios the engine is held to.

First the decode side by side (bench/decode.py), the figures users compare: streamed chat with
short prompts, TPOT and tok/s after each stream's first token, greedy and temperature 0.8 with
and without a seed, our server with speculation off and `auto`, against llama.cpp's llama-server
(`--llama-cpp-url`) in interleaved rounds, with a prompt-processing probe and resident memory
at the same KV capacity. Then, in one run, on the same prompts (ShareGPT-like mixed lengths,
fixed seed), the end-to-end figures that include prefill: our engine offline and through HTTP
at concurrency 1, 8 and 32 (output tokens/s, TTFT and TPOT p50/p99); transformers `generate`
on the same weights and dtype; the memory-bandwidth floor of batch-1 decode; and the prefix
cache's TTFT on a shared 1,000-token system prompt. A script, not a test: figures depend on
the machine.
"""
import json
import os
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch
from django.core.management.base import BaseCommand, CommandError

from inference.bench.http_streams import run_http
from inference.bench.live_server import LiveServer
from inference.bench.offline import run_offline
from inference.bench.own_thread import in_own_thread
from inference.bench.peer import compare, prompt_tok_s, rss_bytes
from inference.bench.prefix import prefix_ttft
from inference.bench.offline import chat_prompt_ids
from inference.bench.references import copy_bandwidth_gb_s, hf_generate_tok_s, hf_same_prompts, weight_bytes
from inference.bench.stats import RunSummary
from inference.engine import kernels
from inference.engine.kernels.build import cpuinfo_field
from inference.bench.workload import sharegpt_like

LLAMA_CPP_8_STREAMS_TOK_S = 80.0  # llama-cpp-python's server, same GGUF, measured on this machine kind (issue 3)


class Command(BaseCommand):
    help = "Benchmark the engine offline and through HTTP against transformers and the bandwidth floor."

    def add_arguments(self, parser):
        parser.add_argument("--dtypes", default="float32,bfloat16")
        parser.add_argument("--concurrency", default="1,8,32")
        parser.add_argument("--requests-per-stream", type=int, default=4,
                            help="requests per concurrent stream at each concurrency (at least 3 at concurrency 1)")
        parser.add_argument("--skip-hf", action="store_true", help="skip the transformers reference runs")
        parser.add_argument("--skip-http", action="store_true")
        parser.add_argument("--lora-only", action="store_true",
                            help="run only the LoRA comparison (8 streams on 4 adapters vs 8 on the base)")
        parser.add_argument("--skip-lora", action="store_true", help="skip the LoRA adapters against the base")
        parser.add_argument("--lora-rank", type=int, default=16)
        parser.add_argument("--lora-targets", default="q_proj,k_proj,v_proj,o_proj",
                            help="the projections the bench's adapters target (comma-separated)")
        parser.add_argument("--lora-rounds", type=int, default=3)
        parser.add_argument("--lora-tokens", type=int, default=64, help="output tokens per stream")
        parser.add_argument("--llama-cpp-url", default="",
                            help="a running llama.cpp llama-server on the same model's GGUF (../shared/tools/"
                                 "llama-server.sh; -t 2 -tb 2 -np 32 -c 16384): the same HTTP workloads run against "
                                 "our server and it in interleaved rounds, with a prompt-processing probe, printed "
                                 "as ratios")
        parser.add_argument("--llama-cpp-pid", type=int, default=0,
                            help="the llama-server's process id, to print its resident memory beside ours")
        parser.add_argument("--peer-rounds", type=int, default=3, help="interleaved rounds against --llama-cpp-url")
        parser.add_argument("--skip-offline", action="store_true", help="skip the in-process (offline) runs")
        parser.add_argument("--decode-only", action="store_true",
                            help="run only the decode side by side (bench/decode.py: streamed chat, TPOT after the "
                                 "first token, greedy and temperature 0.8 with and without a seed, speculation off "
                                 "and auto, against --llama-cpp-url when given), its prefill probe and memory")
        parser.add_argument("--skip-decode", action="store_true", help="skip the decode side by side")
        parser.add_argument("--decode-concurrency", default="1,8,32")
        parser.add_argument("--decode-tokens", type=int, default=128, help="tokens each decode stream generates")
        parser.add_argument("--decode-rounds", type=int, default=2, help="interleaved rounds of the decode side by side")
        parser.add_argument("--probe-tokens", type=int, default=400,
                            help="the prompt-processing probe's prompt length (llama-server -np 32 -c 16384 gives each "
                                 "slot 512 tokens of context)")
        parser.add_argument("--contention", type=int, default=0, metavar="N",
                            help="after the decode side by side, each server's decode (T 0.8, 1 and 8 streams) with N "
                                 "busy processes beside it against its own idle figure, interleaved, and two of our "
                                 "servers decoding one stream each at once (bench/contention.py)")
        parser.add_argument("--contention-only", action="store_true",
                            help="with --contention: skip the decode table and the prompt probe")
        parser.add_argument("--kv-tokens", type=int, default=16384,
                            help="our servers' KV cache capacity in tokens for the decode side by side (llama-server's "
                                 "-c), so that resident memory compares like with like")

    def handle(self, *args, dtypes, concurrency, requests_per_stream, skip_hf, skip_http, llama_cpp_url, llama_cpp_pid,
               peer_rounds, skip_offline, lora_only, skip_lora, lora_rank, lora_targets, lora_rounds, lora_tokens,
               decode_only, skip_decode, decode_concurrency, decode_tokens, decode_rounds, kv_tokens, probe_tokens,
               contention=0, contention_only=False, **options):
        from inference.engine.async_engine import AsyncEngine
        from inference.engine.tokenizer import Tokenizer
        from inference.operations.runtime import engine_config

        if lora_only and skip_lora:
            raise CommandError("--lora-only and --skip-lora leave nothing to run.")
        base = engine_config()
        model = base.model_path
        tokenizer = Tokenizer.from_folder(model)
        levels = [int(c) for c in concurrency.split(",")]
        if not skip_hf and "quantization_config" in json.loads((Path(model) / "config.json").read_text()):
            self.stdout.write("the model folder holds GGUF blocks, which transformers does not read: "
                              "skipping the transformers references")
            skip_hf = True
        bandwidth = in_own_thread(copy_bandwidth_gb_s)
        out = self.stdout.write
        out(f"model {Path(model).name}; weights {base.weights}; prefill weights "
            f"{base.prefill_weights}; KV cache {base.kv_cache_dtype}; copy bandwidth {bandwidth:.1f} GB/s; torch threads "
            f"{torch.get_num_threads()}; CPU {cpuinfo_field('model name') or 'unknown'}; kernels {kernels.instruction_set()}")
        if not (lora_only or skip_decode):
            self._decode(base, tokenizer, llama_cpp_url.rstrip("/"), llama_cpp_pid,
                         [int(c) for c in decode_concurrency.split(",")], decode_tokens, decode_rounds, kv_tokens,
                         probe_tokens, contention, contention_only)
        if decode_only or contention_only:
            return
        for dtype in [] if lora_only else dtypes.split(","):
            rows: list[RunSummary] = []
            workloads = {c: sharegpt_like(tokenizer, max(3, c * requests_per_stream) if c == 1 else c * requests_per_stream,
                                          seed=c) for c in levels}
            ae = AsyncEngine(config=replace(base, dtype=dtype, max_num_seqs=max(levels)))
            engine = ae.engine
            wbytes = weight_bytes(engine.runner.model)
            out(f"{dtype:<9} resident weights {wbytes / 1e6:.1f} MB ({', '.join(f'{n} {fmt}' for fmt, n in engine.runner.model.weight_formats.items())})")
            if not skip_offline:
                run_offline(ae, tokenizer, sharegpt_like(tokenizer, 2, seed=99, output_range=(8, 8)), 2)  # warm-up
                for c in levels:
                    timings, wall = run_offline(ae, tokenizer, workloads[c], c)
                    rows.append(RunSummary.of("offline", c, timings, wall))
                    out(self._row(dtype, rows[-1]))
            ae.stop()
            total = sum(engine.phase_s.values()) or 1.0
            out(f"{dtype:<9} offline step time ({engine.num_steps} steps, {total:.1f} s): " + ", ".join(
                f"{name} {seconds / total:.0%}" for name, seconds in engine.phase_s.items()))
            del ae, engine
            prefix = None
            if not skip_http:
                with tempfile.TemporaryDirectory() as tmp, LiveServer(
                        {"METRALE_MODEL": model, "METRALE_DTYPE": dtype, "METRALE_MAX_NUM_SEQS": str(max(levels))},
                        Path(tmp)) as server:
                    run_http(server.url, sharegpt_like(tokenizer, 2, seed=99, output_range=(8, 8)), 2)
                    if llama_cpp_url:
                        self._peer(server, llama_cpp_url.rstrip("/"), llama_cpp_pid, workloads, tokenizer, peer_rounds)
                    else:
                        for c in levels:
                            timings, wall = run_http(server.url, workloads[c], c)
                            rows.append(RunSummary.of("http", c, timings, wall))
                            out(self._row(dtype, rows[-1]))
                        prefix = prefix_ttft(server.url, tokenizer)
            hf, same = {}, {}
            if not skip_hf:
                for b in (1, 8, 32):
                    hf[b] = in_own_thread(hf_generate_tok_s, model, getattr(torch, dtype), b)
                    out(f"{dtype:<9} transformers generate, padded batch {b:>2} (random 128-token prompts, 64 new): "
                        f"{hf[b]:7.1f} tok/s")
                for b in (1, 8, 32):
                    reqs = workloads.get(b) or sharegpt_like(tokenizer, b, seed=b)
                    reqs = reqs[:b]
                    same[b] = in_own_thread(hf_same_prompts, model, getattr(torch, dtype),
                                              [chat_prompt_ids(tokenizer, r.prompt) for r in reqs],
                                              [r.output_tokens for r in reqs])
                    out(f"{dtype:<9} transformers generate, the workload's first {b} request(s) as one padded batch: "
                        + ", ".join(f"{k} {v:.1f}" for k, v in same[b].items()))
            self._report(dtype, rows, hf, prefix, wbytes, bandwidth, same)
        if not skip_lora:
            self._lora(base, tokenizer, lora_rank, lora_targets.split(","), lora_rounds, lora_tokens)

    def _lora(self, base, tokenizer, rank: int, targets: list[str], rounds: int, output_tokens: int) -> None:
        """8 streams on 4 adapters against 8 on the base model, interleaved (bench/lora.py)."""
        from inference.bench.lora import lora_vs_base, make_adapters, median_line, round_line
        from inference.engine.async_engine import AsyncEngine
        from inference.engine.lora_control import install, read_adapter

        out = self.stdout.write
        with tempfile.TemporaryDirectory() as tmp:
            paths = make_adapters(base.model_path, Path(tmp), 4, rank, targets)
            ae = AsyncEngine(config=replace(base, max_num_seqs=8, max_loras=4, enable_prefix_caching=False))
            names = [p.name for p in paths]
            for name, path in zip(names, paths):
                install(ae, read_adapter(ae, name, str(path))).result()
            out(f"\n== LoRA: 8 streams on 4 adapters (rank {rank} on {', '.join(targets)}) vs 8 on the base, "
                f"{base.weights} weights, offline, {output_tokens} tokens each ==")
            rows = in_own_thread(lora_vs_base, ae, tokenizer, names, 8, rounds, output_tokens,
                                 lambda *r: (out(round_line(*r)), self.stdout.flush()))
            ae.stop()
        out(median_line(rows))

    def _decode(self, base, tokenizer, peer_url: str, peer_pid: int, levels: list[int], tokens: int, rounds: int,
                kv_tokens: int, probe_tokens: int, contention: int = 0, contention_only: bool = False) -> None:
        """The decode side by side (bench/decode.py): our server with speculation off and with it on
        `auto`, llama-server at peer_url when given, each KV cache holding kv_tokens tokens; then a
        prompt-processing probe and resident memory at idle and after the runs; with `contention`, the
        same servers beside that many busy processes (bench/contention.py)."""
        import random

        from inference.bench.decode import SAMPLINGS, compare_decode, decode_table
        from inference.bench.workload import BenchRequest, make_text
        from inference.engine.config import ModelConfig
        from inference.engine.model_runner import ModelRunner

        out = self.stdout.write
        cfg = ModelConfig.from_folder(base.model_path)
        kv_dtype = getattr(torch, base.kv_cache_dtype) if base.kv_cache_dtype != "auto" else torch.float32
        kv_bytes = ModelRunner.kv_bytes_per_block(cfg, base.block_size, kv_dtype) * -(-kv_tokens // base.block_size)
        env = {"METRALE_MODEL": base.model_path, "METRALE_MAX_NUM_SEQS": str(max(levels)),
               "METRALE_KV_CACHE_BYTES": str(kv_bytes)}
        cpu = cpuinfo_field("model name") or "unknown"
        with tempfile.TemporaryDirectory() as tmp, \
                LiveServer({**env, "METRALE_SPECULATIVE": "off"}, Path(tmp) / "off") as off, \
                LiveServer({**env, "METRALE_SPECULATIVE": "auto"}, Path(tmp) / "auto") as auto:
            servers = {"ours (spec off)": off.url, "ours (spec auto)": auto.url}
            if peer_url:
                servers["llama-server"] = peer_url
            run_http(off.url, [BenchRequest("Hello", 1, 4)], 1)  # the first request's one-off costs
            run_http(auto.url, [BenchRequest("Hello", 1, 4)], 1)
            rss = {"ours": rss_bytes(off.proc.pid), "llama-server": rss_bytes(peer_pid)}
            if contention:
                self._contention(servers, contention, rounds, tokens, cpu)
                if contention_only:
                    return
            out(f"\n== decode side by side: streamed chat, short prompts, {tokens} tokens a stream (ignore_eos), "
                f"medians of {rounds} interleaved rounds; CPU {cpu}; kernels {kernels.instruction_set()}; our KV cache "
                f"{kv_tokens} tokens ({kv_bytes / 2**20:.0f} MiB {base.kv_cache_dtype}), weights {base.weights} ==")
            cmp = compare_decode(servers, levels, SAMPLINGS, rounds, tokens, log=out)
            out("\ndecode tok/s (after each stream's first token) and TPOT p50 (after the first token):")
            for line in decode_table(cmp, ["ours (spec off)", "ours (spec auto)"], "llama-server" if peer_url else None,
                                     levels):
                out(line)
            probe_rng = random.Random(time.time_ns())
            rates: dict[str, list[float]] = {}
            for _ in range(rounds):  # prefill: a fresh prompt, one output token (prompt tokens / TTFT)
                probe = BenchRequest(make_text(tokenizer, probe_tokens, probe_rng), probe_tokens, 1)
                for name, url in servers.items():
                    if name != "ours (spec auto)":
                        rates.setdefault(name, []).append(prompt_tok_s(url, probe, None))
            line = f"prompt processing ({probe_tokens} tokens, prompt tokens / TTFT): " + ", ".join(
                f"{name} {statistics.median(r):.0f} tok/s" for name, r in rates.items())
            if peer_url:
                line += f" ({statistics.median(rates['ours (spec off)']) / statistics.median(rates['llama-server']):.2f}x)"
            out(line)
            after = {"ours": rss_bytes(off.proc.pid), "llama-server": rss_bytes(peer_pid)}
            for label, figures in (("at idle", rss), ("after the runs", after)):
                if figures["ours"]:
                    text = f"resident memory {label}: ours {figures['ours'] / 2**20:.0f} MiB"
                    if figures["llama-server"]:
                        text += (f", llama-server {figures['llama-server'] / 2**20:.0f} MiB "
                                 f"({figures['ours'] / figures['llama-server']:.2f}x)")
                    out(text)

    def _contention(self, servers: dict[str, str], busy: int, rounds: int, tokens: int, cpu: str) -> None:
        """Each server's T 0.8 decode at 1 and 8 streams with `busy` busy processes beside it, as a ratio to
        its own idle figure, and our two servers decoding one stream each at once (bench/contention.py)."""
        from inference.bench.contention import compare_contention, contention_table

        out = self.stdout.write
        levels = [1, 8]
        out(f"\n== decode under contention: {busy} busy process(es) beside each server, T 0.8, {tokens} tokens a stream, "
            f"medians of {rounds} interleaved rounds; CPU {cpu}, {os.cpu_count()} CPUs ==")
        cmp = compare_contention(servers, levels, busy, rounds, tokens, pair=("ours (spec off)", "ours (spec auto)"),
                                 log=out)
        out("\ndecode tok/s (after each stream's first token) and TPOT p50, idle and busy, each server against itself:")
        for line in contention_table(cmp, levels):
            out(line)

    def _peer(self, server, url: str, pid: int, workloads, tokenizer, rounds: int) -> None:
        """Interleaved rounds against the llama-server at `url` (bench/peer.py), then the ratio table."""
        out = self.stdout.write
        ours_rss, peer_rss = rss_bytes(server.proc.pid), rss_bytes(pid)
        banned = sorted(tokenizer.special_ids)  # it has no ignore_eos: EOS is made impossible instead
        levels = list(workloads)
        per_level = {c: len(reqs) for c, reqs in workloads.items()}

        def workloads_for(rnd: int):  # the same sizes, new prompts each round (seeds apart from the others')
            return {c: sharegpt_like(tokenizer, per_level[c], seed=1000 * (rnd + 2) + c) for c in levels}

        cmp = compare(server.url, url, workloads_for, tokenizer, banned, rounds, log=out)
        out(f"\n== side by side with llama-server ({url}), medians of {rounds} interleaved rounds; CPU "
            f"{cpuinfo_field('model name') or 'unknown'} ==")
        out("| | ours tok/s | llama-server tok/s | ratio | TPOT ours / llama-server |")
        out("| --- | --- | --- | --- | --- |")
        for c in workloads:
            a, b = cmp.median_tok_s("ours", c), cmp.median_tok_s("peer", c)
            out(f"| {c} stream{'s' if c > 1 else ''} | {a:.1f} | {b:.1f} | {a / b:.2f}x | "
                f"{cmp.median_tpot('ours', c) * 1000:.1f} / {cmp.median_tpot('peer', c) * 1000:.1f} ms |")
        pa, pb = statistics.median(cmp.prompt["ours"]), statistics.median(cmp.prompt["peer"])
        out(f"| prompt processing (1,000 tokens) | {pa:.0f} | {pb:.0f} | {pa / pb:.2f}x | |")
        if ours_rss and peer_rss:
            out(f"resident memory at idle: ours {ours_rss / 2**20:.0f} MiB, llama-server {peer_rss / 2**20:.0f} MiB "
                f"({ours_rss / peer_rss:.2f}x)")
            after, peer_after = rss_bytes(server.proc.pid), rss_bytes(pid)
            if after and peer_after:  # the KV pool's pages are committed as blocks are first written (kv_pool.py)
                out(f"resident memory after the workloads: ours {after / 2**20:.0f} MiB, llama-server "
                    f"{peer_after / 2**20:.0f} MiB ({after / peer_after:.2f}x)")

    @staticmethod
    def _row(dtype: str, r: RunSummary) -> str:
        return (f"{dtype:<9} {r.label:<9} c={r.concurrency:<3} {r.output_tok_s:7.1f} tok/s  "
                f"TTFT p50 {r.ttft_p50 * 1000:7.0f} ms p99 {r.ttft_p99 * 1000:7.0f} ms  "
                f"TPOT p50 {r.tpot_p50 * 1000:6.1f} ms p99 {r.tpot_p99 * 1000:6.1f} ms")

    def _report(self, dtype, rows, hf, prefix, wbytes, bandwidth, same=None):
        same = same or {}
        out = self.stdout.write
        get = {(r.label, r.concurrency): r for r in rows}
        out(f"\n== {dtype}: ratios (measured in this run) ==")
        one = get.get(("offline", 1))
        if one:
            floor_s = wbytes / (bandwidth / 2 * 1e9)  # weights are read once per decode step
            out(f"batch-1 decode: {1 / one.tpot_p50:.1f} tok/s; bandwidth floor {floor_s * 1000:.1f} ms/token "
                f"({wbytes / 2**20:.0f} MiB of weights at {bandwidth / 2:.1f} GB/s read); "
                f"ours {one.tpot_p50 * 1000:.1f} ms/token = {one.tpot_p50 / floor_s:.2f}x the floor")
            if one.tpot_p50 < floor_s:
                out("  (below the floor: the weights stay in this CPU's last-level cache between steps, which "
                    "reads faster than the memory copy measured)")
            if 1 in hf:
                out(f"  vs transformers batch 1: {1 / one.tpot_p50 / hf[1]:.2f}x (target >= 2x)")
            if 1 in same:
                out(f"  vs transformers' decode-only rate on the same prompt: "
                    f"{1 / one.tpot_p50 / same[1]['decode_tok_s']:.2f}x")
        h8 = get.get(("http", 8))
        if h8:
            out(f"8 streams through HTTP: {h8.output_tok_s:.1f} tok/s = {h8.output_tok_s / LLAMA_CPP_8_STREAMS_TOK_S:.2f}x "
                f"llama-cpp-python's {LLAMA_CPP_8_STREAMS_TOK_S:.0f} tok/s (reference figure; target >= 2x)")
            l8 = get.get(("llama.cpp", 8))
            if l8:
                out(f"  vs llama-cpp-python measured in this run on the same workload: {l8.output_tok_s:.1f} tok/s, "
                    f"ours = {h8.output_tok_s / l8.output_tok_s:.2f}x")
            o8 = get.get(("offline", 8))
            if o8:
                out(f"HTTP vs offline at concurrency 8: {h8.output_tok_s / o8.output_tok_s:.2f} (target >= 0.9)")
        h32 = get.get(("http", 32)) or get.get(("offline", 32))
        if h32 and 32 in hf:
            out(f"32 streams ({h32.label}): {h32.output_tok_s:.1f} tok/s = {h32.output_tok_s / hf[32]:.2f}x transformers' "
                f"padded batch 32 (target >= 1.5x)")
        if h32 and 32 in same:
            s32 = same[32]
            out(f"  on the same 32 prompts as one padded batch, transformers delivers {s32['goodput_tok_s']:.1f} tok/s of "
                f"requested tokens ({s32['raw_tok_s']:.1f} generated): ours = {h32.output_tok_s / s32['goodput_tok_s']:.2f}x")
        if h8 and 8 in same:
            out(f"8 streams vs transformers on the same 8 prompts as one padded batch: "
                f"{h8.output_tok_s / same[8]['goodput_tok_s']:.2f}x its delivered tok/s")
        if prefix:
            miss, hit = prefix
            out(f"prefix cache, 1,000-token system prompt: TTFT miss {miss * 1000:.0f} ms, hit {hit * 1000:.0f} ms = "
                f"{miss / hit:.1f}x lower (target >= 5x)")
