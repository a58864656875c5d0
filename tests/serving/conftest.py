"""Fixtures of the serving tests."""
import pytest

from .streaming import smollm2_tokenizer_path


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    """SmolLM2's tokenizers.Tokenizer (for token-boundary splits); skips where the model is not pulled."""
    path = smollm2_tokenizer_path()
    if not path.exists():
        pytest.skip(f"no SmolLM2 tokenizer at {path}; run `manage.py pull_model "
                    "smollm2-135m-instruct` to test token-boundary splits")
    from tokenizers import Tokenizer
    return Tokenizer.from_file(str(path))
