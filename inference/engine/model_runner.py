"""ModelRunner: the only code that builds tensors. A scheduled batch in, sampled tokens out."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from . import kernels
from .config import ModelConfig
from .kv_pool import KVPool
from .layers.attention import AttentionMetadata, PrefillSlice
from .layers import kv_quant
from .layers.fused_decode import FusedDecoder
from .sampler import Sampler, argmax_rows, token_logprobs
from .scheduler import ScheduledBatch
from .verify import argmax_only, stateless


# Prefill chunks whose context (tokens before the chunk + the chunk) is at most this many
# tokens run through the compiled layers, one attention row per prompt token; longer ones
# take torch's flash SDPA, which reuses each K/V block across many queries.
FUSED_PREFILL_MAX_CONTEXT = 768


@dataclass(slots=True)
class RunResult:
    """What one forward gave each batch item (lists aligned with `ScheduledBatch.items`).

    token_ids[i]: the token item i sampled, None when its chunk did not reach the end of its
    known tokens. logprobs[i]: None, or (sampled logprob, [(token id, logprob)] top-N, desc).
    prompt_logprobs[i]: when its request asked for prompt logprobs and the chunk is in the prompt,
    the entries of the prompt tokens this chunk scored (position p scores token p + 1), else None.
    """

    token_ids: list[int | None]
    logprobs: list[tuple | None]
    prompt_logprobs: list[list | None]
    # Items with drafts (ScheduledBatch.drafts): draft_logits[i] float32 [k, vocab], row j the logits after
    # draft token j (verify.py samples them); draft_samples[i] when the runner could already sample all k
    # rows (verify.stateless): (token ids, logprobs) of those rows.
    draft_logits: dict[int, torch.Tensor] = field(default_factory=dict)
    draft_samples: dict[int, tuple[list[int], list]] = field(default_factory=dict)


class ModelRunner:
    """Holds the model, its KV caches and the sampler; runs one step's forward.

    kv_caches: per layer (k, v), each [num_blocks, block_size, n_kv_heads, head_dim]
    in `kv_dtype` (int8: layers/kv_quant.py's rows), zero-initialised (masked slots must not
    hold NaN garbage).
    """

    def __init__(self, model, cfg: ModelConfig, num_blocks: int, block_size: int,
                 device: torch.device, kv_dtype: torch.dtype, eos_token_ids: list[int] | None = None,
                 seed: int | None = None, window_blocks: int | None = None, logprobs_mode: str = "raw_logprobs"):
        """window_blocks: the sliding-window layers' own pool of that many blocks, addressed by each
        sequence's window_table (hybrid_block_manager.py); None: every layer in the one pool. logprobs_mode:
        EngineConfig's (the sampler's)."""
        self.model = model
        self.cfg = cfg
        self.device = device
        self.block_size = block_size
        self.window_blocks = window_blocks
        shape = kv_quant.cache_shape(num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim, kv_dtype)
        shapes = None
        if window_blocks is not None:
            window_shape = kv_quant.cache_shape(window_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim,
                                                kv_dtype)
            shapes = [window_shape if cfg.is_sliding(i) else shape for i in range(cfg.num_hidden_layers)]
        # kv_pool.KVPool: zero-filled, its pages committed on the CPU as blocks are first written.
        self.kv_pool = KVPool(cfg.num_hidden_layers, shape, kv_dtype, device, shapes)
        self.kv_caches = self.kv_pool.caches
        self.sampler = Sampler(eos_token_ids, seed, logprobs_mode)
        # Decode attention runs in the compiled kernel (no mask needed) where it can, and where the
        # model's decode weights are kernel weights, decode rows run through whole compiled layers.
        self.decode_kernel = (device.type == "cpu" and next(model.parameters()).dtype == torch.float32
                              and kernels.supports_kv_dtype(kv_dtype) and kernels.available())
        self.fused = FusedDecoder(model, self.kv_caches) if self.decode_kernel and FusedDecoder.supports(
            model, kv_dtype) else None
        # When prompt rows use the decode rows' weights, they take the compiled layers too (see prepare()).
        self.fused_prefill = self.fused is not None and getattr(model, "compact_prefill", False) == getattr(
            model, "compact_decode", False)
        self.item_rows: list[int] = []
        # layers/lora.LoraSlots once the engine installs adapter slots (each step's row groups).
        self.lora = None
        self.draft_rows: dict[int, list[int]] = {}
        # Seconds the last execute() spent building tensors, in the forward (with the LM head) and sampling.
        self.last_phase_s: dict[str, float] = {}

    @staticmethod
    def kv_bytes_per_block(cfg: ModelConfig, block_size: int, kv_dtype: torch.dtype, layers: int | None = None) -> int:
        """Bytes one block takes across all layers, or `layers` of them (K and V; int8: each head row's
        scale included)."""
        row = kv_quant.head_row_bytes(cfg.head_dim, kv_dtype)
        n = cfg.num_hidden_layers if layers is None else layers
        return 2 * n * block_size * cfg.num_key_value_heads * row

    def prepare(self, batch: ScheduledBatch) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, list[int]]:
        """Pack the batch: input_ids [T], positions [T], metadata, and the rows whose logits are sampled.

        Rows that run through the compiled layers come first (the decodes, then, with
        `fused_prefill`, every prefill chunk whose context fits FUSED_PREFILL_MAX_CONTEXT,
        each prompt row attending like a decode row of its own length), then the prefill
        chunks for the torch layers. `self.item_rows` gets each batch item's first packed row.
        A decode with drafts (batch.drafts) packs its draft tokens after its own token, each a
        decode row of its own context length (a verify row); `self.draft_rows[i]` lists them.
        """
        bs = self.block_size
        fused: list[tuple[int, int, int]] = []  # (item, start, n) in the order they are packed
        rest: list[tuple[int, int, int]] = []
        for i, (seq, n) in enumerate(batch.items):
            start = seq.num_computed_tokens
            if i < batch.num_decodes or (self.fused_prefill and start + n <= FUSED_PREFILL_MAX_CONTEXT):
                fused.append((i, start, n))
            else:
                rest.append((i, start, n))
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        item_rows = [0] * len(batch.items)
        row_tables: list[list[int]] = []
        row_lens: list[int] = []
        prefill_specs: list[tuple[int, int, list[int], int]] = []
        hybrid = self.window_blocks is not None
        window_slots: list[int] = []  # the same per group of the window pool (hybrid)
        window_row_tables: list[list[int]] = []
        window_specs: list[tuple[int, int, list[int], int]] = []
        self.draft_rows = {}
        for group in (fused, rest):
            for i, start, n in group:
                seq = batch.items[i][0]
                q_start = item_rows[i] = len(ids)
                ids.extend(seq.token_ids[start:start + n])
                draft = batch.drafts.get(i)
                if draft:
                    self.draft_rows[i] = list(range(q_start + n, q_start + n + len(draft)))
                    ids.extend(draft)
                    n += len(draft)
                positions = range(start, start + n)
                pos.extend(positions)
                table = seq.block_table
                slots.extend(table[p // bs] * bs + p % bs for p in positions)
                wtable = seq.window_table if hybrid else table
                if hybrid:
                    window_slots.extend(wtable[p // bs] * bs + p % bs for p in positions)
                if group is fused:
                    used = table[: -(-(start + n) // bs)]
                    row_tables.extend([used] * n)
                    row_lens.extend(range(start + 1, start + n + 1))
                    if hybrid:
                        window_row_tables.extend([wtable[: -(-(start + n) // bs)]] * n)
                else:
                    prefill_specs.append((q_start, len(ids), table[: -(-(start + n) // bs)], start))
                    if hybrid:
                        window_specs.append((q_start, len(ids), wtable[: -(-(start + n) // bs)], start))
        self.item_rows = item_rows
        sample_rows = [item_rows[i] + n - 1
                       for i, ((_, n), samples) in enumerate(zip(batch.items, batch.samples)) if samples]

        slot_mapping = torch.tensor(slots, dtype=torch.long, device=self.device)
        meta = self._metadata(slot_mapping, row_tables, row_lens, prefill_specs, None)
        window = self.cfg.sliding_window if any(self.cfg.layer_types) else None
        past = window is not None and (
            any(n > window for n in row_lens)
            or any(q_end - q_start + start > window for q_start, q_end, _, start in prefill_specs))
        if hybrid:  # the window layers' own slots and tables; masked to the window once a row passes it
            meta.window = self._metadata(torch.tensor(window_slots, dtype=torch.long, device=self.device),
                                         window_row_tables, row_lens, window_specs, window if past else None)
        elif past:
            meta.window = self._metadata(slot_mapping, row_tables, row_lens, prefill_specs, window)
        dev = self.device
        input_ids = torch.tensor(ids, dtype=torch.long, device=dev)
        positions_t = torch.tensor(pos, dtype=torch.long, device=dev)
        if self.lora is not None:
            spans = [(seq, item_rows[i], n + len(batch.drafts.get(i) or ()))
                     for i, (seq, n) in enumerate(batch.items)]
            self.lora.begin_step(spans, len(ids), meta.num_decodes if self.fused is not None else 0)
        return input_ids, positions_t, meta, sample_rows

    def _metadata(self, slot_mapping: torch.Tensor, row_tables: list[list[int]], row_lens: list[int],
                  prefill_specs: list[tuple[int, int, list[int], int]], window: int | None) -> AttentionMetadata:
        """The step's AttentionMetadata from each decode row's block table and length and each prefill
        chunk's (q_start, q_end, block table, tokens before it). With `window` (a sliding-window
        layer's, in tokens): a query at position p attends positions p - window + 1 .. p only
        (transformers' sliding_window_overlay), its table cut to the blocks from the one holding
        its first attended position, and the mask always built (the compiled decode kernel
        attends from position 0)."""
        bs = self.block_size
        dev = self.device
        meta = AttentionMetadata(slot_mapping=slot_mapping)
        if row_tables:
            firsts = [max(0, n - window) // bs if window else 0 for n in row_lens]
            tables = [t[f:] for t, f in zip(row_tables, firsts)]
            width = max(len(t) for t in tables)
            meta.num_decodes = len(tables)
            meta.decode_block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.long,
                                                    device=dev)
            lens = torch.tensor(row_lens, device=dev)
            meta.decode_lens = lens
            if window:
                meta.window_starts = torch.tensor([max(0, n - window) - f * bs for n, f in zip(row_lens, firsts)],
                                                  dtype=torch.long, device=dev)
                meta.window_lens = torch.tensor([n - f * bs for n, f in zip(row_lens, firsts)], dtype=torch.long,
                                                device=dev)
            if window or not self.decode_kernel:
                at = (torch.arange(width * bs, device=dev).unsqueeze(0)
                      + torch.tensor(firsts, device=dev).unsqueeze(1) * bs)  # each key's position
                allowed = at < lens.unsqueeze(1)
                if window:
                    allowed &= at >= (lens - window).unsqueeze(1)
                meta.decode_mask = allowed[:, None, None, :]
        for q_start, q_end, table, computed in prefill_specs:
            q_len = q_end - q_start
            first = max(0, computed - window + 1) // bs if window else 0
            table = table[first:]
            at = torch.arange(len(table) * bs, device=dev).unsqueeze(0) + first * bs
            limit = torch.arange(computed, computed + q_len, device=dev).unsqueeze(1)
            mask = at <= limit
            if window:
                mask &= at > limit - window
            meta.prefills.append(PrefillSlice(q_start, q_end, torch.tensor(table, dtype=torch.long, device=dev), mask,
                                              computed, causal=not window or q_len + computed <= window))
        return meta

    @torch.inference_mode()
    def copy_blocks(self, copies: list[tuple[int, int]], window_copies: list[tuple[int, int]] = ()) -> None:
        """Copy whole KV blocks, every layer's K and V: copies[j] = (source block id, destination block id),
        as if applied in order (a destination named twice gets its last source; a destination is never a
        source: it is a fresh block of copy-on-write, BlockManager.allocate). With a window pool
        (window_blocks), `copies` are the full layers' and `window_copies` the window layers'. One
        gather over the whole pool where its layers are one mapping of one shape (KVPool.copy_blocks), else
        one per layer and tensor; run before the forward that writes the destinations."""
        def pairs(group):
            last = {dst: src for src, dst in group}
            return (torch.tensor(list(last), dtype=torch.long, device=self.device),
                    torch.tensor(list(last.values()), dtype=torch.long, device=self.device))

        full = pairs(copies)
        if self.window_blocks is None and len(full[0]) and self.kv_pool.copy_blocks(*full):
            return
        window = pairs(window_copies) if self.window_blocks is not None else full
        for i, (k, v) in enumerate(self.kv_caches):
            dst, src = window if self.window_blocks is not None and self.cfg.is_sliding(i) else full
            if len(dst):
                k[dst] = k[src]
                v[dst] = v[src]

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch) -> RunResult:
        """Run the forward for every scheduled token and sample the items that reached their end.

        Changes no sequence: the KV slots of the scheduled tokens are written (a retry rewrites
        them), the draws advance the sequences' generators, and the scheduler's postprocess
        applies the result.
        """
        t0 = time.perf_counter()
        input_ids, positions, meta, sample_rows = self.prepare(batch)
        t1 = time.perf_counter()
        items = [i for i, s in enumerate(batch.samples) if s]
        # Decode rows, then the drafts' verify rows (decode rows too: the compact head), then prefill rows.
        nd = sum(1 for i in items if i < batch.num_decodes)
        drafted = [i for i in items if i in self.draft_rows]
        verify_rows = [r for i in drafted for r in self.draft_rows[i]]
        rows = sample_rows[:nd] + verify_rows + sample_rows[nd:]
        compact = self.model.compact_rows(nd + len(verify_rows), len(rows))
        logits = None
        if self.fused is not None and meta.num_decodes == len(input_ids) and (
                not rows or compact == slice(0, len(rows))):
            # Every row runs through the compiled layers and samples with the compact head: one call.
            hidden, logits = self.model.decode_logits(input_ids, positions, meta, self.fused, rows)
        else:
            hidden = self.model(input_ids, positions, self.kv_caches, meta, self.fused)
        n = len(batch.items)
        result = RunResult([None] * n, [None] * n, self._prompt_logprobs(batch, hidden))
        if sample_rows:
            if logits is None:
                logits = self.model.compute_logits(hidden[rows], compact)
            t2 = time.perf_counter()
            # Without verify rows the logits are the sampled rows already (a copy would cost a vocabulary a row).
            main = logits if not verify_rows else torch.cat([logits[:nd], logits[nd + len(verify_rows):]])
            seqs = [batch.items[i][0] for i in items]
            # Drafts whose every row can be sampled now (verify.stateless) join the step's one sampler call;
            # those the sampler would leave as they are (verify.argmax_only) take their argmax in one call.
            early, offset, extra_seqs, extra_logits = [], nd, [], []
            by_argmax, argmax_logits = [], []
            for i in drafted:
                k = len(self.draft_rows[i])
                block = logits[offset:offset + k]
                offset += k
                seq = batch.items[i][0]
                if argmax_only(seq):
                    by_argmax.append((i, k))
                    argmax_logits.append(block)
                elif stateless(seq):
                    early.append((i, len(extra_seqs), k))
                    extra_seqs += [seq] * k
                    extra_logits.append(block)
                else:  # kept past this call (a retried step's parts): the fused step's logits are reused
                    result.draft_logits[i] = block.clone()
            if extra_logits:
                main = torch.cat([main, *extra_logits])
            sampled = self.sampler(main, seqs + extra_seqs)
            for k, i in enumerate(items):
                result.token_ids[i] = sampled.token_ids[k]
                result.logprobs[i] = sampled.logprobs[k]
            base = len(items)
            for i, at, k in early:
                result.draft_samples[i] = (sampled.token_ids[base + at:base + at + k],
                                           sampled.logprobs[base + at:base + at + k])
            if by_argmax:
                picked = argmax_rows(torch.cat(argmax_logits)).tolist()
                at = 0
                for i, k in by_argmax:
                    result.draft_samples[i] = (picked[at:at + k], [None] * k)
                    at += k
        else:
            t2 = time.perf_counter()
        t3 = time.perf_counter()
        self.last_phase_s = {"prepare": t1 - t0, "forward": t2 - t1, "sample": t3 - t2}
        return result

    def _prompt_logprobs(self, batch: ScheduledBatch, hidden: torch.Tensor) -> list[list | None]:
        out: list[list | None] = [None] * len(batch.items)
        for i, ((seq, n), row) in enumerate(zip(batch.items, self.item_rows)):
            start = seq.num_computed_tokens
            n_prompt = seq.num_prompt_tokens
            if seq.params.prompt_logprobs is not None and start < n_prompt:
                # Position p predicts token p + 1; only prompt tokens after the first are scored.
                upto = min(start + n, n_prompt - 1)
                out[i] = []
                if upto > start:
                    logits = self.model.compute_logits(hidden[row:row + (upto - start)])
                    targets = seq.token_ids[start + 1:upto + 1]
                    out[i] = token_logprobs(logits, targets, [seq.params.prompt_logprobs] * len(targets))
        return out

    @torch.inference_mode()
    def forward_logits(self, batch: ScheduledBatch) -> torch.Tensor:
        """Logits float32 [T, vocab] for every scheduled token, in batch order (used by parity tests)."""
        input_ids, positions, meta, _ = self.prepare(batch)
        hidden = self.model(input_ids, positions, self.kv_caches, meta, self.fused)
        order = [r for (_, n), start in zip(batch.items, self.item_rows) for r in range(start, start + n)]
        return self.model.compute_logits(hidden[order], self.model.compact_rows(batch.num_decodes, hidden.shape[0]))
