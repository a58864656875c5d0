"""GGUF K-quants (Q4_K, Q5_K, Q6_K): the super-blocks read as gguf-py reads them, the kernels against
their rule bit for bit on every instruction-set path, stacks of formats in one linear, the import that
keeps them as shipped (and refuses a type the engine cannot run), and a tiny Llama GGUF's logits
against transformers on the dequantised weights."""
import ctypes
import json

import numpy as np
import pytest
import torch

from inference.engine import kernels
from inference.engine.checkpoints import import_gguf
from inference.engine.checkpoints.gguf import GGUFImportError
from inference.engine.config import ModelConfig
from inference.engine.kernels.build import build
from inference.engine.layers.blocks import BlockStack, BlockWeight, block_formats
from inference.engine.layers.fused_decode import FusedDecoder
from inference.engine.models.loader import load_model
from .isa_builds import narrower_builds as _narrower_builds
from .kquants import kquant_linear_reference, quantize_kquant, random_kquant

from .test_model_parity import reference_logits, run_ours

needs_kernels = pytest.mark.skipif(not kernels.available(), reason="no C compiler here to build the CPU kernels")
K_FORMATS = ("q4_k", "q5_k", "q6_k")


@pytest.mark.parametrize("fmt", K_FORMATS)
def test_the_test_quantiser_writes_what_gguf_dequantizes_and_blockweight_reads_it_so(fmt):
    from gguf import GGMLQuantizationType as QType
    from gguf.quants import dequantize

    w = np.random.default_rng(3).standard_normal((24, 512)).astype(np.float32)
    raw = quantize_kquant(w, fmt)
    expected = dequantize(raw, getattr(QType, fmt.upper())).reshape(24, 512)
    # the layout is right: gguf's dequantizer gives back the weights within a quantisation step
    assert np.abs(expected - w).max() <= {"q4_k": 0.35, "q5_k": 0.17, "q6_k": 0.12}[fmt]
    bw = BlockWeight.from_gguf(raw, fmt)
    assert bw.shape == (24, 512) and torch.equal(bw.dequantize(), torch.from_numpy(expected))
    f = bw.kquant_fields()  # the integer fields give gguf's floats by its own steps
    d = f["d"].float().repeat_interleave(256, 1)
    if fmt == "q6_k":
        mine = (d * f["sc"].float().repeat_interleave(16, 1)) * (f["q"].to(torch.int16) - 32).float()
    else:
        dm = f["dmin"].float().repeat_interleave(256, 1) * f["m"].float().repeat_interleave(32, 1)
        mine = (d * f["sc"].float().repeat_interleave(32, 1)) * f["q"].float() - dm
    assert torch.equal(mine, bw.dequantize())


@needs_kernels
@pytest.mark.parametrize("fmt", K_FORMATS)
def test_kquant_rows_are_gguf_dequantize_exactly(fmt):
    bw = random_kquant(50, 512, fmt, seed=4)
    ids = torch.tensor([0, 49, 7, 7, 16, 31])
    assert torch.equal(kernels.block_rows(kernels.KernelWeight.from_blocks(bw), ids), bw.dequantize()[ids])


@needs_kernels
@pytest.mark.parametrize("fmt", K_FORMATS)
@pytest.mark.parametrize("n, k", [(96, 256), (37, 512), (576, 1536)])
def test_kquant_linear_follows_its_rule_bitwise_and_each_row_is_batch_independent(fmt, n, k):
    g = torch.Generator().manual_seed(n + k)
    bw = random_kquant(n, k, fmt, seed=n + k)
    kw = kernels.KernelWeight.from_blocks(bw)
    exact = bw.dequantize().double()
    for m in (1, 2, 3, 4, 5, 7, 9, 33, 70):  # every micro-kernel shape, remainders, two cache blocks
        x = torch.randn(m, k, generator=g)
        y = kernels.weight_linear(x, kw)
        assert y.shape == (m, n) and torch.equal(y, kquant_linear_reference(x, bw))
        # against float activations: within half an activation step per term
        ref = x.double() @ exact.T
        step = x.view(m, -1, 256).abs().amax(-1).double() / 127  # [m, super-blocks]
        bound = 0.5 * torch.einsum("mb,nb->mn", step, exact.abs().view(n, -1, 256).sum(-1)) + 1e-4
        assert bool(((y.double() - ref).abs() <= bound).all())
        # the reference path: float32 activations on the dequantised super-blocks
        ye = kernels.weight_linear(x, kw.with_exact(True))
        assert (ye.double() - ref).abs().max().item() <= 1e-5 * max(1.0, ref.abs().max().item())
        for row in range(m):
            assert torch.equal(kernels.weight_linear(x[row:row + 1], kw)[0], y[row])
            assert torch.equal(kernels.weight_linear(x[row:row + 1], kw.with_exact(True))[0], ye[row])


@needs_kernels
@pytest.mark.parametrize("fmt", K_FORMATS)
def test_kquant_linear_keeps_zero_rows_zero_and_does_not_hide_inf_or_nan(fmt):
    kw = kernels.KernelWeight.from_blocks(random_kquant(40, 512, fmt))
    x = torch.randn(4, 512)
    x[1] = 0
    x[2, 5] = float("inf")
    x[3, 300] = float("nan")
    y = kernels.weight_linear(x, kw)
    assert torch.equal(y[1], torch.zeros(40))
    assert bool(y[2:].isnan().all())
    assert torch.equal(y[0], kernels.weight_linear(x[:1], kw)[0])


@needs_kernels
def test_a_stack_of_formats_gives_each_parts_own_outputs_bitwise():
    """A fused linear whose parts ship in different formats (Q4_K q and k beside a Q6_K v, or Q4_1 beside
    Q8_0) computes each part as that part alone would: the parts read the same quantised rows."""
    x = torch.randn(9, 512)
    for parts in ([random_kquant(40, 512, "q4_k", 1), random_kquant(24, 512, "q4_k", 2), random_kquant(19, 512, "q6_k", 3),
                   random_kquant(8, 512, "q5_k", 4)],
                  [BlockWeight.quantize(torch.randn(33, 512), "q4_1"), BlockWeight.quantize(torch.randn(16, 512), "q8_0")]):
        stack = BlockStack.of(parts)
        kw = kernels.KernelWeight.from_blocks(stack)
        assert kw.nbytes == sum(kernels.KernelWeight.from_blocks(p).nbytes for p in stack.parts)
        for exact in (False, True):
            y = kernels.weight_linear(x, kw.with_exact(exact))
            alone = [kernels.weight_linear(x, kernels.KernelWeight.from_blocks(p, exact)) for p in parts]
            assert torch.equal(y, torch.cat(alone, 1))
        ids = torch.tensor([0, 39, 40, 63, 64, stack.shape[0] - 1])
        ids = ids[ids < stack.shape[0]]
        assert torch.equal(kernels.block_rows(kw, ids), stack.dequantize()[ids])


@needs_kernels
@pytest.mark.parametrize("extra", _narrower_builds() or [pytest.param((), marks=pytest.mark.skip(
    reason="this CPU has neither AVX2 nor AVX-512 VNNI: the portable path is the only one and is tested above"))])
def test_every_instruction_set_path_gives_the_same_kquant_linear_bitwise(extra):
    """AVX-512 VNNI (vpdpbusd), AVX2 (vpmaddubsw + vpmaddwd) and portable builds sum the same integers
    and apply the same float steps per channel: one machine's build and its narrower ones agree."""
    lib = ctypes.CDLL(str(build(extra)))
    lib.metrale_block_isa.restype = ctypes.c_char_p
    assert lib.metrale_block_isa().decode() == ("avx2" if extra == ("-mno-avx512f",) else "portable")
    lib.metrale_weight_linear.argtypes = [ctypes.POINTER(kernels.KernelWeight.Struct)] + [ctypes.c_void_p] * 2 + [
        ctypes.c_long] * 3 + [ctypes.c_int]
    g = torch.Generator().manual_seed(9)
    stack = kernels.KernelWeight.from_blocks(BlockStack.of([random_kquant(32, 512, "q4_k", 5),
                                                            random_kquant(17, 512, "q6_k", 6)]))
    for fmt in K_FORMATS:
        for n, k in ((576, 1536), (37, 256)):
            kw = kernels.KernelWeight.from_blocks(random_kquant(n, k, fmt, seed=n))
            for m in (1, 2, 3, 8, 70):
                x = torch.randn(m, k, generator=g)
                for w in (kw, kw.with_exact(True)):
                    y = torch.empty(m, n)
                    lib.metrale_weight_linear(ctypes.byref(w.struct), x.data_ptr(), y.data_ptr(), m, n, k, 2)
                    assert torch.equal(y, kernels.weight_linear(x, w)), (extra, fmt, n, k, m, w.exact)
    x = torch.randn(5, 512, generator=g)
    y = torch.empty(5, 49)
    lib.metrale_weight_linear(ctypes.byref(stack.struct), x.data_ptr(), y.data_ptr(), 5, 49, 512, 2)
    assert torch.equal(y, kernels.weight_linear(x, stack))


def write_kquant_gguf(path, qtypes: dict[str, str], seed: int = 0, extra: dict | None = None) -> None:
    """A 2-layer llama GGUF (hidden 256, 4 heads, 2 KV heads, ffn 512, untied head) whose 2-D tensors are
    quantised as `qtypes` says per GGUF tensor-name part ("attn_q", "ffn_down", "token_embd", ...): a
    K-quant by quantize_kquant, another type by gguf-py's quantiser. extra: GGUF name -> (qtype name,
    float array) written in place of that tensor."""
    from gguf import GGMLQuantizationType as QType
    from gguf.quants import quantize

    from .conftest import tiny_gguf_writer, tiny_vocab

    rng = np.random.default_rng(seed)
    h, heads, kv, ffn, layers = 256, 4, 2, 512, 2
    tokens, merges, types = tiny_vocab()
    w = tiny_gguf_writer(path, "llama", h, heads, kv, ffn, layers, (tokens, merges, types))

    def add(name, *shape):
        value = (rng.standard_normal(shape) * (0.15 if len(shape) == 2 else 1.0)).astype(np.float32)
        if len(shape) == 1:
            value = 1.0 + 0.1 * value
        fmt = qtypes.get(name.split(".")[-2])
        if extra and name in extra:
            fmt, value = extra[name]
        if fmt in K_FORMATS:
            w.add_tensor(name, quantize_kquant(value, fmt), raw_dtype=getattr(QType, fmt.upper()))
        elif fmt:
            w.add_tensor(name, quantize(value, getattr(QType, fmt.upper())), raw_dtype=getattr(QType, fmt.upper()))
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


# llama.cpp's Q4_K_M mixes Q4_K with Q6_K for attn_v and ffn_down; Q5_K stands in for a Q5_K_M part.
KQ_MIXED = {"attn_q": "q4_k", "attn_k": "q4_k", "attn_v": "q6_k", "attn_output": "q5_k", "ffn_gate": "q4_k",
            "ffn_up": "q5_k", "ffn_down": "q6_k", "token_embd": "q4_k", "output": "q6_k"}


def test_import_keeps_the_kquants_as_shipped(tmp_path):
    from gguf import GGUFReader
    from safetensors.torch import load_file

    write_kquant_gguf(tmp_path / "m.gguf", KQ_MIXED)
    out = import_gguf(tmp_path / "m.gguf", tmp_path / "blocks", progress=False)
    floats = import_gguf(tmp_path / "m.gguf", tmp_path / "float", dtype="float32", progress=False)
    formats = block_formats(json.loads((out / "config.json").read_text()))
    assert formats["model.layers.1.self_attn.v_proj.weight"] == "q6_k"
    assert formats["model.layers.0.mlp.up_proj.weight"] == "q5_k"
    assert formats["model.embed_tokens.weight"] == "q4_k" and formats["lm_head.weight"] == "q6_k"
    assert len(formats) == 2 + 2 * 7
    state, reference = load_file(out / "model.safetensors"), load_file(floats / "model.safetensors")
    for name, fmt in formats.items():  # the super-blocks hold exactly the numbers the float import holds
        assert torch.equal(BlockWeight.pop_from(state, name, fmt).dequantize(), reference[name]), name
    assert set(state) == {n for n in reference if n not in formats}  # the norms stay float
    # the tensors are the file's bytes: the import copies, it does not requantise or dequantise
    reader = GGUFReader(tmp_path / "m.gguf")
    saved = load_file(out / "model.safetensors")
    for gguf_name, hf in (("blk.0.ffn_down.weight", "model.layers.0.mlp.down_proj"),
                          ("blk.1.attn_v.weight", "model.layers.1.self_attn.v_proj"), ("output.weight", "lm_head")):
        t = next(t for t in reader.tensors if t.name == gguf_name)
        assert torch.equal(saved[f"{hf}.qweight"], torch.from_numpy(np.asarray(t.data).copy()).view(torch.uint8))


def test_a_tensor_type_the_engine_cannot_run_is_refused_by_name(tmp_path):
    value = np.random.default_rng(1).standard_normal((512, 256)).astype(np.float32)
    write_kquant_gguf(tmp_path / "m.gguf", KQ_MIXED, extra={"blk.1.ffn_up.weight": ("tq2_0", value)})
    with pytest.raises(GGUFImportError, match=r"TQ2_0 \(1 tensors, e\.g\. blk\.1\.ffn_up\.weight\).*Q4_K"):
        import_gguf(tmp_path / "m.gguf", tmp_path / "model", progress=False)
    assert not (tmp_path / "model").exists() and not list(tmp_path.glob(".model*"))


@needs_kernels
def test_a_kquant_llama_runs_on_its_super_blocks_with_transformers_logits_on_the_dequantised_weights(tmp_path):
    """weights="model": the shipped super-blocks (stacks where q/k/v or gate/up mix formats) with float32
    activations, against transformers on the float import; weights="auto": the same super-blocks with
    int8 activations through the compiled decode step, close to it."""
    write_kquant_gguf(tmp_path / "m.gguf", KQ_MIXED)
    blocks = import_gguf(tmp_path / "m.gguf", tmp_path / "blocks", progress=False)
    floats = import_gguf(tmp_path / "m.gguf", tmp_path / "float", dtype="float32", progress=False)
    cfg = ModelConfig.from_folder(blocks)
    model = load_model(blocks, cfg, torch.float32, torch.device("cpu"), weights="auto")
    assert model.weight_formats == {"q6_k": 1 + 2, "q4_k+q6_k": 2, "q5_k": 2, "q4_k+q5_k": 2}
    assert all(lin.weight is None and lin.exact is None for lin in model.packed())  # no float copy
    assert FusedDecoder.supports(model, torch.float32)  # decode rows run through the compiled step
    shipped = sum(int(np.asarray(t).nbytes) for n, t in
                  __import__("safetensors.torch", fromlist=["load_file"]).load_file(blocks / "model.safetensors").items()
                  if n.endswith("qweight"))
    assert model.weight_bytes() <= 1.10 * shipped + 64 * 1024  # packed, not dequantised (norms aside)
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(3, 250, (40,), generator=g).tolist()
    decode = torch.randint(3, 250, (10,), generator=g).tolist()
    ref = reference_logits(floats, prompt + decode)
    for prefill in ("same", "model"):
        ours = run_ours(blocks, prompt, decode, chunk=16, prefill=prefill)
        assert (ours - ref).abs().max().item() <= 1e-4
    # int8 activations: on this random model as close as the per-32 formats' (Q8_0 weights there: KL mean
    # 0.011, max 0.057; here 0.009, 0.086)
    fast = run_ours(blocks, prompt, decode, chunk=16, weights="auto")
    log_p, log_q = torch.log_softmax(ref, -1), torch.log_softmax(fast, -1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)
    assert 0 < (fast - ref).abs().max().item() and kl.mean().item() <= 0.02 and kl.max().item() <= 0.2
