"""Scripted generations for every tool-call format, with the merged deltas each must give.

Each case: (parser, case name, text, expected merged deltas, extra TextPipeline kwargs).
Tools are tests/serving/streaming.py's TOOLS; ids come from counter_ids().
"""
from __future__ import annotations

from .streaming import CALL, C, R

PARIS = {"city": "Paris", "days": 3}
OSLO = {"city": "Oslo", "days": 1}
NESTED = {"a": {"b": [1, {"c": "]"}]}}
COERCED = {"city": "Paris", "days": 3, "hot": True, "ratio": 0.5}


def _cases(parser, one, two, no_args, nested, nested_expected, truncated, truncated_expected,
           in_reasoning, coercion, leak, leak_expected, reasoning_parser="think", sep="\n"):
    return [
        (parser, "one_call", one, CALL(0, "get_weather", PARIS), {}),
        (parser, "parallel_calls", one + sep + two,
         CALL(0, "get_weather", PARIS) + CALL(1, "get_weather", OSLO), {}),
        (parser, "call_after_text", "Let me check.\n" + one,
         [C("Let me check.")] + CALL(0, "get_weather", PARIS), {}),
        (parser, "text_after_call", one + "\n\nIt is sunny.",
         CALL(0, "get_weather", PARIS) + [C("It is sunny.")], {}),
        (parser, "text_around_call", "Checking.\n" + one + "\nDone.",
         [C("Checking.")] + CALL(0, "get_weather", PARIS) + [C("\n\nDone.")], {}),
        (parser, "no_arguments", no_args, CALL(0, "get_time", {}), {}),
        (parser, "nested_json_and_closing_tag_in_string", nested, nested_expected, {}),
        (parser, "truncated_call", "Checking.\n" + truncated, truncated_expected, {}),
        (parser, "call_inside_reasoning", in_reasoning[0], in_reasoning[1],
         {"reasoning_parser": reasoning_parser}),
        (parser, "schema_coercion", coercion, CALL(0, "get_weather", COERCED), {}),
        (parser, "leak_markers_stripped", leak, leak_expected, {}),
    ]


def _write_file(content: str) -> list[tuple]:
    return CALL(0, "write_file", {"path": "a.txt", "content": content, "options": NESTED})


HERMES = _cases(
    "hermes",
    one='<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>',
    two='<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 1}}\n</tool_call>',
    no_args='<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
    nested='<tool_call>{"name": "write_file", "arguments": {"path": "a.txt", "content": '
           '"x</tool_call>}]\\"<tool_call>", "options": {"a": {"b": [1, {"c": "]"}]}}}}</tool_call>',
    nested_expected=_write_file('x</tool_call>}]"<tool_call>'),
    truncated='<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par',
    truncated_expected=[C("Checking.")],
    in_reasoning=('<think>Maybe <tool_call>{"name": "get_time", "arguments": {}}</tool_call> '
                  'helps.</think>\n\nNo tools needed.',
                  [R('Maybe <tool_call>{"name": "get_time", "arguments": {}}</tool_call> helps.'),
                   C("No tools needed.")]),
    coercion='<tool_call>{"name": "get_weather", "arguments": '
             '{"city": "Paris", "days": "3", "hot": "yes", "ratio": "0.5"}}</tool_call>',
    leak='Done </tool_call> ok <tool_response>{"temp": 20}</tool_response> end',
    leak_expected=[C("Done  ok  end")],
)

QWEN3_CODER = _cases(
    "qwen3_coder",
    one="<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
    two="<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n"
        "<parameter=days>\n1\n</parameter>\n</function>\n</tool_call>",
    no_args="<tool_call>\n<function=get_time>\n</function>\n</tool_call>",
    nested="<tool_call>\n<function=write_file>\n<parameter=path>\na.txt\n</parameter>\n"
           "<parameter=content>\nline </tool_call> and </function>\n<b>x</b>\n</parameter>\n"
           '<parameter=options>\n{"a": {"b": [1, {"c": "]"}]}}\n</parameter>\n</function>\n'
           "</tool_call>",
    nested_expected=_write_file("line </tool_call> and </function>\n<b>x</b>"),
    truncated="<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
    truncated_expected=[C("Checking.")],
    in_reasoning=("<think>Maybe <tool_call>\n<function=get_time>\n</function>\n</tool_call>"
                  "</think>\n\nNo tools needed.",
                  [R("Maybe <tool_call>\n<function=get_time>\n</function>\n</tool_call>"),
                   C("No tools needed.")]),
    coercion="<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
             "<parameter=days>\n3\n</parameter>\n<parameter=hot>\ntrue\n</parameter>\n"
             "<parameter=ratio>\n0.5\n</parameter>\n</function>\n</tool_call>",
    leak="x <parameter=city>Paris</parameter> y </function> z",
    leak_expected=[C("x  y  z")],
)

LLAMA3_JSON = _cases(
    "llama3_json",
    one='{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}',
    two='{"name": "get_weather", "parameters": {"city": "Oslo", "days": 1}}',
    sep="; ",
    no_args='{"name": "get_time", "parameters": {}}',
    nested='{"name": "write_file", "parameters": {"path": "a.txt", "content": '
           '"x}]\\"{\\"name\\": 1", "options": {"a": {"b": [1, {"c": "]"}]}}}}',
    nested_expected=_write_file('x}]"{"name": 1'),
    truncated='{"name": "get_weather", "parameters": {"city": "Par',
    truncated_expected=[C('Checking.\n{"name": "get_weather", "parameters": {"city": "Par')],
    in_reasoning=('<think>Maybe {"name": "get_time", "parameters": {}} helps.</think>\n\nNo.',
                  [R('Maybe {"name": "get_time", "parameters": {}} helps.'), C("No.")]),
    coercion='{"name": "get_weather", "parameters": '
             '{"city": "Paris", "days": "3", "hot": "true", "ratio": "0.5"}}',
    leak="x <|python_tag|> y",
    leak_expected=[C("x  y")],
)

MISTRAL = _cases(
    "mistral",
    one='[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 3}',
    two='[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo", "days": 1}',
    sep="",
    no_args="[TOOL_CALLS]get_time[ARGS]{}",
    nested='[TOOL_CALLS]write_file[ARGS]{"path": "a.txt", "content": "x[TOOL_CALLS]}]\\"[ARGS]", '
           '"options": {"a": {"b": [1, {"c": "]"}]}}}',
    nested_expected=_write_file('x[TOOL_CALLS]}]"[ARGS]'),
    truncated='[TOOL_CALLS]get_weather[ARGS]{"city": "Par',
    truncated_expected=[C("Checking.")],
    in_reasoning=("[THINK]Maybe [TOOL_CALLS]get_time[ARGS]{} helps.[/THINK]No tools needed.",
                  [R("Maybe [TOOL_CALLS]get_time[ARGS]{} helps."), C("No tools needed.")]),
    reasoning_parser="mistral",
    coercion='[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": "3", "hot": "1", '
             '"ratio": "0.5"}',
    leak='x [TOOL_RESULTS]{"temp": 20}[/TOOL_RESULTS] y [ARGS] z',
    leak_expected=[C("x  y  z")],
) + [
    ("mistral", "json_list_form",
     '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}, '
     '{"name": "get_time", "arguments": {}}]',
     CALL(0, "get_weather", PARIS) + CALL(1, "get_time", {}), {}),
    ("mistral", "call_id_form", "[TOOL_CALLS]get_time[CALL_ID]a1b2c3d4e[ARGS]{}",
     CALL(0, "get_time", {}), {}),
]

PYTHONIC = _cases(
    "pythonic",
    one='[get_weather(city="Paris", days=3)]',
    two='[get_weather(city="Oslo", days=1)]',
    no_args="[get_time()]",
    nested="[write_file(path='a.txt', content=\"x)]\\\"'\", options={\"a\": {\"b\": [1, {\"c\": \"]\"}]}})]",
    nested_expected=_write_file("x)]\"'"),
    truncated='[get_weather(city="Par',
    truncated_expected=[C('Checking.\n[get_weather(city="Par')],
    in_reasoning=("<think>Maybe [get_time()] helps.</think>\n\nNo tools needed.",
                  [R("Maybe [get_time()] helps."), C("No tools needed.")]),
    coercion='[get_weather(city="Paris", days="3", hot="true", ratio=0.5)]',
    leak="x <|python_start|>[get_time()]<|python_end|> y",
    leak_expected=[C("x ")] + CALL(0, "get_time", {}) + [C(" y")],
) + [
    ("pythonic", "parallel_calls_in_one_list",
     '[get_weather(city="Paris", days=3), get_weather(city="Oslo", days=1)]',
     CALL(0, "get_weather", PARIS) + CALL(1, "get_weather", OSLO), {}),
    ("pythonic", "triple_quoted_string", '[write_file(path="a", content="""say "hi")]""")]',
     CALL(0, "write_file", {"path": "a", "content": 'say "hi")]'}), {}),
    ("pythonic", "brackets_that_are_not_calls", "See [1], [print(x)] and [a](b).",
     [C("See [1], [print(x)] and [a](b).")], {}),
]


def _arg_call(name, **raw):
    pairs = "".join(f"\n<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>" for k, v in raw.items())
    return f"<tool_call>{name}{pairs}\n</tool_call>"


_ARG_NESTED = ("<tool_call>write_file<arg_key>path</arg_key><arg_value>a.txt</arg_value>"
               "<arg_key>content</arg_key><arg_value>  a </tool_call> <arg_key>b</x>  </arg_value>"
               '<arg_key>options</arg_key><arg_value>{"a": {"b": [1, {"c": "]"}]}}</arg_value>'
               "</tool_call>")
_ARG_TRUNCATED = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Par"

POOLSIDE_V1 = _cases(
    "poolside_v1",
    one=_arg_call("get_weather", city="Paris", days="3"),
    two=_arg_call("get_weather", city="Oslo", days="1"),
    no_args="<tool_call>get_time</tool_call>",
    nested=_ARG_NESTED,
    nested_expected=_write_file("  a </tool_call> <arg_key>b</x>  "),
    truncated=_ARG_TRUNCATED,
    truncated_expected=[C("Checking.")],
    in_reasoning=("<think>Maybe <tool_call>get_time</tool_call> helps.</think>\n\nNo.",
                  [R("Maybe <tool_call>get_time</tool_call> helps."), C("No.")]),
    coercion=_arg_call("get_weather", city='"Paris"', days="3", hot="true", ratio="0.5"),
    leak="x <arg_key>k</arg_key> y </tool_call> z",
    leak_expected=[C("x  y  z")],
)

GLM47 = _cases(
    "glm47",
    one=_arg_call("get_weather", city="Paris", days="3"),
    two=_arg_call("get_weather", city="Oslo", days="1"),
    no_args="<tool_call>get_time</tool_call>",
    nested=_ARG_NESTED,
    nested_expected=_write_file("  a </tool_call> <arg_key>b</x>  "),
    truncated=_ARG_TRUNCATED,
    truncated_expected=[C("Checking.")] + CALL(0, "get_weather", {
        "_rejected_by_server": f"the call was cut off before </tool_call>: {_ARG_TRUNCATED}; "
                               "its parameters are: city, days, hot, ratio"}),
    in_reasoning=("<think>Maybe <tool_call>get_time</tool_call> helps.</think>\n\nNo.",
                  [R("Maybe <tool_call>get_time</tool_call> helps."), C("No.")]),
    coercion=_arg_call("get_weather", city="Paris", days="3", hot="true", ratio="0.5"),
    leak="x <arg_key>k</arg_key> y </tool_call> z",
    leak_expected=[C("x  y  z")],
)

ALL_CASES = HERMES + QWEN3_CODER + LLAMA3_JSON + MISTRAL + PYTHONIC + POOLSIDE_V1 + GLM47
