"""GET /metrics: vLLM's names, labels and buckets read from the real engine's counters, Metrale's own
series, METRALE_METRICS_AUTH, and scrapes kept out of the access log."""
import io
import time

import pytest

from inference.engine.stats import ITL_BUCKETS_S, REQUEST_LATENCY_BUCKETS_S, TTFT_BUCKETS_S
from inference.http.observe import QuietScrapesAccessLog

from .asgi_client import serve
from .fake_engine import reply
from .observed import call, request, scrape, value

MODEL = {"model_name": "smollm2-135m-instruct", "engine": "0"}
LONG_SYSTEM = "You are a careful assistant who answers briefly. " * 8  # several full KV blocks


def chat(max_tokens=3, **body):
    return call("POST", "/v1/chat/completions", {"model": "smollm2-135m-instruct", "max_tokens": max_tokens, "temperature": 0,
                                                 "messages": [{"role": "user", "content": "Hi"}], **body})


def counts(table):
    names = ["vllm:time_to_first_token_seconds_count", "vllm:e2e_request_latency_seconds_count",
             "vllm:inter_token_latency_seconds_count", "vllm:request_queue_time_seconds_count",
             "vllm:request_prefill_time_seconds_count", "vllm:request_decode_time_seconds_count",
             "vllm:request_prompt_tokens_count", "vllm:request_generation_tokens_count",
             "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:prefix_cache_queries_total",
             "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total"]
    out = {name: value(table, name, **MODEL) for name in names}
    for reason in ("stop", "length", "abort", "error", "repetition"):
        out[reason] = value(table, "vllm:request_success_total", finished_reason=reason, **MODEL)
    return out


def test_it_exposes_vllms_series_with_their_labels_and_buckets(real_rt):
    chat()
    table = scrape()
    for gauge in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        assert (gauge, tuple(sorted(MODEL.items()))) in table
    assert 0 <= value(table, "vllm:kv_cache_usage_perc", **MODEL) <= 1
    for name, buckets in (("vllm:time_to_first_token_seconds", TTFT_BUCKETS_S),
                          ("vllm:inter_token_latency_seconds", ITL_BUCKETS_S),
                          ("vllm:e2e_request_latency_seconds", REQUEST_LATENCY_BUCKETS_S),
                          ("vllm:request_queue_time_seconds", REQUEST_LATENCY_BUCKETS_S),
                          ("vllm:request_prefill_time_seconds", REQUEST_LATENCY_BUCKETS_S),
                          ("vllm:request_decode_time_seconds", REQUEST_LATENCY_BUCKETS_S)):
        bounds = sorted(float(dict(labels)["le"]) for (sample, labels) in table if sample == name + "_bucket")
        assert bounds == [*buckets, float("inf")], name
    prompt_bounds = sorted(float(dict(labels)["le"]) for (sample, labels) in table
                           if sample == "vllm:request_prompt_tokens_bucket")
    assert prompt_bounds[:4] == [1, 2, 5, 10] and prompt_bounds[-2] == 1000  # 1-2-5 up to max_model_len 1024
    for reason in ("stop", "length", "abort", "error", "repetition"):
        assert ("vllm:request_success_total", tuple(sorted({**MODEL, "finished_reason": reason}.items()))) in table


def test_a_length_capped_request_adds_one_length_and_itl_grows_by_tokens_minus_one(real_rt):
    before = counts(scrape())
    body = chat(max_tokens=4).json()
    after = counts(scrape())
    assert body["choices"][0]["finish_reason"] == "length"
    completion = body["usage"]["completion_tokens"]
    assert completion == 4
    growth = {k: after[k] - before[k] for k in before if after[k] != before[k]}
    assert growth["length"] == 1
    for name in ("vllm:time_to_first_token_seconds_count", "vllm:e2e_request_latency_seconds_count",
                 "vllm:request_queue_time_seconds_count", "vllm:request_prefill_time_seconds_count",
                 "vllm:request_decode_time_seconds_count", "vllm:request_prompt_tokens_count",
                 "vllm:request_generation_tokens_count"):
        assert growth[name] == 1, name
    assert growth["vllm:inter_token_latency_seconds_count"] == completion - 1
    assert growth["vllm:generation_tokens_total"] == completion
    assert growth["vllm:prompt_tokens_total"] == body["usage"]["prompt_tokens"]
    assert all(after[k] >= before[k] for k in before)  # counters are monotonic


def test_a_repeated_prompt_grows_prefix_hits(real_rt):
    messages = [{"role": "system", "content": LONG_SYSTEM}, {"role": "user", "content": "Hi"}]
    chat(messages=messages)
    before = counts(scrape())
    body = chat(messages=messages).json()
    after = counts(scrape())
    cached = body["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 64
    assert after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"] == cached
    assert after["vllm:prefix_cache_queries_total"] - before["vllm:prefix_cache_queries_total"] == \
        body["usage"]["prompt_tokens"]


def test_a_client_that_disconnects_is_an_abort_and_running_is_zero_at_once(real_rt):
    before = counts(scrape())

    async def go_away():
        req = await request("POST", "/v1/chat/completions", {
            "model": "smollm2-135m-instruct", "max_tokens": 300, "stream": True, "ignore_eos": True,
            "messages": [{"role": "user", "content": "Tell me a long story."}]}).start()
        await req.chunk()
        await req.chunk()
        await req.disconnect()

    serve(go_away)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        table = scrape()
        if counts(table)["abort"] > before["abort"]:
            break
        time.sleep(0.01)
    # The abort and the request leaving `running` are one step of the engine thread (scheduler.finish).
    assert counts(table)["abort"] == before["abort"] + 1
    assert value(table, "vllm:num_requests_running", **MODEL) == 0


def test_metrale_counts_http_requests_by_route_and_status(fake_rt):
    route = {"route": "v1/chat/completions", "method": "POST"}
    before = scrape()
    chat()
    call("POST", "/v1/chat/completions", {"model": "smollm2-135m-instruct"})  # no messages: 400
    after = scrape()
    assert value(after, "metrale:http_requests_total", status="200", **route) - \
        value(before, "metrale:http_requests_total", status="200", **route) == 1
    assert value(after, "metrale:http_requests_total", status="400", **route) - \
        value(before, "metrale:http_requests_total", status="400", **route) == 1
    assert value(after, "metrale:http_requests_total", route="metrics", method="GET", status="200") >= 1


def test_metrale_counts_429s_by_axis(fake_rt, settings):
    settings.METRALE = {**settings.METRALE, "RATE_LIMITS": {**settings.METRALE["RATE_LIMITS"], "RPM": 1}}
    before = value(scrape(), "metrale:rate_limited_requests_total", axis="requests")
    assert chat().status == 200
    assert chat().status == 429
    assert value(scrape(), "metrale:rate_limited_requests_total", axis="requests") == before + 1


def test_metrale_counts_tool_calls_parsed_and_rejected(fake_rt):
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    tok = fake_rt.tokenizer
    before = scrape()
    fake_rt.engine.script = reply(tok, '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>')
    chat(max_tokens=200, tools=[weather])
    fake_rt.engine.script = reply(tok, '<tool_call>\n{"name": "launch_rocket", "arguments": {}}\n</tool_call>')
    chat(max_tokens=200, tools=[weather])
    after = scrape()
    for outcome in ("parsed", "rejected"):
        assert value(after, "metrale:tool_calls_total", outcome=outcome) - \
            value(before, "metrale:tool_calls_total", outcome=outcome) == 1, outcome


def test_metrale_times_grammar_compiles(fake_rt):
    before = value(scrape(), "metrale:grammar_compile_seconds_count")
    schema = {"type": "object", "properties": {f"field_{time.time_ns()}": {"type": "integer"}}}
    answer = chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    assert answer.status == 200
    assert value(scrape(), "metrale:grammar_compile_seconds_count") == before + 1


def test_metrics_auth_takes_only_an_admin_key_or_a_staff_session(client, admin_client, fake_rt, settings,
                                                                 make_tenant, make_key):
    settings.METRALE = {**settings.METRALE, "METRICS_AUTH": True}
    tenant = make_tenant("ops")
    _, admin_key = make_key(tenant, is_admin=True)
    _, plain_key = make_key(tenant)
    assert client.get("/metrics").status_code == 401
    refused = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {plain_key}")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "admin_key_required"
    for answer in (client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {admin_key}"), admin_client.get("/metrics")):
        assert answer.status_code == 200 and b"metrale:grammar_compile_seconds_count" in answer.content


def test_metrics_answers_get_only(fake_rt):
    answer = call("POST", "/metrics")
    assert answer.status == 405 and answer.json()["error"]["code"] == "method_not_allowed"


@pytest.mark.parametrize("path, logged", [("/metrics", False), ("/v1/models", True)])
def test_scrapes_stay_out_of_the_access_log(path, logged):
    stream = io.StringIO()
    access = QuietScrapesAccessLog(stream)
    access("http", "complete", {"client": "127.0.0.1:1", "method": "GET", "path": path, "status": 200,
                                "size": 10})
    assert (path in stream.getvalue()) is logged


def test_speculative_counters_appear_once_drafts_are_recorded(real_rt, monkeypatch):
    stats = real_rt.engine.engine.stats
    assert ("vllm:spec_decode_num_drafts_total", tuple(sorted(MODEL.items()))) not in scrape()
    monkeypatch.setattr(stats, "spec_decode_enabled", False)  # put back after the test
    for attr in ("spec_decode_num_drafts", "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens",
                 "spec_decode_accepted_per_pos"):
        monkeypatch.setattr(stats, attr, [] if attr.endswith("per_pos") else 0)
    stats.record_spec_decode(num_draft_tokens=4, num_accepted_tokens=3)
    stats.record_spec_decode(num_draft_tokens=4, num_accepted_tokens=1)
    table = scrape()
    assert value(table, "vllm:spec_decode_num_drafts_total", **MODEL) == 2
    assert value(table, "vllm:spec_decode_num_draft_tokens_total", **MODEL) == 8
    assert value(table, "vllm:spec_decode_num_accepted_tokens_total", **MODEL) == 4
    assert value(table, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position="0", **MODEL) == 2
    assert value(table, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position="2", **MODEL) == 1
    assert value(table, "metrale:spec_decode_acceptance_rate", **MODEL) == 0.5
