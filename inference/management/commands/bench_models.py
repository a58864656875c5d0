"""manage.py bench_models: several models behind one server (README "Many models behind one endpoint"): cold load to
first token, the TTFT a switch between two resident models adds, resident memory, two streams at once."""
from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = ("Start a server with METRALE_MODELS (nothing pinned) and measure each model's cold load to first token, "
            "warm TTFT, resident memory, the TTFT of a switch between two resident models, and two models "
            "streaming at once against each alone.")

    def add_arguments(self, parser):
        parser.add_argument("--models", default="smollm2-135m-instruct,gemma-3-270m",
                            help="chat models (pulled names or folders); those not pulled are skipped")
        parser.add_argument("--rounds", type=int, default=5)
        parser.add_argument("--max-tokens", type=int, default=48, help="tokens a stream of the TPOT runs generates")

    def handle(self, *args, models, rounds, max_tokens, **options):
        from inference.bench import models as bench
        from inference.bench.live_server import LiveServer
        from inference.engine.kernels.build import cpuinfo_field
        from inference.operations.model_specs import spec_for

        names = []
        for item in [m.strip() for m in models.split(",") if m.strip()]:
            spec = spec_for(item)
            if (spec.folder / "config.json").is_file():
                names.append(str(spec.folder) if Path(item).expanduser().exists() else spec.name)
            else:
                self.stdout.write(f"skipped {item}: not pulled ({spec.folder})")
        if not names:
            raise CommandError("no model to measure: run `manage.py pull_model smollm2-135m-instruct`")
        out = self.stdout.write
        out(f"CPU: {cpuinfo_field('model name')}; {rounds} rounds; METRALE_HOME {settings.METRALE_HOME}")
        env = {"METRALE_MODELS": ",".join(names), "METRALE_PIN": "none", "METRALE_KEEP_ALIVE": "-1",
               "METRALE_EMBEDDING_MODEL": ""}
        with tempfile.TemporaryDirectory() as tmp, LiveServer(env, Path(tmp)) as server:
            served = list(bench.model_states(server.url))
            figures = []
            for name in served:
                f = bench.cold_and_warm(server.url, name, rounds)
                f.load_s.append(bench.model_states(server.url)[name].get("load_s") or 0.0)
                figures.append(f)
                out(f"{name}: cold load to first token {bench.median_ms(f.cold_ttft_s)} "
                    f"(min {min(f.cold_ttft_s) * 1000:.1f} ms), warm TTFT {bench.median_ms(f.warm_ttft_s)}, "
                    f"resident {(f.resident_bytes or 0) / 1e6:.1f} MB (KV pool {(f.kv_cache_bytes or 0) / 1e6:.1f} MB)")
            if len(figures) >= 2:
                a, b = figures[0], figures[1]
                for name, (same, switched) in bench.switch_ttft(server.url, a.name, b.name, rounds).items():
                    added = (statistics.median(switched) - statistics.median(same)) * 1000
                    out(f"{name}: TTFT after a request to the same model {bench.median_ms(same)}, right after a switch "
                        f"from the other resident model {bench.median_ms(switched)} (the switch adds {added:+.1f} ms)")
                bench.streams_alone_and_together(server.url, a, b, rounds, max_tokens)
                for f in (a, b):
                    alone, both = statistics.median(f.alone_tpot_s), statistics.median(f.together_tpot_s)
                    out(f"{f.name}: TPOT alone {alone * 1000:.1f} ms, with the other model streaming "
                        f"{both * 1000:.1f} ms ({both / alone:.2f}x; fair share is 2x, target <= 2.2x)")
