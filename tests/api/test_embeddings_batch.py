"""The Batch API's /v1/embeddings lines: each answered as the endpoint answers it, owned by its tenant."""
import pytest

from .conftest import EMBEDDING_MODEL as NAME

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_batch_of_embeddings_lines_answers_each_as_the_endpoint_and_is_the_tenants_own(embed_rt, as_tenant):
    from .batch_support import batch_of, jsonl, lines_of, run_batch

    acme, other = as_tenant("acme"), as_tenant("other")
    rows = [{"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {"model": NAME, "input": ["x", "y"]}},
            {"custom_id": "b", "method": "POST", "url": "/v1/embeddings",
             "body": {"model": NAME, "input": "z", "encoding_format": "base64"}},
            {"custom_id": "c", "method": "POST", "url": "/v1/embeddings", "body": {"model": NAME, "input": [""]}}]
    batch = batch_of(acme, jsonl(*rows), endpoint="/v1/embeddings")
    assert run_batch(embed_rt, batch["id"]) == "completed"
    done = acme.get(f"/v1/batches/{batch['id']}").json()
    assert done["request_counts"] == {"total": 3, "completed": 2, "failed": 1}
    out = {line["custom_id"]: line["response"] for line in lines_of(acme, done["output_file_id"])}
    direct = acme.post("/v1/embeddings", {"model": NAME, "input": ["x", "y"]}).json()
    assert out["a"]["status_code"] == 200 and out["a"]["body"]["model"] == NAME
    for ours, ref in zip(out["a"]["body"]["data"], direct["data"], strict=True):  # float32 rounding apart
        assert ours["index"] == ref["index"] and ours["embedding"] == pytest.approx(ref["embedding"], abs=1e-6)
        assert ours["embedding"] == ref["embedding"]  # written the same way: the same numbers
    assert out["a"]["body"]["usage"] == direct["usage"]
    assert isinstance(out["b"]["body"]["data"][0]["embedding"], str)
    errors = {line["custom_id"]: line["response"] for line in lines_of(acme, done["error_file_id"])}
    assert errors["c"]["status_code"] == 400 and errors["c"]["body"]["error"]["param"] == "input[0]"
    assert other.get(f"/v1/batches/{batch['id']}").status_code == 404
    assert other.client.get(f"/v1/files/{done['output_file_id']}/content", headers=other.headers).status_code == 404
