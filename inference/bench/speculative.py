"""Speculative decoding's workloads: editing a code file with the file as the prediction, summarising the prompt
(prompt lookup), plain chat; each run with speculation on and off, interleaved, in one process."""
from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass

from inference.engine.outputs import TokenEvent
from inference.engine.request import EngineRequest
from inference.engine.sampling_params import SamplingParams

from .offline import chat_prompt_ids
from .workload import make_text

# A ~300-token Python file of plain functions (a file a small model can copy: it repeats it mostly verbatim).
CODE_FILE = '''import math


def area_of_circle(radius):
    """The area of a circle of this radius."""
    return math.pi * radius * radius


def area_of_square(side):
    """The area of a square with this side."""
    return side * side


def area_of_rectangle(width, height):
    """The area of a rectangle."""
    return width * height


def perimeter_of_square(side):
    """The perimeter of a square."""
    return 4 * side


def perimeter_of_rectangle(width, height):
    """The perimeter of a rectangle."""
    return 2 * (width + height)


def average(values):
    """The mean of a list of numbers."""
    if not values:
        return 0.0
    return sum(values) / len(values)


def largest(values):
    """The largest of a list of numbers."""
    best = values[0]
    for value in values:
        if value > best:
            best = value
    return best


def count_words(text):
    """How many words a text has."""
    return len(text.split())
'''


@dataclass(slots=True)
class Workload:
    """Prompts (token ids), each with its prediction's token ids (or None), and the tokens to generate."""

    name: str
    prompts: list[list[int]]
    predictions: list[list[int] | None]
    max_tokens: int


def code_snippet(tokenizer, n_tokens: int = 300) -> str:
    """About n_tokens tokens of CODE_FILE (all of it at 300), cut at a line end."""
    out = []
    for line in CODE_FILE.splitlines(keepends=True):
        out.append(line)
        if len(tokenizer.encode("".join(out))) >= n_tokens:
            break
    return "".join(out)


def editing(tokenizer, n: int) -> Workload:
    """"Repeat this file": the file (in a fence) is the prediction (a 135M model asked for an edit as well
    rewrites the whole file; asked to repeat it, it mostly copies, with departures of its own)."""
    code = code_snippet(tokenizer)
    ask = "Repeat this code exactly, changing nothing. Output only the code.\n```python\n" + code + "```"
    prediction = tokenizer.encode("```python\n" + code + "```")
    prompt = chat_prompt_ids(tokenizer, ask)
    return Workload("editing", [prompt] * n, [prediction] * n, 320)


def editing_one_line(tokenizer, n: int, engine) -> Workload:
    """The editing request with, as its prediction, the model's own greedy answer to it with one line
    in the middle changed: the case Predicted Outputs is for (the client knows the text but for an
    edit). A 135M model asked to repeat a file rewrites parts of it (`editing` measures that); a
    model that copies it gives this one. engine: an LLMEngine (its answer computed once, greedily)."""
    work = editing(tokenizer, 1)
    answer = run(engine, Workload("answer", work.prompts, [None], work.max_tokens)).outputs[0]
    lines = tokenizer.decode(answer).split("\n")
    middle = len(lines) // 2
    lines[middle] = lines[middle] + "  # edited"
    prediction = tokenizer.encode("\n".join(lines))
    return Workload("edit 1 line", work.prompts * n, [prediction] * n, work.max_tokens)


def summarise(tokenizer, n: int) -> Workload:
    """"Summarise this text, quoting it": drafts come from prompt lookup alone."""
    rng = random.Random(7)
    prompts = []
    for _ in range(n):
        text = code_snippet(tokenizer, 200) + "\n" + make_text(tokenizer, 100, rng)
        prompts.append(chat_prompt_ids(tokenizer, "Summarise the following, quoting its key lines verbatim:\n\n"
                                       + text))
    return Workload("summarise", prompts, [None] * n, 160)


def plain_chat(tokenizer, n: int) -> Workload:
    """Chat without repeated text: speculation in auto must not cost it."""
    rng = random.Random(11)
    prompts = [chat_prompt_ids(tokenizer, "Write a short story about " + make_text(tokenizer, 40, rng))
               for _ in range(n)]
    return Workload("plain chat", prompts, [None] * n, 128)


@dataclass(slots=True)
class Run:
    """One run of a workload: output tokens, wall seconds, drafted and accepted tokens, and each output."""

    tokens: int
    wall_s: float
    drafted: int
    accepted: int
    outputs: list[list[int]]

    @property
    def tok_s(self) -> float:
        return self.tokens / self.wall_s


def run(engine, work: Workload) -> Run:
    """Every prompt of `work` at once (greedy), stepped to the end on `engine` (an LLMEngine)."""
    sp = engine.speculator
    drafted, accepted = sp.num_drafted_tokens, sp.num_accepted_tokens
    params = SamplingParams(temperature=0, max_tokens=work.max_tokens)
    seqs = [engine.add_request(EngineRequest(p, params, prediction_token_ids=pred))
            for p, pred in zip(work.prompts, work.predictions)]
    outputs: dict[int, list[int]] = {id(s): [] for s in seqs}
    t0 = time.perf_counter()
    while engine.has_work():
        for seq, events in engine.step():
            outputs[id(seq)].extend(e.token_id for e in events if isinstance(e, TokenEvent))
    wall = time.perf_counter() - t0
    outs = [outputs[id(s)] for s in seqs]
    return Run(sum(map(len, outs)), wall, sp.num_drafted_tokens - drafted, sp.num_accepted_tokens - accepted, outs)


def compare(engines: dict[str, object], work: Workload, repeats: int) -> dict[str, list[Run]]:
    """`repeats` runs of `work` on each engine (mode -> LLMEngine), interleaved (A B A B ...) so machine noise
    falls on both alike. Raises AssertionError when two modes' outputs differ (speculation must not change them)."""
    runs: dict[str, list[Run]] = {mode: [] for mode in engines}
    for _ in range(repeats):
        for mode, engine in engines.items():
            runs[mode].append(run(engine, work))
    first = [r.outputs for r in next(iter(runs.values()))]
    for mode, rs in runs.items():
        assert [r.outputs for r in rs] == first, f"{work.name}: outputs differ in mode {mode}"
    return runs


def median_tok_s(runs: list[Run]) -> float:
    return statistics.median(r.tok_s for r in runs)
