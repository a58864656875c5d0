"""The operators' console against a live daphne (the openai SDK as the client): /metrics grows as
vLLM's would, a client that leaves is an abort, the request log's writer thread writes every request,
and scrapes stay out of daphne's access log."""
import json
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from inference.bench.live_server import LiveServer

MODEL = {"model_name": "smollm2-135m-instruct", "engine": "0"}


@pytest.fixture(scope="module")
def console_server(smollm2_dir, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("console")
    server = LiveServer({"METRALE_MODEL": str(smollm2_dir), "METRALE_KV_CACHE_BYTES": str(64 << 20),
                         "METRALE_REQUEST_LOG": str(workdir / "requests.jsonl")}, workdir)
    server.request_log = workdir / "requests.jsonl"
    server.wait_ready()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(console_server):
    from openai import OpenAI

    return OpenAI(base_url=console_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def scrape(server) -> dict:
    with urllib.request.urlopen(server.url + "/metrics", timeout=30) as response:
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def metric(table, name, **labels):
    return table.get((name, tuple(sorted({**MODEL, **labels}.items()))), 0.0)


def test_metrics_grow_per_request_as_vllms_do(console_server, client):
    before = scrape(console_server)
    answer = client.chat.completions.create(model="smollm2-135m-instruct", messages=[{"role": "user", "content": "Hi"}], max_tokens=5,
                                            temperature=0)
    after = scrape(console_server)
    assert answer.choices[0].finish_reason == "length"
    assert metric(after, "vllm:request_success_total", finished_reason="length") == \
        metric(before, "vllm:request_success_total", finished_reason="length") + 1
    for name in ("vllm:time_to_first_token_seconds_count", "vllm:e2e_request_latency_seconds_count"):
        assert metric(after, name) == metric(before, name) + 1
    assert metric(after, "vllm:inter_token_latency_seconds_count") == \
        metric(before, "vllm:inter_token_latency_seconds_count") + answer.usage.completion_tokens - 1


def test_a_client_that_leaves_is_an_abort_and_leaves_running(console_server, client):
    before = metric(scrape(console_server), "vllm:request_success_total", finished_reason="abort")
    stream = client.chat.completions.create(model="smollm2-135m-instruct", messages=[{"role": "user", "content": "Tell a long story"}],
                                            max_tokens=500, stream=True, extra_body={"ignore_eos": True})
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        table = scrape(console_server)
        if metric(table, "vllm:request_success_total", finished_reason="abort") > before:
            break
        time.sleep(0.05)
    assert metric(table, "vllm:request_success_total", finished_reason="abort") == before + 1
    assert metric(table, "vllm:num_requests_running") == 0


def test_the_request_log_gets_every_request_and_scrapes_stay_out_of_the_access_log(console_server, client):
    client.chat.completions.create(model="smollm2-135m-instruct", messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
                                   extra_headers={"x-request-id": "req_live_logged"})
    scrape(console_server)
    client.models.list()
    deadline = time.monotonic() + 20
    lines = []
    while time.monotonic() < deadline:
        if console_server.request_log.exists():
            lines = [json.loads(line) for line in console_server.request_log.read_text().splitlines()]
            if any(line["route"] == "v1/models" for line in lines):
                break
        time.sleep(0.1)
    [logged] = [line for line in lines if line["request_id"] == "req_live_logged"]
    assert logged["status"] == 200 and logged["completion_tokens"] == 2 and logged["ttft_ms"] > 0
    assert not any(line["route"] == "metrics" for line in lines)
    access = console_server.log()
    assert "GET /v1/models" in access and "GET /metrics" not in access
    assert " [-]: engine ready" in access  # the server's log format names each line's request ("-": none)
