"""Build a `tokenizers` tokenizer from a GGUF file's tokenizer metadata.

A GGUF carries no tokenizer.json: it stores the vocabulary (`tokenizer.ggml.tokens`),
the merges, a token type per token and the name of the pre-tokenizer
(`tokenizer.ggml.pre`). For a byte-level BPE vocabulary ("gpt2") this module rebuilds the
tokenizer.json that transformers' GGUF converter (`integrations/gguf/gguf_tokenizer_mapping.py`)
builds for the same file, so both produce the same ids. For a SentencePiece vocabulary ("llama":
Llama 2, Gemma) it builds the BPE that gives llama.cpp's `llm_tokenizer_spm` ids (build_spm_tokenizer).
"""

from __future__ import annotations

from functools import lru_cache

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

# llama.cpp's `llama_token_type` (gguf.constants.TokenType).
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_USER_DEFINED = 4
TOKEN_TYPE_BYTE = 6
SPM_SPACE = "\u2581"  # SentencePiece's "▁", which stands for a space in its pieces

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


def spm_merges(tokens: list[str], scores: list[float], token_types: list[int]) -> list[tuple[str, str]]:
    """The BPE merges that replay SentencePiece's merge order: every split (left, right) of a normal
    token into two tokens of the vocabulary, the merged token's score best first (ties by id).

    llama.cpp's `llm_tokenizer_spm` merges, at each step, the adjacent pair whose concatenation
    is the highest-scoring token of the vocabulary; a BPE whose merge ranks follow those scores
    merges the same pairs.
    """
    ids = {tok: i for i, tok in enumerate(tokens)}
    ranked = []
    for i, tok in enumerate(tokens):
        if len(tok) < 2 or (token_types and token_types[i] != TOKEN_TYPE_NORMAL):
            continue
        for cut in range(1, len(tok)):
            left, right = tok[:cut], tok[cut:]
            if left in ids and right in ids:
                ranked.append((-scores[i], i, ids[left], left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def build_spm_tokenizer(
    tokens: list[str],
    scores: list[float],
    token_types: list[int],
    add_bos: bool = True,
    bos_id: int | None = None,
    add_space_prefix: bool = True,
) -> Tokenizer:
    """A SentencePiece-style BPE `tokenizers.Tokenizer` with byte fallback for a GGUF vocabulary
    (tokenizer.ggml.model "llama"), giving llama.cpp's ids.

    tokens, scores, token_types: tokenizer.ggml.tokens / scores / token_type (index = id).
    The rules are llama.cpp's (src/llama-vocab.cpp): CONTROL tokens are special and USER_DEFINED
    ones are matched in the raw text before anything else (added tokens here); spaces become
    "▁" (a "▁" put in front first when add_space_prefix, tokenizer.ggml.add_space_prefix); the
    text is not split into words; merges follow the scores (spm_merges); a character no token
    spells falls back to its UTF-8 bytes' <0xXX> tokens. add_bos: the post-processor puts
    tokens[bos_id] first (encode(add_special_tokens=True)). Raises ValueError when the vocabulary
    has no byte tokens or scores do not match the tokens.
    """
    if len(scores) != len(tokens):
        raise ValueError("tokenizer.ggml.scores does not give one score per token")
    types = list(token_types) if token_types else [TOKEN_TYPE_NORMAL] * len(tokens)
    if sum(1 for t in types if t == TOKEN_TYPE_BYTE) < 256:
        raise ValueError("the SentencePiece vocabulary lacks the 256 byte-fallback tokens")
    vocab = {}
    for i, tok in enumerate(tokens):
        vocab.setdefault(tok, i)
    unk = next((tok for tok, kind in zip(tokens, types) if kind == 2), None)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=spm_merges(tokens, scores, types), unk_token=unk,
                                     byte_fallback=True, fuse_unk=True))
    steps = [normalizers.Prepend(SPM_SPACE)] if add_space_prefix else []
    tokenizer.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", SPM_SPACE)])
    decode = [decoders.Replace(SPM_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        decode.append(decoders.Strip(" ", 1, 0))
    tokenizer.decoder = decoders.Sequence(decode)
    if add_bos and bos_id is not None:
        bos = tokens[bos_id]
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)])
    tokenizer.add_special_tokens([AddedToken(tok, normalized=False, special=True)
                                  for tok, kind in zip(tokens, types) if kind == TOKEN_TYPE_CONTROL])
    tokenizer.add_tokens([AddedToken(tok, normalized=False, special=False)
                          for tok, kind in zip(tokens, types) if kind == TOKEN_TYPE_USER_DEFINED])
    return tokenizer
