"""The one preparation pipeline: a surface's GenerationRequest -> rendered, tokenized, checked engine inputs.

Every generating surface (chat completions, legacy completions, Responses, and every later
one) maps its own wire fields to a `GenerationRequest` and calls `prepare`, which, once for
all of them:
1. checks the model name and chooses the parsers (text_setup.py);
2. renders the prompt through the chat template (or takes the completion prompts), refuses a
   prompt that has more characters than the context could ever hold *before* tokenizing, and
   tokenizes -- both off the event loop, in a bounded worker pool (`cpu_work`), so a huge
   prompt never freezes other clients' streams; a request whose body is at most INLINE_BYTES
   does both on the loop (`light_work`), where they cost less than the hop to the pool;
3. with `truncate` (Responses' truncation: auto), drops the oldest turns until it fits;
4. resolves max_tokens against the engine's one fit rule (engine.max_request_tokens) --
   the only context-length check outside the engine;
5. compiles the grammar (structured.py) and builds the one ReasoningSpec (reasoning_spec.py)
   that the engine's thinking cap and the grammar's wait both read;
6. resolves the sampling params of every choice (sampling.py: the request, then the model's
   generation_config.json, then the settings) and returns one GenerationInput per choice.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache

from django.conf import settings

from inference.engine.grammar import GrammarSpec
from inference.engine.grammar_state import StructuredOutput

from inference.engine.request import EngineRequest
from inference.http.request_context import in_request_context

from .errors import ApiError
from .logprobs import spelling_for
from .model_names import check_model
from .pipeline import GenerationInput
from .prompts import completion_prompt_ids, render_messages
from .reasoning_spec import reasoning_spec
from .sampling import defaults_for, resolve_max_tokens, sampling_params
from .structured import compile_spec, grammar_spec
from .text_setup import text_setup
from .thinking import Thinking

_pool: ThreadPoolExecutor | None = None


async def cpu_work(fn: Callable, *args):
    """Run `fn(*args)` (parsing a body, templating, tokenizing: CPU work of one request) on the bounded
    prepare pool (METRALE["PREPARE_THREADS"] threads), so the event loop keeps serving streams meanwhile.
    Returns fn's result; raises what fn raises."""
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=settings.METRALE["PREPARE_THREADS"],
                                   thread_name_prefix="metrale-prepare")
    # The request's context goes along: its log lines there name its request id too.
    return await asyncio.get_running_loop().run_in_executor(_pool, in_request_context(fn), *args)


# A request's CPU work this small runs on the event loop itself: a hop to the prepare pool and back costs
# more than the work (~0.3 ms of the loop's and a pool thread's time a hop, at 32 clients of one-text
# embeddings a fifth of the server's CPU).
INLINE_BYTES = 8192


async def light_work(fn: Callable, size: int | None, *args):
    """`fn(*args)` inline when `size` (the bytes of input it works through) is at most INLINE_BYTES, else
    (or when `size` is None: not known) on the prepare pool (cpu_work). Returns fn's result; raises what
    fn raises."""
    if size is not None and size <= INLINE_BYTES:
        return fn(*args)
    return await cpu_work(fn, *args)


@lru_cache(maxsize=4)
def chars_per_token_bound(tokenizer) -> int:
    """The most characters one token of this tokenizer can stand for (the longest vocabulary
    entry's text), times 4 when a normalizer may fold several characters into one. A text with
    more than `tokens * this` characters needs more than `tokens` tokens."""
    spell = spelling_for(tokenizer)
    longest = max(len(spell(i)[1].decode("utf-8", errors="replace")) for i in range(tokenizer.vocab_size))
    return max(1, longest) * (1 if tokenizer.backend.normalizer is None else 4)


@dataclass(slots=True)
class GenerationRequest:
    """One generating request in the pipeline's terms, whatever surface it came from.

    The prompt is `messages` (normalized chat messages, rendered with the chat template) or
    `prompts` (legacy completions: text or token ids, each its own prompt). `param` names the
    wire field that prompt errors point at ("messages", "prompt", "input"). tools are in the
    chat form ({type: function, function: {...}}); tool_choice likewise. `sampling`: the
    validated request dict, whose SamplingParams-named fields (sampling.PASSTHROUGH) are read.
    max_tokens: requested completion tokens (None: the model's default, else `default_max_tokens`,
    else up to the context). structured: the requested output format (spec, param) from
    structured.requested_grammar. timeout_s: the request's own deadline in seconds (capped by
    METRALE["REQUEST_TIMEOUT_S"]). priority: EngineRequest.priority (0 interactive, batch lines above).
    prediction: a Predicted Output's text (serving/prediction.py). prefix_ids: token ids placed before every
    prompt's own (Ollama's generate `context`: an earlier answer's prompt and output). context_limit: the
    request's own context length in tokens (Ollama's num_ctx): prompt + completion within the lower of it and
    the engine's; the model is never reloaded for it. fit_max_tokens: max_tokens is an upper bound, cut to the room
    the context leaves the prompt (Ollama's num_predict) instead of a 400 when it does not fit.
    """

    param: str
    model: str = ""
    messages: list[dict] | None = None
    prompts: list[str | list[int]] | None = None
    suffix: str | None = None
    chat_template_kwargs: dict | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    tools: list[dict] | None = None
    tool_choice: str | dict = "auto"
    parallel_tool_calls: bool = True
    max_tool_calls: int | None = None
    thinking: Thinking = field(default_factory=Thinking)
    truncate: bool = False
    n: int = 1
    max_tokens: int | None = None
    default_max_tokens: int | None = None
    sampling: dict = field(default_factory=dict)
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    stop: list[str] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    structured: tuple[GrammarSpec, str] | None = None
    timeout_s: float | None = None
    priority: int = 0
    # A Predicted Output's text (chat's `prediction`): the engine drafts from its tokens.
    prediction: str | None = None
    # beam_search.BeamSpec: the choices come from one beam search (blocking requests only).
    beam: object = None
    prefix_ids: list[int] = field(default_factory=list)
    context_limit: int | None = None
    fit_max_tokens: bool = False


@dataclass(slots=True)
class Prepared:
    """A request ready for the engine: inputs[j] is choice j, of prompt `prompt_of(j)`.

    prompt_ids[k] / prompt_texts[k]: prompt k's token ids and text (chat and Responses have one:
    the rendered prompt). messages: the chat messages the prompt was rendered from, after any
    truncation.
    """

    model: str
    created: int
    n: int
    prompt_ids: list[list[int]]
    prompt_texts: list[str]
    inputs: list[GenerationInput]
    messages: list[dict] | None = None
    # beam_search.BeamSpec when the choices are a beam search's best beams (None: each choice its own request).
    beam: object = None
    # The system_fingerprint of the model (and adapter) that answers (Runtime.fingerprint_of).
    fingerprint: str | None = None

    def prompt_of(self, choice: int) -> int:
        """The index of the prompt choice `choice` continues."""
        return choice // self.n

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens, each prompt counted once."""
        return sum(len(ids) for ids in self.prompt_ids)

    @property
    def reserve_tokens(self) -> int:
        """Tokens to reserve against the rate limit: every prompt + every choice's max_tokens."""
        return self.prompt_tokens + sum(g.request.params.max_tokens for g in self.inputs)

    @property
    def timeout_s(self) -> float | None:
        """The request's deadline in seconds."""
        return self.inputs[0].request.timeout_s


def _timeout(greq: GenerationRequest) -> float:
    server = settings.METRALE["REQUEST_TIMEOUT_S"]
    return min(greq.timeout_s, server) if greq.timeout_s else server


def _too_many_chars(chars: int, limit_tokens: int, bound: int, param: str) -> ApiError:
    return ApiError(400, f"The prompt is {chars} characters long: more than this model's context of "
                         f"{limit_tokens} tokens can hold ({limit_tokens * bound} characters at most). "
                         "Shorten it.", param=param, code="context_length_exceeded")


def check_prompt_chars(tokenizer, text: str, limit_tokens: int, param: str) -> None:
    """Refuse, before tokenizing, a text with more characters than `limit_tokens` tokens can hold
    (chars_per_token_bound). Raises ApiError 400 context_length_exceeded naming `param`."""
    bound = chars_per_token_bound(tokenizer)
    if len(text) > limit_tokens * bound:
        raise _too_many_chars(len(text), limit_tokens, bound, param)


def _drop_oldest(messages: list[dict]) -> list[dict] | None:
    """The messages without the oldest non-system turn (and the tool results that answered
    it), or None when only the last message is left to drop."""
    first = next((i for i, m in enumerate(messages) if m["role"] != "system"), None)
    if first is None or first == len(messages) - 1:
        return None
    rest = messages[first + 1:]
    while len(rest) > 1 and rest[0]["role"] == "tool":
        rest = rest[1:]
    return messages[:first] + rest


def _render_and_tokenize(rt, greq: GenerationRequest, limit: int, wanted: int) -> tuple[list[dict], str, list[int]]:
    """(messages, prompt text, ids) of a chat-style request, truncated when asked (runs on the pool).

    Raises ApiError 400 (context_length_exceeded) for a prompt too long in characters, and what
    render_messages raises."""
    tok = rt.tokenizer
    bound = chars_per_token_bound(tok)
    messages = greq.messages

    def render(msgs):
        return render_messages(tok, msgs, tools=greq.tools, tool_choice=greq.tool_choice,
                               parallel_tool_calls=greq.parallel_tool_calls, thinking=greq.thinking,
                               chat_template_kwargs=greq.chat_template_kwargs,
                               add_generation_prompt=greq.add_generation_prompt,
                               continue_final_message=greq.continue_final_message, param=greq.param)

    prefix = greq.prefix_ids
    while True:
        text = render(messages)
        if len(text) <= limit * bound:
            ids = [*prefix, *tok.encode(text)]
            if len(ids) + wanted <= limit or not greq.truncate:
                return messages, text, ids
        elif not greq.truncate:
            raise _too_many_chars(len(text), limit, bound, greq.param)
        shorter = _drop_oldest(messages)
        if shorter is None:
            if len(text) > limit * bound:
                raise _too_many_chars(len(text), limit, bound, greq.param)
            return messages, text, [*prefix, *tok.encode(text)]
        messages = shorter


def _completion_prompts(rt, greq: GenerationRequest, limit: int) -> tuple[list[list[int]], list[str]]:
    """Token ids and texts of legacy completions prompts (runs on the pool)."""
    tok = rt.tokenizer
    ids_list, texts = [], []
    for k, prompt in enumerate(greq.prompts):
        param = greq.param if len(greq.prompts) == 1 else f"{greq.param}[{k}]"
        if isinstance(prompt, str):
            check_prompt_chars(tok, prompt, limit, param)
        ids_list.append([*greq.prefix_ids, *completion_prompt_ids(tok, prompt, greq.suffix, tok.vocab_size, param)])
        texts.append(prompt if isinstance(prompt, str) else tok.decode(prompt, skip_special_tokens=False))
    return ids_list, texts


async def prompt_ids(greq: GenerationRequest, rt) -> list[int]:
    """The token ids of the prompt `prepare` would run for a chat-style `greq` (messages set): the
    model name checked, rendered and tokenized on the prepare pool exactly as `prepare` does (no
    truncation), for counting (Anthropic's count_tokens). Raises ApiError as `prepare` does for the
    model name and the template, and 400 for a prompt longer in characters than the context could
    hold."""
    check_model(greq.model, rt.model_id, rt.adapters)
    _, _, ids = await cpu_work(_render_and_tokenize, rt, greq, rt.engine.max_request_tokens, 1)
    return ids


async def completion_ids(greq: GenerationRequest, rt) -> list[list[int]]:
    """The token ids of each prompt `prepare` would run for a legacy completions `greq` (prompts set), on the
    prepare pool. Raises ApiError as `prepare` does for the model name, out-of-vocabulary ids and a prompt
    longer in characters than the context could hold."""
    check_model(greq.model, rt.model_id, rt.adapters)
    ids, _ = await cpu_work(_completion_prompts, rt, greq, rt.engine.max_request_tokens)
    return ids


async def prepare(greq: GenerationRequest, rt, *, request_id: str | None = None, cache_salt: str = "",
                  size: int | None = None) -> Prepared:
    """Everything between a validated request and the engine (steps in the module doc).

    rt: the process runtime (inference.operations.runtime.Runtime). request_id: engine requests are named
    `<request_id>-<choice>`. cache_salt: the tenant's prefix-cache salt. size: the bytes of the body the
    request came in (None: not known); one of at most INLINE_BYTES is templated and tokenized on the
    event loop (light_work), a larger one on the prepare pool.

    Raises ApiError: 404 for an unknown model name; 400 for a template that fails, out-of-vocabulary
    ids, a prompt longer than the context in characters or, with max_tokens, in tokens
    (context_length_exceeded, naming `greq.param` and the numbers), an invalid grammar or schema.
    """
    lora = check_model(greq.model, rt.model_id, rt.adapters, cache_salt)
    if lora is not None:
        rt.adapter_requests[lora] += 1
    limit = rt.engine.max_request_tokens
    if greq.context_limit is not None:
        limit = max(1, min(limit, greq.context_limit))
    tok = rt.tokenizer
    setup = text_setup(rt, greq.tools, greq.tool_choice, greq.parallel_tool_calls, greq.thinking,
                       max_calls=greq.max_tool_calls)
    messages = None
    if greq.messages is not None:
        messages, text, ids = await light_work(_render_and_tokenize, size, rt, greq, limit, greq.max_tokens or 1)
        prompt_ids, prompt_texts = [ids], [text]
    else:
        prompt_ids, prompt_texts = await light_work(_completion_prompts, size, rt, greq, limit)
    defaults = defaults_for(rt.folder)
    default_max = defaults.get("max_tokens", greq.default_max_tokens)
    text_spec = setup.spec(prompt_texts[0]) if greq.messages is not None else None
    found = grammar_spec(greq.structured, text_spec)
    compiled = await compile_spec(tok, *found) if found is not None else None
    timeout_s = _timeout(greq)
    # Past the context's characters a prediction's tail could never be drafted.
    prediction_ids = (await cpu_work(tok.encode, greq.prediction[:limit * chars_per_token_bound(tok)])
                      if greq.prediction else None)
    inputs: list[GenerationInput] = []
    for k, ids in enumerate(prompt_ids):
        param = greq.param if len(prompt_ids) == 1 else f"{greq.param}[{k}]"
        requested = greq.max_tokens
        if requested is not None and greq.fit_max_tokens:
            requested = min(requested, max(1, limit - len(ids)))
        max_tokens = resolve_max_tokens(requested, default_max, len(ids), limit, param=param)
        structured = StructuredOutput(compiled) if compiled is not None else None
        reasoning = (reasoning_spec(tok, setup.reasoning_parser, prompt_texts[k], setup.thinking)
                     if greq.messages is not None else None)
        for i in range(greq.n):
            params = sampling_params(greq.sampling, max_tokens=max_tokens, tokenizer=tok, defaults=defaults,
                                     logprobs=greq.logprobs, prompt_logprobs=greq.prompt_logprobs,
                                     seed_offset=i, reasoning=reasoning, structured=structured)
            j = len(inputs)
            request = EngineRequest(ids, params, f"{request_id}-{j}" if request_id else None, timeout_s, cache_salt,
                                    priority=greq.priority, prediction_token_ids=prediction_ids,
                                    lora_name=lora)
            inputs.append(GenerationInput(request, stop=greq.stop,
                                          include_stop_str_in_output=greq.include_stop_str_in_output,
                                          text=text_spec))
    return Prepared(lora or rt.model_id, int(time.time()), greq.n, prompt_ids, prompt_texts, inputs, messages,
                    beam=greq.beam, fingerprint=rt.fingerprint_of(lora))


__all__ = ["GenerationRequest", "Prepared", "completion_ids", "cpu_work", "light_work", "prepare", "prompt_ids"]
