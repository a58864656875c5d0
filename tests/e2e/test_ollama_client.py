"""The official `ollama` Python client, sync and async, against a live daphne serving SmolLM2 and all-MiniLM-L6-v2
(the session's metrale_server): chat and generate streamed and not (the stream joins into the blocking answer),
tools, format with a schema, think, generate's context, embed and embeddings, list, show, ps, pull of a model
already pulled, copy and delete, keep_alive 0, the request log and the metric's route, and the probe at /."""
import asyncio
import json
import math
import time

import httpx
import pytest
from ollama import AsyncClient, Client, ResponseError

pytestmark = pytest.mark.e2e

SMOL = "smollm2-135m-instruct"
MINILM = "all-minilm-l6-v2"
GREEDY = {"temperature": 0, "num_predict": 12}
ASK = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def client(metrale_server):
    with Client(host=metrale_server.url, timeout=120) as c:
        yield c


def test_chat_streamed_joins_into_the_blocking_answer(client):
    blocking = client.chat(model=SMOL, messages=ASK, options=GREEDY)
    assert blocking.done and blocking.done_reason in ("stop", "length") and blocking.message.role == "assistant"
    assert blocking.message.content and 0 < blocking.eval_count <= 12 and blocking.prompt_eval_count > 0
    assert blocking.total_duration >= blocking.eval_duration > 0 and blocking.model == SMOL
    parts = list(client.chat(model=f"{SMOL}:latest", messages=ASK, options=GREEDY, stream=True))
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert "".join(p.message.content or "" for p in parts) == blocking.message.content
    assert parts[-1].done_reason == blocking.done_reason and parts[-1].eval_count == blocking.eval_count
    assert all(p.model == f"{SMOL}:latest" for p in parts)


def test_generate_streamed_and_not_and_its_context_round_trips(client):
    first = client.generate(model=SMOL, prompt="The capital of France is", options=GREEDY)
    assert first.response and first.done and len(first.context) == first.prompt_eval_count + first.eval_count
    streamed = list(client.generate(model=SMOL, prompt="The capital of France is", options=GREEDY, stream=True))
    assert "".join(p.response for p in streamed) == first.response and streamed[-1].context == first.context
    follow = client.generate(model=SMOL, prompt="And of Italy?", context=first.context, options=GREEDY)
    assert follow.context[:len(first.context)] == first.context and follow.response


def test_the_async_client_streams_and_blocks_alike(metrale_server):
    async def run():
        async with AsyncClient(host=metrale_server.url, timeout=120) as client:
            blocking = await client.chat(model=SMOL, messages=ASK, options=GREEDY)
            parts = [p async for p in await client.chat(model=SMOL, messages=ASK, options=GREEDY, stream=True)]
            generated = await client.generate(model=SMOL, prompt="Hello", options=GREEDY)
            embedded = await client.embed(model=MINILM, input="a sentence")
            listed = await client.list()
            return blocking, parts, generated, embedded, listed

    blocking, parts, generated, embedded, listed = asyncio.run(run())
    assert "".join(p.message.content or "" for p in parts) == blocking.message.content
    assert generated.response and len(embedded.embeddings[0]) == 384
    assert f"{SMOL}:latest" in {m.model for m in listed.models}


def get_weather(city: str) -> str:
    """Get the weather in a city.

    Args:
      city: The city's name
    """
    return f"Sunny in {city}"


def test_tools_streamed_calls_agree_with_the_blocking_answer(client):
    ask = [{"role": "user", "content": "What is the weather in Paris? Use the tool."}]
    blocking = client.chat(model=SMOL, messages=ask, tools=[get_weather], options={"temperature": 0, "num_predict": 32})
    parts = list(client.chat(model=SMOL, messages=ask, tools=[get_weather], stream=True,
                             options={"temperature": 0, "num_predict": 32}))
    streamed_calls = [c for p in parts for c in p.message.tool_calls or []]
    assert [c.function for c in streamed_calls] == [c.function for c in blocking.message.tool_calls or []]
    assert "".join(p.message.content or "" for p in parts) == blocking.message.content
    assert all(isinstance(c.function.arguments, dict) for c in streamed_calls)
    history = [*ask, {"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_name": "get_weather", "content": get_weather("Paris")}]
    answer = client.chat(model=SMOL, messages=history, tools=[get_weather], options=GREEDY)
    assert answer.done and answer.message.role == "assistant"


def test_format_with_a_schema_gives_json_of_that_schema(client):
    schema = {"type": "object", "properties": {"colour": {"type": "string", "maxLength": 12}}, "required": ["colour"],
              "additionalProperties": False}
    answer = client.chat(model=SMOL, messages=[{"role": "user", "content": "Your favourite colour, as JSON."}],
                         format=schema, options={"temperature": 0, "num_predict": 40})
    assert answer.done_reason == "stop"
    value = json.loads(answer.message.content)
    assert set(value) == {"colour"} and isinstance(value["colour"], str) and len(value["colour"]) <= 12


def test_think_on_a_model_without_thinking_is_a_400_and_off_answers(client):
    with pytest.raises(ResponseError) as refused:
        client.chat(model=SMOL, messages=ASK, think=True)
    assert refused.value.status_code == 400 and refused.value.error == f'"{SMOL}" does not support thinking'
    assert client.chat(model=SMOL, messages=ASK, think=False, options=GREEDY).message.content


def test_embed_and_embeddings(client, metrale_server):
    embedded = client.embed(model=MINILM, input=["a cat", "a dog"])
    assert len(embedded.embeddings) == 2 and all(len(v) == 384 for v in embedded.embeddings)
    assert all(math.isclose(math.fsum(x * x for x in v), 1.0, rel_tol=1e-5) for v in embedded.embeddings)
    assert embedded.prompt_eval_count > 0 and embedded.model == MINILM
    v1 = httpx.post(metrale_server.url + "/v1/embeddings", json={"model": MINILM, "input": "a cat"},
                    timeout=60).json()["data"][0]["embedding"]
    # The same vector to the last bit, whatever the route and whatever shares the pass ("a dog" above).
    assert list(embedded.embeddings[0]) == v1
    legacy = client.embeddings(model=MINILM, prompt="a cat")
    assert list(legacy.embedding) == v1
    with pytest.raises(ResponseError) as refused:
        client.embed(model="nope", input="x")
    assert refused.value.status_code == 404 and refused.value.error == 'model "nope" not found, try pulling it first'
    long = "word " * 600  # past all-MiniLM-L6-v2's 512 tokens
    assert len(client.embed(model=MINILM, input=long).embeddings[0]) == 384  # truncate defaults to true
    with pytest.raises(ResponseError) as refused:
        client.embed(model=MINILM, input=long, truncate=False)
    assert refused.value.status_code == 400 and "set 'truncate' to true to cut it" in refused.value.error
    assert "truncate_prompt_tokens" not in refused.value.error  # /v1/embeddings' field, not Ollama's


def test_list_show_and_ps(client):
    listed = {m.model: m for m in client.list().models}
    smol = listed[f"{SMOL}:latest"]
    assert smol.size > 0 and len(smol.digest) == 64 and smol.details.family == "llama"
    assert smol.details.parameter_size == "134.52M" and f"{MINILM}:latest" in listed
    shown = client.show(SMOL)
    assert shown.capabilities == ["completion", "tools"] and shown.modelinfo["general.architecture"] == "llama"
    assert shown.modelinfo["llama.context_length"] == 8192 and "<|im_start|>" in shown.template
    assert client.show(MINILM).capabilities == ["embedding"]
    running = {m.model: m for m in client.ps().models}
    assert f"{SMOL}:latest" in running and running[f"{SMOL}:latest"].size > 0
    assert running[f"{SMOL}:latest"].expires_at.year > 2100  # pinned: never unloaded


def test_pull_of_a_pulled_model_reports_ollama_s_progress(client):
    statuses = list(client.pull(SMOL, stream=True))
    assert [s.status for s in statuses][0] == "pulling manifest"
    layer = statuses[1]
    assert layer.digest.startswith("sha256:") and layer.status == f"pulling {layer.digest[7:19]}"
    assert layer.total == layer.completed > 0
    assert [s.status for s in statuses[2:]] == ["verifying sha256 digest", "writing manifest", "success"]
    assert client.pull(SMOL).status == "success"
    with pytest.raises(ResponseError) as refused:
        client.pull("llama3.2")
    assert refused.value.status_code == 404 and "catalogue" in refused.value.error


def test_copy_makes_a_name_every_surface_answers_to_and_delete_takes_it_away(client, metrale_server):
    assert client.copy(SMOL, "my-smol").status == "success"
    assert "my-smol:latest" in {m.model for m in client.list().models}
    assert client.chat(model="my-smol", messages=ASK, options=GREEDY).model == "my-smol"
    v1 = httpx.post(metrale_server.url + "/v1/chat/completions", timeout=60,
                    json={"model": "my-smol", "messages": ASK, "max_tokens": 2})
    assert v1.status_code == 200 and v1.json()["model"] == SMOL  # /v1 names the served model, as for its aliases
    assert client.delete("my-smol").status == "success"
    assert "my-smol:latest" not in {m.model for m in client.list().models}
    with pytest.raises(ResponseError) as gone:
        client.delete("my-smol")
    assert gone.value.status_code == 404
    with pytest.raises(ResponseError) as configured:
        client.delete(SMOL)
    assert configured.value.status_code == 400 and "configured" in configured.value.error


def test_keep_alive_0_lets_the_model_go(client):
    unload = client.generate(model=SMOL, prompt="", keep_alive=0)
    assert unload.done and unload.done_reason == "unload"
    client.embed(model=MINILM, input="", keep_alive=0)  # no input: only the keep_alive
    try:
        deadline = time.monotonic() + 10
        while f"{MINILM}:latest" in {m.model for m in client.ps().models} and time.monotonic() < deadline:
            time.sleep(0.1)
        assert f"{MINILM}:latest" not in {m.model for m in client.ps().models}
        assert f"{SMOL}:latest" in {m.model for m in client.ps().models}  # pinned: stays
    finally:  # the session's server goes on with its default keep_alive for both
        client.embed(model=MINILM, input="", keep_alive="5m")
        assert client.generate(model=SMOL, prompt="", keep_alive="5m").done_reason == "load"
    assert f"{MINILM}:latest" in {m.model for m in client.ps().models}


def test_the_request_log_and_the_metrics_name_ollama_s_routes(client, metrale_server):
    answer = client.chat(model=SMOL, messages=ASK, options=GREEDY, stream=True)
    final = list(answer)[-1]
    deadline, found = time.monotonic() + 10, []
    while not found and time.monotonic() < deadline:  # the log's writer thread writes it after the answer
        lines = [json.loads(line) for line in metrale_server.request_log.read_text().splitlines()]
        found = [line for line in lines if line["route"] == "api/chat" and line["status"] == 200
                 and line["completion_tokens"] == final.eval_count and line["prompt_tokens"] == final.prompt_eval_count]
        time.sleep(0.05)
    assert found and found[-1]["model"] == SMOL and found[-1]["tenant"] == "default"
    metrics = httpx.get(metrale_server.url + "/metrics", timeout=30).text
    assert 'metrale:http_requests_total{method="POST",route="api/chat",status="200"}' in metrics


def test_the_root_answers_ollama_probes_and_browsers(metrale_server):
    probe = httpx.get(metrale_server.url + "/", timeout=30)
    assert probe.status_code == 200 and probe.text == "Ollama is running"
    assert httpx.head(metrale_server.url + "/", timeout=30).status_code == 200
    page = httpx.get(metrale_server.url + "/", headers={"Accept": "text/html"}, timeout=30)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html") and "/api/chat" in page.text
    assert httpx.get(metrale_server.url + "/api/version", timeout=30).json()["version"]
