"""Build a `tokenizers` byte-level BPE tokenizer from a GGUF file's tokenizer metadata.

A GGUF carries no tokenizer.json: it stores the vocabulary (`tokenizer.ggml.tokens`),
the merges, a token type per token and the name of the pre-tokenizer
(`tokenizer.ggml.pre`). This module rebuilds the tokenizer.json that
transformers' GGUF converter (`integrations/gguf/gguf_tokenizer_mapping.py`)
builds for the same file, so both produce the same ids.
"""

from __future__ import annotations

from functools import lru_cache

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

# llama.cpp's `llama_token_type` (gguf.constants.TokenType).
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4

# The split regex of Llama 3's tokenizer.json (also llama.cpp's "llama-bpe" pre-tokenizer).
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _gpt2_pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)


def _smollm_pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    # SmolLM's own tokenizer.json splits every digit apart before GPT-2's regex, as does
    # llama.cpp's "smollm" pre-tokenizer. transformers' converter uses GPT-2's regex alone;
    # the ids agree because no SmolLM token holds a digit next to any other character.
    return pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), _gpt2_pre_tokenizer()]
    )


def _llama3_pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
        ]
    )


# tokenizer.ggml.pre -> pre-tokenizer. A file without the key predates it and is GPT-2 style.
PRE_TOKENIZERS = {
    None: _gpt2_pre_tokenizer,
    "default": _gpt2_pre_tokenizer,
    "gpt2": _gpt2_pre_tokenizer,
    "smollm": _smollm_pre_tokenizer,
    "llama-bpe": _llama3_pre_tokenizer,
    "llama3": _llama3_pre_tokenizer,
    "smaug-bpe": _llama3_pre_tokenizer,
}


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (256 entries), from openai/gpt-2 encoder.py."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def build_tokenizer(
    tokens: list[str],
    merges: list[str],
    token_types: list[int],
    pre: str | None,
) -> Tokenizer:
    """A byte-level BPE `tokenizers.Tokenizer` for a GGUF vocabulary (tokenizer.ggml.model "gpt2").

    tokens: tokenizer.ggml.tokens (index = token id); merges: tokenizer.ggml.merges
    ("left right" strings, best first); token_types: tokenizer.ggml.token_type;
    pre: tokenizer.ggml.pre. CONTROL tokens become special added tokens and
    USER_DEFINED ones plain added tokens, as transformers' converter does.
    Raises ValueError for a pre-tokenizer name not in PRE_TOKENIZERS.
    """
    if pre not in PRE_TOKENIZERS:
        known = ", ".join(sorted(k for k in PRE_TOKENIZERS if k))
        raise ValueError(f"tokenizer.ggml.pre {pre!r} is not supported; supported: {known}")
    alphabet = set(bytes_to_unicode().values())
    spelling = bytes_to_unicode()
    # A token outside the byte alphabet is stored as plain text; spell it in bytes like the rest.
    vocab = {
        (tok if set(tok) <= alphabet else "".join(spelling[b] for b in tok.encode("utf-8"))): i
        for i, tok in enumerate(tokens)
    }
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False))
    tokenizer.pre_tokenizer = PRE_TOKENIZERS[pre]()
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)

    types = list(token_types) if token_types else [1] * len(tokens)
    # A CONTROL token outside the byte alphabet is a llama.cpp mislabel; transformers skips it too.
    control = [
        AddedToken(tok, normalized=False, special=True)
        for tok, kind in zip(tokens, types)
        if kind == TOKEN_TYPE_CONTROL and set(tok) <= alphabet
    ]
    user_defined = [
        AddedToken(tok, normalized=False, special=False)
        for tok, kind in zip(tokens, types)
        if kind == TOKEN_TYPE_USER_DEFINED and tok in vocab
    ]
    if control:
        tokenizer.add_special_tokens(control)
    if user_defined:
        tokenizer.add_tokens(user_defined)
    return tokenizer
