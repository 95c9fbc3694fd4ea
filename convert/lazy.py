"""Lazy tensors: sources read piece by piece while the checkpoint is written.

A converter does not load a model: it builds, per output tensor, a small tree
of lazy tensors (a tensor in a safetensors or .pth file, per-layer tensors
stacked, q/k rows permuted per head, model-parallel shards joined) and
write_checkpoint asks each for a block of rows at a time. Peak memory is then
a few blocks (checkpoint._CHUNK_BYTES each), whatever the model's size.

Interface: `shape` (the full shape) and `rows(a, b)`: rows a..b-1 of the
tensor's 2-D view (prod(shape[:-1]), shape[-1]) as a float32 array (a 1-D
tensor is one row).
"""

import math

import numpy as np

from convert.common import ExportError


def _view_rows(shape):
    return math.prod(shape[:-1]) if len(shape) > 1 else 1


class _ArrayTensor:
    """An in-memory array (or a numpy memory map) behind the lazy interface."""

    def __init__(self, a):
        self.a, self.shape = a, tuple(a.shape)

    def rows(self, a, b):
        flat = self.a.reshape(_view_rows(self.shape), self.shape[-1])
        return np.asarray(flat[a:b], dtype=np.float32)


class _Stacked:
    """Equal-shaped parts (one per layer) stacked on a new first axis."""

    def __init__(self, parts):
        self.parts = parts
        self.shape = (len(parts),) + tuple(parts[0].shape)
        self.part_rows = _view_rows(parts[0].shape)

    def rows(self, a, b):
        out, r = [], a
        while r < b:
            i, off = divmod(r, self.part_rows)
            n = min(b - r, self.part_rows - off)
            out.append(self.parts[i].rows(off, off + n))
            r += n
        return out[0] if len(out) == 1 else np.concatenate(out)


def head_permutation(n_heads, head_size, rot_dim, to_interleaved):
    """Row order that converts q/k weights between the two RoPE layouts
    (docs/rope.md §4.2): out_row j = in_row perm[j], within each head, on the
    first rot_dim rows of the head (the rest are not rotated and stay).

    to_interleaved=True undoes Hugging Face's permutation (llama2.c's
    permute_reverse): in a head, neox row c*(rot/2)+i becomes row 2i+c.
    to_interleaved=False applies it (Meta -> Hugging Face layout)."""
    half = rot_dim // 2
    one = np.arange(head_size)
    pair, comp = np.arange(half).repeat(2), np.tile([0, 1], half)  # row 2i+c -> (i, c)
    if to_interleaved:
        one[:rot_dim] = comp * half + pair            # row 2i+c comes from c*half+i
    else:
        one[comp * half + pair] = np.arange(rot_dim)  # row c*half+i comes from 2i+c
    return (np.arange(n_heads)[:, None] * head_size + one[None, :]).reshape(-1)


def permute_heads(w, n_heads, rot_dim=None, to_interleaved=True):
    """w (n_heads*head_size, cols) with its rows reordered by head_permutation.
    For wk, n_heads must be the number of KEY/VALUE heads."""
    hs = w.shape[0] // n_heads
    if hs * n_heads != w.shape[0]:
        raise ExportError(f"{w.shape[0]} rows do not split into {n_heads} heads")
    return w[head_permutation(n_heads, hs, rot_dim or hs, to_interleaved)]


class _HeadPermuted:
    """A q or k projection (n_heads*head_size, dim) with its rows permuted per
    head (head_permutation). Reads whole heads, returns the rows asked for."""

    def __init__(self, src, n_heads, rot_dim, to_interleaved):
        self.src, self.shape = src, tuple(src.shape)
        self.hs = self.shape[0] // n_heads
        self.perm = head_permutation(n_heads, self.hs, rot_dim, to_interleaved)

    def rows(self, a, b):
        h0, h1 = a // self.hs, -(-b // self.hs)
        block = self.src.rows(h0 * self.hs, h1 * self.hs)
        return block[self.perm[a:b] - h0 * self.hs]


def _as_lazy(value):
    if hasattr(value, "rows") and hasattr(value, "shape") and not isinstance(value, np.ndarray):
        return value
    a = value if isinstance(value, np.ndarray) else np.asarray(value)
    if not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
        raise ExportError(f"dtype {a.dtype}, expected a real number type")
    if a.ndim == 0:
        raise ExportError("no dimensions, expected an array")
    return _ArrayTensor(a)
