"""The KV cache's memory: one zero-filled pool per process, its pages committed as blocks are first written.

On the CPU the pool is a single private anonymous mapping (mmap): the kernel hands out
zero pages on first touch, so a server configured for 16k tokens of KV holds in RSS only
the blocks its traffic has written (a block freed and reused stays resident). Reading an
untouched page gives zeros, exactly what `torch.zeros` gave. Elsewhere (CUDA) the tensors
are `torch.zeros` on the device.
"""
from __future__ import annotations

import math
import mmap

import torch


class KVPool:
    """Per layer a (K, V) pair of tensors of `shape` [num_blocks, block_size, num_kv_heads, head_dim] in `dtype`
    (or of shapes[i] for layer i: layer groups with pools of their own sizes).

    `caches`: the list of pairs (what ModelRunner.kv_caches holds). `nbytes`: the pool's size in
    bytes. On the CPU all of them are views of one anonymous mapping, kept alive by this object.
    """

    def __init__(self, num_layers: int, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
                 shapes: list[tuple[int, ...]] | None = None):
        shapes = shapes or [shape] * num_layers
        item = torch.empty((), dtype=dtype).element_size()
        sizes = [math.prod(s) * item for s in shapes for _ in (0, 1)]  # K then V of each layer
        self.nbytes = sum(sizes)
        self._mapping = None
        if device.type != "cpu" or self.nbytes == 0:
            self.caches = [(torch.zeros(s, dtype=dtype, device=device),
                            torch.zeros(s, dtype=dtype, device=device)) for s in shapes]
            return
        self._mapping = mmap.mmap(-1, self.nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        flat = torch.frombuffer(self._mapping, dtype=torch.uint8)
        views, at = [], 0
        for size, s in zip(sizes, (s for s in shapes for _ in (0, 1))):
            views.append(flat[at:at + size].view(dtype).view(s))
            at += size
        self.caches = [(views[2 * i], views[2 * i + 1]) for i in range(len(shapes))]
