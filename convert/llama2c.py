"""Reads llama2.c's checkpoints ("version 0": a 28-byte header of 7 int32,
then float32 tensors) as memory maps."""

import math
import os
import struct

import numpy as np

from convert.checkpoint import MAGIC
from convert.common import ExportError, Source


LEGACY_HEADER_BYTES = 28  # llama2.c: 7 int32


def legacy_layout(dims):
    """[(name, shape)] of a llama2.c file with header dims (7 ints, vocab_size
    possibly negative), in file order, including the unused freq_cis tables."""
    dim, hidden, layers, heads, kv_heads, vocab, seq_len = dims
    hs = dim // heads
    kv_dim = kv_heads * hs
    out = [
        ("token_embedding", (abs(vocab), dim)),
        ("rms_att_weight", (layers, dim)),
        ("wq", (layers, dim, dim)),
        ("wk", (layers, kv_dim, dim)),
        ("wv", (layers, kv_dim, dim)),
        ("wo", (layers, dim, dim)),
        ("rms_ffn_weight", (layers, dim)),
        ("w1", (layers, hidden, dim)),
        ("w2", (layers, dim, hidden)),
        ("w3", (layers, hidden, dim)),
        ("rms_final_weight", (dim,)),
        ("freq_cis_real", (seq_len, hs // 2)),  # unused: RoPE is computed, not stored
        ("freq_cis_imag", (seq_len, hs // 2)),
    ]
    if vocab < 0:
        out.append(("wcls", (-vocab, dim)))
    return out


def read_llama2c(path):
    """Read a llama2.c (version 0) checkpoint as a Source (no tokenizer, no
    notes), its tensors read-only memory maps (nothing is loaded until
    written). The file size must match the header exactly. Raises ExportError
    naming the file."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise ExportError(f"{path}: is a directory, expected a llama2.c checkpoint")
    actual = os.path.getsize(path)  # raises FileNotFoundError, reported by main
    if actual < LEGACY_HEADER_BYTES:
        raise ExportError(f"{path}: {actual} bytes, too short for the llama2.c header "
                          f"({LEGACY_HEADER_BYTES} bytes)")
    with open(path, "rb") as f:
        head = f.read(LEGACY_HEADER_BYTES)
    if struct.unpack_from("<I", head)[0] == MAGIC:
        version = struct.unpack_from("<i", head, 4)[0]
        raise ExportError(f"{path}: already a version-{version} (LRPE) checkpoint, "
                          "not a llama2.c one")
    dims = struct.unpack("<7i", head)
    names = ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len")
    for name, v in zip(names, dims):
        if (abs(v) if name == "vocab_size" else v) <= 0:
            raise ExportError(f"{path}: header {name}={v} is not positive; "
                              "is this a llama2.c checkpoint?")
    dim, _, _, heads, kv_heads, vocab, _ = dims
    if dim % heads or heads % kv_heads or (dim // heads) % 2:
        raise ExportError(f"{path}: header dim={dim}, n_heads={heads}, n_kv_heads={kv_heads} "
                          "is not a valid shape; is this a llama2.c checkpoint?")
    layout = legacy_layout(dims)
    expected = LEGACY_HEADER_BYTES + 4 * sum(math.prod(s) for _, s in layout)
    if actual != expected:
        what = "truncated" if actual < expected else "has trailing bytes"
        raise ExportError(f"{path}: {what}: expected {expected} bytes for "
                          + ",".join(f"{n}={v}" for n, v in zip(names, dims))
                          + f", file has {actual}")
    tensors, offset = {}, LEGACY_HEADER_BYTES
    for name, shape in layout:
        if not name.startswith("freq_cis"):
            tensors[name] = np.memmap(path, dtype="<f4", mode="r", offset=offset, shape=shape)
        offset += 4 * math.prod(shape)
    cfg = dict(zip(names, dims))
    cfg["vocab_size"] = abs(vocab)
    # llama2.c's fixed conventions
    cfg.update(shared_classifier=vocab > 0, bos_id=1, eos_id=2, norm_eps=1e-5,
               rope_theta=10000.0, rope_layout="interleaved")
    return Source(cfg, tensors, None, [])
