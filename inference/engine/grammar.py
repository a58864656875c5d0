"""Grammar-constrained decoding with llguidance: compiled grammars (cached per tokenizer) and per-sequence state.

No torch here: serving compiles through this module (in a worker thread, never on the
engine thread); a sequence's state is `grammar_state.py` and the sampler's torch side
`grammar_mask.py`.

Why llguidance (measured on the 2-vCPU dev machine with SmolLM2's 49,152-token
vocabulary; the numbers are in the README's structured-outputs section): it builds a
grammar lazily (~1 ms per JSON schema against ~30 ms for xgrammar), computes a mask in
~26 µs median (xgrammar ~4 µs; both far below a ~60 ms CPU decode step), refuses the JSON
Schema keywords it cannot enforce (`uniqueItems`, `not`, `if`, `contains`, unknown
formats) where xgrammar compiles them and ignores them, and is one 3 MB wheel with no
dependencies (xgrammar needs transformers and triton, ~290 MB).

Lifecycle: `GrammarCompiler.submit(spec)` -> a future of `CompiledGrammar` (cached by
(spec, tokenizer)); serving puts it in `SamplingParams.structured` as a
`StructuredOutput`; the engine makes a `GrammarState` per sequence when the request is
added, masks its row before every draw (grammar_mask.apply_grammar_masks), feeds it each
accepted token (`GrammarState.accept`), and drops it when the sequence ends.
"""
from __future__ import annotations

import json
import logging
import threading
import time
import weakref
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import llguidance
import numpy as np

from .stats import GRAMMAR_COMPILE_S

log = logging.getLogger("metrale.engine")

# JSON is written the way json.dumps and OpenAI's models write it ({"a": 1, "b": [2, 3]}), with
# no free whitespace: flexible whitespace lets a small model pad with newlines until max_tokens.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
KINDS = ("json_schema", "regex", "lark", "ebnf", "choice")


class GrammarError(ValueError):
    """A grammar that cannot be compiled; the message names the problem (serving answers 400)."""


@dataclass(frozen=True, slots=True)
class GrammarSpec:
    """What to constrain to. kind: json_schema (text: the schema as JSON), regex (a Rust `regex`
    crate pattern, anchored at both ends), lark (llguidance's Lark dialect, which may embed
    `%json {...}` schemas), ebnf (GBNF as llama.cpp writes it, or Lark), choice (text: a JSON
    array of strings). Equal specs share one compiled grammar."""

    kind: str
    text: str

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown grammar kind {self.kind!r}")

    @classmethod
    def json_schema(cls, schema: dict | bool) -> GrammarSpec:
        """A spec for a JSON schema given as a decoded object (key order kept: it is the output's)."""
        return cls("json_schema", json.dumps(schema, separators=(",", ":"), ensure_ascii=False))

    @classmethod
    def choice(cls, options: list[str]) -> GrammarSpec:
        """Exactly one of `options` (vLLM's structured_outputs.choice)."""
        return cls("choice", json.dumps(list(options), ensure_ascii=False))

    def describe(self, limit: int = 80) -> str:
        """A short description for logs."""
        text = self.text if len(self.text) <= limit else self.text[:limit] + "..."
        return f"{self.kind} {text}"


def _llguidance_grammar(spec: GrammarSpec) -> str:
    """The llguidance grammar text of a spec. Raises GrammarError for input llguidance refuses outright."""
    try:
        if spec.kind == "json_schema":
            return llguidance.LLMatcher.grammar_from_json_schema(spec.text, defaults=JSON_OPTIONS)
        if spec.kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(spec.text)
        if spec.kind == "lark":
            return llguidance.LLMatcher.grammar_from_lark(spec.text)
        if spec.kind == "ebnf":
            return llguidance.grammar_from("grammar", spec.text)
        options = json.loads(spec.text)
        return llguidance.LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(o) for o in options))
    except ValueError as exc:
        raise GrammarError(first_line(str(exc))) from exc


def check_json_schema(schema: dict | bool) -> None:
    """Raise GrammarError when llguidance refuses the JSON schema (unknown keywords or formats,
    unsatisfiable, unresolvable $refs, ...). No tokenizer is needed (~0.1 ms for a small schema), so
    serving checks one schema at a time while validating, and can name the one at fault."""
    grammar = _llguidance_grammar(GrammarSpec.json_schema(schema))
    try:
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, None)
    except ValueError as exc:
        raise GrammarError(first_line(str(exc))) from exc
    if is_error:
        raise GrammarError(first_line(messages[0]))


class CompiledGrammar:
    """A validated grammar for one tokenizer: `new_matcher()` gives a fresh matcher per sequence.

    compile_s: seconds the compile took (grammar text, validation, first mask). mask_words: uint32
    words in one row of the token bitmask (ceil(vocab / 32)).
    """

    __slots__ = ("spec", "compile_s", "mask_words", "_template", "__weakref__")

    def __init__(self, spec: GrammarSpec, template: llguidance.LLMatcher, mask_words: int, compile_s: float):
        self.spec = spec
        self._template = template
        self.mask_words = mask_words
        self.compile_s = compile_s

    def new_matcher(self) -> llguidance.LLMatcher:
        """A matcher at the grammar's start (a copy of the compiled one: ~5 µs)."""
        return self._template.deep_copy()


def _build_tokenizer(tokenizer) -> llguidance.LLTokenizer:
    """llguidance's view of an inference.engine.tokenizer.Tokenizer (its tokenizer.json; ~0.3 s)."""
    eos = list(tokenizer.eos_token_ids) or None
    return llguidance.LLTokenizer(tokenizer.backend.to_str(), eos_token=eos)


class GrammarCompiler:
    """Compiles GrammarSpecs for one tokenizer in a worker thread, caching the results.

    The cache holds futures, least recently used dropped past `cache_size`, so concurrent
    requests for one schema share one compile; a spec the compiler refused is cached with its
    GrammarError (any other failure is not cached).
    The first compile also builds llguidance's tokenizer (~0.3 s for a 49k vocabulary).
    """

    def __init__(self, tokenizer, *, cache_size: int = 256, max_workers: int = 1):
        self.tokenizer = tokenizer
        self.cache_size = cache_size
        self._executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="metrale-grammar")
        # Re-entrant: a compile that ends at once runs its done-callback inside `submit`.
        self._lock = threading.RLock()
        self._cache: OrderedDict[GrammarSpec, Future] = OrderedDict()
        self._lltok: llguidance.LLTokenizer | None = None
        self._lltok_lock = threading.Lock()

    def submit(self, spec: GrammarSpec) -> Future:
        """A future of the CompiledGrammar (already done when cached). Its exception is GrammarError."""
        with self._lock:
            future = self._cache.get(spec)
            if future is not None:
                self._cache.move_to_end(spec)
                return future
            future = self._executor.submit(self._compile, spec)
            self._cache[spec] = future
            future.add_done_callback(lambda done, spec=spec: self._forget_if_broken(spec, done))
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
            return future

    def _forget_if_broken(self, spec: GrammarSpec, future: Future) -> None:
        # A GrammarError is the spec's own fault and stays cached; anything else may not recur.
        if future.cancelled() or not isinstance(future.exception() or GrammarError(), GrammarError):
            with self._lock:
                if self._cache.get(spec) is future:
                    del self._cache[spec]

    def compile(self, spec: GrammarSpec) -> CompiledGrammar:
        """Blocking compile (tests, benchmarks). Raises GrammarError."""
        return self.submit(spec).result()

    def _llguidance_tokenizer(self) -> llguidance.LLTokenizer:
        with self._lltok_lock:
            if self._lltok is None:
                self._lltok = _build_tokenizer(self.tokenizer)
            return self._lltok

    def _compile(self, spec: GrammarSpec) -> CompiledGrammar:
        lltok = self._llguidance_tokenizer()
        started = time.perf_counter()
        grammar = _llguidance_grammar(spec)
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, lltok)
        if is_error:
            raise GrammarError(first_line(messages[0]))
        matcher = llguidance.LLMatcher(lltok, grammar, log_level=0)
        words = (lltok.vocab_size + 31) // 32
        # The first mask builds the lexer; do it here, off the engine thread (the copies share it).
        first = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint32)
        if matcher.is_error():
            raise GrammarError(first_line(matcher.get_error()))
        if not first.any():
            raise GrammarError("the grammar allows no output at all")
        # The tokens it forces from the start (llguidance's fast-forward), followed on a copy: a grammar whose
        # start the parser cannot follow (a schema that requires itself without end: "Too many items") fails
        # here with its reason, not with an empty answer at every request's first token.
        probe = matcher.deep_copy()
        for token in probe.compute_ff_tokens():
            if probe.is_error() or not probe.consume_token(token):
                break
        if probe.is_error():
            raise GrammarError(f"the grammar cannot be followed from its start: {first_line(probe.get_error())}")
        elapsed_s = time.perf_counter() - started
        GRAMMAR_COMPILE_S.observe(elapsed_s)
        return CompiledGrammar(spec, matcher, words, elapsed_s)


def first_line(message: str) -> str:
    """The problem in an llguidance error message (the parser state, or a Rust panic's backtrace, that follows
    it is left out)."""
    return message.strip().split("\n<state>")[0].split("\n<backtrace>")[0].strip()


_compilers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_compilers_lock = threading.Lock()


def compiler_for(tokenizer) -> GrammarCompiler:
    """The process's GrammarCompiler for `tokenizer` (one per tokenizer object, made on first use)."""
    with _compilers_lock:
        compiler = _compilers.get(tokenizer)
        if compiler is None:
            compiler = _compilers[tokenizer] = GrammarCompiler(tokenizer)
        return compiler


__all__ = ["CompiledGrammar", "GrammarCompiler", "GrammarError", "GrammarSpec", "JSON_OPTIONS", "check_json_schema",
           "compiler_for", "first_line"]
