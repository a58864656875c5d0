"""manage.py bench_router: replicas behind vllm-router (README "Scaling out"): per policy, how many second turns find
their conversation's prefix cached, the cached share of their prompt tokens and their TTFT; the latency the router
adds to a request; how long a replica killed with -9 takes to be routed around."""
from __future__ import annotations

import os
import secrets
import statistics
import tempfile
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"
DEFAULT_REDIS = "redis://127.0.0.1:6379/0"


class Command(BaseCommand):
    help = ("Start replicas on the production settings (a scratch PostgreSQL database, Redis) behind vllm-router, one "
            "router per policy, and report routing quality, the router's added latency and failover time.")

    def add_arguments(self, parser):
        parser.add_argument("--replicas", type=int, default=2)
        parser.add_argument("--policies", default="kv_aware,cache_aware,round_robin")
        parser.add_argument("--conversations", type=int, default=12, help="two-turn conversations per policy")
        parser.add_argument("--rounds", type=int, default=20, help="requests per latency figure")
        parser.add_argument("--postgres", default=os.environ.get("DATABASE_URL") or DEFAULT_POSTGRES,
                            help="a database URL on the PostgreSQL server that gets the scratch database")
        parser.add_argument("--redis", default=os.environ.get("REDIS_URL") or DEFAULT_REDIS)

    def handle(self, *args, replicas, policies, conversations, rounds, postgres, redis, **options):
        import logging

        from django.conf import settings

        from inference.bench import routing
        from inference.bench.cluster import PROXY, Replica, Router, prepare_database, replica_env, scratch_database

        from .cluster import missing_services

        logging.getLogger("httpx").setLevel(logging.WARNING)
        missing = missing_services(postgres, redis)
        if missing:
            self.stdout.write("skipped: " + " ".join(missing))
            return
        model = Path(settings.METRALE_HOME) / "models" / routing.MODEL
        if not (model / "config.json").is_file():
            raise CommandError(f"{routing.MODEL} is not pulled: run `manage.py pull_model {routing.MODEL}`")
        names = [p.strip() for p in policies.split(",") if p.strip()]
        out = self.stdout.write
        with tempfile.TemporaryDirectory() as tmp, scratch_database(postgres) as database_url:
            tmp = Path(tmp)
            prefix = f"bench-router-{secrets.token_hex(4)}"
            env = replica_env(database_url, redis, secrets.token_urlsafe(50), METRALE_MODEL=str(model),
                              METRALE_CACHE_KEY_PREFIX=prefix, METRALE_KV_CACHE_BYTES=str(256 << 20))
            headers = {"Authorization": f"Bearer {prepare_database(env, {'bench': []})['bench']}", **PROXY}
            started = [Replica(env, tmp / f"replica-{i}").start() for i in range(replicas)]
            routers = {}
            try:
                routers = {p: Router([r.url for r in started], p, tmp / f"{p}.log") for p in names}
                for server in [*started, *routers.values()]:
                    server.wait_ready()
                out(f"{replicas} replicas of {routing.MODEL} behind vllm-router; {conversations} two-turn "
                    f"conversations per policy, one after the other")
                for policy, router in routers.items():
                    turns = routing.second_turns(router.url, headers, policy, conversations)
                    out(f"{policy}: second turns with their prefix cached {routing.hit_ratio(turns):.0%}, cached "
                        f"share of their prompt tokens {routing.cached_token_ratio(turns):.0%}, second-turn TTFT "
                        f"median {routing.median_ms([t.ttft_s for t in turns])}")
                for policy in [p for p in ("kv_aware", "cache_aware") if p in routers]:
                    turns = routing.second_turns(routers[policy].url, headers, f"{policy}-direct", conversations,
                                                 first_to=[r.url for r in started])
                    out(f"{policy}, first turns straight to the replicas in turn (the router never saw them): second "
                        f"turns with their prefix cached {routing.hit_ratio(turns):.0%}")
                direct = routing.request_latency_s(started[0].url, headers, rounds)
                out(f"a one-token request straight to a replica: median {routing.median_ms(direct)}")
                for policy, router in routers.items():
                    via = routing.request_latency_s(router.url, headers, rounds)
                    added = (statistics.median(via) - statistics.median(direct)) * 1000
                    out(f"  through the {policy} router: median {routing.median_ms(via)} ({added:+.1f} ms)")
                if replicas > 1:
                    router = next(iter(routers.values()))
                    f = routing.failover(router, started[-1], headers)
                    out(f"kill -9 of a replica under a request every 0.1 s ({router.policy} router, health checks "
                        f"every 1 s, down after 2 failures): marked down after {f.marked_s:.2f} s; {f.ok} requests "
                        f"answered, {f.failed} failed{f' (first: {f.first_error})' if f.first_error else ''}")
            finally:
                for router in routers.values():
                    router.stop()
                for replica in started:
                    replica.kill()
                import redis as redis_client

                client = redis_client.Redis.from_url(redis)
                stale = list(client.scan_iter(match=f"{prefix}:*"))
                if stale:
                    client.delete(*stale)
