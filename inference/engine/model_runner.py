"""ModelRunner: the only code that builds tensors. A scheduled batch in, sampled tokens out."""
from __future__ import annotations

import time

import torch

from . import kernels
from .config import ModelConfig
from .layers.attention import AttentionMetadata, PrefillSlice
from .layers.fused_decode import FusedDecoder
from .sampler import SampleResult, Sampler, token_logprobs
from .scheduler import ScheduledBatch


class ModelRunner:
    """Holds the model, its KV caches and the sampler; runs one step's forward.

    kv_caches: per layer (k, v), each [num_blocks, block_size, n_kv_heads, head_dim]
    in `kv_dtype`, zero-initialised (masked slots must not hold NaN garbage).
    """

    def __init__(self, model, cfg: ModelConfig, num_blocks: int, block_size: int,
                 device: torch.device, kv_dtype: torch.dtype, eos_token_ids: list[int] | None = None,
                 seed: int | None = None):
        self.model = model
        self.cfg = cfg
        self.device = device
        self.block_size = block_size
        shape = (num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim)
        self.kv_caches = [
            (torch.zeros(shape, dtype=kv_dtype, device=device), torch.zeros(shape, dtype=kv_dtype, device=device))
            for _ in range(cfg.num_hidden_layers)
        ]
        self.sampler = Sampler(eos_token_ids, seed)
        # Decode attention runs in the compiled kernel (no mask needed) where it can, and where the
        # model has int8 decode weights, decode rows run through whole compiled layers.
        self.decode_kernel = (device.type == "cpu" and next(model.parameters()).dtype == torch.float32
                              and kernels.supports_kv_dtype(kv_dtype) and kernels.available())
        self.fused = FusedDecoder(model, self.kv_caches) if self.decode_kernel and FusedDecoder.supports(
            model, kv_dtype) else None
        # Seconds the last execute() spent building tensors, in the forward (with the LM head) and sampling.
        self.last_phase_s: dict[str, float] = {}

    @staticmethod
    def kv_bytes_per_block(cfg: ModelConfig, block_size: int, kv_dtype: torch.dtype) -> int:
        """Bytes one block takes across all layers (K and V)."""
        elem = torch.empty((), dtype=kv_dtype).element_size()
        return 2 * cfg.num_hidden_layers * block_size * cfg.num_key_value_heads * cfg.head_dim * elem

    def prepare(self, batch: ScheduledBatch) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, list[int]]:
        """Pack the batch: input_ids [T], positions [T], metadata, and the rows whose logits are sampled."""
        bs = self.block_size
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        sample_rows: list[int] = []
        decode_tables: list[list[int]] = []
        decode_lens: list[int] = []
        prefill_specs: list[tuple[int, int, list[int], int]] = []
        for i, ((seq, n), samples) in enumerate(zip(batch.items, batch.samples)):
            start = seq.num_computed_tokens
            q_start = len(ids)
            ids.extend(seq.token_ids[start:start + n])
            positions = range(start, start + n)
            pos.extend(positions)
            table = seq.block_table
            slots.extend(table[p // bs] * bs + p % bs for p in positions)
            if samples:
                sample_rows.append(len(ids) - 1)
            if i < batch.num_decodes:
                decode_tables.append(table[: -(-(start + 1) // bs)])
                decode_lens.append(start + 1)
            else:
                prefill_specs.append((q_start, len(ids), table[: -(-(start + n) // bs)], start))

        dev = self.device
        meta = AttentionMetadata(slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev))
        if decode_tables:
            width = max(len(t) for t in decode_tables)
            padded = [t + [0] * (width - len(t)) for t in decode_tables]
            meta.num_decodes = len(decode_tables)
            meta.decode_block_tables = torch.tensor(padded, dtype=torch.long, device=dev)
            lens = torch.tensor(decode_lens, device=dev)
            meta.decode_lens = lens
            if not self.decode_kernel:
                meta.decode_mask = (torch.arange(width * bs, device=dev).unsqueeze(0) < lens.unsqueeze(1))[:, None, None, :]
        for q_start, q_end, table, computed in prefill_specs:
            q_len = q_end - q_start
            length = len(table) * bs
            limit = torch.arange(computed, computed + q_len, device=dev).unsqueeze(1)
            mask = torch.arange(length, device=dev).unsqueeze(0) <= limit
            meta.prefills.append(PrefillSlice(q_start, q_end, torch.tensor(table, dtype=torch.long, device=dev), mask,
                                              computed))
        input_ids = torch.tensor(ids, dtype=torch.long, device=dev)
        positions_t = torch.tensor(pos, dtype=torch.long, device=dev)
        return input_ids, positions_t, meta, sample_rows

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch) -> SampleResult | None:
        """Run the forward for every scheduled token and sample the sequences that reached their end.

        Sequences that asked for prompt_logprobs get this chunk's entries appended to
        `seq.prompt_logprobs` (None for the first prompt token, as vLLM reports it).
        """
        t0 = time.perf_counter()
        input_ids, positions, meta, sample_rows = self.prepare(batch)
        t1 = time.perf_counter()
        hidden = self.model(input_ids, positions, self.kv_caches, meta, self.fused)
        self._prompt_logprobs(batch, hidden)
        result = None
        if sample_rows:
            logits = self.model.compute_logits(hidden[sample_rows], self.model.int8_rows(batch.num_decodes, len(sample_rows)))
            t2 = time.perf_counter()
            sampling = [seq for (seq, _), s in zip(batch.items, batch.samples) if s]
            result = self.sampler(logits, sampling)
        else:
            t2 = time.perf_counter()
        t3 = time.perf_counter()
        self.last_phase_s = {"prepare": t1 - t0, "forward": t2 - t1, "sample": t3 - t2}
        return result

    def _prompt_logprobs(self, batch: ScheduledBatch, hidden: torch.Tensor) -> None:
        row = 0
        for seq, n in batch.items:
            start = seq.num_computed_tokens
            n_prompt = seq.num_prompt_tokens
            if seq.params.prompt_logprobs is not None and start < n_prompt:
                if seq.prompt_logprobs is None:
                    seq.prompt_logprobs = [None]
                # Position p predicts token p + 1; only prompt tokens after the first are scored.
                upto = min(start + n, n_prompt - 1)
                if upto > start:
                    logits = self.model.compute_logits(hidden[row:row + (upto - start)])
                    targets = seq.token_ids[start + 1:upto + 1]
                    seq.prompt_logprobs.extend(
                        token_logprobs(logits, targets, [seq.params.prompt_logprobs] * len(targets)))
            row += n

    @torch.inference_mode()
    def forward_logits(self, batch: ScheduledBatch) -> torch.Tensor:
        """Logits float32 [T, vocab] for every scheduled token (used by parity tests)."""
        input_ids, positions, meta, _ = self.prepare(batch)
        hidden = self.model(input_ids, positions, self.kv_caches, meta, self.fused)
        return self.model.compute_logits(hidden, self.model.int8_rows(meta.num_decodes, hidden.shape[0]))
