"""`manage.py bench_gemm`: the block-format GEMM micro-bench (inference/bench/gemm.py), the K-quants beside Q4_1.

Prints, per shape (N x K: output channels x input features) and rows, each format's µs per call, its
GB/s of packed weights and its time per byte relative to Q4_1's, in one thread's CPU time by default
(on a shared machine wall time counts other processes' turns too). A script, not a test.
"""
from django.core.management.base import BaseCommand, CommandError

# SmolLM2-135M's down projection (the one whose K, 1536, is whole super-blocks: its other linears have
# K = 576), Gemma 3 270M's o and down projections, and a Llama 3.2 1B-sized square.
DEFAULT_SHAPES = "576x1536,640x1024,640x2048,2048x2048"


def _shapes(text: str) -> list[tuple[int, int]]:
    try:
        out = [tuple(int(v) for v in part.split("x")) for part in text.split(",") if part]
    except ValueError:
        out = []
    if not out or any(len(s) != 2 or s[0] <= 0 or s[1] <= 0 or s[1] % 256 for s in out):
        raise CommandError(f"--shapes {text!r}: give NxK pairs, K a multiple of 256, e.g. {DEFAULT_SHAPES}")
    return out


class Command(BaseCommand):
    help = "Block-format GEMM micro-bench: Q4_K / Q5_K / Q6_K beside Q4_1, per call and per byte of weights."

    def add_arguments(self, parser):
        parser.add_argument("--shapes", default=DEFAULT_SHAPES, help="NxK pairs (K a multiple of 256)")
        parser.add_argument("--rows", default="1,8,32", help="activation rows a call")
        parser.add_argument("--formats", default="q4_1,q8_0,q4_k,q5_k,q6_k")
        parser.add_argument("--rounds", type=int, default=7)
        parser.add_argument("--calls", type=int, default=20, help="calls a round")
        parser.add_argument("--threads", type=int, default=1, help="torch threads (1: CPU times are one "
                            "thread's; more: OpenMP workers' spinning counts too)")

    def handle(self, *args, shapes, rows, formats, rounds, calls, threads, **options):
        import torch

        if threads > 0:
            torch.set_num_threads(threads)
        from inference.bench.gemm import BASELINE, bench_gemm, per_byte_ratio
        from inference.engine import kernels
        from inference.engine.kernels.build import cpuinfo_field

        fmts = [f for f in formats.split(",") if f]
        if BASELINE not in fmts:
            fmts.insert(0, BASELINE)
        try:
            row_counts = [int(r) for r in rows.split(",") if r]
        except ValueError as exc:
            raise CommandError(f"--rows {rows!r}: {exc}") from exc
        out = self.stdout.write
        out(f"CPU {cpuinfo_field('model name') or 'unknown'}, {torch.get_num_threads()} threads, kernels "
            f"{kernels.instruction_set()}; {rounds} interleaved rounds of {calls} calls: CPU us per call in the "
            "fastest round (wall us, median round)")
        figures = bench_gemm(_shapes(shapes), row_counts, fmts, rounds=rounds, calls=calls)
        base = {(f.n, f.k, f.rows): f for f in figures if f.fmt == BASELINE}
        out(f"{'shape':>10} {'rows':>4} {'format':>6} {'CPU us':>9} {'(wall)':>10} {'KiB':>7} {'GB/s':>6} "
            f"{'per byte vs ' + BASELINE:>16}")
        for f in figures:
            ratio = per_byte_ratio(f, base[(f.n, f.k, f.rows)])
            out(f"{f'{f.n}x{f.k}':>10} {f.rows:>4} {f.fmt:>6} {f.us:>9.1f} {f'({f.median_us:.1f})':>10} "
                f"{f.weight_bytes / 1024:>7.0f} "
                f"{f.gb_per_s:>6.1f} {ratio:>16.2f}")
