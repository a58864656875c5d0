"""The streaming content sanitizer: removes stray tool-call markup (leak markers) from content text.

Source: the original server's behaviour doc, section 4, "Leak markers and the
sanitizer". Each tool parser declares its `LeakMarkers`; the sanitizer sees only
the text that the tool parser passed on as content (calls are already taken
out), so what it removes is markup outside any call: an orphan `<arg_key>`, a
lone `</tool_call>`, a hallucinated `<tool_response>` block.

- Outside an envelope, an `orphan_open` marker starts suppression, which drops
  everything up to and including the next `close` marker; a stray `close`
  marker is dropped.
- `envelope_open` passes through and enters envelope mode, where orphan and
  close markers are payload; `envelope_close` leaves it.
- Only the longest suffix that could still become a marker is held back.
- `flush()` (at the end, and before every tool-call event): a suppressed tail
  is dropped and suppression ends; a held fragment of two or more characters
  (a partial tag such as `</arg_`) is dropped, a lone `<` or `[` is kept.
"""
from __future__ import annotations

from dataclasses import dataclass

from .markers import next_marker


@dataclass(frozen=True, slots=True)
class LeakMarkers:
    """The markup a tool-call format may leak into content; all empty: text passes unchanged."""

    orphan_open: tuple[str, ...] = ()
    close: tuple[str, ...] = ()
    envelope_open: tuple[str, ...] = ()
    envelope_close: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.orphan_open or self.close or self.envelope_open or self.envelope_close)


class ContentSanitizer:
    """Per-request streaming filter over content; `feed` and `flush` return the text to send."""

    def __init__(self, markers: LeakMarkers | None = None):
        self.markers = markers or LeakMarkers()
        m = self.markers
        # Outside an envelope a stray envelope_close is just another stray close.
        self._outside = tuple(dict.fromkeys(m.orphan_open + m.close + m.envelope_close
                                            + m.envelope_open))
        self._buf = ""
        self._suppressing = False
        self._in_envelope = False

    def feed(self, text: str) -> str:
        """Sanitized text that is certain now; a possible marker prefix is held back."""
        if self.markers.empty:
            return text
        self._buf += text
        return self._drain()

    def flush(self) -> str:
        """Release what is held: a suppressed tail and partial tags are dropped (see module doc)."""
        if self.markers.empty:
            return ""
        out = self._drain()
        held, self._buf = self._buf, ""
        if self._suppressing:
            self._suppressing = False
            return out
        if len(held) == 1:
            out += held
        return out

    def _drain(self) -> str:
        m = self.markers
        out: list[str] = []
        while self._buf:
            buf = self._buf
            if self._suppressing:
                j, found = next_marker(buf, m.close)
                if found is None:
                    self._buf = buf[j:]
                    break
                self._buf = buf[j + len(found):]
                self._suppressing = False
            elif self._in_envelope:
                j, found = next_marker(buf, m.envelope_close)
                out.append(buf[:j])
                self._buf = buf[j:] if found is None else buf[j + len(found):]
                if found is None:
                    break
                out.append(found)
                self._in_envelope = False
            else:
                j, found = next_marker(buf, self._outside)
                out.append(buf[:j])
                self._buf = buf[j:] if found is None else buf[j + len(found):]
                if found is None:
                    break
                if found in m.orphan_open:
                    self._suppressing = True
                elif found in m.envelope_open:
                    out.append(found)
                    self._in_envelope = True
        return "".join(out)
