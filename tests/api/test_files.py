"""The Files API in-process: upload (multipart, to disk), list, retrieve, content, delete; bad input; the upload limit."""
import json

import pytest

from batches.models import StoredFile

from .batch_support import jsonl, upload
from .fake_engine import call

DATA = jsonl({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}})


def test_it_stores_lists_reads_and_deletes_a_file(fake_rt, as_tenant):
    tc = as_tenant()
    made = upload(tc, DATA, filename="requests.jsonl")
    assert made.status_code == 200, made.content
    obj = made.json()
    assert obj["id"].startswith("file-") and obj["object"] == "file" and obj["bytes"] == len(DATA)
    assert obj["filename"] == "requests.jsonl" and obj["purpose"] == "batch" and obj["status"] == "processed"
    assert obj["expires_at"] - obj["created_at"] == 30 * 86400
    assert tc.get(f"/v1/files/{obj['id']}").json() == obj
    listed = tc.get("/v1/files", purpose="batch").json()
    assert listed["object"] == "list" and [f["id"] for f in listed["data"]] == [obj["id"]]
    assert tc.get("/v1/files", purpose="batch_output").json()["data"] == []
    content = tc.client.get(f"/v1/files/{obj['id']}/content", headers=tc.headers)
    assert content["Content-Type"] == "application/octet-stream"
    assert b"".join(content.streaming_content) == DATA
    path = StoredFile.objects.get(pk=obj["id"]).content.path
    assert open(path, "rb").read() == DATA
    assert tc.delete(f"/v1/files/{obj['id']}").json() == {"id": obj["id"], "object": "file", "deleted": True}
    assert tc.get(f"/v1/files/{obj['id']}").status_code == 404
    assert tc.get(f"/v1/files/{obj['id']}").json()["error"]["code"] == "file_not_found"
    import os
    assert not os.path.exists(path)


def test_list_pages_newest_first_with_after_and_order(fake_rt, as_tenant):
    tc = as_tenant()
    ids = [upload(tc, DATA).json()["id"] for _ in range(5)]
    page = tc.get("/v1/files", limit=2).json()
    assert [f["id"] for f in page["data"]] == ids[::-1][:2] and page["has_more"]
    rest = tc.get("/v1/files", limit=10, after=page["last_id"]).json()
    assert [f["id"] for f in rest["data"]] == ids[::-1][2:] and not rest["has_more"]
    assert [f["id"] for f in tc.get("/v1/files", order="asc").json()["data"]] == ids


def test_expires_after_sets_the_files_expiry(fake_rt, as_tenant):
    tc = as_tenant()
    obj = upload(tc, DATA, **{"expires_after[anchor]": "created_at", "expires_after[seconds]": "7200"}).json()
    assert obj["expires_at"] - obj["created_at"] == 7200
    bad = upload(tc, DATA, **{"expires_after[anchor]": "created_at", "expires_after[seconds]": "5"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "expires_after.seconds"


@pytest.mark.parametrize("purpose, data, param", [
    ("", DATA, "purpose"), ("fine-tune", DATA, "purpose"), ("nonsense", DATA, "purpose"), ("batch", None, "file"),
])
def test_bad_uploads_are_400_naming_the_part(fake_rt, as_tenant, purpose, data, param):
    tc = as_tenant()
    answer = upload(tc, data, purpose=purpose)
    assert answer.status_code == 400, answer.content
    assert answer.json()["error"]["param"] == param
    assert not StoredFile.objects.exists()


def test_a_json_body_is_400_not_a_500(fake_rt, as_tenant):
    tc = as_tenant()
    answer = tc.post("/v1/files", {"purpose": "batch"})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "file"


def _multipart(data: bytes) -> tuple[bytes, str]:
    boundary = "metraleboundary"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.jsonl\"\r\n"
            f"Content-Type: application/octet-stream\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


def test_uploads_have_their_own_size_limit_in_place_of_the_request_limit(fake_rt, settings):
    settings.METRALE = {**settings.METRALE, "MAX_REQUEST_BYTES": 1000, "MAX_FILE_BYTES": 5000}
    body, ctype = _multipart(b"x" * 3000)  # over the request limit, under the file limit
    ok = call("POST", "/v1/files", raw=body, headers={"content-type": ctype})
    assert ok.status == 200, ok.body
    assert ok.json()["bytes"] == 3000
    body, ctype = _multipart(b"x" * 5001)
    over = call("POST", "/v1/files", raw=body, headers={"content-type": ctype})
    assert over.status == 413 and over.json()["error"]["code"] == "file_too_large"
    huge, ctype = _multipart(b"x" * (5000 + (1 << 20) + 1))  # the body itself past the upload's limit
    refused = call("POST", "/v1/files", raw=huge, headers={"content-type": ctype})
    assert refused.status == 413 and refused.json()["error"]["code"] == "request_too_large"
    other = call("POST", "/v1/chat/completions", raw=json.dumps({"messages": "x" * 3000}).encode())
    assert other.status == 413  # every other route keeps MAX_REQUEST_BYTES
