"""Speculative decoding without a draft model: drafts from prompt lookup (n-grams) or a Predicted Output, and the gate.

A sequence that speculates proposes up to `num_draft_tokens` tokens after its last one;
the scheduler adds them to its decode item (`ScheduledBatch.drafts`), the model runner
computes every drafted position as a decode row of its own context length, and
`verify.py` accepts drafts by sample-and-compare, so the output is token for token
what decoding without drafts gives.

Drafts come from (1) a request's `prediction` (OpenAI's Predicted Outputs): the
prediction's tokens after the place that matches the output's last tokens, found again
after a rejection (llama.cpp's lookup decoding, PR #12127); or (2) prompt lookup (vLLM's
n-gram proposer, Saxena 2023): the last n tokens (n from ngram_max down to ngram_min)
found earlier in the prompt or the output, and what followed them. A request with a
prediction that has nothing to offer (used up, or the output's last token is not in it)
drafts by prompt lookup; only drafts taken from the prediction count as its accepted and
rejected prediction tokens.

The gate (`SpeculativeConfig.mode`): "off" never drafts; "on" drafts whenever a draft
exists; "auto" drafts while the batch has at most `max_batch` decodes and a drafted token
raises the step's tokens per second: the engine fits its decode steps' time as a fixed
cost plus a cost per computed row (`StepCost`), and a sequence drafts only while its
recent acceptance (accepted / drafted tokens) exceeds the share of a token's time that
one more row costs at this step's size (`StepCost.threshold`). Per sequence, the draft
length doubles after a fully accepted draft; after a rejection a prompt-lookup draft falls to
what was accepted plus one, a prediction's keeps its length; and a sequence whose recent acceptance falls below `min_acceptance` pauses
drafting for a number of steps that doubles each time.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

MODES = ("auto", "on", "off")


@dataclass(slots=True)
class SpeculativeConfig:
    """The speculation knobs, as EngineConfig.speculative_config() gives them (their defaults live there).
    Raises ValueError on a bad value."""

    mode: str
    num_draft_tokens: int
    ngram_max: int
    ngram_min: int
    max_batch: int
    min_acceptance: float

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"speculative mode must be auto, on or off, got {self.mode!r}")
        if self.num_draft_tokens < 1 or not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError("speculative draft tokens >= 1 and 1 <= ngram_min <= ngram_max are required")
        if self.max_batch < 1 or not 0 <= self.min_acceptance <= 1:
            raise ValueError("speculative max_batch must be >= 1 and min_acceptance in [0, 1]")


class StepCost:
    """A running fit of a decode step's wall time as `fixed_s + row_s * rows` (seconds; rows: the
    positions the step computed, decodes and their drafts).

    Exponentially weighted least squares (each observation's weight decays by `decay` per
    later one, about 1 / (1 - decay) steps of memory). The fit is refreshed only while the
    remembered steps differ enough in rows (variance at least `min_var` rows²) for a slope to
    mean anything; otherwise the last fit holds. Before the first fit, `prior_row_share`
    (row_s / fixed_s) stands in. Both terms are kept at or above 0, and a row at or below
    `max_row_share` of the fixed part (a row reads no weights: the fixed part, the weights'
    read, bounds it; a fit above that is a warm-up or a noisy stretch). A fit that has not been
    refreshed for `stale_after` steps (no steps of different sizes: nobody drafted) is dropped
    for the prior, so the gate drafts again and measures anew instead of holding a fit that
    made it stop.
    """

    __slots__ = ("decay", "min_var", "prior_row_share", "max_row_share", "stale_after", "since_fit",
                 "w", "sx", "sy", "sxx", "sxy", "fixed_s", "row_s", "fitted")

    def __init__(self, decay: float = 0.95, min_var: float = 1.0, prior_row_share: float = 1 / 16,
                 max_row_share: float = 1.0, stale_after: int = 256):
        self.decay, self.min_var = decay, min_var
        self.prior_row_share, self.max_row_share, self.stale_after = prior_row_share, max_row_share, stale_after
        self._reset()

    def _reset(self) -> None:
        self.w = self.sx = self.sy = self.sxx = self.sxy = 0.0
        self.fixed_s, self.row_s = 1.0, self.prior_row_share  # only their ratio is used before a fit
        self.fitted = False
        self.since_fit = 0

    def observe(self, rows: int, seconds: float) -> None:
        """Fold in one step that computed `rows` positions in `seconds`."""
        self.since_fit += 1
        if self.fitted and self.since_fit > self.stale_after:
            self._reset()
        d = self.decay
        self.w = self.w * d + 1.0
        self.sx = self.sx * d + rows
        self.sy = self.sy * d + seconds
        self.sxx = self.sxx * d + rows * rows
        self.sxy = self.sxy * d + rows * seconds
        mx, my = self.sx / self.w, self.sy / self.w
        var = self.sxx / self.w - mx * mx
        if self.w < 2.0 or var < self.min_var:
            return
        slope = max(0.0, (self.sxy / self.w - mx * my) / var)
        fixed = max(0.0, my - slope * mx)
        if slope > self.max_row_share * fixed:  # keep the mean step time, bound the row's share
            fixed = my / (1.0 + self.max_row_share * mx)
            slope = self.max_row_share * fixed
        self.fixed_s, self.row_s = fixed, slope
        self.fitted = True
        self.since_fit = 0

    def threshold(self, tokens: float, rows: int) -> float:
        """The acceptance a draft token needs for one more row to raise tokens per second.

        A step of `rows` rows yielding `tokens` tokens runs at tokens / (fixed + row * rows);
        a draft row that is accepted with probability p adds p tokens and one row's time, which
        pays when p > row * tokens / (fixed + row * rows). 0 when rows cost nothing.
        """
        step = self.fixed_s + self.row_s * rows
        return self.row_s * tokens / step if step > 0 else 1.0


class NgramIndex:
    """n-gram -> where its latest earlier occurrence's continuation starts, over a growing token list.

    For each n in [ngram_min, ngram_max], every n-gram that ends before the list's last token
    is indexed once (positions only grow), so a lookup costs O(ngram_max) dictionary probes,
    never a scan of the whole context.
    """

    __slots__ = ("sizes", "maps", "indexed")

    def __init__(self, ngram_min: int, ngram_max: int):
        self.sizes = range(ngram_max, ngram_min - 1, -1)
        self.maps: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self.sizes}
        self.indexed = 0  # n-grams ending before this position are in the maps

    def propose(self, tokens: list[int], k: int) -> list[int]:
        """Up to k tokens that followed the longest earlier match of the list's last n tokens ([] when none)."""
        end = len(tokens) - 1  # index n-grams ending at positions < end (the suffix itself is not a match)
        for e in range(self.indexed, end):
            for n in self.sizes:
                if e + 1 >= n:
                    self.maps[n][tuple(tokens[e + 1 - n:e + 1])] = e + 1
        self.indexed = max(self.indexed, end)
        for n in self.sizes:
            if len(tokens) < n + 1:
                continue
            start = self.maps[n].get(tuple(tokens[-n:]))
            if start is not None:
                return tokens[start:start + k]
        return []


class PredictionDraft:
    """A Predicted Output's token ids and where the output is in them.

    `pointer`: the prediction index expected to follow the output's last token. When the
    prediction's token before it is not that last token (a rejection, or an edit), the
    output is aligned again: among the prediction positions holding the last token, the one
    whose preceding tokens match the output's longest, nearest after the pointer on ties.
    """

    __slots__ = ("tokens", "pointer", "where")
    MATCH = 16  # output tokens compared when aligning

    def __init__(self, tokens: list[int]):
        self.tokens = list(tokens)
        self.pointer = 0
        self.where: dict[int, list[int]] = {}
        for i, t in enumerate(self.tokens):
            self.where.setdefault(t, []).append(i)

    def align(self, output: list[int]) -> int | None:
        """The prediction index of the next token after `output`, or None when its last token is not in it."""
        if not output:
            return 0
        last = output[-1]
        p = self.pointer
        if 0 < p <= len(self.tokens) and self.tokens[p - 1] == last:
            return p
        best, best_key = None, None
        for c in self.where.get(last, ()):
            n = 1
            while n < self.MATCH and n < len(output) and c - n >= 0 and self.tokens[c - n] == output[-1 - n]:
                n += 1
            key = (n, c + 1 >= p, -abs(c + 1 - p))
            if best_key is None or key > best_key:
                best, best_key = c + 1, key
        return best

    def propose(self, output: list[int], k: int) -> tuple[int | None, list[int]]:
        """(aligned index, up to k prediction tokens from it)."""
        at = self.align(output)
        return at, ([] if at is None else self.tokens[at:at + k])


class SpecState:
    """One sequence's speculation: its drafters, its adaptive draft length and pause, and its counts.

    drafted / accepted: all draft tokens proposed and accepted. A request with a prediction
    drafts from it while it has a draft to offer, else by prompt lookup (`from_prediction`
    says which the last proposal used). accepted_prediction / rejected_prediction count
    prediction tokens (usage's accepted_prediction_tokens and rejected_prediction_tokens,
    OpenAI's prediction tokens that were and were not in the completion): each prediction
    position once, at the first verify that drafts it, as accepted or rejected, so their sum
    never exceeds the prediction's length however often the output realigns on it. Drafts
    from prompt lookup count in neither. `step_prediction`: the last verify's share of them,
    (for each accepted draft token whether it newly counts, the newly rejected count), or None.
    """

    __slots__ = ("prediction", "ngrams", "window", "pause", "backoff", "recent", "drafted", "accepted",
                 "accepted_prediction", "rejected_prediction", "from_prediction", "step_prediction", "_at",
                 "_counted")

    def __init__(self, cfg: SpeculativeConfig, prediction: list[int] | None):
        self.prediction = PredictionDraft(prediction) if prediction else None
        self.ngrams = NgramIndex(cfg.ngram_min, cfg.ngram_max)
        self.window = 1 if prediction is None else 2
        self.pause = 0
        self.backoff = 1
        self.recent = 1.0  # exponential average of accepted / drafted per verify
        self.drafted = 0
        self.accepted = 0
        self.accepted_prediction = 0
        self.rejected_prediction = 0
        self.from_prediction = False
        self.step_prediction: tuple[list[bool], int] | None = None
        self._at: int | None = None
        self._counted = bytearray(len(prediction or ()))  # prediction positions already counted

    def propose(self, tokens: list[int], num_prompt: int, k: int) -> list[int]:
        """Up to k draft tokens to follow `tokens` (prompt + output ids): the prediction's, else prompt lookup's."""
        self._at, draft = self.prediction.propose(tokens[num_prompt:], k) if self.prediction else (None, [])
        self.from_prediction = bool(draft)
        return draft or self.ngrams.propose(tokens, k)

    def record(self, cfg: SpeculativeConfig, num_drafted: int, num_accepted: int) -> None:
        """Fold in one verify of the last proposal: counts, the prediction's pointer, the window and the pause."""
        self.drafted += num_drafted
        self.accepted += num_accepted
        self.step_prediction = None
        if self.from_prediction:
            at, counted = self._at, self._counted
            fresh = [not counted[at + j] for j in range(num_drafted)]
            counted[at:at + num_drafted] = b"\x01" * num_drafted
            self.step_prediction = (fresh[:num_accepted], sum(fresh[num_accepted:]))
            self.accepted_prediction += sum(fresh[:num_accepted])
            self.rejected_prediction += self.step_prediction[1]
            self.prediction.pointer = at + num_accepted + 1
        if num_accepted == num_drafted:
            self.window = min(cfg.num_draft_tokens, self.window * 2)
        elif not self.from_prediction:
            self.window = max(1, num_accepted + 1)
        # A prediction's rejection keeps the window: the output departs from it locally (an edit) and
        # realigns, and what follows the realignment is as likely to match as what came before; a
        # rejected n-gram continuation says the lookup itself was wrong.
        self.recent = 0.7 * self.recent + 0.3 * (num_accepted / num_drafted)
        if cfg.mode == "auto" and self.recent < cfg.min_acceptance:
            self.pause, self.backoff = self.backoff, min(self.backoff * 2, 64)
            self.recent = cfg.min_acceptance  # retried at the threshold after the pause
        elif num_accepted:
            self.backoff = 1


class Speculator:
    """Plans the drafts of one step's decodes (called by Scheduler.schedule) and keeps the engine's counters.

    exact: whether the model runner computes each decode row independently of the others (the
    compiled decode layers); drafts are never planned otherwise, since only then is a verify
    row bitwise the decode row it stands for. clock: the seconds source of the step timings
    `StepCost` fits (time.perf_counter; tests script it). The engine brackets each step with
    `start_step()` and, for a step of decodes only (their drafts included), `end_step(rows)`.
    """

    def __init__(self, cfg: SpeculativeConfig, exact: bool, clock=time.perf_counter):
        self.cfg = cfg
        self.enabled = exact and cfg.mode != "off"
        self.num_drafted_tokens = 0
        self.num_accepted_tokens = 0
        self.num_verifies = 0
        # Called with (drafted, accepted) after each verify (LLMEngine: stats.EngineStats.record_spec_decode).
        self.observe = None
        self.clock = clock
        self.cost = StepCost()
        self._started: float | None = None
        # The step being planned: its rows so far and the tokens they are expected to yield.
        self._rows = 0
        self._tokens = 0.0

    def state_for(self, prediction: list[int] | None) -> SpecState | None:
        """A new sequence's SpecState (None when speculation is off for this engine)."""
        return SpecState(self.cfg, prediction) if self.enabled else None

    def start_step(self) -> None:
        """Mark a step's start (before its schedule: drafting's own time is part of the step's)."""
        self._started = self.clock()

    def end_step(self, rows: int) -> None:
        """The step started last computed `rows` positions (decodes and drafts, no prompt chunk): fold its
        time into the cost fit."""
        if self._started is not None:
            self.cost.observe(rows, self.clock() - self._started)
            self._started = None

    def begin_plan(self, num_decodes: int) -> None:
        """Start planning a step of `num_decodes` decodes (each a row and a token before any draft)."""
        self._rows = num_decodes
        self._tokens = float(num_decodes)

    def plan(self, seq, num_decodes: int, budget: int, max_model_len: int | None) -> list[int]:
        """The draft tokens of decode `seq` this step (may be []), within `budget` tokens and its limits.
        In auto, only while its recent acceptance beats StepCost.threshold at the rows planned so far."""
        state = seq.spec
        cfg = self.cfg
        if state is None or budget <= 0:
            return []
        auto = cfg.mode == "auto"
        if auto and num_decodes > cfg.max_batch:
            return []
        if state.pause > 0:
            state.pause -= 1
            return []
        if auto and state.recent <= self.cost.threshold(self._tokens, self._rows):
            return []
        k = min(cfg.num_draft_tokens if not auto else state.window, budget,
                seq.params.max_tokens - seq.num_output_tokens - 1)
        if max_model_len is not None:
            k = min(k, max_model_len - len(seq.token_ids))
        if k <= 0:
            return []
        draft = state.propose(seq.token_ids, seq.num_prompt_tokens, k)
        self._rows += len(draft)
        self._tokens += state.recent * len(draft)
        return draft

    def record(self, seq, num_drafted: int, num_accepted: int) -> None:
        """Count one verify of `seq` (engine totals and its own state)."""
        self.num_drafted_tokens += num_drafted
        self.num_accepted_tokens += num_accepted
        self.num_verifies += 1
        seq.spec.record(self.cfg, num_drafted, num_accepted)
        if self.observe is not None:
            self.observe(num_drafted, num_accepted)
