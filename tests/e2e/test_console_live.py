"""The operators' console against a live daphne (the openai SDK as the client): /metrics grows as
vLLM's would, a client that leaves is an abort, the request log's writer thread writes every request,
and scrapes stay out of daphne's access log. The shared live server of tests/live_servers.py,
which writes its request log."""
import json
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


MODEL = {"model_name": "smollm2-135m-instruct", "engine": "0"}


def scrape(server) -> dict:
    with urllib.request.urlopen(server.url + "/metrics", timeout=30) as response:
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def metric(table, name, **labels):
    return table.get((name, tuple(sorted({**MODEL, **labels}.items()))), 0.0)


def test_metrics_grow_per_request_as_vllms_do(metrale_server, openai_client):
    before = scrape(metrale_server)
    answer = openai_client.chat.completions.create(model="smollm2-135m-instruct", messages=[{"role": "user", "content": "Hi"}], max_tokens=5,
                                            temperature=0)
    after = scrape(metrale_server)
    assert answer.choices[0].finish_reason == "length"
    assert metric(after, "vllm:request_success_total", finished_reason="length") == \
        metric(before, "vllm:request_success_total", finished_reason="length") + 1
    for name in ("vllm:time_to_first_token_seconds_count", "vllm:e2e_request_latency_seconds_count"):
        assert metric(after, name) == metric(before, name) + 1
    assert metric(after, "vllm:inter_token_latency_seconds_count") == \
        metric(before, "vllm:inter_token_latency_seconds_count") + answer.usage.completion_tokens - 1


def test_a_client_that_leaves_is_an_abort_and_leaves_running(metrale_server, openai_client):
    before = metric(scrape(metrale_server), "vllm:request_success_total", finished_reason="abort")
    stream = openai_client.chat.completions.create(model="smollm2-135m-instruct", messages=[{"role": "user", "content": "Tell a long story"}],
                                            max_tokens=500, stream=True, extra_body={"ignore_eos": True})
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        table = scrape(metrale_server)
        if metric(table, "vllm:request_success_total", finished_reason="abort") > before:
            break
        time.sleep(0.05)
    assert metric(table, "vllm:request_success_total", finished_reason="abort") == before + 1
    assert metric(table, "vllm:num_requests_running") == 0


def test_the_request_log_gets_every_request_and_scrapes_stay_out_of_the_access_log(metrale_server, openai_client):
    openai_client.chat.completions.create(model="smollm2-135m-instruct", messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
                                   extra_headers={"x-request-id": "req_live_logged"})
    scrape(metrale_server)
    openai_client.models.list(extra_headers={"x-request-id": "req_live_models"})
    deadline = time.monotonic() + 20
    lines = []
    while time.monotonic() < deadline:  # the session server's log holds earlier tests' lines too
        if metrale_server.request_log.exists():
            lines = [json.loads(line) for line in metrale_server.request_log.read_text().splitlines()]
            if {"req_live_logged", "req_live_models"} <= {line["request_id"] for line in lines}:
                break
        time.sleep(0.1)
    [logged] = [line for line in lines if line["request_id"] == "req_live_logged"]
    assert logged["status"] == 200 and logged["completion_tokens"] == 2 and logged["ttft_ms"] > 0
    assert not any(line["route"] == "metrics" for line in lines)
    access = metrale_server.log()
    assert "GET /v1/models" in access and "GET /metrics" not in access
    assert " [-]: engine ready" in access  # the server's log format names each line's request ("-": none)
