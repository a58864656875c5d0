"""The embeddings bench's parts: texts of 8-256 tokens and texts of 4-180 random words, /v1/embeddings clients
at a fixed concurrency, sentence-transformers' encode in-process at its best (the whole corpus in one call,
its own length sorting), and an interactive stream's TPOT while an embedding job runs."""
from __future__ import annotations

import http.client
import json
import random
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlsplit

from .decode import stream_once, story_prompt

WORDS = ("the model reads each sentence and maps it to a vector so that texts with similar meaning land "
         "close together retrieval systems search millions of such vectors for the nearest neighbours of a "
         "question server batches requests of different lengths without padding cosine similarity of "
         "normalised vectors ranks passages quickly kernels quantised weights memory bandwidth latency "
         "throughput tokens per second").split()


def bench_texts(tokenize, count: int, low: int = 8, high: int = 256, seed: int = 0) -> list[str]:
    """`count` texts whose token counts (tokenize(text) -> ids, special tokens included) are spread
    uniformly over [low, high]: words drawn with a fixed seed, cut to the drawn length."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        target = rng.randint(low, high)
        words = [rng.choice(WORDS) for _ in range(target)]
        n = max(1, target - 2)
        text = " ".join(words[:n])
        while len(tokenize(text)) > target and n > 1:
            n -= 1
            text = " ".join(words[:n])
        out.append(text)
    return out


def random_word_texts(count: int, low: int = 4, high: int = 180, seed: int = 0) -> list[str]:
    """`count` texts of a uniform [low, high] number of words, each word drawn from WORDS with a fixed
    seed: a mix of short and long texts that is not cut to token counts."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high))) for _ in range(count)]


@dataclass(slots=True)
class EmbedRun:
    """One side's run: texts embedded, wall seconds, per-request latencies (s)."""

    texts: int
    wall_s: float
    latencies_s: list[float]

    @property
    def texts_per_s(self) -> float:
        return self.texts / self.wall_s

    @property
    def p50_ms(self) -> float:
        return statistics.median(self.latencies_s) * 1000


def post_embeddings(url: str, texts: list[str], model: str | None, timeout_s: float = 180,
                    conn: http.client.HTTPConnection | None = None) -> list[list[float]]:
    """One POST /v1/embeddings (float); the vectors. On `conn` (a kept-alive connection to url's host, as a
    client library keeps one; its owner closes it) or on a connection of its own, closed after. Raises
    RuntimeError on a non-200 answer, OSError / http.client.HTTPException on a transport error."""
    parts = urlsplit(url)
    body = {"input": texts, "encoding_format": "float"}
    if model:
        body["model"] = model
    own = conn is None
    if own:
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout_s)
    try:
        conn.request("POST", "/v1/embeddings", json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        data = response.read()
    finally:
        if own:
            conn.close()
    if response.status != 200:
        raise RuntimeError(f"{url} answered {response.status}: {data[:300]!r}")
    return [d["embedding"] for d in sorted(json.loads(data)["data"], key=lambda d: d["index"])]


def run_clients(url: str, texts: list[str], clients: int, per_request: int, model: str | None) -> EmbedRun:
    """Embed `texts` in requests of `per_request` texts from `clients` concurrent clients, each client on one
    kept-alive HTTP/1.1 connection (as the openai SDK's pool and vLLM's benchmark clients keep theirs; the same
    for every side measured)."""
    batches = [texts[i:i + per_request] for i in range(0, len(texts), per_request)]
    latencies: list[float] = []
    lock = threading.Lock()
    local = threading.local()
    opened: list[http.client.HTTPConnection] = []
    parts = urlsplit(url)

    def one(batch):
        if getattr(local, "conn", None) is None:
            local.conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=180)
            with lock:
                opened.append(local.conn)
        t0 = time.perf_counter()
        post_embeddings(url, batch, model, conn=local.conn)
        with lock:
            latencies.append(time.perf_counter() - t0)

    started = time.perf_counter()
    try:
        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(one, batches))
    finally:
        for conn in opened:
            conn.close()
    return EmbedRun(len(texts), time.perf_counter() - started, latencies)


ST_BATCH_SIZES = (32, 64, 256)


def sentence_transformers_run(st_model, texts: list[str], batch_size: int) -> EmbedRun:
    """sentence-transformers' encode in this process over the whole corpus in one call (so its own sorting
    by length applies), `batch_size` texts a forward; its one latency is the whole call's."""
    started = time.perf_counter()
    st_model.encode(texts, batch_size=batch_size, show_progress_bar=False)
    wall = time.perf_counter() - started
    return EmbedRun(len(texts), wall, [wall])


def sentence_transformers_best(st_model, texts: list[str], rounds: int) -> tuple[EmbedRun, int]:
    """sentence-transformers' best: the fastest of `rounds` whole-corpus encodes at each of ST_BATCH_SIZES;
    (that run, its batch size)."""
    runs = [(sentence_transformers_run(st_model, texts, size), size) for _ in range(rounds) for size in ST_BATCH_SIZES]
    return max(runs, key=lambda r: r[0].texts_per_s)


def tpot_during_job(url: str, job_texts: list[str], model: str | None, *, per_request: int = 64,
                    job_clients: int = 4, streams: int = 3, max_tokens: int = 64) -> tuple[float, float, int]:
    """(idle TPOT s, TPOT s while an embedding job of job_texts runs, texts embedded meanwhile): medians of
    `streams` greedy chat streams of max_tokens tokens each, first alone, then while job_clients clients
    send the job's requests; the job's clients stop once the streams are done."""
    idle = statistics.median(stream_once(url, story_prompt(i), max_tokens, 0.0, None).tpot_s for i in range(streams))
    stop = threading.Event()
    done = [0]
    batches = [job_texts[i:i + per_request] for i in range(0, len(job_texts), per_request)]
    cursor = iter(range(len(batches)))
    lock = threading.Lock()

    def client():
        while not stop.is_set():
            with lock:
                i = next(cursor, None)
            if i is None:
                return
            post_embeddings(url, batches[i], model)
            with lock:
                done[0] += len(batches[i])

    threads = [threading.Thread(target=client, daemon=True) for _ in range(job_clients)]
    for t in threads:
        t.start()
    time.sleep(1.0)  # the job's requests are queued and running
    busy = statistics.median(stream_once(url, story_prompt(i), max_tokens, 0.0, None).tpot_s for i in range(streams))
    stop.set()
    for t in threads:
        t.join(900)
    return idle, busy, done[0]
