"""POST /v1/messages and /v1/messages/count_tokens in-process, on the SmolLM2 tokenizer and its real chat template
with a scripted engine: the body, the stream's framing and order, stop reasons, tools, thinking and its signatures,
Claude Code's billing header, count_tokens, max_tokens 0 and pings."""
import json

import pytest

from anthropic_api import signatures
from anthropic_api.encoder import fold
from tests.api.test_chat_reasoning import THINKING_TEMPLATE

from ..asgi_client import serve
from ..fake_engine import call, reply
from .support import USER, check_event_order, messages, sse_frames

WEATHER = {"name": "get_weather", "description": "The weather in a city.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def prompt_of(rt, i=-1) -> str:
    return rt.tokenizer.decode(rt.engine.submissions[i].prompt_token_ids, skip_special_tokens=False)


def streamed_message(**body) -> dict:
    """The message the SDK's accumulator would build from the stream (encoder.fold over the frames),
    after checking the framing and the event order."""
    frames = sse_frames(messages(stream=True, **body))
    check_event_order(frames)
    return fold([data for name, data in frames if name != "ping"])


def without_ids(message: dict) -> dict:
    """A message without its random ids (message and tool_use ids)."""
    out = {**message, "id": None, "content": [dict(b) for b in message["content"]]}
    for block in out["content"]:
        block.pop("id", None)
    return out


def test_a_blocking_message_has_anthropic_s_shape(fake_rt):
    answer = messages()
    assert answer.status == 200
    body = answer.json()
    assert body["id"].startswith("msg_") and body["type"] == "message" and body["role"] == "assistant"
    assert body["model"] == "smollm2-135m-instruct"
    assert body["content"] == [{"type": "text", "text": "Hello world"}]
    assert (body["stop_reason"], body["stop_sequence"]) == ("end_turn", None)
    prompt_tokens = len(fake_rt.engine.submissions[-1].prompt_token_ids)
    assert body["usage"] == {"input_tokens": prompt_tokens, "output_tokens": 2, "cache_creation_input_tokens": 0,
                             "cache_read_input_tokens": 0}
    assert answer.headers["request-id"] == answer.headers["x-request-id"]


def test_the_stream_and_the_blocking_answer_are_the_same_message(fake_rt):
    fake_rt.engine.script = reply(fake_rt.tokenizer, "Paris is the capital of France.")
    blocking = messages().json()
    streamed = streamed_message()
    assert without_ids(streamed) == without_ids(blocking)


def test_the_stream_starts_with_an_empty_message_and_reports_usage_at_the_end(fake_rt):
    frames = sse_frames(messages(stream=True))
    start = frames[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert start["usage"]["input_tokens"] == len(fake_rt.engine.submissions[-1].prompt_token_ids)
    assert frames[1][0] == "ping"
    delta = next(d for n, d in frames if n == "message_delta")
    assert delta["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == 2


def test_a_stop_sequence_is_reported_with_its_string(fake_rt):
    fake_rt.engine.script = reply(fake_rt.tokenizer, "One, two, three, four")
    for message in (messages(stop_sequences=["three", "nine"]).json(),
                    streamed_message(stop_sequences=["three", "nine"])):
        assert (message["stop_reason"], message["stop_sequence"]) == ("stop_sequence", "three")
        assert message["content"] == [{"type": "text", "text": "One, two, "}]
    assert fake_rt.engine.submissions[-1].handle.aborted == "stop"


def test_the_length_limit_is_max_tokens(fake_rt):
    fake_rt.engine.script = reply(fake_rt.tokenizer, "one two three four five six seven eight")
    body = messages(max_tokens=3).json()
    assert body["stop_reason"] == "max_tokens" and body["usage"]["output_tokens"] == 3


def test_max_tokens_0_prefills_and_answers_an_empty_message(fake_rt):
    for message in (messages(max_tokens=0).json(), streamed_message(max_tokens=0)):
        assert message["content"] == [] and message["stop_reason"] == "max_tokens"
        assert message["usage"]["output_tokens"] == 0
    assert fake_rt.engine.submissions[-1].params.max_tokens == 1  # the prefill ran


def test_a_forced_tool_call_is_a_tool_use_block(fake_rt):
    fake_rt.engine.script = reply(fake_rt.tokenizer, "\n" + HERMES_CALL)
    body = {"tools": [WEATHER], "tool_choice": {"type": "any"}}
    for message in (messages(**body).json(), streamed_message(**body)):
        assert message["stop_reason"] == "tool_use"
        assert len(message["content"]) == 1  # no stray (empty) text block beside the call
        block = message["content"][0]
        assert block["type"] == "tool_use" and block["id"].startswith("toolu_")
        assert (block["name"], block["input"]) == ("get_weather", {"city": "Paris"})
    assert fake_rt.engine.submissions[-1].params.structured is not None


@pytest.mark.parametrize("anthropic_choice, chat_choice", [
    ({"type": "any"}, "required"),
    ({"type": "tool", "name": "get_weather"}, {"type": "function", "function": {"name": "get_weather"}}),
    ({"type": "any", "disable_parallel_tool_use": True}, "required"),
])
def test_any_and_tool_use_chat_s_forced_call_grammar(fake_rt, anthropic_choice, chat_choice):
    fake_rt.engine.script = reply(fake_rt.tokenizer, HERMES_CALL)
    messages(tools=[WEATHER], tool_choice=anthropic_choice)
    ours = fake_rt.engine.submissions[-1].params.structured.grammar.spec
    call("POST", "/v1/chat/completions", {
        "messages": USER, "max_tokens": 32, "tool_choice": chat_choice,
        "parallel_tool_calls": not anthropic_choice.get("disable_parallel_tool_use", False),
        "tools": [{"type": "function", "function": {"name": WEATHER["name"], "description": WEATHER["description"],
                                                    "parameters": WEATHER["input_schema"]}}]})
    assert ours == fake_rt.engine.submissions[-1].params.structured.grammar.spec


def test_auto_and_none_force_nothing(fake_rt):
    for choice in ({"type": "auto"}, {"type": "none"}):
        messages(tools=[WEATHER], tool_choice=choice)
        assert fake_rt.engine.submissions[-1].params.structured is None


def test_a_tool_result_round_trip_renders_through_the_chat_template(fake_rt):
    history = [{"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": [
                   {"type": "text", "text": "Let me look."},
                   {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
               {"role": "user", "content": [
                   {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "21 C"}]},
                   {"type": "text", "text": "And tomorrow?"}]}]
    assert messages(messages=history, tools=[WEATHER]).status == 200
    prompt = prompt_of(fake_rt)
    assert prompt.index("Weather in Paris?") < prompt.index("Let me look.") < prompt.index('"Paris"') \
        < prompt.index("21 C") < prompt.index("And tomorrow?")
    failed = [*history[:2], {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "no network", "is_error": True}]}]
    assert messages(messages=failed, tools=[WEATHER]).status == 200
    assert "Error: no network" in prompt_of(fake_rt)


def test_system_blocks_and_system_messages_join_the_system_prompt(fake_rt):
    messages(system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
             messages=[{"role": "system", "content": "Answer in French."}, *USER])
    prompt = prompt_of(fake_rt)
    assert "Be brief.\n\nAnswer in French." in prompt and prompt.count("<|im_start|>system") == 1


def test_claude_code_s_billing_header_is_dropped_so_turns_share_their_prefix(fake_rt):
    def turn(cch):
        header = {"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.1; cc_entrypoint=cli; cch={cch};"}
        assert messages(system=[header, {"type": "text", "text": "You are an agent."}]).status == 200
        return fake_rt.engine.submissions[-1].prompt_token_ids
    first, second = turn("0a1b2"), turn("9f8e7")
    assert first == second
    assert "billing" not in prompt_of(fake_rt) and "You are an agent." in prompt_of(fake_rt)


def test_claude_code_s_ctx_and_msg_roles_read_as_user(fake_rt):
    assert messages(messages=[{"role": "ctx", "content": "context"}, {"role": "msg", "content": "hello"}]).status == 200
    assert "<|im_start|>user\ncontext\n\nhello" in prompt_of(fake_rt)


def test_a_final_assistant_message_is_continued(fake_rt):
    fake_rt.engine.script = reply(fake_rt.tokenizer, " blue.")
    body = messages(messages=[*USER, {"role": "assistant", "content": "The sky is"}]).json()
    assert prompt_of(fake_rt).endswith("The sky is")
    assert body["content"] == [{"type": "text", "text": " blue."}]


def test_count_tokens_counts_exactly_the_prompt_messages_runs(fake_rt):
    body = {"model": "smollm2-135m-instruct", "system": "Be brief.", "tools": [WEATHER], "tool_choice": {"type": "auto"},
            "messages": [{"role": "user", "content": "Weather in Paris?"}]}
    counted = call("POST", "/v1/messages/count_tokens", body)
    assert counted.status == 200 and set(counted.json()) == {"input_tokens"}
    usage = messages(**body).json()["usage"]
    assert counted.json()["input_tokens"] == len(fake_rt.engine.submissions[-1].prompt_token_ids) \
        == usage["input_tokens"] + usage["cache_read_input_tokens"]
    without_tools = call("POST", "/v1/messages/count_tokens", {**body, "tools": None, "tool_choice": None})
    assert without_tools.json()["input_tokens"] < counted.json()["input_tokens"]


def test_count_tokens_validates_like_messages(fake_rt):
    bad = call("POST", "/v1/messages/count_tokens", {"model": "smollm2-135m-instruct", "messages": [{"role": "wizard", "content": "x"}]})
    assert bad.status == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    assert "messages[0].role" in bad.json()["error"]["message"]


def test_pings_are_sent_while_nothing_else_is(fake_rt, settings):
    settings.METRALE = {**settings.METRALE, "ANTHROPIC_PING_S": 0.02}
    fake_rt.engine.delay_s = 0.15
    frames = sse_frames(messages(stream=True))
    check_event_order(frames)
    names = [n for n, _ in frames]
    first_block = names.index("content_block_start")
    assert names[:2] == ["message_start", "ping"] and names[2:first_block].count("ping") >= 2


# --- thinking ----------------------------------------------------------------------------------


@pytest.fixture
def thinking_rt(fake_rt, monkeypatch):
    """The SmolLM2 tokenizer with a template that opens <think> (the `think` parser reads the reasoning)."""
    monkeypatch.setattr(fake_rt.tokenizer, "chat_template", THINKING_TEMPLATE)
    fake_rt.engine.script = reply(fake_rt.tokenizer, "Two and two make four.</think>The answer is 4.")
    return fake_rt


def test_thinking_comes_first_with_a_signature_then_the_text(thinking_rt):
    body = {"thinking": {"type": "enabled", "budget_tokens": 16}}
    for message in (messages(**body).json(), streamed_message(**body)):
        thinking, text = message["content"]
        assert thinking == {"type": "thinking", "thinking": "Two and two make four.",
                            "signature": signatures.sign("Two and two make four.")}
        assert text == {"type": "text", "text": "The answer is 4."}
    assert thinking_rt.engine.submissions[-1].params.reasoning.budget_tokens == 16


@pytest.mark.parametrize("thinking, enabled, cap", [
    ({"type": "enabled", "budget_tokens": 8}, True, 8),
    ({"type": "adaptive"}, True, None),
    ({"type": "disabled"}, False, 0),
])
def test_thinking_maps_to_the_chat_thinking_controls(thinking_rt, thinking, enabled, cap):
    messages(thinking=thinking)
    prompt = prompt_of(thinking_rt)
    assert prompt.endswith("<think>\n") is enabled
    assert thinking_rt.engine.submissions[-1].params.reasoning.budget_tokens == cap


def test_a_thinking_block_sent_back_must_carry_this_server_s_signature(thinking_rt):
    first = messages(thinking={"type": "enabled", "budget_tokens": 16}).json()
    history = [*USER, {"role": "assistant", "content": first["content"]}, {"role": "user", "content": "And 3 + 3?"}]
    assert messages(messages=history).status == 200
    tampered = json.loads(json.dumps(history))
    tampered[1]["content"][0]["thinking"] = "Two and two make five."
    for bad in (tampered, [*USER, {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "x", "signature": "bogus"}, {"type": "text", "text": "y"}]}, *USER],
            [*USER, {"role": "assistant", "content": [{"type": "thinking", "thinking": "x"}]}, *USER]):
        answer = messages(messages=bad)
        assert answer.status == 400
        error = answer.json()["error"]
        assert error["type"] == "invalid_request_error" and "messages[1].content[0]" in error["message"]
    redacted = [*USER, {"role": "assistant", "content": [{"type": "redacted_thinking", "data": "opaque"},
                                                          {"type": "text", "text": "4"}]}, *USER]
    assert messages(messages=redacted).status == 200


@pytest.mark.parametrize("ping_s", [5.0, 0.001])
def test_a_client_that_leaves_mid_stream_aborts_the_engine_request(fake_rt, settings, caplog, ping_s):
    """Also while a ping's wait holds a read of the engine's deltas (the read is cancelled first)."""
    import asyncio

    from ..asgi_client import AsgiRequest

    settings.METRALE = {**settings.METRALE, "ANTHROPIC_PING_S": ping_s}
    fake_rt.engine.script = reply(fake_rt.tokenizer, "one two three four five six seven eight nine ten")
    fake_rt.engine.delay_s = 0.05
    body = json.dumps({"model": "smollm2-135m-instruct", "max_tokens": 32, "messages": USER, "stream": True}).encode()

    async def run():
        req = await AsgiRequest("POST", "/v1/messages", {"content-type": "application/json"}, body).start()
        await req.chunk()
        await req.chunk()
        await req.disconnect()
    serve(run)
    assert fake_rt.engine.submissions[-1].handle.aborted == "cancelled"
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


def test_output_config_format_constrains_the_answer_to_its_schema(fake_rt):
    fake_rt.engine.script = reply(fake_rt.tokenizer, '{"city": "Paris"}')
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    body = messages(output_config={"format": {"type": "json_schema", "schema": schema}, "effort": "low"}).json()
    assert json.loads(body["content"][0]["text"]) == {"city": "Paris"}
    grammar = fake_rt.engine.submissions[-1].params.structured.grammar
    assert grammar.spec.kind == "json_schema"
    messages(output_config={"effort": "high"})
    assert fake_rt.engine.submissions[-1].params.structured is None
