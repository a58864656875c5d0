"""TextPipeline: generated text -> StreamDeltas via the reasoning parser, tool parser and sanitizer.

The pure-text half of `pipeline.py` (which owns engine events, detokenizing
and stop strings and calls this with each piece of decoded text). Order, from
the original server's behaviour doc, section 4: text before the end of
reasoning is never parsed for calls; the tool parser sees only content; the
sanitizer sees only what the tool parser passed on as content, and is flushed
before every tool call so content keeps its place before the call.

Not here: Refusal (no refusal-phrase detection), logprobs on Content (the
caller attaches them), the suppress-streak and in-think tool-leak guards, the
glm47 keep-alive.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .deltas import Content, Reasoning, StreamDelta, ToolCallStart
from .reasoning import make_reasoning_parser
from .sanitizer import ContentSanitizer
from .tool_parsers import DEFAULT_MAX_CALLS, make_tool_parser


@dataclass(slots=True)
class TextSpec:
    """How one request's generated text is parsed: TextPipeline's arguments (see there)."""

    reasoning_parser: str | None = None
    tool_parser: str | None = None
    tools: list[dict] | None = None
    tool_choice: str | dict | None = "auto"
    parallel_tool_calls: bool = True
    max_calls: int = DEFAULT_MAX_CALLS
    started_in_reasoning: bool = False
    stream_arguments: bool = False

    @property
    def active(self) -> bool:
        """Whether any stage parses (else text is content as generated)."""
        return bool(self.reasoning_parser or self.tool_parser)

    def pipeline(self, id_factory: Callable[[], str] | None = None) -> TextPipeline:
        """A new TextPipeline for one choice."""
        return TextPipeline(self.reasoning_parser, self.tool_parser, self.tools, self.tool_choice,
                            self.parallel_tool_calls, self.max_calls, self.started_in_reasoning,
                            id_factory, self.stream_arguments)


class TextPipeline:
    """Per-request streaming text parser; construct one per choice.

    reasoning_parser / tool_parser: registry names or None (then that stage
    passes text through). tools, tool_choice, parallel_tool_calls: the
    request's fields. max_calls: calls per response before `should_stop`.
    started_in_reasoning: the prompt opened the reasoning block (see
    reasoning.prompt_opens_reasoning). id_factory: tool call ids (tests).
    stream_arguments: tool-call arguments sent as they are generated (every served
    request, streamed or not; tool_parsers/base.py), else each call whole when it closes.
    Raises ValueError for an unknown parser name.
    """

    def __init__(self, reasoning_parser: str | None = None, tool_parser: str | None = None,
                 tools: list[dict] | None = None, tool_choice: str | dict | None = "auto",
                 parallel_tool_calls: bool = True, max_calls: int = DEFAULT_MAX_CALLS,
                 started_in_reasoning: bool = False, id_factory: Callable[[], str] | None = None,
                 stream_arguments: bool = False):
        self.tool_parser = (make_tool_parser(tool_parser, tools, tool_choice=tool_choice,
                                             parallel_tool_calls=parallel_tool_calls,
                                             max_calls=max_calls, id_factory=id_factory,
                                             stream_arguments=stream_arguments)
                            if tool_parser else None)
        # Reasoning tags inside a tool call are the call's text (a file that mentions <think>).
        outside_calls = (lambda: not self.tool_parser.in_call) if self.tool_parser else None
        self.reasoning = (make_reasoning_parser(reasoning_parser, started_in_reasoning,
                                                tags_in_content=outside_calls)
                          if reasoning_parser else None)
        self.sanitizer = ContentSanitizer(
            self.tool_parser.leak_markers if self.tool_parser else None)
        self.reasoning_tokens = 0

    @property
    def in_reasoning(self) -> bool:
        """True while generation is inside a reasoning block."""
        return self.reasoning is not None and self.reasoning.in_reasoning

    @property
    def should_stop(self) -> bool:
        """True once the response should end (the tool-call limit was passed)."""
        return self.tool_parser is not None and self.tool_parser.should_stop

    @property
    def tool_calls(self) -> list[dict]:
        """Delivered calls so far: {"id", "name", "arguments" (a JSON object string)}."""
        return self.tool_parser.calls if self.tool_parser else []

    @property
    def tool_call_cut_off(self) -> bool:
        """True when generation ended inside a call region (its finish reason is then the engine's,
        not tool_calls)."""
        return self.tool_parser is not None and self.tool_parser.cut_off

    @property
    def rejected_tool_calls(self) -> list[dict]:
        """Tool markup that was not delivered, as {"name", "reason"} (for logs and metrics)."""
        return self.tool_parser.rejected if self.tool_parser else []

    def feed(self, text: str, n_tokens: int = 1) -> list[StreamDelta]:
        """Deltas for newly generated text; n_tokens: how many tokens produced it.

        Those tokens count as reasoning tokens when generation was in reasoning
        before or after them (so the tokens of the tags count as reasoning).
        """
        was_reasoning = self.in_reasoning
        out: list[StreamDelta] = []
        if self.reasoning:
            self.reasoning.feed_into(text, lambda delta: self._route(delta, out))
        elif text:
            self._route(Content(text), out)
        if was_reasoning or self.in_reasoning:
            self.reasoning_tokens += n_tokens
        return out

    def finish(self) -> list[StreamDelta]:
        """Deltas for everything held back, at the end of generation; call once."""
        out: list[StreamDelta] = []
        if self.reasoning:
            self.reasoning.finish_into(lambda delta: self._route(delta, out))
        if self.tool_parser:
            self._sanitize(self.tool_parser.finish(), out)
        tail = self.sanitizer.flush()
        if tail:
            out.append(Content(tail))
        return out

    def _route(self, delta: StreamDelta, out: list[StreamDelta]) -> None:
        """Pass one reasoning-parser delta on: content goes through the tool parser and sanitizer."""
        if isinstance(delta, Reasoning):
            out.append(delta)
        elif self.tool_parser:
            self._sanitize(self.tool_parser.feed(delta.text), out)
        else:
            self._sanitize([delta], out)

    def _sanitize(self, deltas: list[StreamDelta], out: list[StreamDelta]) -> None:
        for delta in deltas:
            if isinstance(delta, Content):
                text = self.sanitizer.feed(delta.text)
                if text:
                    out.append(Content(text))
                continue
            if isinstance(delta, ToolCallStart):
                held = self.sanitizer.flush()
                if held:
                    out.append(Content(held))
            out.append(delta)
