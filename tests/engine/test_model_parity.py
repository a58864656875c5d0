"""Our forward (paged KV cache, chunked prefill, decode) equals transformers' on the same weights."""
import pytest
import torch

from inference.engine.block_manager import BlockManager
from inference.engine.config import ModelConfig
from inference.engine.model_runner import ModelRunner
from inference.engine.models.loader import load_model
from inference.engine.sampling_params import SamplingParams
from inference.engine.scheduler import Scheduler
from inference.engine.sequence import Sequence

from .tiny_models import make_tiny_model


def run_ours(folder, prompt, decode_tokens, *, chunk=512, block_size=16, dtype=torch.float32, kv_dtype=None,
             weights="model", prefill="same", device="cpu", logit_rows=None):
    """Logits float32 [len(prompt) + len(decode_tokens), V]: prefill in chunks, then one decode step per token.

    weights, prefill: EngineConfig.weights and prefill_weights. logit_rows: positions (of prompt + decode_tokens)
    whose logits alone are computed; then (hidden float32 [len(prompt) + len(decode_tokens), hidden_size] after
    the final norm, every row; logits float32 [len(logit_rows), V] in logit_rows' order) is returned."""
    cfg = ModelConfig.from_folder(folder)
    dev = torch.device(device)
    model = load_model(folder, cfg, dtype, dev, weights=weights, prefill=prefill)
    bm = BlockManager(64, block_size)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=chunk)
    runner = ModelRunner(model, cfg, 64, block_size, dev, kv_dtype or dtype)
    seq = Sequence("r", list(prompt), SamplingParams(temperature=0, max_tokens=len(decode_tokens) + 1))
    sched.add(seq)
    wanted = None if logit_rows is None else {p: i for i, p in enumerate(logit_rows)}
    rows, hidden_rows, picked = [], [], {}

    def forward(batch):
        if wanted is None:
            rows.append(runner.forward_logits(batch))
            return
        # ModelRunner.forward_logits with the LM head on the wanted rows only (one sequence: its rows in order)
        input_ids, positions, meta, _ = runner.prepare(batch)
        hidden = runner.model(input_ids, positions, runner.kv_caches, meta, runner.fused)
        hidden_rows.append(hidden.float())
        keep = [r for r, p in enumerate(positions.tolist()) if p in wanted]
        if keep:
            logits = model.compute_logits(hidden[keep], model.compact_rows(batch.num_decodes, len(keep)))
            picked.update(zip((wanted[int(positions[r])] for r in keep), logits))

    while seq.num_computed_tokens < len(prompt):
        batch = sched.schedule()
        forward(batch)
        for s, n in batch.items:
            s.num_computed_tokens += n
    for tok in decode_tokens:
        seq.token_ids.append(tok)
        batch = sched.schedule()
        assert batch.num_decodes == 1
        forward(batch)
        seq.num_computed_tokens += 1
    if wanted is None:
        return torch.cat(rows)
    return torch.cat(hidden_rows), torch.stack([picked[i] for i in range(len(logit_rows))])


def reference_logits(folder, tokens, dtype=torch.float32, device="cpu", logit_rows=None):
    """transformers' logits float32 [len(tokens), V] for the same weights (on `device`, in `dtype`).

    logit_rows: positions whose logits alone are computed (transformers' logits_to_keep); then (hidden float32
    [len(tokens), hidden_size], its final norm's output, every row; logits float32 [len(logit_rows), V])."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()
    ids = torch.tensor([tokens], device=device)
    with torch.no_grad():
        if logit_rows is None:
            return model(ids).logits[0].float()
        hidden = []
        hook = model.model.norm.register_forward_hook(lambda _m, _args, out: hidden.append(out[0].float()))
        try:
            logits = model(ids, logits_to_keep=torch.tensor(logit_rows, device=device)).logits[0].float()
        finally:
            hook.remove()
        return hidden[0], logits


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device on this machine"))])
@pytest.mark.parametrize("arch", ["llama", "llama3", "mistral", "qwen2", "qwen3", "gemma3"])
def test_it_matches_transformers_on_tiny_random_models(arch, device, tmp_path):
    """float32 within 1e-4 of transformers on the same device (chunked prefill too); bfloat16
    within 5e-2 of transformers' bfloat16. On CUDA these are the torch paths (SDPA, masks)."""
    folder = make_tiny_model(arch, tmp_path / arch)
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(3, 320, (64,), generator=g).tolist()
    decode = torch.randint(3, 320, (16,), generator=g).tolist()
    ours = run_ours(folder, prompt, decode, device=device)
    ref = reference_logits(folder, prompt + decode, device=device)
    assert ours.shape == ref.shape
    assert (ours - ref).abs().max().item() <= 1e-4
    chunked = run_ours(folder, prompt, decode, chunk=24, block_size=8, device=device)
    assert (chunked - ours).abs().max().item() <= 1e-4
    half = run_ours(folder, prompt, decode, dtype=torch.bfloat16, device=device)
    ref_half = reference_logits(folder, prompt + decode, dtype=torch.bfloat16, device=device)
    assert (half - ref_half).abs().max().item() <= 5e-2


def test_it_gives_the_same_logits_with_chunked_prefill(tmp_path):
    folder = make_tiny_model("qwen3", tmp_path / "m")
    prompt = torch.randint(3, 320, (100,), generator=torch.Generator().manual_seed(2)).tolist()
    one_shot = run_ours(folder, prompt, [5, 6, 7])
    chunked = run_ours(folder, prompt, [5, 6, 7], chunk=24, block_size=8)
    assert (one_shot - chunked).abs().max().item() <= 1e-4


def test_it_matches_transformers_on_smollm2(smollm2_dir):
    tok_ids = list(range(1000, 1064))
    decode = list(range(2000, 2016))
    ours = run_ours(smollm2_dir, tok_ids, decode)
    ref = reference_logits(smollm2_dir, tok_ids + decode)
    assert (ours - ref).abs().max().item() <= 1e-3


def test_it_keeps_int8_decode_close_to_float32_on_smollm2(smollm2_dir):
    """The int8 decode path is lossy by design (METRALE_DECODE_WEIGHTS=model is exact); this bounds the loss."""
    from inference.engine.tokenizer import Tokenizer

    tok = Tokenizer.from_folder(smollm2_dir)
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}]))
    decode = tok.encode("The capital of France is Paris. It is famous for the Eiffel Tower and the Louvre museum.")
    n = len(prompt)
    exact = run_ours(smollm2_dir, prompt, decode)
    fast = run_ours(smollm2_dir, prompt, decode, weights="int8", prefill="model")
    assert torch.equal(exact[:n], fast[:n])  # prefill rows keep the float32 weights
    err = (exact[n:] - fast[n:]).abs().max().item()
    assert err <= 1.5
    # Wherever the exact top-1 leads by more than twice the error, the int8 path picks it too.
    top2 = exact[n:].topk(2, dim=-1).values
    confident = (top2[:, 0] - top2[:, 1]) > 2 * err
    assert confident.sum() >= 3
    assert torch.equal(exact[n:].argmax(-1)[confident], fast[n:].argmax(-1)[confident])


def test_it_keeps_int8_prefill_close_to_float32_on_smollm2(smollm2_dir):
    """METRALE_PREFILL_WEIGHTS=int8 (int16 activations x int8 weights, exact sums) is lossy by
    design too; this bounds the loss on every prompt row and checks the decode rows that follow."""
    from inference.engine import kernels
    from inference.engine.tokenizer import Tokenizer

    if not kernels.available():
        pytest.skip("int8 prefill needs the compiled CPU kernels (no C compiler here)")
    tok = Tokenizer.from_folder(smollm2_dir)
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": "Name three rivers of Europe."}]))
    decode = tok.encode("Three rivers of Europe are the Danube, the Rhine and the Seine.")
    exact = run_ours(smollm2_dir, prompt, decode)
    fast = run_ours(smollm2_dir, prompt, decode, weights="int8")
    err = (exact - fast).abs().max().item()
    assert 0 < err <= 3.0  # logits here span about +-30; measured 2.24 on 2026-11-30
    log_p, log_q = torch.log_softmax(exact, -1), torch.log_softmax(fast, -1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)  # KL(exact || int8) per row, in nats
    assert kl.mean().item() <= 0.02 and kl.max().item() <= 0.15  # measured 0.008 and 0.053
    top2 = exact.topk(2, dim=-1).values
    confident = (top2[:, 0] - top2[:, 1]) > 2 * err
    assert confident.sum() >= 5
    assert torch.equal(exact.argmax(-1)[confident], fast.argmax(-1)[confident])


def test_int8_prefill_in_chunks_equals_one_shot(tmp_path):
    """The int8 linears are row-independent, so only attention's blocking differs between chunkings."""
    from inference.engine import kernels

    if not kernels.available():
        pytest.skip("int8 prefill needs the compiled CPU kernels (no C compiler here)")
    folder = make_tiny_model("llama", tmp_path / "m")
    prompt = torch.randint(3, 320, (100,), generator=torch.Generator().manual_seed(3)).tolist()
    one_shot = run_ours(folder, prompt, [5, 6, 7], weights="int8")
    chunked = run_ours(folder, prompt, [5, 6, 7], chunk=24, block_size=8, weights="int8")
    exact = run_ours(folder, prompt, [5, 6, 7])
    assert (one_shot - exact).abs().max().item() > 1e-4  # the int8 path did run
    assert (one_shot - chunked).abs().max().item() <= 1e-4
