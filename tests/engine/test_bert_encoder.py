"""The BERT encoder and pooling against transformers' BertModel and sentence-transformers' encode."""
import json

import pytest
import torch
import torch.nn.functional as F

from inference.engine.config import ConfigError
from inference.engine.embedding_model import EmbeddingModel
from inference.engine.models.bert import BertConfig, BertEncoder, PackedBatch
from inference.engine.pooling import PoolingSpec
from tests.conftest import pulled_minilm

# Varied lengths: one token to past the model's 256-token limit, accents, CJK, emoji, code, digits.
TEXTS = [
    "a", "hello", "What is the capital of France?",
    "The quick brown fox jumps over the lazy dog. " * 4,
    "Ünïcödé 文字 emoji 🙂 " * 12, "def f(x):\n    return x ** 2  # squares\n",
    "3.14159 2.71828 1.41421 " * 20, "word " * 400, "  spaces   and\ttabs\n\nnewlines  ",
    "Retrieval-augmented generation combines a retriever with a generator.",
]


def tiny_config(**over) -> dict:
    cfg = {"model_type": "bert", "vocab_size": 99, "hidden_size": 32, "num_hidden_layers": 3,
           "num_attention_heads": 4, "intermediate_size": 64, "max_position_embeddings": 64,
           "type_vocab_size": 2, "layer_norm_eps": 1e-12, "hidden_act": "gelu"}
    cfg.update(over)
    return cfg


@pytest.fixture(scope="module")
def tiny_bert():
    from transformers import BertConfig as HFBertConfig, BertModel

    torch.manual_seed(0)
    model = BertModel(HFBertConfig(**tiny_config(), hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
                      add_pooling_layer=False).eval()
    return model


def test_it_equals_transformers_bert_on_packed_sequences_of_different_lengths(tiny_bert):
    enc = BertEncoder(BertConfig.from_dict(tiny_config()), tiny_bert.state_dict(), "float32")
    torch.manual_seed(1)
    seqs = [torch.randint(0, 99, (n,)).tolist() for n in (1, 7, 7, 33, 64, 2)]
    types = [[0] * (n // 2) + [1] * (n - n // 2) for n in map(len, seqs)]
    batch = PackedBatch.pack(seqs, types)
    hidden = enc.forward(batch)
    assert batch.seq_lens == sorted(map(len, seqs))
    with torch.no_grad():
        for j, i in enumerate(batch.order):
            s, t = seqs[i], types[i]
            ref = tiny_bert(input_ids=torch.tensor([s]), token_type_ids=torch.tensor([t])).last_hidden_state[0]
            start = batch.starts[j]
            torch.testing.assert_close(hidden[start:start + len(s)], ref, atol=2e-6, rtol=1e-5)


def drain(units) -> tuple:
    """(the forward's result, how many units it yielded) of a BertEncoder.units generator run to its end."""
    count = 0
    while True:
        try:
            next(units)
            count += 1
        except StopIteration as done:
            return done.value, count


def test_its_units_in_small_row_chunks_give_the_whole_forward(tiny_bert):
    enc = BertEncoder(BertConfig.from_dict(tiny_config()), tiny_bert.state_dict(), "float32")
    seqs = [list(range(1, n + 1)) for n in (5, 9, 30)]
    batch = PackedBatch.pack(seqs)
    chunked, count = drain(enc.units(batch, lambda: 12))
    # Three layers, each at least: the 5 and 9 rows (a one-call group each with the kernels, else steps), then
    # the 30-row sequence, past a 12-row unit, in steps: 3 row chunks, its attention, 3 row chunks.
    assert count >= 1 + 3 * 9
    torch.testing.assert_close(chunked, enc.forward(batch), atol=1e-6, rtol=1e-6)


def test_it_refuses_configs_it_cannot_serve():
    with pytest.raises(ConfigError, match="position_embedding_type"):
        BertConfig.from_dict(tiny_config(position_embedding_type="relative_key"))
    with pytest.raises(ConfigError, match="hidden_act"):
        BertConfig.from_dict(tiny_config(hidden_act="swish"))
    with pytest.raises(ConfigError, match="not a BERT"):
        BertConfig.from_dict(tiny_config(model_type="llama"))


@pytest.mark.parametrize("mode", ["cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken",
                                  ("cls", "mean")])
def test_pooling_equals_sentence_transformers_pooling(mode, tmp_path):
    from sentence_transformers.sentence_transformer.modules import Pooling

    torch.manual_seed(2)
    lens = [1, 4, 9, 9]
    hidden = torch.randn(sum(lens), 16)
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "config.json").write_text(json.dumps({"pooling_mode": mode}))
    (tmp_path / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "p", "type": "sentence_transformers.models.Pooling"}]))
    ours = PoolingSpec.from_folder(tmp_path, 512).pool(hidden, lens)
    padded = torch.zeros(len(lens), max(lens), 16)
    mask = torch.zeros(len(lens), max(lens), dtype=torch.int64)
    start = 0
    for i, n in enumerate(lens):
        padded[i, :n], mask[i, :n] = hidden[start:start + n], 1
        start += n
    ref = Pooling(16, pooling_mode=mode)({"token_embeddings": padded, "attention_mask": mask})["sentence_embedding"]
    torch.testing.assert_close(ours, ref, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("lens", [[12], [1], [3, 7, 20]])
def test_normalized_pooling_is_f_normalize_of_the_pooled_rows_bit_for_bit(lens):
    import torch.nn.functional as F

    torch.manual_seed(3)
    hidden = torch.randn(sum(lens), 384) * 3
    for modes in (("mean",), ("cls", "mean")):
        pooled = PoolingSpec(modes, False, 512).pool(hidden, lens)
        assert torch.equal(PoolingSpec(modes, True, 512).pool(hidden, lens), F.normalize(pooled, p=2, dim=1))


@pytest.fixture(scope="module")
def minilm_reference():
    from sentence_transformers import SentenceTransformer

    path = pulled_minilm()
    st = SentenceTransformer(str(path), device="cpu")
    return path, torch.tensor(st.encode(TEXTS, batch_size=4))


@pytest.mark.parametrize("weights,floor", [("float32", 0.99999), ("auto", 0.999), ("bfloat16", 0.999)])
def test_minilm_embeddings_equal_sentence_transformers_encode(minilm_reference, weights, floor):
    path, ref = minilm_reference
    model = EmbeddingModel(path, weights)
    seqs = [model.truncate(ids, model.max_input_tokens, from_text=True) for ids in model.tokenize(TEXTS)]
    assert max(map(len, seqs)) == 256 and min(map(len, seqs)) == 3
    ours = model.embed(seqs)
    assert ours.shape == (len(TEXTS), 384) == tuple(ref.shape)
    cos = F.cosine_similarity(ours, ref)
    assert cos.min().item() >= floor, cos.tolist()
    torch.testing.assert_close(ours.norm(dim=1), torch.ones(len(TEXTS)), atol=1e-5, rtol=0)
