"""Two replicas on the production settings (PostgreSQL, Redis) behind the real vllm-router (0.1.17), started once:
second turns land where their prefix is cached (kv_aware from the replicas' KV events, cache_aware from the router's
own tree; not round_robin); a response, a batch and rate limits shared across replicas; a replica killed with -9
under load (marked down, its streams end in error, the others serve, nothing left in progress after its restart);
SIGTERM drains a replica out of the router with no client error; HTTPS redirects spare the probes."""
import json
import secrets
import signal
import threading
import time

import httpx
import openai
import pytest

from inference.bench.cluster import PROXY, Replica, Router, prepare_database, replica_env
from inference.bench.routing import hit_ratio, second_turns
from tests.batch_checks import chat_lines, check_every_line_once, create_batch, wait_batch
from tests.conftest import pulled_smollm2

from .conftest import pg_rows, postgres_database, redis_server_url

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MODEL = "smollm2-135m-instruct"
POLICIES = ("kv_aware", "cache_aware", "round_robin")


class Cluster:
    def __init__(self, replicas, routers, keys, database_url, http):
        self.a, self.b = replicas
        self.routers = routers
        self.keys = keys
        self.database_url = database_url
        self.http = http  # one httpx client for the tests' plain requests (a new one builds an SSL context)

    def headers(self, tenant="owner"):
        return {"Authorization": f"Bearer {self.keys[tenant]}", **PROXY}

    def client(self, url, tenant="owner"):
        return openai.OpenAI(base_url=url + "/v1", api_key=self.keys[tenant], max_retries=0, timeout=120,
                             default_headers=PROXY)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("router-cluster")
    redis_url = redis_server_url()
    prefix = f"router-{secrets.token_hex(4)}"
    with postgres_database() as database_url:
        env = replica_env(database_url, redis_url, secrets.token_urlsafe(50), METRALE_MODEL=str(pulled_smollm2()),
                          METRALE_KV_CACHE_BYTES=str(64 << 20), METRALE_CACHE_KEY_PREFIX=prefix,
                          METRALE_FILES_DIR=str(tmp / "files"), METRALE_HEARTBEAT_INTERVAL="1")
        keys = prepare_database(env, {"owner": [], "limited": ["--rpm", "4", "--burst-rpm", "4"]})
        replicas = [Replica(env, tmp / name).start() for name in ("a", "b")]
        routers = {}
        try:
            routers = {p: Router([r.url for r in replicas], p, tmp / f"{p}.log") for p in POLICIES}
            for server in [*replicas, *routers.values()]:
                server.wait_ready()
            with httpx.Client(timeout=120) as http:
                yield Cluster(replicas, routers, keys, database_url, http)
        finally:
            for router in routers.values():
                router.stop()
            for replica in replicas:  # no drain to wait for: what they hold goes with the database
                replica.kill()
            import redis

            client = redis.Redis.from_url(redis_url)
            stale = list(client.scan_iter(match=f"{prefix}:*"))
            if stale:
                client.delete(*stale)


def chat(cluster, url, messages, max_tokens=4):
    r = cluster.http.post(url + "/v1/chat/completions", headers=cluster.headers(),
                          json={"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()


def test_second_turns_land_where_their_prefix_is_cached_with_kv_aware_and_cache_aware(cluster):
    """Four conversations a policy, one after the other: one miss already fails kv_aware or cache_aware (3/4)."""
    ratios = {policy: hit_ratio(second_turns(cluster.routers[policy].url, cluster.headers(), policy, 4))
              for policy in POLICIES}
    print(f"second turns with their prefix cached: {ratios}")
    assert ratios["kv_aware"] >= 0.9 and ratios["cache_aware"] >= 0.9, ratios
    assert ratios["round_robin"] <= 0.5, ratios  # alternating turns: the other replica (1/N or less)


def test_kv_aware_follows_what_the_replicas_cache_even_when_the_router_never_saw_the_first_turn(cluster):
    """First turns straight to each replica in turn: only the replicas' KV events tell the router where they are."""
    turns = second_turns(cluster.routers["kv_aware"].url, cluster.headers(), "direct", 4,
                         first_to=[cluster.a.url, cluster.b.url])
    assert hit_ratio(turns) == 1.0, turns


def test_a_response_stored_on_one_replica_is_read_continued_and_deleted_on_the_other(cluster):
    on_a, on_b = cluster.client(cluster.a.url), cluster.client(cluster.b.url)
    first = on_a.responses.create(model=MODEL, input="Say hi.", max_output_tokens=4)
    read = on_b.responses.retrieve(first.id)
    assert (read.id, read.output_text, read.status) == (first.id, first.output_text, first.status)
    follow = on_b.responses.create(model=MODEL, input="Again.", previous_response_id=first.id, max_output_tokens=4)
    assert follow.previous_response_id == first.id and follow.usage.input_tokens > first.usage.input_tokens
    assert on_a.responses.retrieve(follow.id).id == follow.id
    on_b.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        on_a.responses.retrieve(first.id)


def test_a_batch_made_on_one_replica_is_reported_on_the_other(cluster):
    rows = chat_lines(3)
    batch = create_batch(cluster.client(cluster.a.url), rows)
    on_b = cluster.client(cluster.b.url)
    check_every_line_once(on_b, wait_batch(on_b, batch.id, timeout_s=300), rows, {})


def test_rate_limits_are_shared_by_the_replicas(cluster):
    headers = cluster.headers("limited")
    statuses = [cluster.http.get(r.url + "/v1/models", headers=headers).status_code
                for r in (cluster.a, cluster.b, cluster.a, cluster.b, cluster.a, cluster.b)]
    assert statuses[:4] == [200] * 4 and statuses[4:] == [429, 429]


def test_plain_http_is_sent_to_https_but_the_probes_a_load_balancer_and_the_router_make(cluster):
    auth = {"Authorization": f"Bearer {cluster.keys['owner']}"}
    plain = cluster.http.get(cluster.a.url + "/v1/models", headers=auth)
    assert plain.status_code == 301 and plain.headers["location"].startswith("https://")
    for path in ("/health", "/get_server_info", "/kv_event_sources", "/get_load"):
        assert cluster.http.get(cluster.a.url + path).status_code == 200, path
    render = cluster.http.post(cluster.a.url + "/v1/chat/completions/render", headers=auth,
                               json={"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]})
    assert render.status_code == 200 and render.json()["token_ids"]
    secure = cluster.http.get(cluster.a.url + "/v1/models", headers=cluster.headers())
    assert secure.status_code == 200 and "max-age=31536000" in secure.headers["strict-transport-security"]


class Stream(threading.Thread):
    """One streamed chat request through a router: `started` once its first content arrived; then `done` (the
    stream ended with [DONE] after a finish_reason) or `error` (an error event, or the connection broke)."""

    def __init__(self, url, headers, n):
        super().__init__(daemon=True)
        self.url, self.headers, self.n = url, headers, n
        self.started = threading.Event()
        self.done, self.error, self.finish = False, None, None

    def run(self):
        body = {"model": MODEL, "stream": True, "max_tokens": 48, "temperature": 0, "ignore_eos": True,
                "messages": [{"role": "user", "content": f"Count slowly from {self.n}."}]}
        try:
            with httpx.stream("POST", self.url + "/v1/chat/completions", headers=self.headers, json=body,
                              timeout=120) as r:
                if r.status_code != 200:
                    self.error = f"status {r.status_code}: {r.read()[:200]!r}"
                    return
                for line in r.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line[6:]
                    if data == "[DONE]":
                        self.done = self.finish is not None
                        return
                    event = json.loads(data)
                    if "error" in event:
                        self.error = event["error"].get("message", "error event")
                        return
                    for choice in event.get("choices", []):
                        self.started.set()
                        self.finish = choice.get("finish_reason") or self.finish
            self.error = "the stream ended without [DONE]"
        except httpx.HTTPError as exc:
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.started.set()


def start_streams(url, headers, count):
    streams = [Stream(url, headers, n) for n in range(count)]
    for s in streams:
        s.start()
    for s in streams:
        assert s.started.wait(120)
    return streams


def test_a_replica_killed_under_load_is_marked_down_its_streams_fail_and_nothing_stays_in_progress(cluster):
    router = cluster.routers["round_robin"]
    background = cluster.client(cluster.a.url).responses.create(
        model=MODEL, input="Write a long story about a lighthouse.", background=True, max_output_tokens=400,
        extra_body={"ignore_eos": True})
    streams = start_streams(router.url, cluster.headers(), 4)  # round robin: two on each replica
    assert cluster.client(cluster.b.url).responses.retrieve(background.id).status in ("queued", "in_progress")
    killed = time.monotonic()
    cluster.a.kill()
    while router.health().get(cluster.a.url, True):
        assert time.monotonic() - killed < 30, "the router never marked the killed replica down"
        time.sleep(0.05)
    marked_s = time.monotonic() - killed
    cluster.a.start()  # loading while the survivor answers what follows
    after = [chat(cluster, router.url, [{"role": "user", "content": f"Hi {n}"}]) for n in range(4)]
    for s in streams:
        s.join(120)
    print(f"kill -9: marked down after {marked_s:.2f} s; streams: {[(s.done, s.error) for s in streams]}")
    assert all(a["choices"][0]["finish_reason"] in ("stop", "length") for a in after)
    assert sum(s.done for s in streams) == 2 and all(s.done or s.error for s in streams)

    cluster.a.wait_ready()
    router.wait_ready()
    status = cluster.client(cluster.b.url).responses.retrieve(background.id).status
    assert status == "failed", status
    unfinished = pg_rows(cluster.database_url, "SELECT count(*) FROM responses_api_storedresponse "
                                              "WHERE status IN ('queued', 'in_progress')")
    assert unfinished == [(0,)]


def test_sigterm_drains_a_replica_out_of_the_router_without_a_client_error(cluster):
    router = cluster.routers["round_robin"]
    streams = start_streams(router.url, cluster.headers(), 4)
    cluster.b.signal(signal.SIGTERM)
    during = [chat(cluster, router.url, [{"role": "user", "content": f"Hello {n}"}]) for n in range(4)]
    for s in streams:
        s.join(120)
    assert [(s.done, s.error) for s in streams] == [(True, None)] * 4
    assert all(d["choices"][0]["finish_reason"] in ("stop", "length") for d in during)
    assert cluster.b.server.proc.wait(60) == 0
