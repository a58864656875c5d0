"""Validated request fields -> SamplingParams, with defaults from generation_config.json, then the settings.

A field the request leaves unset takes the model's generation_config.json value
(as vLLM's `--generation-config auto` does: temperature, top_p, top_k, min_p,
repetition_penalty, max_new_tokens), then for a catalogue model pulled by name its model card's
recommendation (engine/model_cards.py; both through ModelFolder.sampling_defaults), then
METRALE["SAMPLING_DEFAULTS"], then OpenAI's documented default (temperature 1, top_p 1, penalties 0).
"""
from __future__ import annotations

import logging
from dataclasses import fields
from functools import lru_cache

from django.conf import settings

from inference.engine.grammar_state import StructuredOutput
from inference.engine.model_folder import ModelFolder
from inference.engine.reasoning import ReasoningSpec
from inference.engine.repetition import RepetitionDetection
from inference.engine.sampling_params import SamplingParams

from .errors import ApiError, bad_request
from .logprobs import spelling_for

log = logging.getLogger("metrale.api")

# Request fields copied to SamplingParams under the same name when set.
PASSTHROUGH = ("temperature", "top_p", "top_k", "min_p", "top_n_sigma", "repetition_penalty", "presence_penalty",
               "frequency_penalty", "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n",
               "min_tokens", "seed", "logit_bias", "stop_token_ids")
# Temperatures this small divide logits into infinities; they mean greedy (vLLM's _SAMPLING_EPS).
GREEDY_BELOW = 1e-5
# llama.cpp's default DRY sequence breakers.
DEFAULT_DRY_BREAKERS = ("\n", ":", "\"", "*")
_PARAM_NAMES = {f.name for f in fields(SamplingParams)}


def defaults_for(folder: ModelFolder) -> dict:
    """The merged sampling defaults: the model folder's (generation_config.json, its model card's) over
    METRALE["SAMPLING_DEFAULTS"] (SamplingParams names; max_tokens among them)."""
    server = {k: v for k, v in (settings.METRALE.get("SAMPLING_DEFAULTS") or {}).items() if k in _PARAM_NAMES}
    return {**server, **folder.sampling_defaults}


def resolve_max_tokens(requested: int | None, default: int | None, prompt_tokens: int, limit: int,
                       param: str = "messages") -> int:
    """The completion budget in tokens. A missing max_tokens means "up to the context".

    Raises ApiError 400 (code context_length_exceeded, the numbers in the message) when the prompt
    plus the requested tokens exceed `limit`, before anything is generated. Source: OpenAI's
    context_length_exceeded error; vLLM answers the same case with a 400.
    """
    if requested is None and default is not None:
        requested = min(default, max(1, limit - prompt_tokens))
    if prompt_tokens + (requested or 1) > limit:
        asked = f"{prompt_tokens + requested} tokens ({prompt_tokens} in the prompt, {requested} in the completion)" \
            if requested else f"{prompt_tokens} tokens in the prompt, leaving no room for the completion"
        raise ApiError(400, f"This model's maximum context length is {limit} tokens. However, you requested "
                            f"{asked}. Please reduce the length of the prompt or of the completion.",
                       param=param, code="context_length_exceeded")
    return requested if requested is not None else limit - prompt_tokens


def check_token_ids(ids, vocab_size: int, param: str) -> None:
    """Raises ApiError 400 naming `param` when a token id is outside [0, vocab_size)."""
    bad = next((t for t in ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise bad_request(f"Token id {bad} in '{param}' is out of range: this model's vocabulary has "
                          f"{vocab_size} tokens.", param)


@lru_cache(maxsize=8)
def dry_breaker_ids(tokenizer, breakers: tuple[str, ...]) -> frozenset[int]:
    """Ids of the tokens whose text contains a DRY sequence breaker (llama.cpp matches breakers
    inside tokens too). Computed once per tokenizer and breaker set."""
    spell = spelling_for(tokenizer)
    ids = set()
    for token_id in range(tokenizer.vocab_size):
        text = spell(token_id)[1].decode("utf-8", errors="ignore")
        if any(b in text for b in breakers):
            ids.add(token_id)
    return frozenset(ids)


def repetition_rule(requested: dict | None) -> RepetitionDetection | None:
    """The request's repetition_detection, else METRALE["REPETITION_DETECTION"] (a JSON object of the same
    fields), else None. Raises ApiError 400 for a rule the engine refuses (it validates the fields)."""
    rule = requested if requested is not None else settings.METRALE.get("REPETITION_DETECTION")
    if not rule:
        return None
    try:
        return RepetitionDetection(int(rule["max_pattern_size"]), int(rule.get("min_pattern_size", 0)),
                                   int(rule.get("min_count", 2)))
    except (KeyError, TypeError, ValueError) as exc:
        raise bad_request(f"Invalid value for 'repetition_detection': {exc}", "repetition_detection") from exc


def sampling_params(req: dict, *, max_tokens: int, tokenizer, defaults: dict, logprobs: int | None = None,
                    prompt_logprobs: int | None = None, seed_offset: int = 0,
                    reasoning: ReasoningSpec | None = None,
                    structured: StructuredOutput | None = None) -> SamplingParams:
    """SamplingParams for one choice of a validated request.

    max_tokens: the resolved completion budget (see resolve_max_tokens). logprobs: top-N count per
    token (0 = only the sampled token's), None = off. seed_offset: added to the request's seed, so
    choice i of a seeded n>1 request uses seed + i. reasoning: how the output reasons, for the
    engine's thinking cap and grammar (reasoning_spec.reasoning_spec). DRY's sequence breakers (strings; llama.cpp's
    default set when unset) become the ids of the tokens containing them. Raises ApiError 400 for
    token ids outside the vocabulary in logit_bias or stop_token_ids.
    """
    vocab_size = tokenizer.vocab_size
    if req.get("logit_bias"):
        check_token_ids(req["logit_bias"], vocab_size, "logit_bias")
    if req.get("stop_token_ids"):
        check_token_ids(req["stop_token_ids"], vocab_size, "stop_token_ids")
    values = {k: v for k, v in defaults.items() if k != "max_tokens"}
    values.update({k: req[k] for k in PASSTHROUGH if req.get(k) is not None})
    if values.get("top_k", 0) < 0:
        values["top_k"] = 0
    if 0 < values.get("temperature", 1.0) < GREEDY_BELOW:
        values["temperature"] = 0.0
    if values.get("seed") is not None:
        values["seed"] += seed_offset
    if values.get("dry_multiplier", 0) > 0:
        breakers = req.get("dry_sequence_breakers")
        values["dry_sequence_breaker_ids"] = dry_breaker_ids(
            tokenizer, tuple(DEFAULT_DRY_BREAKERS if breakers is None else breakers))
    values["repetition_detection"] = repetition_rule(req.get("repetition_detection"))
    return SamplingParams(**values, max_tokens=max_tokens, ignore_eos=req.get("ignore_eos", False),
                          logprobs=logprobs, prompt_logprobs=prompt_logprobs, reasoning=reasoning,
                          structured=structured)
