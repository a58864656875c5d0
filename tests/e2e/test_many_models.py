"""Several models behind one live server configured as `make serve` configures it (README "Many models behind one
endpoint"): SmolLM2, all-MiniLM-L6-v2 and Gemma 3 270M named from pull_model's catalogue, and a GGUF file imported on
first use, each loaded by the request that names it, under a memory budget that evicts the least recently used idle
model; embeddings keep being served after the chat engine that hosted their passes unloads; /v1/models, /metrics
and `manage.py models` show it. Gemma 3 270M joins the list where it is pulled (`make test` pulls it)."""
import re
import time
from pathlib import Path

import httpx
import pytest

from inference.bench.live_server import LiveServer
from tests.live_servers import manage

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
ASK = [{"role": "user", "content": "Say hi."}]
SMOLLM2, MINILM, GEMMA3 = "smollm2-135m-instruct", "all-minilm-l6-v2", "gemma-3-270m"


@pytest.fixture(scope="module")
def many_server(tmp_path_factory):
    from django.conf import settings

    from tests.conftest import pulled_minilm, pulled_smollm2
    from tests.engine.conftest import write_tiny_gguf

    work = tmp_path_factory.mktemp("live-many")
    write_tiny_gguf(work / "Tiny.gguf")
    # A METRALE_HOME of its own (the GGUF is imported into it), whose models/ links the pulled models so that the
    # list names them from the catalogue as `make serve` does, and whose kernels/ links the ones already built.
    home, cache = work / "home", Path(settings.METRALE_HOME)
    (home / "models").mkdir(parents=True)
    pulled = [pulled_smollm2(), pulled_minilm()]
    if (cache / "models" / GEMMA3 / "config.json").is_file():
        pulled.append(cache / "models" / GEMMA3)
    for folder in pulled:
        (home / "models" / folder.name).symlink_to(folder)
    if (cache / "kernels").is_dir():
        (home / "kernels").symlink_to(cache / "kernels")
    # Each chat model's KV pool is 49% of the 2 GB budget (reserved, committed as written): two chat models
    # never fit together, so loading one evicts another when it is idle.
    server = LiveServer({"METRALE_MODELS": ",".join([*(f.name for f in pulled), str(work / "Tiny.gguf")]),
                         "METRALE_PIN": "none", "METRALE_MEMORY_BUDGET": "2GB", "METRALE_KV_BUDGET_SHARE": "0.49",
                         "METRALE_HOME": str(home), "METRALE_SWAP_POLL_S": "0.3",
                         "METRALE_KEEP_ALIVE": "-1"}, work)
    server.wait_ready()
    yield server
    server.stop()


def states(url):
    return {m["id"]: m for m in httpx.get(url + "/v1/models", timeout=30).json()["data"]}


def chat(url, model):
    r = httpx.post(url + "/v1/chat/completions", timeout=120, json={"model": model, "messages": ASK, "max_tokens": 4})
    assert r.status_code == 200, r.text
    return r.json()


def embed(url):
    r = httpx.post(url + "/v1/embeddings", timeout=120, json={"model": MINILM, "input": ["a", "b"]})
    assert r.status_code == 200, r.text
    return r.json()


def test_models_load_on_demand_and_the_budget_evicts_the_idle_one(many_server):
    url = many_server.url
    assert {m["state"] for m in states(url).values()} == {"unloaded"}
    assert chat(url, "smollm2-135m-instruct")["model"] == "smollm2-135m-instruct"
    assert len(embed(url)["data"]) == 2
    before = states(url)
    assert before["smollm2-135m-instruct"]["state"] == "loaded" and before["smollm2-135m-instruct"]["resident_bytes"] > 0
    assert chat(url, "tiny")["model"] == "tiny"  # imported from its GGUF on this first use
    after = states(url)
    assert after["tiny"]["state"] == "loaded" and after["smollm2-135m-instruct"]["state"] == "unloaded"
    assert after["all-minilm-l6-v2"]["state"] == "loaded"
    assert len(embed(url)["data"]) == 2  # its passes moved off the unloaded engine, onto the new one
    log = many_server.log()
    assert "all-minilm-l6-v2: its passes run on a thread of their own (smollm2-135m-instruct unloaded)" in log
    assert "all-minilm-l6-v2: its passes run between tiny's steps from now on" in log
    metrics = httpx.get(url + "/metrics", timeout=30).text
    assert 'metrale:model_loaded{model_name="smollm2-135m-instruct",state="unloaded"} 0.0' in metrics
    assert re.search(r'vllm:num_requests_running\{[^}]*model_name="tiny"', metrics)
    missing = httpx.post(url + "/v1/chat/completions", timeout=30, json={"model": "gemma-9", "messages": ASK})
    assert missing.status_code == 404 and "gemma-9" in missing.json()["error"]["message"]
    time.sleep(1.0)  # the watcher reports the states into the database
    listed = manage(many_server, "models", "list")
    assert "tiny\tloaded" in listed and "smollm2-135m-instruct\tunloaded" in listed
    said = manage(many_server, "models", "load", "smollm2-135m-instruct", "--wait", "120")
    assert "loaded" in said
    assert states(url)["tiny"]["state"] == "unloaded"  # evicted in turn


def test_the_three_catalogue_models_serve_by_name_and_the_budget_evicts_the_least_recently_used(many_server,
                                                                                                 gemma3_dir):
    url = many_server.url
    assert chat(url, SMOLLM2)["model"] == SMOLLM2
    assert embed(url)["model"] == MINILM  # used after SmolLM2: SmolLM2 is the least recently used
    before = states(url)
    assert before[SMOLLM2]["state"] == before[MINILM]["state"] == "loaded" and before[GEMMA3]["state"] == "unloaded"
    assert chat(url, GEMMA3)["model"] == GEMMA3  # SmolLM2 + MiniLM + Gemma pass 2 GB; MiniLM + Gemma do not
    after = states(url)
    assert after[GEMMA3]["state"] == "loaded" and after[GEMMA3]["resident_bytes"] > after[GEMMA3]["kv_cache_bytes"]
    assert after[SMOLLM2]["state"] == "unloaded" and after[MINILM]["state"] == "loaded"
    assert sum(m["resident_bytes"] or 0 for m in after.values()) <= 2_000_000_000
    assert f"model {SMOLLM2} unloaded to make room under the memory budget for {GEMMA3}" in many_server.log()
    metrics = httpx.get(url + "/metrics", timeout=30).text
    assert f'metrale:model_loaded{{model_name="{GEMMA3}",state="loaded"}} 1.0' in metrics
    assert f'metrale:model_loaded{{model_name="{SMOLLM2}",state="unloaded"}} 0.0' in metrics
    assert re.search(rf'vllm:generation_tokens_total\{{[^}}]*model_name="{GEMMA3}"[^}}]*\}} [1-9]', metrics)
    assert len(embed(url)["data"]) == 2  # its passes moved from SmolLM2's engine to Gemma's
    assert f"{MINILM}: its passes run between {GEMMA3}'s steps from now on" in many_server.log()
