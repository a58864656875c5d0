"""An embedding model: a sentence-transformers folder's tokenizer, BERT encoder and pooling, run whole.

Tokenization is tokenizer.json's with its own padding and truncation turned off (the folder's fixed
128-token padding would otherwise enter the mean): the over-length rule is the caller's, against
`max_input_tokens`.
"""
from __future__ import annotations

from pathlib import Path

import tokenizers
import torch

from .models.bert import BertEncoder, PackedBatch
from .pooling import PoolingSpec


class EmbeddingModel:
    """tokenizer (tokenizers.Tokenizer), encoder (BertEncoder), pooling (PoolingSpec), dimensions."""

    def __init__(self, path: str | Path, weights: str = "auto"):
        """Load the folder at `path` with its linears in `weights` (BertEncoder's: "auto", "float32",
        "bfloat16"). Raises
        ConfigError (not a servable encoder), FileNotFoundError (a file missing)."""
        path = Path(path)
        self.path = path
        self.encoder = BertEncoder.from_folder(path, weights)
        self.pooling = PoolingSpec.from_folder(path, self.encoder.cfg.max_position_embeddings)
        if not (path / "tokenizer.json").is_file():
            raise FileNotFoundError(f"{path / 'tokenizer.json'} does not exist")
        self.tokenizer = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        self.dimensions = self.encoder.cfg.hidden_size * len(self.pooling.modes)

    @property
    def max_input_tokens(self) -> int:
        """The most tokens one input may hold, special tokens included (sentence_bert_config.json)."""
        return self.pooling.max_seq_length

    @property
    def vocab_size(self) -> int:
        return self.encoder.cfg.vocab_size

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text with the post-processor's special tokens ([CLS] ... [SEP]), untruncated."""
        return [e.ids for e in self.tokenizer.encode_batch(texts, add_special_tokens=True)]

    def truncate(self, ids: list[int], limit: int, from_text: bool) -> list[int]:
        """`ids` cut to `limit` tokens: a text's as its tokenizer cuts (the first tokens, its closing
        special token kept: sentence-transformers' max_seq_length rule), a token-id input's last
        `limit` tokens (vLLM's truncate_prompt_tokens rule)."""
        if len(ids) <= limit:
            return ids
        if not from_text:
            return ids[-limit:]
        tail = self.tokenizer.post_process(self.tokenizer.encode("", add_special_tokens=False)).ids
        closing = tail[1:] if len(tail) >= 2 else []
        return ids[:limit - len(closing)] + closing

    def embed(self, sequences: list[list[int]]) -> torch.Tensor:
        """The pooled vectors float32 [len(sequences), dimensions] of token id lists (each non-empty,
        at most max_position_embeddings tokens), in one packed forward."""
        batch = PackedBatch.pack(sequences)
        return batch.restore(self.pooling.pool(self.encoder.forward(batch), batch.seq_lens))
