"""POST /tokenize and POST /detokenize: vLLM's shapes.

/tokenize takes `prompt` (text; add_special_tokens default true) or `messages`
(rendered with the chat template; add_special_tokens default false) and answers
`{tokens, count, max_model_len}` (+ `token_strs` with return_token_strs);
/detokenize takes `tokens` and answers `{prompt}`. Source: vLLM's
serving_tokenization (TokenizeRequest, DetokenizeRequest).
"""
from __future__ import annotations

from .model_names import check_model
from .prompts import render_chat
from .protocol import DetokenizeRequest, TokenizeRequest, parse_json_body, validate
from .sampling import check_token_ids


def tokenize(raw_body: bytes, rt) -> dict:
    """The token ids of a prompt or a conversation. Raises ApiError 400 on bad input, 404 on a bad model."""
    req = validate(TokenizeRequest, parse_json_body(raw_body))
    check_model(req["model"], rt.model_id)
    tok = rt.tokenizer
    if req.get("messages") is not None:
        text = render_chat(tok, req)
        special = bool(req.get("add_special_tokens"))
    else:
        text = req["prompt"]
        special = req.get("add_special_tokens") is not False
    ids = tok.encode(text, add_special_tokens=special)
    body = {"tokens": ids, "count": len(ids), "max_model_len": rt.engine.max_model_len}
    if req["return_token_strs"]:
        body["token_strs"] = tok.convert_ids_to_tokens(ids)
    return body


def detokenize(raw_body: bytes, rt) -> dict:
    """The text of token ids (special tokens kept). Raises ApiError 400 for ids outside the vocabulary."""
    req = validate(DetokenizeRequest, parse_json_body(raw_body))
    check_model(req["model"], rt.model_id)
    check_token_ids(req["tokens"], rt.tokenizer.vocab_size, "tokens")
    return {"prompt": rt.tokenizer.decode(req["tokens"], skip_special_tokens=False)}
