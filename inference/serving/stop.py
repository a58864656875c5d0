"""Stop strings, held back across chunk boundaries so a stop string is never streamed in part."""
from __future__ import annotations


class StopStringMatcher:
    """Feeds generated text through; cuts at the first stop string, holding back a possible partial match.

    Holds back at most (longest stop string - 1) characters between feeds. Source:
    OpenAI's `stop` ("the returned text will not contain the stop sequence");
    vLLM's include_stop_str_in_output keeps it.
    """

    def __init__(self, stops: list[str], include_stop_str_in_output: bool = False):
        self.stops = [s for s in stops if s]
        self.include = include_stop_str_in_output
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.pending = ""
        self.stopped = False
        self.matched: str | None = None  # the stop string that matched (Anthropic reports it)
        self.emitted = 0  # characters returned so far: where the output was cut once one matched

    def feed(self, text: str) -> tuple[str, bool]:
        """Returns (text safe to emit now, whether a stop string matched)."""
        out, matched = self._feed(text)
        self.emitted += len(out)
        return out, matched

    def _feed(self, text: str) -> tuple[str, bool]:
        if self.stopped:
            return "", True
        if not self.stops:
            return text, False
        buf = self.pending + text
        first: tuple[int, str] | None = None
        for s in self.stops:
            i = buf.find(s)
            if i >= 0 and (first is None or i < first[0]):
                first = (i, s)
        if first is not None:
            self.stopped = True
            self.matched = first[1]
            self.pending = ""
            end = first[0] + (len(first[1]) if self.include else 0)
            return buf[:end], True
        cut = len(buf) - self.hold if self.hold else len(buf)
        cut = max(cut, 0)
        # Keep back only a tail that could still start a stop string.
        while cut < len(buf) and not any(s.startswith(buf[cut:]) for s in self.stops):
            cut += 1
        self.pending = buf[cut:]
        return buf[:cut], False

    def flush(self) -> str:
        """At the end of generation: the held-back text (it never became a stop string)."""
        out, self.pending = self.pending, ""
        out = "" if self.stopped else out
        self.emitted += len(out)
        return out
