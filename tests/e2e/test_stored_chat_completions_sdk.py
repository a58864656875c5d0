"""Stored chat completions through the official openai SDK against a live server with auth on: create with
store=True (blocking and streamed), then list (filters, pages), retrieve, update, messages.list and delete,
each with the real values; a second tenant's key gets 404 (openai.NotFoundError) on each, and sees
none of them listed."""
import uuid

import openai
import pytest

pytestmark = pytest.mark.e2e

MODEL = "smollm2-135m-instruct"
MESSAGES = [{"role": "system", "content": "Answer in one word."},
            {"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def owner(tenant_client):
    return tenant_client("owner")


@pytest.fixture(scope="module")
def other(tenant_client):
    return tenant_client("other")


def test_the_stored_chat_completions_surface_and_a_second_tenant_refused(owner, other):
    run = uuid.uuid4().hex
    made = owner.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4, temperature=0,
                                         store=True, metadata={"run": run, "kind": "blocking"})
    chunks = list(owner.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4, temperature=0,
                                                store=True, metadata={"run": run, "kind": "stream"},
                                                stream=True))
    streamed_id = chunks[0].id
    streamed_text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    got = owner.chat.completions.retrieve(made.id)
    assert got.id == made.id and got.model == made.model == MODEL
    assert got.choices[0].message.content == made.choices[0].message.content
    assert got.usage == made.usage and got.metadata == {"run": run, "kind": "blocking"}
    assert owner.chat.completions.retrieve(streamed_id).choices[0].message.content == streamed_text

    page = owner.chat.completions.list(metadata={"run": run}, limit=1)
    assert [c.id for c in page.data] == [made.id] and page.has_more is True
    assert [c.id for c in owner.chat.completions.list(metadata={"run": run})] == [made.id, streamed_id]
    assert [c.id for c in owner.chat.completions.list(metadata={"run": run}, order="desc")] == \
        [streamed_id, made.id]
    assert [c.id for c in owner.chat.completions.list(metadata={"run": run, "kind": "stream"})] == [streamed_id]
    assert [c.id for c in owner.chat.completions.list(metadata={"run": run}, model="not-served")] == []
    pages = list(owner.chat.completions.list(metadata={"run": run}, limit=1).iter_pages())
    assert [[c.id for c in p.data] for p in pages] == [[made.id], [streamed_id]]

    updated = owner.chat.completions.update(made.id, metadata={"run": run, "kind": "reviewed"})
    assert updated.id == made.id and updated.metadata == {"run": run, "kind": "reviewed"}
    assert owner.chat.completions.retrieve(made.id).metadata == {"run": run, "kind": "reviewed"}

    messages = owner.chat.completions.messages.list(made.id)
    assert [(m.id, m.role, m.content) for m in messages.data] == [
        (f"{made.id}-0", "system", MESSAGES[0]["content"]), (f"{made.id}-1", "user", MESSAGES[1]["content"])]
    assert messages.has_more is False
    last = owner.chat.completions.messages.list(made.id, order="desc", limit=1)
    assert [m.id for m in last.data] == [f"{made.id}-1"] and last.has_more is True

    assert [c.id for c in other.chat.completions.list()] == []
    assert [c.id for c in other.chat.completions.list(metadata={"run": run})] == []
    for refused in (lambda: other.chat.completions.retrieve(made.id),
                    lambda: other.chat.completions.update(made.id, metadata={"stolen": "yes"}),
                    lambda: other.chat.completions.messages.list(made.id),
                    lambda: other.chat.completions.delete(made.id)):
        with pytest.raises(openai.NotFoundError) as refusal:
            refused()
        assert refusal.value.status_code == 404
    assert owner.chat.completions.retrieve(made.id).metadata == {"run": run, "kind": "reviewed"}

    deleted = owner.chat.completions.delete(made.id)
    assert deleted.id == made.id and deleted.deleted is True and deleted.object == "chat.completion.deleted"
    with pytest.raises(openai.NotFoundError):
        owner.chat.completions.retrieve(made.id)
    assert [c.id for c in owner.chat.completions.list(metadata={"run": run})] == [streamed_id]


def test_a_key_is_required(auth_server):
    anonymous = openai.OpenAI(base_url=auth_server.url + "/v1", api_key="not-a-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        anonymous.chat.completions.list()
