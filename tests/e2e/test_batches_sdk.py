"""End to end: the official openai SDK's Files and Batches clients against a live daphne serving SmolLM2, in the
embedded default (the server's own batch thread runs the batches on its engine)."""
import io
import json
import time

import pytest

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module", autouse=True)
def no_server_errors(metrale_server):
    """No traceback reaches the server log while this module runs (the batch thread included)."""
    start = len(metrale_server.log())
    yield
    assert "Traceback" not in metrale_server.log()[start:], metrale_server.log()[start:]


def line(custom_id: str, content: str = "Say hi.", **body) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": content}],
                     "max_tokens": 8, "temperature": 0, **body}}


def input_file(client, rows) -> str:
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    made = client.files.create(file=("requests.jsonl", io.BytesIO(data)), purpose="batch")
    assert made.purpose == "batch" and made.status == "processed" and made.bytes == len(data)
    return made.id


def wait(client, batch_id: str, statuses: tuple[str, ...], timeout_s: float = 180):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if batch.status in statuses:
            return batch
        time.sleep(0.2)
    raise AssertionError(f"{batch_id} never reached {statuses}: {batch.status}")


def test_files_create_batches_create_poll_and_files_content(openai_client):
    client = openai_client
    file_id = input_file(client, [line("good-1", "Say hi."), line("good-2", "Name a color."),
                                  line("bad", temperature=9)])
    created = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                    completion_window="24h", metadata={"job": "e2e"})
    assert created.status == "validating" and created.metadata == {"job": "e2e"}
    done = wait(client, created.id, ("completed", "failed"))
    assert done.status == "completed", done
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (3, 2, 1)
    assert done.in_progress_at and done.finalizing_at and done.completed_at
    out = [json.loads(x) for x in client.files.content(done.output_file_id).text.splitlines()]
    errors = [json.loads(x) for x in client.files.content(done.error_file_id).text.splitlines()]
    assert sorted(r["custom_id"] for r in out) == ["good-1", "good-2"]
    assert [r["custom_id"] for r in errors] == ["bad"]
    for row in out:
        body = row["response"]["body"]
        assert row["response"]["status_code"] == 200 and body["object"] == "chat.completion"
        assert body["id"].startswith("chatcmpl-") and body["choices"][0]["message"]["content"]
    # A line's body is what the endpoint answers for the same body (greedy: the same text and usage).
    direct = client.chat.completions.create(**line("x", "Say hi.")["body"])
    first = next(r for r in out if r["custom_id"] == "good-1")["response"]["body"]
    assert first["choices"][0]["message"]["content"] == direct.choices[0].message.content
    # (cached_tokens may differ: the direct request finds the line's prompt in the prefix cache)
    assert (first["usage"]["prompt_tokens"], first["usage"]["completion_tokens"]) == (
        direct.usage.prompt_tokens, direct.usage.completion_tokens)
    assert set(first) == set(direct.model_dump(exclude_none=True)) | {
        k for k, v in first.items() if v is None}
    assert errors[0]["response"]["status_code"] == 400 and errors[0]["error"] is None
    assert errors[0]["response"]["body"]["error"]["param"] == "temperature"
    assert done.usage.input_tokens == sum(r["response"]["body"]["usage"]["prompt_tokens"] for r in out)
    assert done.usage.output_tokens == sum(r["response"]["body"]["usage"]["completion_tokens"] for r in out)
    assert client.files.retrieve(done.output_file_id).purpose == "batch_output"


def test_batches_list_auto_paginates_over_25_batches(openai_client):
    client = openai_client
    file_id = input_file(client, [line("only", max_tokens=1)])
    made = [client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                  completion_window="24h").id for _ in range(25)]
    seen = [b.id for b in client.batches.list(limit=10)]
    assert [i for i in seen if i in made] == made[::-1]  # newest first, each once
    assert len(seen) == len(set(seen))
    for batch_id in made:
        wait(client, batch_id, ("completed",))


def test_cancelling_a_running_50_line_batch_ends_cancelled_with_fewer_than_50_results(openai_client):
    client = openai_client
    file_id = input_file(client, [line(f"l{i}", "Count to a hundred.", max_tokens=48, ignore_eos=True)
                                  for i in range(50)])
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    deadline = time.monotonic() + 120
    while client.batches.retrieve(batch.id).request_counts.completed < 1:
        assert time.monotonic() < deadline, "no line finished"
        time.sleep(0.1)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at
    done = wait(client, batch.id, ("cancelled",), timeout_s=60)
    assert 1 <= done.request_counts.completed < 50
    results = client.files.content(done.output_file_id).text.splitlines()
    assert len(results) == done.request_counts.completed
    assert len({json.loads(r)["custom_id"] for r in results}) == len(results)
    assert done.cancelled_at >= done.cancelling_at
