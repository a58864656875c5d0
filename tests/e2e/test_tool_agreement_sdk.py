"""Streamed and blocking tool calls agree on chat completions, Responses, Messages and Ollama's /api/chat: the
official clients' streams (openai's chat.completions.stream and responses.stream, anthropic's messages.stream,
ollama's chat(stream=True)) accumulate exactly the blocking answer over a grid of max_tokens cuts, tool_choice auto / required /
named and parallel_tool_calls true / false, SmolLM2 at temperature 0 on the session's live daphne. The
answers also tell the truth about the token limit: a call cut off (arguments that are not a JSON object)
comes only with finish_reason length (max_tokens on Messages, incomplete on Responses) and only as the
last call; a finish of tool_calls has whole calls only.

The max_tokens grid comes from the uncut generation of each tool_choice / parallel_tool_calls pair
(its token ids, vLLM's return_token_ids): the first cut of every stretch of the text where the
parser's view changes (before a call, the call's opener, its arguments, a string in them, after
them, the close) in the first call, the cut one token before its end, one cut inside the second call,
and max_tokens past the end, on required with parallel calls; the other pairs, whose generation is the
same call (one tool) or none (auto), get their first and last cuts (required without parallel calls
also the cut inside the value and the call's end). Responses and Messages (whose encoders read the
same deltas as chat's) run the cuts of required with parallel calls but the first and the one inside
the arguments' key, and a named call without parallel calls. Every request of a surface is sent at once (the engine
batches them; each row's logits are its own), blocking and streamed alike.

Ollama's API has no tool_choice (a model calls a tool when it chooses to, and SmolLM2 at this size does not on
its own): its grid is the same cuts over a generation that copies two calls out of the prompt (OLLAMA_ASK), the
cuts taken from chat completions' answer to the same messages and tools (the same prompt, checked by its token
count). Ollama sends a call only whole (arguments are an object in its types), so a cut call is left out and
done_reason length says why.

Content: a blocking answer with calls carries its content stripped, null when empty (assembly.py's
rule, vLLM's), while the stream's first chunk opened the content as "" before any call was known: the
streamed content is compared under that rule."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
from tokenizers import Tokenizer

from inference.serving.assembly import final_content

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")
ollama = pytest.importorskip("ollama")

pytestmark = pytest.mark.e2e

MODEL = "smollm2-135m-instruct"
ASK = "What is the weather in Paris? Use the get_weather tool."
PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CHAT_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Get the weather of a city.",
                                              "parameters": PARAMETERS}}
RESPONSES_TOOL = {"type": "function", "name": "get_weather", "description": "Get the weather of a city.",
                  "parameters": PARAMETERS}
MESSAGES_TOOL = {"name": "get_weather", "description": "Get the weather of a city.", "input_schema": PARAMETERS}
CHOICES = ("auto", "required", "named")
LONGEST = 52        # the uncut generation's cap; "past the end" is its length + 4, at most this
OPEN, CLOSE = "<tool_call>", "</tool_call>"


@pytest.fixture(scope="module")
def clients(metrale_server):
    chat = openai.OpenAI(base_url=metrale_server.url + "/v1", api_key="k", max_retries=0, timeout=120)
    messages = anthropic.Anthropic(base_url=metrale_server.url, api_key="k", max_retries=0, timeout=120)
    return chat, messages


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    return Tokenizer.from_file(str(smollm2_dir / "tokenizer.json"))


def chat_kwargs(choice: str, parallel: bool, max_tokens: int) -> dict:
    tool_choice = {"type": "function", "function": {"name": "get_weather"}} if choice == "named" else choice
    return dict(model=MODEL, messages=[{"role": "user", "content": ASK}], tools=[CHAT_TOOL], temperature=0,
                tool_choice=tool_choice, parallel_tool_calls=parallel, max_tokens=max_tokens)


def _state(text: str) -> tuple:
    """(calls closed, where the text ends in the open one): none, opener (no arguments object yet), args,
    string (inside a string in the arguments), after (the arguments closed, the region not)."""
    closed = text.count(CLOSE)
    tail = text.rsplit(CLOSE, 1)[-1]
    if OPEN not in tail:
        return closed, "none"
    region = tail.split(OPEN, 1)[1]
    at = region.find('"arguments"')
    brace = region.find("{", at) if at >= 0 else -1
    if brace < 0:
        return closed, "opener"
    depth, in_string, escaped = 0, False, False
    for ch in region[brace:]:
        if in_string:
            in_string = not (ch == '"' and not escaped)
            escaped = ch == "\\" and not escaped
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
    return closed, "string" if in_string else "args" if depth > 0 else "after"


def cut_points(tokenizer, ids: list[int], finish: str) -> list[int]:
    """The grid of max_tokens for a generation of token ids `ids` (see the module doc)."""
    firsts: dict[tuple, int] = {}   # (calls closed, state) -> the first cut that ends there
    value_string = None             # the first cut inside the first call's last string (a value)
    last = None
    for k in range(1, len(ids) + 1):
        state = _state(tokenizer.decode(ids[:k], skip_special_tokens=False))
        if state[0] >= 1 and state[1] not in ("none", "opener"):
            firsts[state] = k       # inside the second call's arguments: enough
            break
        firsts.setdefault(state, k)
        if state == (0, "string") and last != state:
            value_string = k
        if last is not None and state[0] > last[0]:
            firsts[(last[0], "end-1")] = k - 1   # one token short of the first call's end
        last = state
    points = {k for (closed, kind), k in firsts.items() if kind != "string" or closed > 0}
    points |= {value_string} if value_string else set()
    points.add(min(LONGEST, len(ids) + 4) if finish != "length" else len(ids))
    return sorted(points)


def chat_summary(completion) -> tuple:
    choice = completion.choices[0]
    calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
    return choice.message.content, calls, choice.finish_reason


def check_truth(calls: list[tuple[str, str]], finish, cut_reason, whole_reason, parallel: bool) -> None:
    """A call whose arguments are no JSON object is the last one and comes with `cut_reason` (the token
    limit); `whole_reason` (None: not checked) comes with whole calls only, at least one."""
    assert all(_whole(a) for _, a in calls[:-1]), calls
    if calls and not _whole(calls[-1][1]):
        assert finish == cut_reason, (calls, finish)
    if whole_reason is not None and finish == whole_reason:
        assert calls and all(_whole(a) for _, a in calls), (calls, finish)
    if not parallel:
        assert len(calls) <= 1, calls


@pytest.fixture(scope="module")
def grids(clients, tokenizer):
    """(chat's cells, the Responses and Messages cells): (tool_choice, parallel_tool_calls, max_tokens),
    the max_tokens from each pair's uncut blocking chat answer."""
    chat, _ = clients
    pairs = [(choice, parallel) for choice in CHOICES for parallel in (True, False)]
    fulls = _run(pairs, lambda pair: chat.chat.completions.create(**chat_kwargs(*pair, LONGEST),
                                                                   extra_body={"return_token_ids": True}))
    points = {pair: cut_points(tokenizer, full.choices[0].model_extra["token_ids"], full.choices[0].finish_reason)
              for pair, full in zip(pairs, fulls)}
    # Every cut class once, on required with parallel calls (the second call cut included); the other pairs
    # generate the same call (one tool) or none (auto here): their first and last cuts, and required
    # without parallel calls also inside the value and at the call's end.
    full = points["required", True]
    ends = {pair: [ks[0], ks[-1]] for pair, ks in points.items()}
    ends["required", True] = full
    ends["required", False] = sorted({*ends["required", False], *[k for k in points["required", False]
                                                                   if k in full[3:4] + full[6:7]]})
    classes = [k for k in full if k > 1]
    return ([(*pair, k) for pair, ks in ends.items() for k in ks],
            [("required", True, k) for k in classes[:1] + classes[2:]] + [("named", False, k)
                                                                           for k in ends["named", False]])


def _run(items, fn):
    # All at once: the engine batches them into the same decode steps.
    with ThreadPoolExecutor(len(items)) as pool:
        return list(pool.map(fn, items))


def _both(cells, blocking, streamed) -> list[tuple]:
    """[(blocking(cell), streamed(cell))] for every cell, all requests sent at once."""
    results = _run([(cell, mode) for cell in cells for mode in (0, 1)],
                   lambda job: (blocking, streamed)[job[1]](job[0]))
    return list(zip(results[0::2], results[1::2]))


def test_chat_streams_accumulate_to_the_blocking_answer(clients, grids):
    chat, _ = clients
    cells = grids[0]

    def streamed(cell):
        with chat.chat.completions.stream(**chat_kwargs(*cell)) as stream:
            try:
                return stream.get_final_completion()
            except openai.LengthFinishReasonError as cut:   # the helper raises at length, with what it built
                return cut.completion
    results = _both(cells, lambda cell: chat.chat.completions.create(**chat_kwargs(*cell)), streamed)
    seen = set()
    for (choice, parallel, k), (blocking, streamed) in zip(cells, results):
        content, calls, finish = chat_summary(streamed)
        assert (final_content(content or "", bool(calls)), calls, finish) == chat_summary(blocking), \
            (choice, parallel, k)
        content, calls, finish = chat_summary(blocking)
        check_truth(calls, finish, "length", "tool_calls", parallel)
        if finish == "length":
            assert blocking.usage.completion_tokens == k
        if choice != "auto" and k > 1 and finish != "length":
            assert calls   # a forced call is made once there is room for one
        seen.add((finish, len(calls), bool(calls) and not _whole(calls[-1][1])))
    # The grid reached a first call cut, a second call cut after a whole one (the case: both modes
    # carry the whole call and the cut one as sent, finish_reason length), whole calls, a cut before any call.
    assert {("length", 1, True), ("length", 2, True), ("tool_calls", 1, False), ("length", 0, False)} <= seen


def _whole(arguments: str) -> bool:
    try:
        return isinstance(json.loads(arguments), dict)
    except ValueError:
        return False


def responses_kwargs(choice: str, parallel: bool, max_tokens: int) -> dict:
    tool_choice = {"type": "function", "name": "get_weather"} if choice == "named" else choice
    return dict(model=MODEL, input=ASK, tools=[RESPONSES_TOOL], tool_choice=tool_choice,
                parallel_tool_calls=parallel, max_output_tokens=max_tokens, temperature=0)


def responses_summary_blocking(response) -> tuple:
    items = [(i.type, i.name, i.arguments) if i.type == "function_call"
             else (i.type, "".join(p.text for p in i.content if p.type == "output_text"))
             for i in response.output]
    reason = response.incomplete_details.reason if response.incomplete_details else None
    return items, response.status, reason, response.usage.output_tokens


def responses_summary_streamed(client, kwargs: dict) -> tuple:
    """What responses.stream's events accumulate: each item as added, its text and arguments from the
    helper's running snapshots; the terminal event's status."""
    items: dict[int, list] = {}
    status = reason = output_tokens = None
    with client.responses.stream(**kwargs) as stream:
        for event in stream:
            if event.type == "response.output_item.added":
                item = event.item
                items[event.output_index] = ([item.type, item.name, ""] if item.type == "function_call"
                                             else [item.type, ""])
            elif event.type == "response.function_call_arguments.delta":
                items[event.output_index][2] = event.snapshot
            elif event.type == "response.output_text.delta":
                items[event.output_index][1] = event.snapshot
            elif event.type in ("response.completed", "response.incomplete"):
                status = event.response.status
                details = event.response.incomplete_details
                reason = details.reason if details else None
                output_tokens = event.response.usage.output_tokens
        if status == "completed":   # the helper's own final response says the same
            final = stream.get_final_response()
            assert responses_summary_blocking(final)[0] == [tuple(items[i]) for i in sorted(items)]
    return [tuple(items[i]) for i in sorted(items)], status, reason, output_tokens


def test_responses_streams_accumulate_to_the_blocking_answer(clients, grids):
    chat, _ = clients
    cells = grids[1]
    results = _both(cells, lambda cell: responses_summary_blocking(chat.responses.create(**responses_kwargs(*cell))),
                    lambda cell: responses_summary_streamed(chat, responses_kwargs(*cell)))
    for cell, (blocking, streamed) in zip(cells, results):
        assert streamed == blocking, cell
        items, status, reason, output_tokens = blocking
        calls = [(name, args) for kind, *rest in items if kind == "function_call" for name, args in [rest]]
        check_truth(calls, (status, reason), ("incomplete", "max_output_tokens"), None, cell[1])
        # The token limit ended it exactly when it says so, whole calls before it or not.
        assert (status == "incomplete") == (output_tokens == cell[2]), (cell, status, output_tokens)


def messages_kwargs(choice: str, parallel: bool, max_tokens: int) -> dict:
    tool_choice = {"type": "tool", "name": "get_weather"} if choice == "named" else \
        {"type": "any" if choice == "required" else "auto"}
    tool_choice["disable_parallel_tool_use"] = not parallel
    return dict(model=MODEL, max_tokens=max_tokens, messages=[{"role": "user", "content": ASK}],
                tools=[MESSAGES_TOOL], tool_choice=tool_choice, extra_body={"temperature": 0})


def messages_summary(message) -> tuple:
    blocks = [(b.type, b.name, b.input) if b.type == "tool_use" else (b.type, b.text) for b in message.content]
    return blocks, message.stop_reason, message.usage.output_tokens


def test_messages_streams_accumulate_to_the_blocking_answer(clients, grids):
    _, messages = clients
    cells = grids[1]

    def streamed(cell):
        with messages.messages.stream(**messages_kwargs(*cell)) as stream:
            return messages_summary(stream.get_final_message())
    results = _both(cells, lambda cell: messages_summary(messages.messages.create(**messages_kwargs(*cell))),
                    streamed)
    cut_seen = False
    for (choice, parallel, k), (blocking, streamed) in zip(cells, results):
        assert streamed == blocking, (choice, parallel, k)
        blocks, stop_reason, output_tokens = blocking
        uses = [b for b in blocks if b[0] == "tool_use"]
        if stop_reason == "tool_use":
            assert uses
        if stop_reason == "max_tokens":
            assert output_tokens == k
        if not parallel:
            assert len(uses) <= 1
        cut_seen |= stop_reason == "max_tokens" and bool(uses)
    assert cut_seen


_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "%s"}}\n</tool_call>'
OLLAMA_ASK = "Repeat exactly this text and nothing else:\n" + _CALL % "Paris" + "\n" + _CALL % "Rome"


def ollama_summary(parts) -> tuple:
    """(content, [(name, arguments)], done_reason, eval_count) of an Ollama answer: one ChatResponse
    (blocking), or a stream's parts joined (content concatenated, calls gathered, the rest the last part's)."""
    parts = parts if isinstance(parts, list) else [parts]
    calls = [(c.function.name, dict(c.function.arguments)) for p in parts for c in p.message.tool_calls or []]
    return "".join(p.message.content or "" for p in parts), calls, parts[-1].done_reason, parts[-1].eval_count


def test_ollama_chat_streams_accumulate_to_the_blocking_answer(clients, tokenizer, metrale_server):
    chat, _ = clients
    messages = [{"role": "user", "content": OLLAMA_ASK}]
    full = chat.chat.completions.create(model=MODEL, messages=messages, tools=[CHAT_TOOL], temperature=0,
                                        max_tokens=LONGEST + 30, extra_body={"return_token_ids": True})
    ids = full.choices[0].model_extra["token_ids"]
    assert len(chat_summary(full)[1]) == 2, chat_summary(full)  # the copy makes both calls
    cuts = cut_points(tokenizer, ids, full.choices[0].finish_reason)
    cuts[-1] = len(ids) + 4  # past the end

    def ask(k: int, stream: bool):
        with ollama.Client(host=metrale_server.url, timeout=120) as client:
            answer = client.chat(model=MODEL, messages=messages, tools=[CHAT_TOOL], stream=stream,
                                 options={"temperature": 0, "num_predict": k})
            return ollama_summary(list(answer) if stream else answer)
    results = _run([(k, stream) for k in cuts for stream in (False, True)], lambda job: ask(*job))
    seen = set()
    for k, blocking, streamed in zip(cuts, results[0::2], results[1::2]):
        assert streamed == blocking, k
        content, calls, done_reason, eval_count = blocking
        assert all(isinstance(arguments, dict) for _, arguments in calls)  # only whole calls are sent
        if k < len(ids):
            assert (done_reason, eval_count) == ("length", k), k
        else:   # the uncut generation: chat completions' calls, Ollama's "stop" for a turn that made them
            assert (done_reason, eval_count) == ("stop", len(ids))
            assert calls == [(n, json.loads(a)) for n, a in chat_summary(full)[1]]
        seen.add((done_reason, len(calls)))
    # Cut before any call, cut inside the second after the first (the first sent whole), both whole.
    assert {("length", 0), ("length", 1), ("stop", 2)} <= seen
