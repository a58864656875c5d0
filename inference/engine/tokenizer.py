"""Tokenizer: a `tokenizers.Tokenizer` from an HF folder, with special tokens and chat template."""

from __future__ import annotations

import json
from pathlib import Path

import tokenizers

from .chat_template import ChatTemplateError, render_chat_template
from .model_folder import ModelFolder


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _token_text(value) -> str | None:
    # tokenizer_config.json writes a special token as a string or as a serialized AddedToken.
    if isinstance(value, dict):
        return value.get("content")
    return value


def _ids(value) -> list[int]:
    if value is None:
        return []
    return [int(value)] if isinstance(value, int) else [int(v) for v in value]


def _pick_template(value) -> str | None:
    # Some folders keep several named templates: [{"name": "default", "template": "..."}, ...].
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        return named.get("default") or next(iter(named.values()), None)
    return value


class Tokenizer:
    """Text <-> token ids for one model, plus what the server needs around that.

    Built from an HF folder: tokenizer.json (required), tokenizer_config.json
    (special token strings, chat_template), chat_template.jinja (overrides the
    config's template, as in transformers) and generation_config.json (eos ids).
    """

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        tokenizer_config: dict,
        generation_config: dict,
        chat_template: str | None = None,
    ):
        self.backend = backend
        self.bos_token = _token_text(tokenizer_config.get("bos_token"))
        self.eos_token = _token_text(tokenizer_config.get("eos_token"))
        self.pad_token = _token_text(tokenizer_config.get("pad_token"))
        self.unk_token = _token_text(tokenizer_config.get("unk_token"))
        self.chat_template = chat_template or _pick_template(tokenizer_config.get("chat_template"))
        added = backend.get_added_tokens_decoder()
        self.special_ids = frozenset(i for i, tok in added.items() if tok.special)
        self.special_tokens = [added[i].content for i in sorted(self.special_ids)]
        self.bos_token_id = self.token_to_id(self.bos_token)
        eos_ids = _ids(generation_config.get("eos_token_id"))
        eos_from_config = self.token_to_id(self.eos_token)
        if eos_from_config is not None:
            eos_ids.append(eos_from_config)
        self.eos_token_ids = list(dict.fromkeys(eos_ids))
        self._decoder = backend.decoder

    @classmethod
    def from_folder(cls, path: str | Path) -> Tokenizer:
        """Load from an HF model folder. Raises FileNotFoundError when tokenizer.json is missing."""
        path = Path(path)
        if not (path / "tokenizer.json").is_file():
            raise FileNotFoundError(f"{path / 'tokenizer.json'} does not exist")
        backend = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
        jinja_file = path / "chat_template.jinja"
        template = jinja_file.read_text(encoding="utf-8") if jinja_file.is_file() else None
        return cls(
            backend,
            _read_json(path / "tokenizer_config.json"),
            ModelFolder.read(path).generation_config,
            template,
        )

    @property
    def vocab_size(self) -> int:
        """Number of token ids, added tokens included."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids for `text`; add_special_tokens runs tokenizer.json's post-processor."""
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def count(self, text: str) -> int:
        """Number of tokens in `text` (no special tokens added)."""
        return len(self.encode(text))

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """The text of `ids`; special tokens (e.g. <|im_end|>) dropped when skip_special_tokens."""
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary string of one id (byte-level spelling, e.g. 'Ġhello'); None if unknown."""
        return self.backend.id_to_token(token_id)

    def token_to_id(self, token: str | None) -> int | None:
        """The id of a vocabulary string, or None."""
        return None if token is None else self.backend.token_to_id(token)

    def convert_ids_to_tokens(self, ids: list[int], skip_special_tokens: bool = False) -> list[str]:
        """Vocabulary strings of `ids` (out-of-range ids dropped)."""
        out = []
        for i in ids:
            if skip_special_tokens and i in self.special_ids:
                continue
            tok = self.backend.id_to_token(i)
            if tok is not None:
                out.append(tok)
        return out

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        """Vocabulary strings joined into text by the decoder (bytes -> UTF-8, lossy)."""
        if self._decoder is None:
            return " ".join(tokens)
        return self._decoder.decode(tokens)

    def apply_chat_template(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
        **kwargs,
    ) -> str:
        """The prompt text for a conversation, as transformers' apply_chat_template(tokenize=False).

        The special token strings (bos_token, eos_token, unk_token, pad_token) are
        template variables; kwargs (e.g. enable_thinking) add to or override them.
        Raises ChatTemplateError (a ValueError) when the template fails, or when
        the model has no chat template.
        """
        if not self.chat_template:
            raise ChatTemplateError("this model has no chat template")
        variables = {
            name: value
            for name, value in (
                ("bos_token", self.bos_token),
                ("eos_token", self.eos_token),
                ("unk_token", self.unk_token),
                ("pad_token", self.pad_token),
            )
            if value is not None
        }
        variables.update(kwargs)
        return render_chat_template(
            self.chat_template,
            messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            **variables,
        )

    def encode_chat(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
        **kwargs,
    ) -> list[int]:
        """Prompt token ids for a conversation (the template writes any BOS itself)."""
        return self.encode(
            self.apply_chat_template(messages, tools, add_generation_prompt, **kwargs)
        )
