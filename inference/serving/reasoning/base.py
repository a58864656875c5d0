"""TagReasoningParser: splits streamed text into reasoning and content at a start and an end tag.

Source: the original server's behaviour doc, section 4, "Reasoning parsers":
one `<think>...</think>` implementation for the prompt-opened case and the
model-opened case; `<think>\\n\\n</think>` from the template is a no-op, not a
block; several blocks are concatenated; a start tag after the answer began
returns the stream to reasoning. vLLM's reasoning parsers split the same way.

Shaping (our choices, applied identically however the text is split):
- each block's leading and trailing whitespace is dropped, so a block of only
  whitespace emits nothing; later blocks are joined to earlier ones by "\\n\\n";
- whitespace at the start of the content that follows a block is dropped;
- a start tag at the very beginning of a block (only whitespace before it) is
  redundant and dropped: models often re-emit `<think>` that the prompt opened;
- an end tag outside reasoning is leftover markup and is dropped;
- in content, tags count only while `tags_in_content()` says so: the text
  pipeline answers False inside a tool call, so a call argument that
  contains `<think>` (a file being written) stays the call's text;
- at `finish()`, a partial tag still held back is ordinary text.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from ..deltas import Content, Reasoning, StreamDelta
from ..markers import next_marker


class TagReasoningParser:
    """Per-request streaming reasoning parser; subclasses set the tags.

    started_in_reasoning: the chat template already opened the block in the
    prompt (for example a prompt ending in `<think>\\n`), so the model's first
    text is reasoning until the end tag. tags_in_content: asked, once the
    content before a tag has been emitted, whether tags in content count now
    (default: always).

    `feed` / `finish` return the deltas; `feed_into` / `finish_into` hand each
    delta to `emit` as soon as it is made, which is what lets
    `tags_in_content` see the content that precedes the tag.
    """

    name: ClassVar[str] = ""
    start_tag: ClassVar[str] = ""
    end_tag: ClassVar[str] = ""
    # Markers that end reasoning and stay in the text for the tool parser (glm47: `<tool_call>`).
    closing_openers: ClassVar[tuple[str, ...]] = ()

    def __init__(self, started_in_reasoning: bool = False,
                 tags_in_content: Callable[[], bool] | None = None):
        self._tags_in_content = tags_in_content
        self._buf = ""
        self._in_reasoning = started_in_reasoning
        self._block_has_text = False   # the current block emitted non-whitespace text
        self._trailing_ws = ""         # whitespace at the end of the block so far, not yet emitted
        self._any_reasoning = False    # some block emitted text (the next one is joined by "\n\n")
        self._trim_content = False     # drop whitespace at the start of content after a block

    @property
    def in_reasoning(self) -> bool:
        """True while the text being generated is reasoning (after all text fed so far)."""
        return self._in_reasoning

    def feed(self, text: str) -> list[StreamDelta]:
        """Reasoning and Content deltas for text that is certain now; a possible tag is held."""
        out: list[StreamDelta] = []
        self.feed_into(text, out.append)
        return out

    def finish(self) -> list[StreamDelta]:
        """Everything still held, at the end of generation; an unclosed block stays reasoning."""
        out: list[StreamDelta] = []
        self.finish_into(out.append)
        return out

    def feed_into(self, text: str, emit: Callable[[StreamDelta], None]) -> None:
        """`feed`, handing each delta to emit as it is made."""
        self._buf += text
        self._drain(False, emit)

    def finish_into(self, emit: Callable[[StreamDelta], None]) -> None:
        """`finish`, handing each delta to emit as it is made."""
        self._drain(True, emit)
        self._end_block()

    def _drain(self, final: bool, emit: Callable[[StreamDelta], None]) -> None:
        while self._buf:
            buf = self._buf
            if self._in_reasoning:
                markers = (self.end_tag, self.start_tag) + self.closing_openers
                j, tag = next_marker(buf, markers, final=final)
                self._reasoning_text(buf[:j], emit)
                if tag is None:
                    self._buf = buf[j:]
                    break
                if tag == self.start_tag:
                    self._buf = buf[j + len(tag):]
                    if self._block_has_text:   # not at the block's start: ordinary text
                        self._reasoning_text(tag, emit)
                    continue
                self._end_block()
                self._in_reasoning = False
                if tag == self.end_tag:
                    self._buf = buf[j + len(tag):]
                    self._trim_content = True
                else:
                    self._buf = buf[j:]
            else:
                j, tag = next_marker(buf, (self.start_tag, self.end_tag), final=final)
                self._content_text(buf[:j], emit)
                if tag is None:
                    self._buf = buf[j:]
                    break
                self._buf = buf[j + len(tag):]
                if self._tags_in_content is not None and not self._tags_in_content():
                    self._content_text(tag, emit)
                elif tag == self.start_tag:
                    self._in_reasoning = True

    def _reasoning_text(self, text: str, emit: Callable[[StreamDelta], None]) -> None:
        if not text:
            return
        if not self._block_has_text:
            text = text.lstrip()
            if not text:
                return
            self._block_has_text = True
            if self._any_reasoning:
                text = "\n\n" + text
        text = self._trailing_ws + text
        body = text.rstrip()
        self._trailing_ws = text[len(body):]
        if body:
            emit(Reasoning(body))
            self._any_reasoning = True

    def _content_text(self, text: str, emit: Callable[[StreamDelta], None]) -> None:
        if self._trim_content:
            text = text.lstrip()
            if text:
                self._trim_content = False
        if text:
            emit(Content(text))

    def _end_block(self) -> None:
        self._block_has_text = False
        self._trailing_ws = ""
