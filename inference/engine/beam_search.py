"""Beam search in the engine: vLLM's search rule (BeamSearch) and one request's live beams as sequences (BeamGroup).

The rule is vLLM's (`vllm/entrypoints/llm.py` beam_search, `vllm/beam_search.py`): every step each
live beam's top 2 * width next tokens (the model's own log-probabilities, temperature 0) extend
its cumulative logprob; candidates ending in an ending token are complete, the `width` best
others live on; after max_tokens steps (or, with early_stopping, once `width` beams are complete)
the complete and live beams are ranked by score() and the n best come back.

The live beams are ordinary sequences of the continuous batch (decode rows beside every other
request). A beam's sampled row gives its candidates (Sequence.beam_top) instead of a token; once
every live beam of the group has them, BeamGroup.advance selects the next beams and each is a
fork of its parent (Scheduler.fork: the parent's block table shared, refcounts + 1; its partial
last block copied when the child first writes into it, BlockManager.allocate). Parents are then
released, so no beam ever recomputes its prefix. The request's first sequence (the root) is the
handle's: it prefills the prompt, is the first live beam, and ends with the Finished that
carries the best beams. No torch here.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .outputs import Failed


@dataclass(frozen=True, slots=True)
class BeamSpec:
    """width: beams kept per step; n: beams returned (<= width); length_penalty; early_stopping."""

    width: int
    n: int
    length_penalty: float = 1.0
    early_stopping: bool = False


@dataclass(slots=True)
class Beam:
    """One hypothesis: all its token ids (prompt + output), its cumulative logprob (natural log, the sum
    of its output tokens' logprobs), whether an ending token ended it, its output token ids, and per
    output token (its logprob, that step's candidates [(token id, logprob)] best first)."""

    tokens: list[int]
    cum_logprob: float = 0.0
    finished: bool = False
    output: list[int] = field(default_factory=list)
    logprobs: list[tuple[float, list[tuple[int, float]]]] = field(default_factory=list)


def score(beam: Beam, length_penalty: float) -> float:
    """vLLM's get_beam_search_score: cum_logprob / len ** length_penalty, len without an ending EOS."""
    length = len(beam.tokens) - (1 if beam.finished else 0)
    return beam.cum_logprob / (length ** length_penalty)


def check_beam_request(spec: BeamSpec, params) -> None:
    """Raises ValueError unless `params` (SamplingParams, as the engine uses them) can run `spec`: width >= 1,
    1 <= n <= width, logprobs at least 2 * width (the candidates ranked each step)."""
    if spec.width < 1 or not 1 <= spec.n <= spec.width:
        raise ValueError(f"a beam search needs 1 <= n <= width (n {spec.n}, width {spec.width})")
    if params.logprobs is None or params.logprobs < 2 * spec.width:
        raise ValueError(f"a beam search of width {spec.width} needs logprobs >= {2 * spec.width}")


class BeamSearch:
    """The search's state without any engine object: live beams, complete beams, steps taken."""

    def __init__(self, prompt_ids: list[int], spec: BeamSpec, max_tokens: int, ending_ids):
        self.spec = spec
        self.max_tokens = max_tokens
        self.ending = frozenset(ending_ids)
        self.live: list[Beam] = [Beam(list(prompt_ids))]
        self.done: list[Beam] = []
        self.steps = 0

    def advance(self, tops: list[list[tuple[int, float]]]) -> list[int]:
        """One step. tops[i]: live beam i's next-token candidates [(token id, logprob)], best first (at
        least 2 * width of them unless the vocabulary is smaller; more are kept as alternatives only).
        Replaces `live` by the width best non-ending children, in score order, and returns each new
        live beam's parent index into the old `live`."""
        k = 2 * self.spec.width
        grown: list[tuple[int, Beam]] = []
        for i, (beam, top) in enumerate(zip(self.live, tops)):
            for token, logprob in top[:k]:
                child = Beam(beam.tokens + [token], beam.cum_logprob + logprob, token in self.ending,
                             beam.output + [token], beam.logprobs + [(logprob, top)])
                if child.finished:
                    self.done.append(child)
                else:
                    grown.append((i, child))
        grown.sort(key=lambda pc: score(pc[1], self.spec.length_penalty), reverse=True)
        grown = grown[:self.spec.width]
        self.live = [child for _, child in grown]
        self.steps += 1
        return [parent for parent, _ in grown]

    @property
    def finished(self) -> bool:
        """max_tokens steps taken, no live beam left, or (early_stopping) width beams complete."""
        return (self.steps >= self.max_tokens or not self.live
                or (self.spec.early_stopping and len(self.done) >= self.spec.width))

    def best(self) -> list[Beam]:
        """The n best of the complete and live beams, best first (vLLM's ranking by score)."""
        ranked = sorted(self.done + self.live, key=lambda b: score(b, self.spec.length_penalty), reverse=True)
        return ranked[:self.spec.n]


class BeamGroup:
    """One beam-search request in the engine: its BeamSearch and the sequence of each live beam.

    root: the request's own sequence (its handle's key, the first live beam). seqs[i] runs
    search.live[i]. Beams end on params.stop_token_ids (the serving layer's EOS ids).
    """

    def __init__(self, root, spec: BeamSpec):
        self.root = root
        self.search = BeamSearch(root.prompt_token_ids, spec, root.params.max_tokens, root.params.stop_token_ids)
        self.seqs = [root]

    def ready(self) -> bool:
        """Every live beam has its candidates (its row of this or an earlier step ran)."""
        return all(seq.beam_top is not None for seq in self.seqs)

    def advance(self, scheduler, now: float):
        """Select the next beams from the live beams' candidates, fork them from their parents and release
        the parents (Scheduler.fork / replace_beams). Returns (root, [Finished]) when the search is
        over (every beam's blocks freed), else None."""
        parents = self.search.advance([seq.beam_top for seq in self.seqs])
        if self.root.first_token_time is None:
            self.root.first_token_time = now
        old = self.seqs
        if self.search.finished:
            self.seqs = []
            scheduler.replace_beams(old, [])
            return self.end(scheduler, "stop")
        children = [(old[p], scheduler.fork(old[p], beam.tokens[-1])) for p, beam in zip(parents, self.search.live)]
        self.seqs = [child for _, child in children]
        scheduler.replace_beams(old, children)
        return None

    def end(self, scheduler, reason: str):
        """End the request: every live beam's sequence and the root finish with `reason` (blocks freed).
        Returns (root, [its Finished, carrying the best beams])."""
        for seq in self.seqs:
            if seq is not self.root and not seq.is_finished:
                scheduler.finish(seq, reason)
        self.seqs = []
        scheduler.finish(self.root, reason)
        return self.root, [self.root.finished_output()]

    def fail(self, scheduler, message: str):
        """End the request with Failed(message) (a beam's step raised): returns (root, [Failed])."""
        for seq in self.seqs:
            if not seq.is_finished:
                scheduler.finish(seq, "error")
        self.seqs = []
        if not self.root.is_finished:
            scheduler.finish(self.root, "error")
        return self.root, [Failed(message)]
