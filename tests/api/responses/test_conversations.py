"""/v1/conversations in-process with a real key, and responses created with `conversation`."""

from responses_api.models import Conversation, ConversationItem

from ..fake_engine import reply
from .support import prompt_of

ITEMS = [{"type": "message", "role": "user", "content": "My name is Ada."},
         {"type": "message", "role": "assistant", "content": "Nice to meet you, Ada."}]


def test_it_creates_reads_updates_and_deletes_a_conversation(api):
    r = api.post("/v1/conversations", {"items": ITEMS, "metadata": {"topic": "intro"}})
    assert r.status_code == 200, r.content
    conv = r.json()
    assert conv["id"].startswith("conv_") and conv["object"] == "conversation"
    assert conv["metadata"] == {"topic": "intro"} and isinstance(conv["created_at"], int)
    assert Conversation.objects.get(pk=conv["id"]).tenant == api.tenant
    assert api.get(f"/v1/conversations/{conv['id']}").json() == conv

    updated = api.post(f"/v1/conversations/{conv['id']}", {"metadata": {"topic": "x"}}).json()
    assert updated["metadata"] == {"topic": "x"} and updated["id"] == conv["id"]
    assert api.post(f"/v1/conversations/{conv['id']}", {}).status_code == 400

    r = api.delete(f"/v1/conversations/{conv['id']}")
    assert r.json() == {"id": conv["id"], "object": "conversation.deleted", "deleted": True}
    r = api.get(f"/v1/conversations/{conv['id']}")
    assert r.status_code == 404 and r.json()["error"]["code"] == "conversation_not_found"
    assert not ConversationItem.objects.exists()


def test_an_empty_body_makes_an_empty_conversation(api):
    r = api.post("/v1/conversations", b"")
    assert r.status_code == 200 and r.json()["metadata"] == {}


def test_items_are_added_listed_read_and_deleted(api):
    cid = api.post("/v1/conversations", {"items": ITEMS}).json()["id"]
    added = api.post(f"/v1/conversations/{cid}/items",
                 {"items": [{"role": "user", "content": "And yours?"}]}).json()
    assert added["object"] == "list" and len(added["data"]) == 1 and added["has_more"] is False
    new = added["data"][0]
    assert new["id"].startswith("msg_") and new["content"] == [{"type": "input_text",
                                                                "text": "And yours?"}]
    page = api.get(f"/v1/conversations/{cid}/items", limit=2).json()
    assert page["data"][0]["id"] == new["id"] and page["has_more"] is True
    everything = api.get(f"/v1/conversations/{cid}/items", order="asc").json()["data"]
    assert [i["role"] for i in everything] == ["user", "assistant", "user"]
    assert everything[1]["content"][0]["type"] == "output_text"

    assert api.get(f"/v1/conversations/{cid}/items/{new['id']}").json() == new
    r = api.delete(f"/v1/conversations/{cid}/items/{new['id']}")
    assert r.status_code == 200 and r.json()["object"] == "conversation"
    r = api.get(f"/v1/conversations/{cid}/items/{new['id']}")
    assert r.status_code == 404 and r.json()["error"]["code"] == "item_not_found"


def test_at_most_twenty_items_a_call(api):
    many = [{"role": "user", "content": str(i)} for i in range(21)]
    r = api.post("/v1/conversations", {"items": many})
    assert r.status_code == 400 and r.json()["error"]["param"] == "items"
    assert r.json()["error"]["code"] == "items_too_many"
    cid = api.post("/v1/conversations", {"items": many[:20]}).json()["id"]
    r = api.post(f"/v1/conversations/{cid}/items", {"items": many})
    assert r.status_code == 400
    assert api.post(f"/v1/conversations/{cid}/items", {"items": []}).status_code == 400
    assert ConversationItem.objects.count() == 20


def test_an_item_id_may_appear_once_in_a_conversation(api):
    cid = api.post("/v1/conversations", {"items": [{**ITEMS[0], "id": "msg_a"}]}).json()["id"]
    r = api.post(f"/v1/conversations/{cid}/items", {"items": [{**ITEMS[1], "id": "msg_a"}]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "duplicate_item_id"


def test_a_response_in_a_conversation_reads_its_items_and_appends_its_turn(
        api, engine, smollm2_tokenizer):
    cid = api.post("/v1/conversations", {"items": ITEMS}).json()["id"]
    engine.script = reply(smollm2_tokenizer, "You are Ada.")
    body = api.post("/v1/responses", {"input": "What is my name?",
                                          "conversation": {"id": cid}}).json()
    assert body["status"] == "completed" and body["conversation"] == {"id": cid}
    prompt = prompt_of(engine)
    assert prompt.index("My name is Ada.") < prompt.index("Nice to meet you") < \
        prompt.index("What is my name?")
    items = api.get(f"/v1/conversations/{cid}/items", order="asc").json()["data"]
    assert [i.get("role") for i in items] == ["user", "assistant", "user", "assistant"]
    assert items[2]["content"][0]["text"] == "What is my name?"
    assert items[3]["id"] == body["output"][0]["id"]
    assert items[3]["content"][0]["text"] == "You are Ada."

    # A second turn sees the first one, through the conversation alone.
    api.post("/v1/responses", {"input": "Thanks.", "conversation": cid})
    assert "You are Ada." in prompt_of(engine)


def test_a_failed_turn_is_not_appended(api, engine, smollm2_tokenizer):
    cid = api.post("/v1/conversations", {}).json()["id"]
    engine.script = reply(smollm2_tokenizer, "", fail="boom")
    assert api.post("/v1/responses", {"input": "Hi", "conversation": cid}).status_code == 500
    assert not Conversation.objects.get(pk=cid).items.exists()


def test_an_unknown_conversation_is_404(api):
    r = api.post("/v1/responses", {"input": "Hi", "conversation": "conv_nope"})
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "conversation_not_found"
    assert r.json()["error"]["param"] == "conversation"
    for path in ("/v1/conversations/conv_nope", "/v1/conversations/conv_nope/items",
                 "/v1/conversations/conv_nope/items/msg_1"):
        assert api.get(path).status_code == 404


def test_bad_list_queries_are_400(api):
    cid = api.post("/v1/conversations", {"items": ITEMS}).json()["id"]
    for query, param in (({"limit": 0}, "limit"), ({"limit": 101}, "limit"),
                         ({"limit": "x"}, "limit"), ({"order": "up"}, "order"),
                         ({"after": "msg_nope"}, "after")):
        r = api.get(f"/v1/conversations/{cid}/items", **query)
        assert r.status_code == 400 and r.json()["error"]["param"] == param
