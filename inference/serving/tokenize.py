"""POST /tokenize and POST /detokenize: vLLM's shapes.

/tokenize takes `prompt` (text; add_special_tokens default true) or `messages`
(rendered with the chat template; add_special_tokens default false) and answers
`{tokens, count, max_model_len}` (+ `token_strs` with return_token_strs);
/detokenize takes `tokens` and answers `{prompt}`. Source: vLLM's
serving_tokenization (TokenizeRequest, DetokenizeRequest).
"""
from __future__ import annotations

from rest_framework import serializers

from .errors import bad_request
from .fields import BooleanField, ObjectField, StringField, TokenIdListField
from .model_names import check_model
from .prepare import check_prompt_chars
from .prompts import render_chat
from .protocol import MessagesField, opt, parse_json_body, validate
from .sampling import check_token_ids
from .thinking import resolve_thinking
from .tool_fields import ToolsField


class TokenizeRequest(serializers.Serializer):
    """POST /tokenize: `prompt` (a string) or `messages` (rendered with the chat template). vLLM's shape."""

    model = StringField(required=False, default="")
    prompt = StringField(**opt())
    messages = MessagesField(**opt())
    add_special_tokens = BooleanField(**opt())
    add_generation_prompt = BooleanField(required=False, default=True)
    continue_final_message = BooleanField(required=False, default=False)
    chat_template_kwargs = ObjectField(**opt())
    tools = ToolsField(**opt())
    return_token_strs = BooleanField(required=False, default=False)

    def validate(self, attrs):
        if (attrs.get("prompt") is None) == (attrs.get("messages") is None):
            raise bad_request("Send exactly one of 'prompt' or 'messages'.", "prompt")
        if attrs["continue_final_message"] and self.initial_data.get("add_generation_prompt") is True:
            raise bad_request("'continue_final_message' and 'add_generation_prompt' cannot both be true.",
                              "continue_final_message")
        return attrs


class DetokenizeRequest(serializers.Serializer):
    """POST /detokenize: `tokens` (token ids) -> text."""

    model = StringField(required=False, default="")
    tokens = TokenIdListField()


def parse_tokenize(raw_body: bytes) -> dict:
    """POST /tokenize's body validated. Raises ApiError 400."""
    return validate(TokenizeRequest, parse_json_body(raw_body))


def parse_detokenize(raw_body: bytes) -> dict:
    """POST /detokenize's body validated. Raises ApiError 400."""
    return validate(DetokenizeRequest, parse_json_body(raw_body))


def tokenize(req: dict, rt) -> dict:
    """The token ids of a prompt or a conversation (`req`: parse_tokenize's; CPU work: views run it on
    the prepare pool).

    Raises ApiError 400 on bad input or a text longer than the context could hold in characters
    (prepare.check_prompt_chars), 404 on a bad model."""
    check_model(req["model"], rt.model_id, rt.adapters)
    tok = rt.tokenizer
    if req.get("messages") is not None:
        text = render_chat(tok, req, resolve_thinking(req))
        special = bool(req.get("add_special_tokens"))
    else:
        text = req["prompt"]
        special = req.get("add_special_tokens") is not False
    check_prompt_chars(tok, text, rt.engine.max_request_tokens, "messages" if req.get("messages") else "prompt")
    ids = tok.encode(text, add_special_tokens=special)
    body = {"tokens": ids, "count": len(ids), "max_model_len": rt.engine.max_model_len}
    if req["return_token_strs"]:
        body["token_strs"] = tok.convert_ids_to_tokens(ids)
    return body


def detokenize(req: dict, rt) -> dict:
    """The text of token ids (`req`: parse_detokenize's; special tokens kept). Raises ApiError 400 for ids
    outside the vocabulary."""
    check_model(req["model"], rt.model_id, rt.adapters)
    check_token_ids(req["tokens"], rt.tokenizer.vocab_size, "tokens")
    return {"prompt": rt.tokenizer.decode(req["tokens"], skip_special_tokens=False)}
