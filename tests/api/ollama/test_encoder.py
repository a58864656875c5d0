"""ollama_api's pure parts: the tool-call accumulation over every split of the arguments' fragments, an NDJSON
stream read back the way the `ollama` client reads it (httpx's iter_lines) over every split of its bytes, the fold,
the timestamps and metrics, generate's Go template subset, and /api/embed's body."""
import json

import httpx
import numpy as np
import pytest

from inference.serving.deltas import Content, Finish, Reasoning, ToolCallArgs, ToolCallStart, Usage
from inference.serving.errors import ApiError
from ollama_api.catalogue import _quantization, human_count
from ollama_api.embeddings import embed_json
from ollama_api.encoder import CHAT, GENERATE, OllamaStream, Timing, created_at, fold
from ollama_api.go_template import render
from ollama_api.wire import ndjson_line

ARGUMENTS = ['{"city":"Paris","days":3}', '{"a":"}","b":{"c":[1,{"d":"}"}]}}', "{}"]


def ids():
    n = iter(range(10**6))
    return lambda: f"call_{next(n):08d}"


def calls_of(fragments: list[str], kind=CHAT) -> tuple[list[dict], list[int]]:
    """(the calls the stream sent, the index of the fragment after which each was sent)."""
    stream = OllamaStream(kind, "m", Timing(0.0), new_id=ids())
    sent, at = [], []
    stream.feed(ToolCallStart(0, "x", "get_weather"))
    for i, fragment in enumerate(fragments):
        for obj in stream.feed(ToolCallArgs(0, fragment)):
            sent += obj["message"]["tool_calls"]
            at.append(i)
    final = stream.end(Finish("tool_calls"), Usage(3, 4))
    return (sent if kind == CHAT else final.get("tool_calls", [])), at


@pytest.mark.parametrize("arguments", ARGUMENTS)
def test_a_call_is_sent_whole_once_its_arguments_close_whatever_the_split(arguments):
    whole = {"id": "call_00000000", "function": {"index": 0, "name": "get_weather", "arguments": json.loads(arguments)}}
    for cut in range(len(arguments) + 1):
        for second in range(cut, len(arguments) + 1):
            fragments = [arguments[:cut], arguments[cut:second], arguments[second:]]
            sent, at = calls_of(fragments)
            assert sent == [whole] and at == [max(i for i, f in enumerate(fragments) if f)], fragments
    assert calls_of(list(arguments))[0] == [whole]
    assert calls_of(list(arguments), GENERATE)[0] == [whole]  # generate: on the final object


def test_a_call_that_never_closes_is_not_sent():
    assert calls_of(['{"city":"Par'])[0] == []
    assert calls_of(['["not", "an object"]'])[0] == []


def stream_objects() -> list[dict]:
    stream = OllamaStream(CHAT, "m:latest", Timing(0.0), new_id=ids())
    out = []
    for delta in (Reasoning("Let me think: é🙂"), Content("Héllo "), Content("wörld 🙂\n"), Content("", token_ids=[1]),
                  ToolCallStart(0, "x", "f"), ToolCallArgs(0, '{"q":"ü"}')):
        out += stream.feed(delta)
    return out + [stream.end(Finish("stop"), Usage(5, 6))]


def test_every_split_of_the_ndjson_bytes_reads_back_as_the_same_objects():
    objects = stream_objects()
    raw = b"".join(ndjson_line(o) for o in objects)
    assert raw.count(b"\n") == len(objects) and raw.endswith(b"\n")
    for cut in range(len(raw) + 1):
        for second in (cut, (cut + len(raw)) // 2, len(raw)):
            chunks = [raw[:cut], raw[cut:max(cut, second)], raw[max(cut, second):]]
            response = httpx.Response(200, content=iter(chunks))
            assert [json.loads(line) for line in response.iter_lines()] == objects


def test_the_fold_is_what_a_blocking_answer_says():
    objects = stream_objects()
    body = fold(objects)
    assert body["message"] == {"role": "assistant", "content": "Héllo wörld 🙂\n", "thinking": "Let me think: é🙂",
                               "tool_calls": [{"id": "call_00000000", "function": {
                                   "index": 0, "name": "f", "arguments": {"q": "ü"}}}]}
    assert body["done"] is True and body["done_reason"] == "stop" and body["eval_count"] == 6
    assert body["prompt_eval_count"] == 5 and body["model"] == "m:latest"


def test_generate_objects_carry_response_and_the_final_one_context():
    stream = OllamaStream(GENERATE, "m", Timing(0.0), context=[7, 8])
    parts = stream.feed(Content("Hi", token_ids=[1, 2])) + stream.feed(Reasoning("hm", token_ids=[3]))
    final = stream.end(Finish("length"), Usage(2, 3))
    assert parts[0]["response"] == "Hi" and parts[1] == {**parts[1], "response": "", "thinking": "hm"}
    assert final["context"] == [7, 8, 1, 2, 3] and final["done_reason"] == "length" and final["response"] == ""
    assert fold([*parts, final])["response"] == "Hi" and fold([*parts, final])["thinking"] == "hm"


def test_created_at_is_go_s_rfc3339_nano_in_utc():
    assert created_at(1_700_000_000_123_000_000) == "2023-11-14T22:13:20.123Z"
    assert created_at(1_700_000_000_000_000_001) == "2023-11-14T22:13:20.000000001Z"
    assert created_at(1_700_000_000_000_000_000) == "2023-11-14T22:13:20Z"


def test_metrics_are_nanoseconds_and_tokens_and_zeros_are_left_out():
    timing = Timing(started=10.0, submitted=10.5, first=11.0, ended=13.0)
    assert timing.metrics(Usage(7, 9)) == {"total_duration": 3_000_000_000, "prompt_eval_count": 7,
                                           "prompt_eval_duration": 500_000_000, "eval_count": 9,
                                           "eval_duration": 2_000_000_000}
    assert Timing(started=1.0, load_s=0.25, ended=1.5).metrics(Usage(0, 0))["load_duration"] == 250_000_000


@pytest.mark.parametrize("template, expected", [
    ("{{ .System }}|{{ .Prompt }}|{{ .Response }}", "s|p|"),
    ("{{- if .System }}<sys>{{ .System }}</sys>\n{{ end -}}\n  <u>{{ .Prompt }}", "<sys>s</sys>\n<u>p"),
    ("{{ if .Suffix }}<PRE> {{ .Prompt }} <SUF>{{ .Suffix }} <MID>{{ else }}{{ .Prompt }}{{ end }}", "p"),
    ("{{ if .System }}{{ if .Prompt }}both{{ else }}system{{ end }}{{ else }}neither{{ end }}", "both"),
    ("{{/* a comment */}}[{{ .Prompt }}]", "[p]"),
    ("{{ if .System }}" * 64 + "{{ .Prompt }}" + "{{ end }}" * 64, "p"),
])
def test_the_go_template_subset(template, expected):
    assert render(template, system="s", prompt="p") == expected


@pytest.mark.parametrize("template, named", [
    ("{{ range .Messages }}{{ .Content }}{{ end }}", "range .Messages"), ("{{ .Tools }}", ".Tools"),
    ("{{ if .System }}x", "never closed"), ("{{ end }}", "outside an if"), ("{{ .Prompt", "never closed"),
    ("{{ json .Prompt }}", "json .Prompt"),
    ("{{ if .System }}" * 1000 + "{{ end }}" * 1000 + "{{ .Prompt }}", "nested more than 64 deep"),
])
def test_what_the_subset_does_not_run_is_a_400_naming_it(template, named):
    with pytest.raises(ApiError) as refused:
        render(template, prompt="p")
    assert refused.value.status == 400 and named in refused.value.message and refused.value.param == "template"


@pytest.mark.parametrize("count, text", [(7_615_616_512, "7.6B"), (8_000_000_000, "8B"), (134_515_008, "134.52M"),
                                         (270_000_000, "270M"), (22_713_216, "22.71M"), (12_345, "12K"), (7, "7")])
def test_parameter_sizes_read_as_ollama_writes_them(count, text):
    assert human_count(count) == text


def test_embed_writes_a_normalizing_models_vectors_as_computed_and_normalizes_the_others():
    rng = np.random.default_rng(0)
    raw = rng.standard_normal((3, 384)).astype(np.float32)
    unit = (raw / np.linalg.norm(raw, axis=1, keepdims=True)).astype(np.float32)
    kept = json.loads(embed_json("m", [v.tobytes() for v in unit], {"prompt_eval_count": 3}, normalizes=True))
    assert kept["model"] == "m" and kept["prompt_eval_count"] == 3
    # The same float32 bits as the model gave (normalizing an already unit vector again moves its last bits).
    assert np.array_equal(np.array(kept["embeddings"], dtype=np.float32), unit)
    scaled = json.loads(embed_json("m", [(v * 7).tobytes() for v in raw], {}, normalizes=False))["embeddings"]
    assert np.allclose(np.linalg.norm(np.array(scaled, dtype=np.float64), axis=1), 1.0, atol=1e-6)
    assert np.allclose(np.array(scaled), unit, atol=1e-6)


def test_quantization_level_is_the_files_own_name_else_the_most_common_block_else_the_dtype():
    blocks = {"quant_method": "gguf_blocks", "block_size": 32, "weights": {"a": "q5_0", "b": "q5_0", "c": "q4_k"}}
    # Gemma 3 270M's Q4_K_M keeps most rows in Q5_0 (llama.cpp's fallback): Ollama says Q4_K_M, the file's name.
    assert _quantization({"quantization_config": blocks | {"file_type": "Q4_K_M"}}) == ("Q4_K_M", "gguf")
    assert _quantization({"quantization_config": blocks}) == ("Q5_0", "gguf")   # imported before it was kept
    assert _quantization({"torch_dtype": "bfloat16"}) == ("BF16", "safetensors")
