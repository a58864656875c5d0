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
found earlier in the prompt or the output, at the occurrence whose preceding tokens match
longest, and what followed them. A request with a prediction drafts from the source whose
match of the tokens before is longer (the prediction on ties and up to
SpecState.PREDICTION_LEAD tokens shorter: an output that repeats its own earlier text
drafts from that text), and by prompt lookup where the prediction has nothing to offer
(used up, or the output's last token is not in it). Usage's accepted and rejected
prediction tokens do not depend on the drafts: `PredictionMatch` walks the emitted tokens
against the prediction.

The gate (`SpeculativeConfig.mode`): "off" never drafts; "on" drafts `num_draft_tokens`
whenever a draft exists; "auto" drafts while the batch has at most `max_batch` decodes, and
as many tokens as raise the step's tokens per second: the engine fits its decode steps'
time as a fixed cost plus a cost per computed row (`StepCost`), each sequence estimates the
chance that its next draft token is accepted (`SpecState.acceptance`: draft tokens as a
geometric run, accepted / (accepted + refusals), over a decaying window), and a draft of k
tokens is expected to add acceptance + acceptance² + ... + acceptanceᵏ tokens for k rows'
time (`StepCost.best_draft` picks k, 0 for none). A sequence whose acceptance falls below
`min_acceptance` pauses drafting for a number of steps that doubles each time.
"""
from __future__ import annotations

import time
from collections import deque
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
    made it stop. Once fitted, a step is taken at no more than `clip` times the fit's prediction
    for it: a step the machine interrupted (another process, a page fault, a collection) is
    longer the more rows it had a chance to be interrupted in, and would otherwise read as
    dear rows; a lasting change still moves the fit, by up to that factor a step.
    """

    __slots__ = ("decay", "min_var", "prior_row_share", "max_row_share", "stale_after", "clip", "since_fit",
                 "w", "sx", "sy", "sxx", "sxy", "fixed_s", "row_s", "fitted")

    def __init__(self, decay: float = 0.99, min_var: float = 1.0, prior_row_share: float = 1 / 16,
                 max_row_share: float = 1.0, stale_after: int = 256, clip: float = 1.25):
        self.decay, self.min_var, self.clip = decay, min_var, clip
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
        if self.fitted:
            seconds = min(seconds, self.clip * (self.fixed_s + self.row_s * rows))
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

    def best_draft(self, acceptance: float, tokens: float, rows: int, most: int) -> int:
        """The draft length k in [0, most] that gives the step the most tokens per second.

        The step planned so far computes `rows` rows for `tokens` expected tokens; a draft of k
        tokens, each accepted with probability `acceptance` given the ones before it (a draft is
        accepted up to its first refusal), adds sum(acceptance ** j, j = 1..k) expected tokens
        and k rows: rate(k) = (tokens + gain(k)) / (fixed + row * (rows + k)). Returns 0 when no
        k beats rate(0); `most` when rows cost nothing and acceptance > 0.
        """
        step = self.fixed_s + self.row_s * rows
        best_k, best = 0, tokens / step if step > 0 else 0.0
        gain, p = 0.0, 1.0
        for k in range(1, most + 1):
            p *= acceptance
            gain += p
            rate = (tokens + gain) / (step + self.row_s * k)
            if rate > best:
                best_k, best = k, rate
        return best_k


def expected_accepted(acceptance: float, k: int) -> float:
    """Expected accepted tokens of a k-token draft whose tokens are each accepted with probability
    `acceptance` given the ones before: acceptance + acceptance² + ... + acceptanceᵏ."""
    gain, p = 0.0, 1.0
    for _ in range(k):
        p *= acceptance
        gain += p
    return gain


def common_suffix(a, a_end: int, b, b_end: int, most: int) -> int:
    """How many tokens a[:a_end] and b[:b_end] (token id lists) end alike, up to `most`: the length of
    the context a draft source matches before the place it proposes from (compared 8 at a time)."""
    n = 0
    while n < most:
        step = min(8, most - n, a_end - n, b_end - n)
        if step <= 0:
            return n
        if a[a_end - n - step:a_end - n] == b[b_end - n - step:b_end - n]:
            n += step
            continue
        while n < most and a_end - n > 0 and b_end - n > 0 and a[a_end - n - 1] == b[b_end - n - 1]:
            n += 1
        return n
    return n


MATCH_MOST = 64  # tokens compared when measuring how long a draft source's match is


class NgramIndex:
    """n-gram -> where its latest earlier occurrences' continuations start, over a growing token list.

    For each n in [ngram_min, ngram_max], every n-gram that ends before the list's last token
    is indexed once (positions only grow), keeping its last KEEP occurrences; a lookup probes
    the longest n first and, among that n-gram's occurrences, takes the one whose preceding
    tokens match the list's longest (the latest on ties: a suffix-matching drafter's rule), so
    it costs O(ngram_max + KEEP) probes, never a scan of the whole context.
    """

    __slots__ = ("sizes", "maps", "indexed")
    KEEP = 8

    def __init__(self, ngram_min: int, ngram_max: int):
        self.sizes = range(ngram_max, ngram_min - 1, -1)
        self.maps: dict[int, dict[tuple[int, ...], list[int]]] = {n: {} for n in self.sizes}
        self.indexed = 0  # n-grams ending before this position are in the maps

    def lookup(self, tokens: list[int]) -> tuple[int | None, int]:
        """(where the continuation of the best earlier match of the list's last tokens starts, how many
        tokens that match has, up to MATCH_MOST); (None, 0) when no n-gram matches."""
        end = len(tokens) - 1  # index n-grams ending at positions < end (the suffix itself is not a match)
        for e in range(self.indexed, end):
            for n in self.sizes:
                if e + 1 >= n:
                    starts = self.maps[n].setdefault(tuple(tokens[e + 1 - n:e + 1]), [])
                    starts.append(e + 1)
                    if len(starts) > self.KEEP:
                        del starts[0]
        self.indexed = max(self.indexed, end)
        for n in self.sizes:
            if len(tokens) < n + 1:
                continue
            starts = self.maps[n].get(tuple(tokens[-n:]))
            if starts:
                best, best_len = None, -1
                for start in reversed(starts):
                    m = common_suffix(tokens, start, tokens, len(tokens), MATCH_MOST)
                    if m > best_len:
                        best, best_len = start, m
                return best, best_len
        return None, 0


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

    def align(self, output) -> int | None:
        """The prediction index of the next token after `output` (token ids, a list or a deque of at least its
        last MATCH), or None when its last token is not in it."""
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


class PredictionMatch:
    """Usage's prediction tokens (OpenAI's accepted_prediction_tokens: the prediction's tokens that
    appeared in the completion; rejected_prediction_tokens: the ones that did not), from the
    completion's tokens alone, so the counts are the same whatever was drafted (speculation on,
    auto or off, any batch, any timing).

    Each completion token is compared with the prediction token that `PredictionDraft.align`
    expects after the tokens before it (the drafter's alignment: in order, found again after an
    edit), or, where the token before it is not in the prediction, the one after the last
    compared (a substituted token); an equal one counts that prediction position as accepted,
    once however often the output realigns on it. rejected = len(prediction) - accepted.
    """

    __slots__ = ("draft", "output", "accepted", "_counted")

    def __init__(self, prediction: list[int]):
        self.draft = PredictionDraft(prediction)
        self.output: deque[int] = deque(maxlen=PredictionDraft.MATCH)  # the completion's last tokens
        self.accepted = 0
        self._counted = bytearray(len(prediction))

    def feed(self, token_id: int) -> bool:
        """Fold in the completion's next token; True when it newly counts as an accepted prediction token."""
        aligned = self.draft.align(self.output)
        at = self.draft.pointer if aligned is None else aligned
        self.output.append(token_id)
        tokens = self.draft.tokens
        if at >= len(tokens) or tokens[at] != token_id:
            if aligned is not None:
                self.draft.pointer = at + 1  # the model's token stands in for this one (or realigns later)
            return False
        self.draft.pointer = at + 1
        if self._counted[at]:
            return False
        self._counted[at] = 1
        self.accepted += 1
        return True

    @property
    def rejected(self) -> int:
        return len(self.draft.tokens) - self.accepted


class SpecState:
    """One sequence's speculation: its drafters, its acceptance estimate and pause, and its counts.

    acceptance: the estimated chance that a draft token is accepted given the ones before it,
    hits / (hits + misses) where each verify adds its accepted tokens to hits and 1 to misses
    when it refused one, both decaying by DECAY a verify (about the last 10 verifies). The
    prior: 3 hits to 1 miss (0.75) for a prediction, 1 to 1 for prompt lookup.

    drafted / accepted: all draft tokens proposed and accepted. A request with a prediction
    drafts from it unless prompt lookup matches a longer context (the model repeating text of
    its own, not the prediction's) or the prediction has nothing to offer (`from_prediction`
    says which the last proposal used).
    """

    __slots__ = ("prediction", "ngrams", "hits", "misses", "pause", "backoff", "drafted", "accepted",
                 "from_prediction", "_at")

    def __init__(self, cfg: SpeculativeConfig, prediction: list[int] | None):
        self.prediction = PredictionDraft(prediction) if prediction else None
        self.ngrams = NgramIndex(cfg.ngram_min, cfg.ngram_max)
        self.hits, self.misses = (1.0, 1.0) if prediction is None else (3.0, 1.0)
        self.pause = 0
        self.backoff = 1
        self.drafted = 0
        self.accepted = 0
        self.from_prediction = False
        self._at: int | None = None

    DECAY = 0.9

    @property
    def acceptance(self) -> float:
        return self.hits / (self.hits + self.misses)

    # A prediction's draft is taken over prompt lookup's unless the context prompt lookup matched is
    # longer by more than this many tokens (the model repeating its own output, not the prediction).
    PREDICTION_LEAD = 2

    def propose(self, tokens: list[int], num_prompt: int, k: int) -> list[int]:
        """Up to k draft tokens to follow `tokens` (prompt + output ids): from the source whose match of
        the tokens before is the longest (common_suffix), the prediction's on ties and up to
        PREDICTION_LEAD tokens shorter; prompt lookup's where the prediction has nothing to offer."""
        draft, self._at = [], None
        pred_match = -1
        if self.prediction is not None:
            at, draft = self.prediction.propose(tokens[num_prompt:], k)
            if draft:
                self._at = at
                pred_match = common_suffix(self.prediction.tokens, at, tokens, len(tokens),
                                           min(MATCH_MOST, len(tokens) - num_prompt))
        start, match = self.ngrams.lookup(tokens)
        if start is not None and match > pred_match + self.PREDICTION_LEAD:
            draft = tokens[start:start + k]
            self.from_prediction = False
        else:
            self.from_prediction = bool(draft)
        return draft

    def record(self, cfg: SpeculativeConfig, num_drafted: int, num_accepted: int) -> None:
        """Fold in one verify of the last proposal: counts, the prediction's pointer, the acceptance and the pause."""
        self.drafted += num_drafted
        self.accepted += num_accepted
        if self.from_prediction:
            self.prediction.pointer = self._at + num_accepted + 1
        self.hits = self.DECAY * self.hits + num_accepted
        self.misses = self.DECAY * self.misses + (num_accepted < num_drafted)
        if cfg.mode == "auto" and self.acceptance < cfg.min_acceptance:
            self.pause, self.backoff = self.backoff, min(self.backoff * 2, 64)
            # retried at min_acceptance after the pause, with the weight of two verifies
            self.hits, self.misses = 2 * cfg.min_acceptance, 2 * (1 - cfg.min_acceptance)
        elif num_accepted:
            self.backoff = 1


class Speculator:
    """Plans the drafts of one step's decodes (called by Scheduler.schedule) and keeps the engine's counters.

    exact: whether the model runner computes each decode row independently of the others (the
    compiled decode layers); drafts are never planned otherwise, since only then is a verify
    row bitwise the decode row it stands for. clock: the seconds source of the step timings
    `StepCost` fits (time.perf_counter; tests script it). The engine brackets each step with
    `start_step()` and, for a step of decodes only (their drafts included), `end_step(rows,
    num_decodes)`. Steps are fitted per number of decodes (`costs`, 1 to max_batch): a step's
    time is not one line across batch sizes (each decode brings its own sampling and
    bookkeeping, its own context to attend), and a fit made at 8 streams would misjudge a
    lone stream's drafts; a size without a fit of its own uses the nearest fitted size's.
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
        self.costs: dict[int, StepCost] = {}
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

    def end_step(self, rows: int, num_decodes: int = 1) -> None:
        """The step started last computed `rows` positions for `num_decodes` decodes (their drafts
        included, no prompt chunk): fold its time into that batch size's cost fit."""
        if self._started is not None:
            seconds, self._started = self.clock() - self._started, None
            if 1 <= num_decodes <= self.cfg.max_batch:
                self.costs.setdefault(num_decodes, StepCost()).observe(rows, seconds)

    def cost_for(self, num_decodes: int) -> StepCost:
        """The step-cost fit for `num_decodes` decodes: its own once fitted, else the nearest fitted
        size's, else a fresh one (the prior)."""
        own = self.costs.get(num_decodes)
        if own is not None and own.fitted:
            return own
        fitted = [n for n, c in self.costs.items() if c.fitted]
        if fitted:
            return self.costs[min(fitted, key=lambda n: (abs(n - num_decodes), n))]
        return own if own is not None else StepCost()

    def begin_plan(self, num_decodes: int) -> None:
        """Start planning a step of `num_decodes` decodes (each a row and a token before any draft)."""
        self._rows = num_decodes
        self._tokens = float(num_decodes)

    def plan(self, seq, num_decodes: int, budget: int, max_model_len: int | None) -> list[int]:
        """The draft tokens of decode `seq` this step (may be []), within `budget` tokens and its limits.
        In auto, as many as StepCost.best_draft says pay at the rows planned so far."""
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
        k = min(cfg.num_draft_tokens, budget, seq.params.max_tokens - seq.num_output_tokens - 1)
        if max_model_len is not None:
            k = min(k, max_model_len - len(seq.token_ids))
        if auto and k > 0:
            k = self.cost_for(num_decodes).best_draft(state.acceptance, self._tokens, self._rows, k)
        if k <= 0:
            return []
        draft = state.propose(seq.token_ids, seq.num_prompt_tokens, k)
        self._rows += len(draft)
        self._tokens += expected_accepted(state.acceptance, len(draft))
        return draft

    def record(self, seq, num_drafted: int, num_accepted: int) -> None:
        """Count one verify of `seq` (engine totals and its own state)."""
        self.num_drafted_tokens += num_drafted
        self.num_accepted_tokens += num_accepted
        self.num_verifies += 1
        seq.spec.record(self.cfg, num_drafted, num_accepted)
        if self.observe is not None:
            self.observe(num_drafted, num_accepted)
