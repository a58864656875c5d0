"""Prometheus metrics: vLLM's engine series read from EngineStats at scrape time, and Metrale's own.

`EngineCollector` (a prometheus_client custom collector, registered on the default registry)
reads the engine's plain counters (inference/engine/stats.py) each scrape and exposes them
under vLLM's names, labels (`model_name`, `engine` = "0") and bucket lists, so vLLM's Grafana
dashboards work unchanged (reference/contracts-next.md section 3; vllm/v1/metrics/loggers.py).
The engine thread never touches prometheus_client.

Metrale's own series (prometheus_client objects, incremented off the engine thread):
`metrale:http_requests_total{route, method, status}`, `metrale:rate_limited_requests_total{axis}`
(the 429s, by the axis that refused: requests, tokens, concurrency),
`metrale:tool_calls_total{outcome}` (parsed, rejected), `metrale:grammar_compile_seconds`,
`metrale:request_log_dropped_total`, and `metrale:spec_decode_acceptance_rate` with vLLM's
`vllm:spec_decode_*` counters once a drafting engine records drafts (EngineStats.record_spec_decode).

Importing this module needs no Django (serving increments the counters); the collector
looks the registry up lazily.
"""
from __future__ import annotations

from prometheus_client import REGISTRY, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from inference.engine import stats as engine_stats

LABELS = ["model_name", "engine"]
ENGINE_INDEX = "0"

HTTP_REQUESTS = Counter("metrale:http_requests", "HTTP requests answered, by route (the URL pattern), "
                        "method and status.", ["route", "method", "status"])
RATE_LIMITED = Counter("metrale:rate_limited_requests", "Requests refused with 429 by the rate limiter, "
                       "by the axis that refused (requests, tokens, concurrency).", ["axis"])
TOOL_CALLS = Counter("metrale:tool_calls", "Tool calls in generated output: parsed (delivered) or "
                     "rejected (markup that was not a valid call of an offered tool).", ["outcome"])
REQUEST_LOG_DROPPED = Counter("metrale:request_log_dropped", "Request log records dropped because the "
                              "writer's queue was full (METRALE_REQUEST_LOG).")
for _outcome in ("parsed", "rejected"):
    TOOL_CALLS.labels(_outcome)
for _axis in ("requests", "tokens", "concurrency"):
    RATE_LIMITED.labels(_axis)


def count_tool_calls(parsed: int, rejected: int) -> None:
    """Add one generation's tool calls: `parsed` delivered, `rejected` refused (counts)."""
    if parsed:
        TOOL_CALLS.labels("parsed").inc(parsed)
    if rejected:
        TOOL_CALLS.labels("rejected").inc(rejected)


def _histogram(name: str, doc: str, hist: engine_stats.Histogram, labels: list[str],
               more: tuple[list[str], engine_stats.Histogram] | None = None) -> HistogramMetricFamily:
    """A histogram family: `hist` under `labels`, and `more` (another model's labels and histogram)."""
    family = HistogramMetricFamily(name, doc, labels=LABELS)
    for lab, h in ((labels, hist), *((more,) if more else ())):
        cumulative, _, total = h.read()
        family.add_metric(lab, [(floatToGoString(bound), count) for bound, count in cumulative], total)
    return family


def _counters(labels: list[str], rows, more: dict | None = None):
    """A counter family per (name without _total, documentation, value) row; `more`: (labels, value)
    of another model by name."""
    for name, doc, value in rows:
        family = CounterMetricFamily(name, doc, labels=LABELS)
        family.add_metric(labels, value)
        if more and name in more:
            family.add_metric(*more[name])
        yield family


def _gauge(name: str, doc: str, value: float, labels: list[str]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=LABELS)
    family.add_metric(labels, value)
    return family


def engine_families(async_engine, model_name: str, pooling=None):
    """vLLM's metric families for one AsyncEngine (its LLMEngine's stats, scheduler and KV pool) and the
    embedding model served beside it (`pooling`: runtime.EmbeddingService or None): its requests under
    its own model_name in the series vLLM counts pooling requests in (prompt tokens, request success
    with finished_reason "stop", e2e latency, prompt tokens per request)."""
    llm = async_engine.engine
    pool = pooling.runner.stats if pooling is not None else None
    pool_labels = [pooling.name, ENGINE_INDEX] if pooling is not None else None
    stats = llm.stats
    labels = [model_name, ENGINE_INDEX]
    scheduler, blocks = llm.scheduler, llm.block_manager
    yield _gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
                 scheduler.num_running_requests(), labels)
    yield _gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                 async_engine.num_waiting, labels)
    yield _gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                 (blocks.num_blocks - blocks.num_free_blocks) / blocks.num_blocks, labels)
    team = getattr(llm, "team", None)
    if team is not None:  # engine/core_share.py: the threads each step runs on, and the most it may
        yield _gauge("metrale:engine_threads", "Threads the engine's last step ran on (its CPU cap less the "
                     "cores other runnable tasks held; one for a step too small for a second).", team.threads, labels)
        yield _gauge("metrale:engine_threads_max", "The most threads a step may use: the affinity mask, the "
                     "cgroup's CPU quota and METRALE_NUM_THREADS, whichever is least.", team.cap.cpus, labels)
        yield from _counters(labels, (("metrale:engine_thread_changes", "Times the engine's team changed size.",
                                       team.changes),))
    info = GaugeMetricFamily("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                             labels=["block_size", "cache_dtype", "enable_prefix_caching", "num_gpu_blocks", "engine"])
    info.add_metric([str(blocks.block_size), str(llm.config.kv_cache_dtype), str(llm.config.enable_prefix_caching),
                     str(blocks.num_blocks), ENGINE_INDEX], 1)
    yield info
    yield from _counters(labels, (
        ("vllm:prompt_tokens", "Number of prefill tokens processed.", stats.prompt_tokens),
        ("vllm:generation_tokens", "Number of generation tokens processed.", stats.generation_tokens),
        ("vllm:num_preemptions", "Cumulative number of preemption from the engine.", scheduler.num_preemptions),
        ("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
         stats.prefix_cache_queries),
        ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", stats.prefix_cache_hits)),
        {"vllm:prompt_tokens": (pool_labels, pool.prompt_tokens)} if pool is not None else None)
    success = CounterMetricFamily("vllm:request_success", "Count of successfully processed requests.",
                                  labels=[*LABELS, "finished_reason"])
    for reason, count in list(stats.request_success.items()):
        success.add_metric([*labels, reason], count)
    if pool is not None:
        success.add_metric([*pool_labels, "stop"], pool.requests_finished)
    yield success
    for name, doc, hist in (
            ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", stats.ttft_s),
            ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", stats.itl_s),
            ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", stats.e2e_s),
            ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
             stats.queue_s),
            ("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.",
             stats.inference_s),
            ("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.",
             stats.prefill_s),
            ("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.",
             stats.decode_s),
            ("vllm:request_prompt_tokens", "Number of prefill tokens processed.", stats.request_prompt_tokens),
            ("vllm:request_generation_tokens", "Number of generation tokens processed.",
             stats.request_generation_tokens),
            ("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.",
             stats.request_max_tokens),
            ("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
             stats.iteration_tokens)):
        pooled = {"vllm:e2e_request_latency_seconds": "e2e_s", "vllm:request_prompt_tokens": "request_prompt_tokens"}
        more = (pool_labels, getattr(pool, pooled[name])) if pool is not None and name in pooled else None
        yield _histogram(name, doc, hist, labels, more)
    if stats.spec_decode_enabled:
        yield from spec_decode_families(stats, labels)


def spec_decode_families(stats: engine_stats.EngineStats, labels: list[str]):
    """vLLM's speculative-decoding counters (vllm/v1/spec_decode/metrics.py) and our acceptance rate."""
    yield from _counters(labels, (
        ("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", stats.spec_decode_num_drafts),
        ("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", stats.spec_decode_num_draft_tokens),
        ("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", stats.spec_decode_num_accepted_tokens)))
    per_pos = CounterMetricFamily("vllm:spec_decode_num_accepted_tokens_per_pos",
                                  "Accepted tokens per draft position.", labels=[*LABELS, "position"])
    for position, count in enumerate(list(stats.spec_decode_accepted_per_pos)):
        per_pos.add_metric([*labels, str(position)], count)
    yield per_pos
    drafted = stats.spec_decode_num_draft_tokens
    yield _gauge("metrale:spec_decode_acceptance_rate", "Accepted / drafted tokens since the start (0-1).",
                 stats.spec_decode_num_accepted_tokens / drafted if drafted else 0.0, labels)


def pooling_families(service):
    """An embedding model's series (`service`: runtime.EmbeddingService) under its own model_name, in the
    families vLLM counts pooling requests in (prompt tokens, request success with finished_reason
    "stop", e2e latency, prompt tokens per request)."""
    pool = service.runner.stats
    labels = [service.name, ENGINE_INDEX]
    yield from _counters(labels, (("vllm:prompt_tokens", "Number of prefill tokens processed.", pool.prompt_tokens),))
    success = CounterMetricFamily("vllm:request_success", "Count of successfully processed requests.",
                                  labels=[*LABELS, "finished_reason"])
    success.add_metric([*labels, "stop"], pool.requests_finished)
    yield success
    yield _histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", pool.e2e_s,
                     labels)
    yield _histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", pool.request_prompt_tokens,
                     labels)


def merged(families):
    """Families of the same name (one per model) as one family with every model's samples: an exposition
    names each family once."""
    by_name: dict = {}
    for family in families:
        first = by_name.get(family.name)
        if first is None:
            by_name[family.name] = family
        else:
            first.samples.extend(family.samples)
    return list(by_name.values())


class EngineCollector:
    """Every loaded model's series at scrape time (operations/registry: each under its model_name; none
    for a model not loaded), metrale:model_loaded, and the grammar compile time."""

    def describe(self):
        # Nothing to declare up front: registering must not look the registry up (or load a model).
        return []

    def collect(self):
        from inference.operations.model_specs import EMBEDDING
        from inference.operations.registry import LOADED, process_registry

        registry = process_registry()
        families = []
        for entry, model in registry.loaded_models():
            if entry.kind == EMBEDDING:
                if getattr(getattr(model, "runner", None), "stats", None) is not None:
                    families += pooling_families(model)
            elif getattr(getattr(model.engine, "engine", None), "stats", None) is not None:
                families += engine_families(model.engine, entry.name)
        yield from merged(families)
        loaded = GaugeMetricFamily("metrale:model_loaded", "Whether each configured model is loaded (1) or not "
                                   "(0: unloaded, loading or failed), by model_name and state.",
                                   labels=["model_name", "state"])
        resident = GaugeMetricFamily("metrale:model_resident_bytes", "Resident bytes of each loaded model (its "
                                     "weights as measured after load, plus its KV pool).", labels=["model_name"])
        for state in registry.states():
            loaded.add_metric([state["id"], state["state"]], 1.0 if state["state"] == LOADED else 0.0)
            if state["resident_bytes"] is not None:
                resident.add_metric([state["id"]], state["resident_bytes"])
        yield loaded
        yield resident
        family = HistogramMetricFamily("metrale:grammar_compile_seconds",
                                       "Seconds to compile a request's grammar (structured outputs, forced "
                                       "tool calls), off the engine thread; cached grammars are not counted.")
        cumulative, _, total = engine_stats.GRAMMAR_COMPILE_S.read()
        family.add_metric([], [(floatToGoString(bound), count) for bound, count in cumulative], total)
        yield family


_collector = EngineCollector()
REGISTRY.register(_collector)
