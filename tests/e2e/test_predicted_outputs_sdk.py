"""Predicted Outputs and repetition detection through the official openai SDK against a live daphne (SmolLM2,
compact weights: speculation in auto): the text with a prediction (exact, junk, partial) is the text without one;
accepted / rejected prediction tokens in blocking and streamed usage; the restrictions as 400s; a repeating
output stopped."""
import openai
import pytest

pytestmark = pytest.mark.e2e

MODEL = "smollm2-135m-instruct"
CODE = '''def block_hash(parent, token_ids, salt):
    """The chained hash of a full block."""
    return hash((parent, token_ids, salt))


def blocks_needed(num_tokens, block_size, table):
    total = -(-num_tokens // block_size)
    return max(0, total - len(table))
'''
ASK = [{"role": "user", "content": "Repeat this code exactly, changing nothing. Output only the code.\n```python\n"
        + CODE + "```"}]


def chat(client, **kw):
    return client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=120, temperature=0, **kw)


def test_the_text_is_the_same_with_any_prediction_and_an_echo_accepts_its_tokens(openai_client):
    plain = chat(openai_client)
    assert plain.usage.completion_tokens_details.accepted_prediction_tokens == 0
    assert plain.usage.completion_tokens_details.rejected_prediction_tokens == 0
    text = plain.choices[0].message.content
    exact = chat(openai_client, prediction={"type": "content", "content": "```python\n" + CODE + "```"})
    # Junk that still shares tokens with the output (so drafts are made, and refused): the code's words reversed.
    junk = chat(openai_client, prediction={"type": "content", "content": " ".join(reversed(CODE.split()))})
    partial = chat(openai_client, prediction={"type": "content", "content": [
        {"type": "text", "text": "```python\n" + CODE[:80]}, {"type": "text", "text": "# an edit\n" + CODE[80:]}]})
    for answer in (exact, junk, partial):
        assert answer.choices[0].message.content == text
        assert answer.choices[0].finish_reason == plain.choices[0].finish_reason
        assert answer.usage.completion_tokens == plain.usage.completion_tokens
    assert exact.usage.completion_tokens_details.accepted_prediction_tokens > 20
    assert junk.usage.completion_tokens_details.rejected_prediction_tokens > 0
    details = partial.usage.completion_tokens_details
    assert details.accepted_prediction_tokens > 0 and details.rejected_prediction_tokens > 0


def test_streamed_usage_reports_the_prediction_counts(openai_client):
    prediction = {"type": "content", "content": "```python\n" + CODE + "```"}
    blocking = chat(openai_client, prediction=prediction)
    chunks = list(chat(openai_client, prediction=prediction, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == blocking.choices[0].message.content
    usage = chunks[-1].usage
    assert usage.completion_tokens_details.accepted_prediction_tokens == \
        blocking.usage.completion_tokens_details.accepted_prediction_tokens > 0
    assert usage.completion_tokens_details.rejected_prediction_tokens == \
        blocking.usage.completion_tokens_details.rejected_prediction_tokens


@pytest.mark.parametrize("extra, param", [
    (dict(n=2), "n"), (dict(logprobs=True), "logprobs"), (dict(presence_penalty=0.5), "presence_penalty"),
    (dict(frequency_penalty=1.0), "frequency_penalty"),
    (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]), "tools"),
])
def test_a_prediction_with_what_it_excludes_is_a_400_naming_the_field(openai_client, extra, param):
    with pytest.raises(openai.BadRequestError) as err:
        chat(openai_client, prediction={"type": "content", "content": "x"}, **extra)
    assert err.value.body["param"] == param


def test_an_unknown_prediction_type_is_a_400_naming_prediction_type(openai_client):
    with pytest.raises(openai.BadRequestError) as err:
        chat(openai_client, prediction={"type": "audio", "content": "x"})
    assert err.value.body["param"] == "prediction.type"


def test_repetition_detection_stops_a_looping_output_with_stop_and_keeps_the_repeated_tail(openai_client):
    """logit_bias scripts the loop: one token's logit raised so far that greedy decoding repeats it."""
    loop_id = 28  # a plain token of SmolLM2's vocabulary
    kw = dict(model=MODEL, prompt="Count: ", max_tokens=40, temperature=0, logit_bias={str(loop_id): 100})
    free = openai_client.completions.create(**kw)
    assert free.choices[0].finish_reason == "length" and free.usage.completion_tokens == 40
    stopped = openai_client.completions.create(
        **kw, extra_body={"repetition_detection": {"max_pattern_size": 4, "min_pattern_size": 1, "min_count": 5}})
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.usage.completion_tokens == 5  # the pattern's five repeats are kept
    assert stopped.choices[0].text == free.choices[0].text[:len(stopped.choices[0].text)] != ""


def test_a_bad_repetition_detection_is_a_400_naming_its_field(openai_client):
    with pytest.raises(openai.BadRequestError) as err:
        openai_client.completions.create(model=MODEL, prompt="x", max_tokens=4, extra_body={
            "repetition_detection": {"max_pattern_size": 2, "min_pattern_size": 3}})
    assert err.value.body["param"] == "repetition_detection.min_pattern_size"
