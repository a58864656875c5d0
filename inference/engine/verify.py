"""Verifying drafts by sample-and-compare: a draft token is accepted while it equals the token decoding would choose.

For a decode with drafts d_1..d_k the model runner computed k + 1 decode rows: row 0 after
the sequence's last token, row j after d_j. The scheduler's postprocess appends row 0's
token t_0 as for any decode. Then, while t_{j-1} == d_j, d_j's KV is kept (the sequence's
computed tokens grow by one) and row j is sampled exactly as decoding would sample it:
the sampler sees the sequence with every accepted token appended through the one append
path (`Scheduler.append_token`: grammar acceptance, stop rules, max_tokens), so penalty
and DRY counts, the grammar matcher, min_tokens and the reasoning budget are those of
decoding at that length, and a seeded request draws from its own generator once per
emitted token, in the same order. The first mismatch emits the model's token and ends the
sequence's step; the rejected drafts' KV slots are dropped (`BlockManager.truncate`) and
rewritten when decoding reaches them. Rows are sampled depth by depth, every verifying
sequence of the batch in one sampler call per depth; rows that no sequence state can
change (`stateless`) were sampled by the runner in the step's one sampler call (or, where
the sampler would change nothing, `argmax_only`, taken as their logits' argmax).
"""
from __future__ import annotations

import time

import torch

from .outputs import TokenEvent
from .penalties import penalties_on


def stateless(seq) -> bool:
    """True when no row of `seq`'s drafts depends on the tokens before it beyond the logits:
    greedy, no penalty, DRY, grammar or reasoning, and min_tokens already reached."""
    p = seq.params
    return (p.greedy and not penalties_on(p) and p.dry_multiplier <= 0 and seq.grammar is None
            and p.reasoning is None and seq.num_output_tokens >= p.min_tokens)


def argmax_only(seq) -> bool:
    """True when each of `seq`'s draft rows picks exactly the argmax of its raw logits, as the sampler
    would: stateless, no logit_bias and no logprobs asked for (the sampler then changes nothing)."""
    p = seq.params
    return stateless(seq) and not p.logit_bias and p.logprobs is None


def verify_drafts(scheduler, sampler, speculator, batch, result, outputs: list) -> None:
    """Accept the drafts of `batch` (ScheduledBatch.drafts) against `result` (RunResult), after
    Scheduler.postprocess appended each item's first token. Extends `outputs` (StepOutputs)
    with the accepted and corrected tokens' events; a sequence whose verification raises ends
    alone with Failed. Each sequence's rejected drafts' blocks go back to the pool.
    """
    if not batch.drafts:
        return
    events = {id(seq): evs for seq, evs in outputs}
    now = time.monotonic()
    # [sequence, draft, item index, drafts accepted]
    entries = [[batch.items[i][0], draft, i, 0] for i, draft in batch.drafts.items()]
    live = entries
    depth = 0
    while live:
        ready, stateful = [], []
        for entry in live:
            seq, draft, i, _ = entry
            if seq.is_finished or seq.token_ids[-1] != draft[depth]:
                continue
            # The token decoding chose equals draft `depth`: its KV holds, and its row picks the next token.
            entry[3] += 1
            seq.num_computed_tokens += 1
            scheduler.block_manager.cache_full_blocks(seq)
            (ready if i in result.draft_samples else stateful).append(entry)
        picks: dict[int, tuple[int, tuple | None]] = {}
        for seq, _, i, _ in ready:
            tokens, logprobs = result.draft_samples[i]
            picks[id(seq)] = (tokens[depth], logprobs[depth])
        if stateful:
            picks.update(_sample_depth(scheduler, sampler, result, stateful, depth, outputs, events))
        live = []
        for entry in ready + stateful:
            seq, draft = entry[0], entry[1]
            if id(seq) not in picks or seq.is_finished:
                continue
            token, logprobs = picks[id(seq)]
            try:
                evs = scheduler.append_token(seq, token, logprobs, now)
            except Exception as exc:  # this request's state alone is broken
                evs = [scheduler.fail(seq, exc)]
            _extend(outputs, events, seq, evs)
            if depth + 1 < len(draft):
                live.append(entry)
        depth += 1
    for seq, draft, _, accepted in entries:
        if seq.spec is not None:
            speculator.record(seq, len(draft), accepted)
        if not seq.is_finished:
            scheduler.block_manager.truncate(seq, len(seq.token_ids))


def _sample_depth(scheduler, sampler, result, entries, depth, outputs, events) -> dict:
    """Row `depth` of each entry's draft logits sampled in one call (one by one if that raises)."""
    seqs = [e[0] for e in entries]
    logits = torch.stack([result.draft_logits[e[2]][depth] for e in entries])
    try:
        out = sampler(logits, seqs)
        return {id(s): (t, lp) for s, t, lp in zip(seqs, out.token_ids, out.logprobs)}
    except Exception:
        picks = {}
        for s, row in zip(seqs, logits):
            try:
                one = sampler(row[None], [s])
                picks[id(s)] = (one.token_ids[0], one.logprobs[0])
            except Exception as exc:
                _extend(outputs, events, s, [scheduler.fail(s, exc)])
        return picks


def _extend(outputs, events, seq, evs) -> None:
    if id(seq) in events:
        events[id(seq)].extend(evs)
    else:
        events[id(seq)] = list(evs)
        outputs.append((seq, events[id(seq)]))

