"""K-quant test helpers: a plain quantiser writing ggml's Q4_K / Q5_K / Q6_K super-block bytes (gguf-py
0.19 ships only their dequantizers), and the kernels' fast rule in torch (the reference they equal bit
for bit)."""
import numpy as np
import torch

from inference.engine.layers.blocks import BlockWeight

QK = 256


def _pack_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """The 12 bytes of 8 6-bit scales and mins (the inverse of gguf-py's Q4_K.get_scale_min): [n, 8] -> [n, 12]."""
    out = np.zeros((sc.shape[0], 12), dtype=np.uint8)
    for i in range(4):
        out[:, i] = sc[:, i] | ((sc[:, i + 4] >> 4) << 6)
        out[:, 4 + i] = m[:, i] | ((m[:, i + 4] >> 4) << 6)
        out[:, 8 + i] = (sc[:, i + 4] & 0x0F) | ((m[:, i + 4] & 0x0F) << 4)
    return out


def quantize_kquant(w: np.ndarray, fmt: str) -> np.ndarray:
    """w float [N, K] (K a multiple of 256) -> the GGUF bytes uint8 [N, K / 256 * super-block bytes].

    A plain round-to-nearest quantiser (not llama.cpp's search): Q4_K / Q5_K take each 32's min and
    max, Q6_K each 16's largest magnitude; the sub-block scales are quantised against the super-block's
    float16 d (and dmin)."""
    n, k = w.shape
    x = w.astype(np.float64).reshape(-1, QK)
    blocks = x.shape[0]
    if fmt == "q6_k":
        sub = x.reshape(blocks, 16, 16)
        amax_i = np.abs(sub).argmax(-1)
        peak = np.take_along_axis(sub, amax_i[..., None], -1)[..., 0]
        scale = -peak / 32.0  # the largest magnitude maps to -32 (as ggml does)
        d = (np.abs(scale).max(-1) / 127.0).astype(np.float16)
        df = d.astype(np.float64)
        sc = np.where(df[:, None] > 0, np.round(scale / np.where(df > 0, df, 1)[:, None]), 0).clip(-128, 127)
        step = df[:, None] * sc
        q = np.where(step[..., None] != 0, np.round(sub / np.where(step != 0, step, 1)[..., None]), 0)
        q = (q.clip(-32, 31) + 32).astype(np.uint8).reshape(blocks, QK)
        ql = np.zeros((blocks, 128), dtype=np.uint8)
        qh = np.zeros((blocks, 64), dtype=np.uint8)
        for wi in range(QK):
            h2, r = wi >> 7, wi & 127
            ql[:, 64 * h2 + (r & 63)] |= (q[:, wi] & 0x0F) << (4 * (r >> 6))
            qh[:, 32 * h2 + (r & 31)] |= (q[:, wi] >> 4) << (2 * (r >> 5))
        out = np.concatenate([ql, qh, sc.astype(np.int8).view(np.uint8), d.reshape(-1, 1).view(np.uint8)], axis=1)
        return out.reshape(n, -1)
    levels = 15 if fmt == "q4_k" else 31
    sub = x.reshape(blocks, 8, 32)
    lo = np.minimum(sub.min(-1), 0.0)
    scale = (sub.max(-1) - lo) / levels
    d = (scale.max(-1) / 63.0).astype(np.float16)
    dmin = ((-lo).max(-1) / 63.0).astype(np.float16)
    df, dmf = d.astype(np.float64), dmin.astype(np.float64)
    sc = np.where(df[:, None] > 0, np.round(scale / np.where(df > 0, df, 1)[:, None]), 0).clip(0, 63).astype(np.uint8)
    m = np.where(dmf[:, None] > 0, np.round(-lo / np.where(dmf > 0, dmf, 1)[:, None]), 0).clip(0, 63).astype(np.uint8)
    step = df[:, None] * sc
    q = np.where(step[..., None] > 0, np.round((sub + (dmf[:, None] * m)[..., None]) / np.where(step > 0, step, 1)[..., None]), 0)
    q = q.clip(0, levels).astype(np.uint8).reshape(blocks, QK)
    low = (q & 0x0F).reshape(blocks, 4, 2, 32)
    qs = (low[:, :, 0] | (low[:, :, 1] << 4)).reshape(blocks, 128)
    head = [d.reshape(-1, 1).view(np.uint8), dmin.reshape(-1, 1).view(np.uint8), _pack_scales(sc, m)]
    if fmt == "q5_k":
        hb = (q >> 4).reshape(blocks, 8, 32)
        qh = np.zeros((blocks, 32), dtype=np.uint8)
        for s in range(8):
            qh |= hb[:, s] << s
        head.append(qh)
    return np.concatenate(head + [qs], axis=1).reshape(n, -1)


def random_kquant(n: int, k: int, fmt: str, seed: int = 0) -> BlockWeight:
    """A [n, k] weight of gaussian values quantised to `fmt` by quantize_kquant."""
    w = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32)
    return BlockWeight.from_gguf(quantize_kquant(w, fmt), fmt)


def kquant_linear_reference(x: torch.Tensor, bw: BlockWeight) -> torch.Tensor:
    """kquant_gemm.c's fast rule in plain torch: each row's super-blocks of 256 quantised to int8 with
    dx = amax / 127 (x * (127 / amax), round half to even, clamped to 127), exact integer sums per
    (row, channel, super-block) -- Q4_K / Q5_K isum = sum_s sc * dot_s, msum = sum_s m * (sum of the 32
    activations); Q6_K isum = sum_s sc * (dot_s - 32 * sum of the 16) -- then, super-block by
    super-block, acc = acc + float(isum) * (d * dx) (and acc = acc - float(msum) * (dmin * dx))."""
    n, k = bw.shape
    ks = k // QK
    xs = x.float().view(x.shape[0], ks, QK)
    amax = xs.abs().amax(-1)
    inv = torch.where(amax > 0, torch.tensor(127.0) / amax, torch.zeros(()))
    a = torch.round(xs * inv.unsqueeze(-1)).clamp(-127, 127).to(torch.int64)
    dx = amax / 127.0
    f = bw.kquant_fields()
    q = f["q"].to(torch.int64)
    if bw.format == "q6_k":
        dot = torch.einsum("mbse,nbse->mnbs", a.view(-1, ks, 16, 16), q.view(n, ks, 16, 16))
        bs16 = a.view(-1, ks, 16, 16).sum(-1)
        isum = ((dot - 32 * bs16[:, None]) * f["sc"].to(torch.int64).view(n, ks, 16)[None]).sum(-1)
        msum = None
    else:
        dot = torch.einsum("mbse,nbse->mnbs", a.view(-1, ks, 8, 32), q.view(n, ks, 8, 32))
        isum = (dot * f["sc"].to(torch.int64).view(n, ks, 8)[None]).sum(-1)
        msum = torch.einsum("mbs,nbs->mnb", a.view(-1, ks, 8, 32).sum(-1), f["m"].to(torch.int64).view(n, ks, 8))
    d = f["d"].float()
    acc = torch.zeros(x.shape[0], n)
    for b in range(ks):
        acc = acc + isum[:, :, b].float() * (d[None, :, b] * dx[:, b:b + 1])
        if msum is not None:
            acc = acc - msum[:, :, b].float() * (f["dmin"].float()[None, :, b] * dx[:, b:b + 1])
    return acc
