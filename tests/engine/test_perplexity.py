"""The served path's perplexity stays that of the exact path (llama-perplexity's rule, a real text).

SmolLM2 with the GGUF's blocks and the default settings (int8 activation blocks, bfloat16 KV, the
compiled prefill rows) against the same weights dequantised to float32 with float32 KV through
torch's layers (transformers' logits: tests/engine/test_model_parity.py), over the first chunks of
the GPL-3 text every Debian machine carries. On the whole text (14 chunks) manage.py
bench_perplexity gives the served path 18.37, llama-perplexity on the GGUF 18.39; on 8 chunks the
served path 18.40 against the exact path's 18.34.
"""
from dataclasses import replace
from pathlib import Path

import pytest

from inference.bench.perplexity import chunk_tokens, engine_perplexity
from inference.engine.config import EngineConfig
from inference.engine.llm_engine import LLMEngine
from inference.engine.tokenizer import Tokenizer
from inference.management.commands.bench_perplexity import DEFAULT_TEXT


def test_chunks_follow_llama_perplexity():
    assert chunk_tokens(list(range(10)), 4) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert chunk_tokens(list(range(10)), 4, bos_id=99, max_chunks=1) == [[99, 1, 2, 3]]


@pytest.mark.slow
def test_the_served_path_is_within_one_percent_of_the_exact_path(smollm2_blocks_dir, smollm2_dir):
    text = Path(DEFAULT_TEXT)
    if not text.is_file():
        pytest.skip(f"{text} is missing (Debian's base-files installs it)")
    tokens = Tokenizer.from_folder(smollm2_blocks_dir).encode(text.read_text(), add_special_tokens=True)
    base = EngineConfig(model_path=str(smollm2_blocks_dir), speculative="off", enable_prefix_caching=False,
                        max_num_seqs=4, kv_cache_bytes=64 << 20)
    served = engine_perplexity(LLMEngine(base), tokens, 512, max_chunks=2)
    exact = engine_perplexity(LLMEngine(replace(base, model_path=str(smollm2_dir), weights="model",
                                                kv_cache_dtype="float32")), tokens, 512, max_chunks=2)
    assert served.scored == exact.scored == 2 * 255
    assert 5 < exact.value < 100  # a language model reading English, not noise
    assert abs(served.value / exact.value - 1) < 0.01, (served.value, exact.value)
