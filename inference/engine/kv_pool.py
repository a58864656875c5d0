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
        self._stacked = None  # every layer's K and V as one tensor, where they are one mapping of one shape
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
        if all(shape == shapes[0] for shape in shapes):
            # Every layer's K and V as one tensor [2 * layers, num_blocks, ...]: a block of all of them is one
            # strided slice (copy_blocks).
            self._stacked = flat.view(dtype).view(2 * len(shapes), *shapes[0])

    def copy_blocks(self, destinations: torch.Tensor, sources: torch.Tensor) -> bool:
        """Copy whole blocks, every layer's K and V: block destinations[j] <- sources[j] (int64 [n] each,
        destinations distinct), in one gather and scatter over the pool: every source is read before any
        destination is written (a block may be a source and, later in the list, a destination). Returns
        False, copying nothing, where the layers' tensors are not one mapping of one shape (CUDA, a window
        pool): the caller copies layer by layer."""
        if self._stacked is None:
            return False
        if len(destinations) == 1:
            self._stacked[:, int(destinations[0])].copy_(self._stacked[:, int(sources[0])])
        else:
            self._stacked[:, destinations] = self._stacked[:, sources]
        return True
