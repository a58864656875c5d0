"""The imported SmolLM2 folder vs transformers' own GGUF loader: same logits, same token ids."""

import functools

import pytest
import torch

from inference.engine.tokenizer import Tokenizer

CORPUS = [
    "Hello, world! This is plain ASCII.",
    "12345 3.14159 -42 1e10 2024-06-01 0x1F",
    "def f(x):\n    if x:\n        return [i for i in range(x)]\n\treturn None\n",
    "spaces   between    words     and\n\n\nnewlines \t\t tabs  ",
    "   leading spaces and trailing   ",
    "Accents: café, naïve, résumé, Ångström, São Paulo, Dvořák",
    "CJK: 日本語のテキスト、中文文本，한국어 텍스트",
    "Emoji: 👍🏽 🙂 👨‍👩‍👧 🇫🇷 ❤️",
    "don't I'll we've they're it's",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more <repo_name>x<file_sep>",
    "https://example.com/path?q=1&b=two#frag",
    "",
]


@pytest.fixture(scope="module", autouse=True)
def gguf_parsed_once():
    """transformers parses the GGUF anew for the tokenizer, the model's config and its weights (gguf-py's
    GGUFReader reads SmolLM2's 49,152 tokens and 48,900 merges field by field, about 5 CPU-s a parse on the
    2-vCPU EPYC), and builds gguf-py's tensor-name map again for each of the model's 397 submodules: here
    each file is parsed once and each map built once, for this module only. The reader is read-only (a
    memory map opened "r") and the map a lookup table, so transformers' results are the same; both are
    imported from gguf inside transformers' functions, at each call, which is where the patch reaches."""
    import gguf

    parse = gguf.GGUFReader

    @functools.cache
    def parsed_once(path, mode="r"):
        return parse(path, mode)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf, "GGUFReader", parsed_once)
        patch.setattr(gguf, "get_tensor_name_map", functools.cache(gguf.get_tensor_name_map))
        yield
    parsed_once.cache_clear()


@pytest.fixture(scope="module")
def hf_gguf_tokenizer(smollm2_gguf):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name)


@pytest.fixture(scope="module")
def ours(smollm2_dir):
    return Tokenizer.from_folder(smollm2_dir)


@pytest.mark.slow
@pytest.mark.parametrize("text", CORPUS)
def test_it_tokenizes_like_transformers_gguf_converter(text, ours, hf_gguf_tokenizer):
    ids = ours.encode(text)
    assert ids == hf_gguf_tokenizer(text, add_special_tokens=False).input_ids
    assert ours.decode(ids, skip_special_tokens=False) == text
    assert ours.decode(ids) == hf_gguf_tokenizer.decode(ids, skip_special_tokens=True)


@pytest.mark.slow
def test_it_has_the_special_tokens_transformers_finds(ours, hf_gguf_tokenizer):
    assert ours.vocab_size == len(hf_gguf_tokenizer)
    assert ours.bos_token == hf_gguf_tokenizer.bos_token
    assert ours.eos_token == hf_gguf_tokenizer.eos_token
    assert ours.eos_token_ids == [hf_gguf_tokenizer.eos_token_id]
    assert ours.chat_template == hf_gguf_tokenizer.chat_template
    hf_special = {t.content for t in hf_gguf_tokenizer.added_tokens_decoder.values() if t.special}
    assert set(ours.special_tokens) == hf_special


@pytest.mark.slow
def test_it_gives_the_logits_of_transformers_gguf_loader(ours, smollm2_dir, smollm2_gguf):
    from transformers import AutoModelForCausalLM

    ids = torch.tensor(
        [ours.encode_chat([{"role": "user", "content": "What is the capital of France?"}])]
    )
    with torch.no_grad():
        reference = AutoModelForCausalLM.from_pretrained(
            str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name, dtype=torch.float32
        )
        expected = reference(ids).logits
        del reference
        imported = AutoModelForCausalLM.from_pretrained(str(smollm2_dir), dtype=torch.float32)
        actual = imported(ids).logits
    assert actual.shape == expected.shape == (1, ids.shape[1], 49152)
    assert (actual - expected).abs().max().item() <= 1e-3
