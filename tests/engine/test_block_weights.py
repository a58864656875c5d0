"""GGUF weight blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): the block kernels against their rule bit for bit on every
instruction-set path, the import that keeps a GGUF's blocks, the loader that quantises a float
checkpoint on request, and logits against transformers on the dequantised weights."""
import ctypes
import json
import math

import numpy as np
import pytest
import torch

from inference.engine import kernels
from inference.engine.checkpoints import import_gguf
from inference.engine.config import ModelConfig
from inference.engine.kernels.build import build
from inference.engine.layers.blocks import BlockWeight, block_formats
from inference.engine.models.loader import load_model
from .isa_builds import narrower_builds as _narrower_builds

from .test_model_parity import reference_logits, run_ours
from .tiny_models import make_tiny_model

needs_kernels = pytest.mark.skipif(not kernels.available(), reason="no C compiler here to build the CPU kernels")
FORMATS = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0")


def block_linear_reference(x: torch.Tensor, bw: BlockWeight) -> torch.Tensor:
    """The documented fast rule of kernels.weight_linear on blocks, in plain torch: each row's blocks of
    32 quantised to int8 with dx = amax / 127 (x * (127 / amax), round half to even), exact integer
    dot products per block with the weights' integer values, then, block by block in order,
    acc = acc + float(isum) * (d * dx) (+ m * (dx * float(sum a)) for Q4_1 and Q5_1)."""
    n, k = bw.shape
    xb = x.view(x.shape[0], -1, 32)
    amax = xb.abs().amax(-1)
    inv = torch.where(amax > 0, torch.tensor(127.0) / amax, torch.zeros(()))
    a = torch.round(xb * inv.unsqueeze(-1)).clamp(-127, 127).to(torch.int64)
    dx = amax / 127.0
    q = bw.code_values().to(torch.int64).view(n, -1, 32)
    if bw.format in ("q4_0", "q5_0"):
        q = q - (8 if bw.format == "q4_0" else 16)
    isum = torch.einsum("mbk,nbk->mnb", a, q)
    d = bw.scales.float()
    sa = dx * a.sum(-1).float()
    acc = torch.zeros(x.shape[0], n)
    for b in range(k // 32):
        acc = acc + isum[:, :, b].float() * (d[None, :, b] * dx[:, b:b + 1])
        if bw.format in ("q4_1", "q5_1"):
            acc = acc + bw.mins.float()[None, :, b] * sa[:, b:b + 1]
    return acc


@needs_kernels
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("n, k", [(96, 64), (100, 96), (17, 32), (576, 1536)])
def test_block_linear_follows_its_rule_bitwise_and_each_row_is_batch_independent(fmt, n, k):
    """Batches of the first m of 70 random rows, m in every micro-kernel shape, remainders and two cache
    blocks: each batch's rows are the rule's bit for bit (the rule is row by row: its 70 rows once) and
    each row's result alone, on the fast path and on the exact one."""
    g = torch.Generator().manual_seed(n + k)
    bw = BlockWeight.quantize(torch.randn(n, k, generator=g), fmt)
    kw = kernels.KernelWeight.from_blocks(bw)
    exact = bw.dequantize().double()
    x = torch.randn(70, k, generator=g)
    rule = block_linear_reference(x, bw)
    alone = torch.cat([kernels.weight_linear(x[row:row + 1], kw) for row in range(70)])
    alone_exact = torch.cat([kernels.weight_linear(x[row:row + 1], kw.with_exact(True)) for row in range(70)])
    # against float activations: within half an activation step per term
    ref = x.double() @ exact.T
    step = x.view(70, -1, 32).abs().amax(-1).double() / 127  # [70, blocks]
    bound = 0.5 * torch.einsum("mb,nb->mn", step, exact.abs().view(n, -1, 32).sum(-1)) + 1e-4
    for m in (1, 2, 3, 4, 5, 7, 9, 33, 70):
        y = kernels.weight_linear(x[:m], kw)
        assert y.shape == (m, n) and torch.equal(y, rule[:m]) and torch.equal(y, alone[:m])
        assert bool(((y.double() - ref[:m]).abs() <= bound[:m]).all())
        # the reference path: float32 activations on the dequantised blocks
        ye = kernels.weight_linear(x[:m], kw.with_exact(True))
        assert (ye.double() - ref[:m]).abs().max().item() <= 1e-5 * max(1.0, ref[:m].abs().max().item())
        assert torch.equal(ye, alone_exact[:m])


@needs_kernels
@pytest.mark.parametrize("fmt", FORMATS)
def test_block_rows_are_gguf_dequantize_exactly(fmt):
    from gguf import GGMLQuantizationType as QType
    from gguf.quants import dequantize, quantize

    w = torch.randn(50, 96, generator=torch.Generator().manual_seed(1)).numpy()
    qtype = getattr(QType, fmt.upper())
    data = quantize(w, qtype)
    expected = torch.from_numpy(dequantize(data, qtype)).reshape(50, 96)
    bw = BlockWeight.from_gguf(data.reshape(50, -1), fmt)
    assert torch.equal(bw.dequantize(), expected)
    ids = torch.tensor([0, 49, 7, 7, 16, 31])
    assert torch.equal(kernels.block_rows(kernels.KernelWeight.from_blocks(bw), ids), expected[ids])


@needs_kernels
def test_block_linear_keeps_zero_blocks_zero_and_does_not_hide_inf_or_nan():
    bw = BlockWeight.quantize(torch.randn(40, 64), "q4_1")
    kw = kernels.KernelWeight.from_blocks(bw)
    x = torch.randn(4, 64)
    x[1] = 0
    x[2, 5] = float("inf")
    x[3, 40] = float("nan")
    y = kernels.weight_linear(x, kw)
    assert torch.equal(y[1], torch.zeros(40))
    assert bool(y[2:].isnan().all())
    assert torch.equal(y[0], kernels.weight_linear(x[:1], kw)[0])




@needs_kernels
@pytest.mark.parametrize("extra", _narrower_builds() or [pytest.param((), marks=pytest.mark.skip(
    reason="this CPU has neither AVX2 nor AVX-512 VNNI: the portable path is the only one and is tested above"))])
def test_every_instruction_set_path_gives_the_same_block_linear_bitwise(extra):
    """AVX-512 VNNI (vpdpbusd), AVX2 (vpmaddubsw) and portable builds sum the same integers and
    apply the same float steps per channel: one machine's build and its narrower ones agree."""
    lib = ctypes.CDLL(str(build(extra)))
    lib.metrale_block_isa.restype = ctypes.c_char_p
    assert lib.metrale_block_isa().decode() == ("avx2" if extra == ("-mno-avx512f",) else "portable")
    lib.metrale_weight_linear.argtypes = [ctypes.POINTER(kernels.KernelWeight.Struct)] + [ctypes.c_void_p] * 2 + [
        ctypes.c_long] * 3 + [ctypes.c_int]
    g = torch.Generator().manual_seed(9)
    for fmt in FORMATS:
        for n, k in ((576, 576), (37, 64), (100, 1536)):
            kw = kernels.KernelWeight.from_blocks(BlockWeight.quantize(torch.randn(n, k, generator=g), fmt))
            for m in (1, 3, 8, 70):
                x = torch.randn(m, k, generator=g)
                for w in (kw, kw.with_exact(True)):
                    y = torch.empty(m, n)
                    lib.metrale_weight_linear(ctypes.byref(w.struct), x.data_ptr(), y.data_ptr(), m, n, k, 2)
                    assert torch.equal(y, kernels.weight_linear(x, w)), (extra, fmt, n, k, m, w.exact)


def write_block_gguf(path, qtypes: dict[str, str], seed: int = 0, file_type: int | None = None) -> None:
    """A 2-layer llama GGUF (hidden 64, 4 heads, 2 KV heads, ffn 96, untied head) whose 2-D tensors are
    quantised as `qtypes` says per GGUF tensor-name part ("attn_q", "ffn_down", "token_embd", ...);
    `file_type`: its general.file_type (llama.cpp's LlamaFileType number), left out when None."""
    from gguf import GGMLQuantizationType as QType
    from gguf.quants import quantize

    from .conftest import tiny_gguf_writer, tiny_vocab

    rng = np.random.default_rng(seed)
    h, heads, kv, ffn, layers = 64, 4, 2, 96, 2
    tokens, merges, types = tiny_vocab()
    w = tiny_gguf_writer(path, "llama", h, heads, kv, ffn, layers, (tokens, merges, types))
    if file_type is not None:
        w.add_file_type(file_type)

    def add(name, *shape):
        value = (rng.standard_normal(shape) * (0.3 if len(shape) == 2 else 1.0)).astype(np.float32)
        if len(shape) == 1:
            value = 1.0 + 0.1 * value
        part = name.split(".")[-2]
        fmt = qtypes.get(part)
        if fmt:
            qtype = getattr(QType, fmt.upper())
            w.add_tensor(name, quantize(value, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, value)

    add("token_embd.weight", len(tokens), h)
    add("output_norm.weight", h)
    add("output.weight", len(tokens), h)
    for i in range(layers):
        for part, shape in (("attn_q", (h, h)), ("attn_k", (kv * h // heads, h)), ("attn_v", (kv * h // heads, h)),
                            ("attn_output", (h, h)), ("ffn_gate", (ffn, h)), ("ffn_up", (ffn, h)),
                            ("ffn_down", (h, ffn)), ("attn_norm", (h,)), ("ffn_norm", (h,))):
            add(f"blk.{i}.{part}.weight", *shape)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


MIXED = {"attn_q": "q4_1", "attn_k": "q4_1", "attn_v": "q4_1", "attn_output": "q4_0", "ffn_gate": "q4_0",
         "ffn_up": "q4_0", "ffn_down": "q8_0", "token_embd": "q8_0", "output": "q4_1"}
# llama.cpp's fallbacks where rows are not whole super-blocks (Gemma 3 270M's Q4_K_M: Q5_0 q / k / gate /
# up, Q8_0 v in some layers); ffn_gate in Q5_1 beside ffn_up in Q4_0 and attn_v in Q8_0 beside Q5_0 make
# their fused linears stacks of two formats.
MIXED_Q5 = {"attn_q": "q5_0", "attn_k": "q5_0", "attn_v": "q8_0", "attn_output": "q5_0", "ffn_gate": "q5_1",
            "ffn_up": "q4_0", "ffn_down": "q5_1", "token_embd": "q8_0", "output": "q5_0"}


def test_import_keeps_the_blocks_as_shipped(tmp_path):
    from gguf import GGUFReader
    from safetensors.torch import load_file

    write_block_gguf(tmp_path / "m.gguf", MIXED, file_type=3)   # llama.cpp's MOSTLY_Q4_1
    out = import_gguf(tmp_path / "m.gguf", tmp_path / "blocks", progress=False)
    floats = import_gguf(tmp_path / "m.gguf", tmp_path / "float", dtype="float32", progress=False)
    config = json.loads((out / "config.json").read_text())
    formats = block_formats(config)
    # The file's own name for its mix, which Ollama's /api/show and /api/tags report as quantization_level.
    assert config["quantization_config"]["file_type"] == "Q4_1"
    assert formats["model.layers.1.self_attn.q_proj.weight"] == "q4_1"
    assert formats["model.layers.0.mlp.up_proj.weight"] == "q4_0"
    assert formats["model.embed_tokens.weight"] == "q8_0" and formats["lm_head.weight"] == "q4_1"
    assert len(formats) == 2 + 2 * 7
    state, reference = load_file(out / "model.safetensors"), load_file(floats / "model.safetensors")
    for name, fmt in formats.items():  # the blocks hold exactly the numbers the float import holds
        assert torch.equal(BlockWeight.pop_from(state, name, fmt).dequantize(), reference[name]), name
    assert set(state) == {n for n in reference if n not in formats}  # the norms stay float
    # the codes are the file's bytes: the import copies, it does not requantise
    reader = GGUFReader(tmp_path / "m.gguf")
    down = next(t for t in reader.tensors if t.name == "blk.0.ffn_down.weight")
    q8 = load_file(out / "model.safetensors")["model.layers.0.mlp.down_proj.qweight"]
    assert torch.equal(q8.view(torch.uint8), torch.from_numpy(np.asarray(down.data).reshape(64, -1, 34)[..., 2:].copy()
                                                              ).reshape(64, -1))


@needs_kernels
@pytest.mark.parametrize("prefill", ["same", "model"])
def test_blocks_read_exactly_give_transformers_logits_on_the_dequantised_weights(tmp_path, prefill):
    """weights="model" on a block folder: the shipped blocks with float32 activations (the
    reference path), no float copy of any linear; transformers reads the float import."""
    write_block_gguf(tmp_path / "m.gguf", MIXED)
    blocks = import_gguf(tmp_path / "m.gguf", tmp_path / "blocks", progress=False)
    floats = import_gguf(tmp_path / "m.gguf", tmp_path / "float", dtype="float32", progress=False)
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(3, 250, (40,), generator=g).tolist()
    decode = torch.randint(3, 250, (10,), generator=g).tolist()
    ours = run_ours(blocks, prompt, decode, chunk=16, prefill=prefill)
    ref = reference_logits(floats, prompt + decode)
    assert (ours - ref).abs().max().item() <= 1e-4
    model = load_model(blocks, ModelConfig.from_folder(blocks), torch.float32, torch.device("cpu"))
    assert all(lin.weight is None and lin.exact is not None and lin.compact is None for lin in model.packed())
    # the fast path (int8 activation blocks) on the same blocks stays close
    fast = run_ours(blocks, prompt, decode, chunk=16, weights="auto")
    assert 0 < (fast - ours).abs().max().item() <= 0.1 * ours.abs().max().item()


@needs_kernels
def test_q5_blocks_and_stacks_of_formats_give_transformers_logits_on_the_dequantised_weights(tmp_path):
    """Q5_0 / Q5_1 blocks kept as shipped (stacks where q/k/v or gate/up mix formats): with float32
    activations transformers' logits on the float import; with int8 activations close to them."""
    write_block_gguf(tmp_path / "m.gguf", MIXED_Q5)
    blocks = import_gguf(tmp_path / "m.gguf", tmp_path / "blocks", progress=False)
    floats = import_gguf(tmp_path / "m.gguf", tmp_path / "float", dtype="float32", progress=False)
    formats = block_formats(json.loads((blocks / "config.json").read_text()))
    assert formats["model.layers.0.self_attn.q_proj.weight"] == "q5_0"
    assert formats["model.layers.1.mlp.down_proj.weight"] == "q5_1"
    model = load_model(blocks, ModelConfig.from_folder(blocks), torch.float32, torch.device("cpu"), weights="auto")
    assert model.weight_formats == {"q5_0": 1 + 2, "q5_0+q8_0": 2, "q5_1+q4_0": 2, "q5_1": 2}
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(3, 250, (40,), generator=g).tolist()
    decode = torch.randint(3, 250, (10,), generator=g).tolist()
    ours = run_ours(blocks, prompt, decode, chunk=16)
    ref = reference_logits(floats, prompt + decode)
    assert (ours - ref).abs().max().item() <= 1e-4
    fast = run_ours(blocks, prompt, decode, chunk=16, weights="auto")
    kl, _, _ = kl_and_agreement(ref, fast, margin=1.0)
    assert 0 < (fast - ref).abs().max().item() and kl.mean().item() <= 0.01


@needs_kernels
def test_the_loader_quantises_a_float_checkpoint_on_request(tmp_path):
    folder = make_tiny_model("llama3", tmp_path / "m")  # tied embeddings
    cfg = ModelConfig.from_folder(folder)
    model = load_model(folder, cfg, torch.float32, torch.device("cpu"), weights="q4")
    assert model.weight_formats == {"q8_0": 1, "q4_1": 4 * cfg.num_hidden_layers}
    assert all(lin.weight is None and lin.exact is None for lin in model.packed())  # no float copy left
    # the embedding rows are the head's Q8_0 values, read from its blocks
    from safetensors.torch import load_file

    embed = load_file(folder / "model.safetensors")["model.embed_tokens.weight"]
    q8 = BlockWeight.quantize(embed, "q8_0").dequantize()
    assert torch.equal(model.model.embed_tokens(torch.arange(cfg.vocab_size)), q8)
    q8_model = load_model(folder, cfg, torch.float32, torch.device("cpu"), weights="q8")
    assert q8_model.weight_formats == {"q8_0": 1 + 4 * cfg.num_hidden_layers}
    assert q8_model.weight_bytes() < model.weight_bytes() * 2 < load_model(
        folder, cfg, torch.float32, torch.device("cpu")).weight_bytes()


@needs_kernels
def test_smollm2_blocks_read_exactly_give_transformers_logits(smollm2_blocks_dir, smollm2_dir):
    """The GGUF's own Q4_1 / Q8_0 blocks with float32 activations (weights="model") against
    transformers on the same GGUF dequantised to float32 (smollm2_dir): 48 prompt rows (three blocks of
    16), then 4 decode steps in a fourth block; the exact form costs a full pass over the blocks a decode
    step. Measured 9e-5 at most, prompt and decode rows alike (as over 64 + 16 rows)."""
    tok_ids = list(range(1000, 1048))
    decode = list(range(2000, 2004))
    ours = run_ours(smollm2_blocks_dir, tok_ids, decode)
    ref = reference_logits(smollm2_dir, tok_ids + decode)
    assert (ours - ref).abs().max().item() <= 1e-3


def kl_and_agreement(exact: torch.Tensor, fast: torch.Tensor, margin: float) -> tuple[torch.Tensor, torch.Tensor, int]:
    """KL(exact || fast) per row in nats; whether the argmaxes agree on the rows where exact's
    top-two margin exceeds `margin`; and how many such rows there are."""
    log_p, log_q = torch.log_softmax(exact, -1), torch.log_softmax(fast, -1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)
    top2 = exact.topk(2, dim=-1).values
    confident = (top2[:, 0] - top2[:, 1]) > margin
    return kl, torch.equal(exact.argmax(-1)[confident], fast.argmax(-1)[confident]), int(confident.sum())


@needs_kernels
def test_smollm2_int8_activation_blocks_stay_close_to_float32_activations(smollm2_blocks_dir):
    """The default fast path (int8 activation blocks x the shipped Q4_1 / Q8_0 blocks, exact integer
    sums) against the same blocks with float32 activations, on every prompt and decode row. The float32
    activations' logits come from one prefill of the prompt and the decode tokens: the exact form gives
    their rows the same bits as prompt rows as it does as decode steps (measured), and a decode step of
    it costs several prompt rows (the whole run: half the CPU time)."""
    from inference.engine.tokenizer import Tokenizer

    tok = Tokenizer.from_folder(smollm2_blocks_dir)
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": "Name three rivers of Europe."}]))
    decode = tok.encode("Three rivers of Europe are the Danube, the Rhine and the Seine. The Danube flows "
                        "through Vienna and Budapest.")
    exact = run_ours(smollm2_blocks_dir, prompt + decode, [], chunk=24)
    fast = run_ours(smollm2_blocks_dir, prompt, decode, chunk=24, weights="auto")
    kl, agree, confident = kl_and_agreement(exact, fast, margin=1.0)
    assert kl.mean().item() <= 0.01 and kl.max().item() <= 0.1
    assert confident >= 20 and agree


def gguf_tensor_bytes(path) -> tuple[int, int, int]:
    """(the bytes of a GGUF file's tensors, each its element count at its type's block size; the bytes of the
    file's data section, from the aligned end of the header to the end of the file; the number of tensors),
    read from the header's tensor infos with the metadata values skipped by their lengths (gguf-py's
    GGUFReader makes arrays for each of the metadata's strings: SmolLM2's 49,152 tokens and 48,900 merges
    cost it seconds). Little-endian GGUF v2 / v3."""
    import mmap
    import struct

    from gguf.constants import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGMLQuantizationType, GGUFValueType

    sizes = {GGUFValueType.UINT8: 1, GGUFValueType.INT8: 1, GGUFValueType.BOOL: 1, GGUFValueType.UINT16: 2,
             GGUFValueType.INT16: 2, GGUFValueType.UINT32: 4, GGUFValueType.INT32: 4, GGUFValueType.FLOAT32: 4,
             GGUFValueType.UINT64: 8, GGUFValueType.INT64: 8, GGUFValueType.FLOAT64: 8}
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", data, 0)
        assert magic == b"GGUF" and version in (2, 3)
        off = 24

        def string(at):
            (n,) = struct.unpack_from("<Q", data, at)
            return at + 8 + n, bytes(data[at + 8:at + 8 + n])

        def skip(at, kind):
            if kind == GGUFValueType.STRING:
                return at + 8 + struct.unpack_from("<Q", data, at)[0]
            if kind == GGUFValueType.ARRAY:
                item, count = struct.unpack_from("<IQ", data, at)
                at += 12
                if item in sizes:
                    return at + count * sizes[item]
                for _ in range(count):
                    at = skip(at, item)
                return at
            return at + sizes[kind]

        alignment = GGUF_DEFAULT_ALIGNMENT
        for _ in range(n_kv):
            off, key = string(off)
            (kind,) = struct.unpack_from("<I", data, off)
            if key == b"general.alignment":
                (alignment,) = struct.unpack_from("<I", data, off + 4)
            off = skip(off + 4, kind)
        total = 0
        for _ in range(n_tensors):
            off, _name = string(off)
            (n_dims,) = struct.unpack_from("<I", data, off)
            dims = struct.unpack_from(f"<{n_dims}Q", data, off + 4)
            qtype, _offset = struct.unpack_from("<IQ", data, off + 4 + 8 * n_dims)
            off += 4 + 8 * n_dims + 12
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
            total += math.prod(dims) * type_size // block
        start = -(-off // alignment) * alignment
        return total, len(data) - start, n_tensors


@needs_kernels
def test_smollm2_resident_weights_are_the_ggufs_bytes(smollm2_blocks_dir, smollm2_gguf):
    """The default weights keep the GGUF's blocks: the resident bytes are at most 110% of the file's
    tensor bytes, the embedding rows come from the tied head's Q8_0 blocks, and no float copy stays."""
    gguf_bytes, data_bytes, count = gguf_tensor_bytes(smollm2_gguf)
    # the tensors fill the file's data section, less at most one alignment gap after each
    assert gguf_bytes <= data_bytes < gguf_bytes + 32 * count
    model = load_model(smollm2_blocks_dir, ModelConfig.from_folder(smollm2_blocks_dir), torch.float32,
                       torch.device("cpu"), weights="auto")
    assert model.weight_formats == {"q8_0": 1, "q4_1": 4 * 30}
    assert model.model.embed_tokens.weight_blocks is model.head.compact
    assert all(lin.weight is None and lin.exact is None for lin in model.packed())
    assert model.weight_bytes() <= 1.10 * gguf_bytes


def test_large_packed_weights_move_to_huge_page_memory_with_their_values():
    small = torch.arange(1000, dtype=torch.int32)
    assert kernels.resident(small) is small
    big = torch.randint(-128, 127, (kernels.HUGE_PAGE_BYTES + 100,), dtype=torch.int8)
    moved = kernels.resident(big)
    assert moved.data_ptr() != big.data_ptr() and moved.data_ptr() % (2 << 20) == 0
    assert torch.equal(moved, big)
    del big
    assert int(moved[-1]) == int(moved.clone()[-1])  # the mapping lives with the tensor
