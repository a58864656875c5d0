"""The official openai SDK's embeddings.create against a live daphne serving all-MiniLM-L6-v2 beside SmolLM2:
sentence-transformers' vectors in float and base64 (the SDK's default, decoded by it), several inputs, token-id
inputs, usage, and its error classes for the 400s and the 404."""
import openai
import pytest
import torch
import torch.nn.functional as F

from tests.conftest import pulled_minilm

pytestmark = pytest.mark.e2e

MODEL = "all-minilm-l6-v2"
TEXTS = ["The cat sat on the mat.", "Ünïcödé 文字 🙂", "def f(x): return x * 2",
         "Retrieval-augmented generation combines search with a language model. " * 8]


@pytest.fixture(scope="module")
def reference():
    from sentence_transformers import SentenceTransformer

    return torch.tensor(SentenceTransformer(str(pulled_minilm()), device="cpu").encode(TEXTS))


@pytest.fixture(scope="module")
def tokenizer():
    from inference.engine.embedding_model import EmbeddingModel

    return EmbeddingModel(pulled_minilm(), "float32")


@pytest.mark.parametrize("encoding_format", ["float", "base64", openai.NOT_GIVEN])
def test_it_returns_sentence_transformers_vectors(openai_client, reference, encoding_format):
    answer = openai_client.embeddings.create(model=MODEL, input=TEXTS, encoding_format=encoding_format)
    assert answer.model == MODEL and answer.object == "list"
    assert [d.index for d in answer.data] == list(range(len(TEXTS)))
    if encoding_format == "base64":  # asked for explicitly, the SDK hands the string over as it came
        import base64

        import numpy as np

        ours = torch.tensor(np.stack([np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") for d in answer.data]))
    else:  # float, or the SDK's own default: base64 requested and decoded by the SDK
        ours = torch.tensor([d.embedding for d in answer.data])
    assert ours.shape == (len(TEXTS), 384)
    assert F.cosine_similarity(ours, reference).min().item() >= 0.999
    assert answer.usage.prompt_tokens == answer.usage.total_tokens > len(TEXTS) * 3


def test_token_id_inputs_and_one_string(openai_client, reference, tokenizer):
    ids = tokenizer.tokenize(TEXTS[:2])
    by_ids = openai_client.embeddings.create(model=MODEL, input=ids)
    assert F.cosine_similarity(torch.tensor([d.embedding for d in by_ids.data]), reference[:2]).min() >= 0.999
    assert by_ids.usage.prompt_tokens == sum(map(len, ids))
    one_list = openai_client.embeddings.create(model=MODEL, input=ids[0])
    one_text = openai_client.embeddings.create(model=MODEL, input=TEXTS[0])
    assert len(one_list.data) == len(one_text.data) == 1
    assert one_list.data[0].embedding == pytest.approx(one_text.data[0].embedding, abs=1e-5)


def test_errors_reach_the_sdk_as_its_classes(openai_client):
    with pytest.raises(openai.BadRequestError) as bad:
        openai_client.embeddings.create(model=MODEL, input=["fine", ""])
    assert bad.value.body["param"] == "input[1]"
    with pytest.raises(openai.BadRequestError) as dims:
        openai_client.embeddings.create(model=MODEL, input="x", dimensions=64)
    assert "Matryoshka" in dims.value.body["message"]
    with pytest.raises(openai.BadRequestError) as long:
        openai_client.embeddings.create(model=MODEL, input="word " * 300)
    assert long.value.body["param"] == "input[0]"
    cut = openai_client.embeddings.create(model=MODEL, input="word " * 300, extra_body={"truncate_prompt_tokens": 16})
    assert cut.usage.prompt_tokens == 16
    with pytest.raises(openai.NotFoundError):
        openai_client.embeddings.create(model="text-embedding-3-small", input="x")


def test_models_lists_both(openai_client):
    assert [m.id for m in openai_client.models.list()] == ["smollm2-135m-instruct", MODEL]
