"""The transformers reference of `make bench` on the workload's own prompts (a tiny model, for speed)."""
import pytest
import torch

from inference.bench.references import hf_same_prompts
from tests.engine.tiny_models import make_tiny_model


def test_same_prompt_reference_counts_only_the_requested_tokens_as_goodput(tmp_path):
    folder = make_tiny_model("llama", tmp_path / "llama")
    r = hf_same_prompts(folder, torch.float32, [[5, 6, 7, 8, 9], [10, 11]], [3, 6])
    assert set(r) == {"goodput_tok_s", "raw_tok_s"}
    # both rows ran to the longest request (6 tokens): 9 of the 12 generated tokens were asked for
    assert r["goodput_tok_s"] / r["raw_tok_s"] == pytest.approx(9 / 12)


def test_single_prompt_reference_reports_a_decode_only_rate(tmp_path):
    folder = make_tiny_model("llama", tmp_path / "llama")
    r = hf_same_prompts(folder, torch.float32, [[5, 6, 7, 8]], [8])
    assert r["decode_tok_s"] > 0 and r["goodput_tok_s"] == r["raw_tok_s"]
