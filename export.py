#!/usr/bin/env python3
"""export.py: the only writer of checkpoints and tokenizers for `run`.

The checkpoint format (version 1, magic "LRPE") is documented field by field in
the top comment of model.h. In short:

    256-byte header  magic, version, dimensions, shared-classifier flag, BOS/EOS,
                     weight type, norm eps and every RoPE parameter; the rest zero
    tensors          float32, little-endian, row-major, in TENSOR_TABLE order,
                     each starting at a file offset that is a multiple of 64
                     (zero padding in between); the file ends where the last
                     tensor ends. With --dtype q8_0 (weight_type 1) the
                     matrices are int8 values, then float32 scales, one per
                     group_size values of a row (model.h, "q8_0 tensors")

The tokenizer is llama2.c's tokenizer.bin layout:

    i32 max_token_length, then per token: f32 score, i32 length, the bytes

Python API (numpy only; torch for Meta .pth files):
    write_checkpoint(path, cfg, tensors)   cfg: dict (see CONFIG_DEFAULTS); tensors:
                                           arrays or lazy tensors, streamed
    write_tokenizer(path, pieces, scores)
    read_llama2c(path) -> (cfg, tensors)   tensors are read-only memory maps
    read_hf(dir, layout) -> (cfg, tensors, notes)     Hugging Face Llama, lazy tensors
    read_meta(dir, layout, seq_len) -> (cfg, tensors, notes)   Meta consolidated.*.pth
    hf_config(config_dict) -> (cfg, notes) config.json -> our header fields
    read_safetensors_header(path) -> {name: lazy tensor}
    permute_heads(w, n_heads, rot_dim, to_interleaved)  the q/k row permutation
    random_tensors(cfg, seed) -> tensors   small random models for tests
    read_header(path) -> dict              the header of a version-1 file

Command line (docs/convert.md is the user's guide to the conversions):
    python3 export.py OUT --hf DIR                Hugging Face Llama directory
                                                  (config.json + safetensors)
    python3 export.py OUT --meta-llama DIR        Meta params.json + consolidated.*.pth
        [--rope-layout neox|interleaved]          q/k layout to write (default: the
                                                  source's: neox for HF, interleaved for Meta)
        [--seq-len N]                             training context to record
    python3 export.py OUT --llama2c IN.bin        convert a llama2.c checkpoint
    python3 export.py OUT --checkpoint IN.bin     re-export one of ours (e.g. --dtype q8_0)
    python3 export.py OUT --tokenizer FILE.model  sentencepiece -> tokenizer.bin
    python3 export.py OUT --random D,H,L,NH,NKV,V,S [--seed N] [--unshared] ...
                                                   random weights (tests, benchmarks)
    Any checkpoint source also takes
        [--dtype f32|q8_0] [--group-size N]       q8_0: int8 weights, a float32 scale
                                                  per N values (default 32, or the largest
                                                  power of two dividing dim and hidden_dim)

Conversions stream: each output tensor is read, converted to float32 and
written a block of rows at a time (see "Lazy tensors"), so memory stays at a
few tens of MB whatever the model's size (Meta .pth files: as torch.load
allows, see _torch_load). Progress goes to stderr when a job takes more than
2 seconds.

Every file is written atomically: into a temporary file beside OUT, renamed
over OUT only when complete. On any error the temporary file is removed, OUT is
left as it was, one line naming the file and the problem goes to stderr, and
the exit status is 1 (2 for bad usage).
"""

import argparse
import importlib.util
import json
import math
import os
import struct
import sys
import time

import numpy as np

MAGIC = 0x4550524C  # the bytes "LRPE" read as a little-endian u32
VERSION = 1
HEADER_BYTES = 256
ALIGN = 64
LEGACY_HEADER_BYTES = 28  # llama2.c: 7 int32
WEIGHT_F32 = 0
WEIGHT_TYPES = ("f32", "q8_0")  # index = weight_type in the header
Q8_DEFAULT_GROUP = 32

ROPE_LAYOUTS = ("interleaved", "neox")  # index = value in the header
ROPE_SCALINGS = ("none", "linear", "ntk", "dynamic", "yarn", "llama3")

# The header, in model.h's order. Each entry: (name, struct code). Fields that
# are not in the user-facing config (magic, version, weight_type, group_size)
# are filled in by _pack_header.
HEADER_FIELDS = [
    ("magic", "I"),
    ("version", "i"),
    ("dim", "i"),
    ("hidden_dim", "i"),
    ("n_layers", "i"),
    ("n_heads", "i"),
    ("n_kv_heads", "i"),
    ("vocab_size", "i"),
    ("seq_len", "i"),
    ("shared_classifier", "i"),
    ("bos_id", "i"),
    ("eos_id", "i"),
    ("weight_type", "i"),
    ("group_size", "i"),
    ("norm_eps", "f"),
    ("rope_theta", "f"),
    ("rope_layout", "i"),
    ("rot_dim", "i"),
    ("rope_scaling", "i"),
    ("rope_factor", "f"),
    ("rope_orig_ctx", "i"),
    ("yarn_beta_fast", "f"),
    ("yarn_beta_slow", "f"),
    ("yarn_attn_factor", "f"),
    ("llama3_low_freq", "f"),
    ("llama3_high_freq", "f"),
]
HEADER_STRUCT = struct.Struct("<" + "".join(code for _, code in HEADER_FIELDS))
assert HEADER_STRUCT.size == 104  # fields end at offset 104; 104..255 reserved, zero

# Required config keys, then the optional ones with their defaults.
CONFIG_REQUIRED = ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads",
                   "vocab_size", "seq_len")
CONFIG_DEFAULTS = {
    "shared_classifier": True,
    "bos_id": 1,
    "eos_id": 2,
    "norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "rope_layout": "interleaved",
    "rot_dim": None,             # None = head_size (full rotary)
    "rope_scaling": "none",
    "rope_factor": 1.0,
    "rope_orig_ctx": 0,          # 0 = seq_len
    "yarn_beta_fast": 32.0,
    "yarn_beta_slow": 1.0,
    "yarn_attn_factor": 0.0,     # 0 = derive 0.1 ln s + 1
    "llama3_low_freq": 1.0,
    "llama3_high_freq": 4.0,
    "weight_type": "f32",        # f32 | q8_0 (or the header's 0 | 1)
    "group_size": 0,             # q8_0: values per scale; 0 = the default (Q8_DEFAULT_GROUP,
                                 # or the largest power of two below it dividing dim and hidden_dim)
}

# The tensor order of the format. run.c's `weight_table` walks the same list to
# assign its pointers: reordering one side without the other is a format change.
# Each entry: (name, shape as a function of the config, matrix?). Matrices
# are quantized when weight_type is q8_0 (run.c: a Matrix entry); the norm
# weights always stay float32.
TENSOR_TABLE = [
    ("token_embedding",  lambda c: (c["vocab_size"], c["dim"]), True),
    ("rms_att_weight",   lambda c: (c["n_layers"], c["dim"]), False),
    ("wq",               lambda c: (c["n_layers"], c["dim"], c["dim"]), True),
    ("wk",               lambda c: (c["n_layers"], _kv_dim(c), c["dim"]), True),
    ("wv",               lambda c: (c["n_layers"], _kv_dim(c), c["dim"]), True),
    ("wo",               lambda c: (c["n_layers"], c["dim"], c["dim"]), True),
    ("rms_ffn_weight",   lambda c: (c["n_layers"], c["dim"]), False),
    ("w1",               lambda c: (c["n_layers"], c["hidden_dim"], c["dim"]), True),  # gate
    ("w2",               lambda c: (c["n_layers"], c["dim"], c["hidden_dim"]), True),  # down
    ("w3",               lambda c: (c["n_layers"], c["hidden_dim"], c["dim"]), True),  # up
    ("rms_final_weight", lambda c: (c["dim"],), False),
    ("wcls",             lambda c: (c["vocab_size"], c["dim"]), True),  # only when not shared
]

INT32_MAX = 2**31 - 1


class ExportError(Exception):
    """A problem with an input or an argument; str() is one line for the user."""


def _kv_dim(c):
    return c["n_kv_heads"] * (c["dim"] // c["n_heads"])


def tensor_names(cfg):
    """The tensor names a checkpoint with this config holds, in file order."""
    return [name for name, _, _ in TENSOR_TABLE
            if name != "wcls" or not cfg["shared_classifier"]]


def _align(offset):
    return (offset + ALIGN - 1) // ALIGN * ALIGN


def is_quantized(cfg, name):
    """Whether tensor `name` is stored as q8_0 in a checkpoint with this config."""
    return cfg["weight_type"] == "q8_0" and dict((n, m) for n, _, m in TENSOR_TABLE)[name]


def tensor_layout(cfg):
    """[(name, shape, file offset, scales offset)] in file order, and the file size.

    The file size is the end of the last tensor: header, then each tensor at
    the next multiple of ALIGN. A q8_0 tensor is int8 values at `file offset`,
    then float32 scales at the next multiple of ALIGN; scales offset is None
    for float32 tensors."""
    cfg = normalize_config(cfg)
    shapes = dict((name, fn(cfg)) for name, fn, _ in TENSOR_TABLE)
    layout, offset = [], HEADER_BYTES
    for name in tensor_names(cfg):
        n = math.prod(shapes[name])
        offset = _align(offset)
        if is_quantized(cfg, name):
            scales = _align(offset + n)
            layout.append((name, shapes[name], offset, scales))
            offset = scales + 4 * (n // cfg["group_size"])
        else:
            layout.append((name, shapes[name], offset, None))
            offset += 4 * n
    return layout, offset


# ---------------------------------------------------------------------------
# Config validation

def normalize_config(cfg):
    """Return a complete, validated copy of cfg (defaults filled in, rope_layout
    and rope_scaling as names, rot_dim resolved). Raises ExportError."""
    unknown = set(cfg) - set(CONFIG_REQUIRED) - set(CONFIG_DEFAULTS)
    if unknown:
        raise ExportError("unknown config key(s): " + ", ".join(sorted(unknown)))
    missing = [k for k in CONFIG_REQUIRED if k not in cfg]
    if missing:
        raise ExportError("config is missing: " + ", ".join(missing))
    c = dict(CONFIG_DEFAULTS)
    c.update(cfg)

    for k in CONFIG_REQUIRED + ("bos_id", "eos_id", "rope_orig_ctx"):
        v = c[k]
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise ExportError(f"config {k}={v!r} is not an integer")
        c[k] = int(v)
    for k in CONFIG_REQUIRED:
        if not 0 < c[k] <= INT32_MAX:
            raise ExportError(f"config {k}={c[k]} must be positive (and fit in int32)")
    if c["dim"] % c["n_heads"]:
        raise ExportError(f"config dim={c['dim']} is not divisible by n_heads={c['n_heads']}")
    if c["n_heads"] % c["n_kv_heads"]:
        raise ExportError(f"config n_kv_heads={c['n_kv_heads']} does not divide "
                          f"n_heads={c['n_heads']}")
    head_size = c["dim"] // c["n_heads"]
    if c["rot_dim"] is None:
        c["rot_dim"] = head_size
    rot = c["rot_dim"]
    if isinstance(rot, bool) or not isinstance(rot, (int, np.integer)):
        raise ExportError(f"config rot_dim={rot!r} is not an integer")
    c["rot_dim"] = rot = int(rot)
    if rot < 2 or rot % 2 or rot > head_size:
        raise ExportError(f"config rot_dim={rot} must be even and in 2..head_size={head_size}"
                          + (" (head_size is odd)" if head_size % 2 else ""))
    c["shared_classifier"] = bool(c["shared_classifier"])
    for k in ("bos_id", "eos_id"):
        if not 0 <= c[k] < c["vocab_size"]:
            raise ExportError(f"config {k}={c[k]} is outside the vocabulary (0..{c['vocab_size'] - 1})")
    if c["rope_orig_ctx"] < 0 or c["rope_orig_ctx"] > INT32_MAX:
        raise ExportError(f"config rope_orig_ctx={c['rope_orig_ctx']} must be >= 0 (0 = seq_len)")

    layout = c["rope_layout"]
    if isinstance(layout, (int, np.integer)) and not isinstance(layout, bool) \
            and 0 <= layout < len(ROPE_LAYOUTS):
        layout = ROPE_LAYOUTS[layout]
    if layout not in ROPE_LAYOUTS:
        raise ExportError(f"config rope_layout={layout!r} must be one of {', '.join(ROPE_LAYOUTS)}")
    c["rope_layout"] = layout
    scaling = c["rope_scaling"]
    if isinstance(scaling, (int, np.integer)) and not isinstance(scaling, bool) \
            and 0 <= scaling < len(ROPE_SCALINGS):
        scaling = ROPE_SCALINGS[scaling]
    if scaling not in ROPE_SCALINGS:
        raise ExportError(f"config rope_scaling={scaling!r} must be one of "
                          f"{', '.join(ROPE_SCALINGS)}")
    c["rope_scaling"] = scaling

    for k in ("norm_eps", "rope_theta", "rope_factor", "yarn_beta_fast", "yarn_beta_slow",
              "yarn_attn_factor", "llama3_low_freq", "llama3_high_freq"):
        try:
            v = float(c[k])
        except (TypeError, ValueError):
            raise ExportError(f"config {k}={c[k]!r} is not a number") from None
        if not math.isfinite(v) or abs(v) > 3.4e38:
            raise ExportError(f"config {k}={c[k]!r} is not a finite float32")
        c[k] = v
    # the same ranges run.c's loader accepts
    if not 0 < c["norm_eps"] < 1:
        raise ExportError(f"config norm_eps={c['norm_eps']} must be in (0, 1)")
    if c["rope_theta"] <= 1:
        raise ExportError(f"config rope_theta={c['rope_theta']} must be > 1")
    if c["rope_factor"] < 1:
        raise ExportError(f"config rope_factor={c['rope_factor']} must be >= 1 (1 = unscaled)")
    if c["rope_scaling"] == "yarn" and not c["yarn_beta_fast"] > c["yarn_beta_slow"] > 0:
        raise ExportError(f"config yarn_beta_fast={c['yarn_beta_fast']}, yarn_beta_slow="
                          f"{c['yarn_beta_slow']}: expected beta_fast > beta_slow > 0")
    if c["rope_scaling"] == "llama3" and not c["llama3_high_freq"] > c["llama3_low_freq"] > 0:
        raise ExportError(f"config llama3_low_freq={c['llama3_low_freq']}, llama3_high_freq="
                          f"{c['llama3_high_freq']}: expected high > low > 0")
    if c["yarn_attn_factor"] < 0:
        raise ExportError(f"config yarn_attn_factor={c['yarn_attn_factor']} must be >= 0 "
                          "(0 = derive from the factor)")

    wt = c["weight_type"]
    if isinstance(wt, (int, np.integer)) and not isinstance(wt, bool) and 0 <= wt < len(WEIGHT_TYPES):
        wt = WEIGHT_TYPES[wt]
    if wt not in WEIGHT_TYPES:
        raise ExportError(f"config weight_type={wt!r} must be one of {', '.join(WEIGHT_TYPES)}")
    c["weight_type"] = wt
    gs = c["group_size"] or 0
    if isinstance(gs, bool) or not isinstance(gs, (int, np.integer)) or gs < 0:
        raise ExportError(f"config group_size={gs!r} must be a positive integer (0 = default)")
    gs = int(gs)
    if wt == "f32" and gs:
        raise ExportError(f"group_size {gs}: only q8_0 weights have groups")
    if wt == "q8_0":
        if gs == 0:  # the default: the largest power of two <= Q8_DEFAULT_GROUP dividing both
            gs = Q8_DEFAULT_GROUP
            while c["dim"] % gs or c["hidden_dim"] % gs:
                gs //= 2
        if c["dim"] % gs or c["hidden_dim"] % gs:
            raise ExportError(f"group_size {gs} must divide both dim={c['dim']} and "
                              f"hidden_dim={c['hidden_dim']}")
    c["group_size"] = gs
    return c


def _pack_header(c):
    values = dict(c)
    values.update(magic=MAGIC, version=VERSION, weight_type=WEIGHT_TYPES.index(c["weight_type"]),
                  shared_classifier=int(c["shared_classifier"]),
                  rope_layout=ROPE_LAYOUTS.index(c["rope_layout"]),
                  rope_scaling=ROPE_SCALINGS.index(c["rope_scaling"]))
    packed = HEADER_STRUCT.pack(*(values[name] for name, _ in HEADER_FIELDS))
    return packed + bytes(HEADER_BYTES - len(packed))


def read_header(path):
    """Read the header of a version-1 checkpoint back into a dict (every
    HEADER_FIELDS entry, rope_layout/rope_scaling as integers, plus
    'reserved_zero': whether bytes 104..255 are all zero). No validation."""
    with open(path, "rb") as f:
        raw = f.read(HEADER_BYTES)
    if len(raw) < HEADER_BYTES:
        raise ExportError(f"{path}: {len(raw)} bytes, shorter than the {HEADER_BYTES}-byte header")
    h = dict(zip((name for name, _ in HEADER_FIELDS), HEADER_STRUCT.unpack_from(raw)))
    h["reserved_zero"] = not any(raw[HEADER_STRUCT.size:])
    return h


# ---------------------------------------------------------------------------
# Atomic writing and progress

class _AtomicFile:
    """`with _AtomicFile(path) as f:` writes to a temporary file beside path
    (same directory, so the final rename stays on one file system) and renames
    it over path only if the block finishes without an exception. Otherwise
    the temporary file is removed and path is untouched."""

    def __init__(self, path):
        self.path = os.fspath(path)
        if os.path.isdir(self.path):
            raise ExportError(f"{self.path}: is a directory")
        d, base = os.path.split(os.path.abspath(self.path))
        self.tmp = os.path.join(d, f".{base}.{os.getpid()}.{os.urandom(4).hex()}.tmp")

    def __enter__(self):
        try:
            fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except OSError as e:
            raise ExportError(f"{self.path}: cannot create: {e.strerror}") from None
        self.f = os.fdopen(fd, "wb")
        return self.f

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc_type is None:
                self.f.flush()
                os.fsync(self.f.fileno())
            self.f.close()
            if exc_type is None:
                os.replace(self.tmp, self.path)
        except BaseException:
            _remove_quietly(self.tmp)
            raise
        if exc_type is not None:
            _remove_quietly(self.tmp)
        return False


def _remove_quietly(path):
    try:
        os.unlink(path)
    except OSError:
        pass


class _Progress:
    """Progress lines on stderr, only once a job has taken more than 2 seconds,
    then at most one a second: `what: text (N s)`."""

    def __init__(self, what):
        self.what, self.start, self.last = what, time.monotonic(), None

    def step(self, text):
        now = time.monotonic()
        if now - self.start > 2.0 and (self.last is None or now - self.last > 1.0):
            print(f"{self.what}: {text} ({now - self.start:.0f} s)", file=sys.stderr, flush=True)
            self.last = now

    def done(self, text="done"):
        if self.last is not None or time.monotonic() - self.start > 2.0:
            print(f"{self.what}: {text} ({time.monotonic() - self.start:.0f} s)", file=sys.stderr,
                  flush=True)


# ---------------------------------------------------------------------------
# Lazy tensors: sources read piece by piece while the checkpoint is written
#
# A converter does not load a model: it builds, per output tensor, a small tree
# of lazy tensors (a tensor in a safetensors or .pth file, per-layer tensors
# stacked, q/k rows permuted per head, model-parallel shards joined) and
# write_checkpoint asks each for a block of rows at a time. Peak memory is then
# a few blocks (_CHUNK_BYTES each), whatever the model's size.
#
# Interface: `shape` (the full shape) and `rows(a, b)`: rows a..b-1 of the
# tensor's 2-D view (prod(shape[:-1]), shape[-1]) as a float32 array (a 1-D
# tensor is one row).

_CHUNK_BYTES = 16 << 20  # convert and write at most this much at a time


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


# ---------------------------------------------------------------------------
# Checkpoints

def _check_tensor(name, value, shape):
    try:
        t = _as_lazy(value)
    except ExportError as e:
        raise ExportError(f"tensor {name} has {e}") from None
    if tuple(t.shape) != tuple(shape):
        raise ExportError(f"tensor {name} has shape {tuple(t.shape)}, expected {tuple(shape)}")
    return t


def _write_tensor(f, name, t, on_block=None):
    """Write lazy tensor t as little-endian float32, a block of rows at a time,
    so that a large tensor is never converted or held all at once."""
    n_rows, cols = _view_rows(t.shape), t.shape[-1]
    step = max(1, _CHUNK_BYTES // max(1, 4 * cols))
    for r in range(0, n_rows, step):
        block = np.ascontiguousarray(t.rows(r, min(n_rows, r + step)), dtype="<f4")
        if block.shape != (min(n_rows, r + step) - r, cols):  # a reader bug, not bad input
            raise AssertionError(f"{name}: block of shape {block.shape}")
        if not np.isfinite(block).all():
            raise ExportError(f"tensor {name} contains NaN or infinite values")
        f.write(block.data)
        if on_block:
            on_block(block.nbytes)


def quantize_q8(rows, group_size):
    """q8_0 of float32 rows (r, cols): int8 values (r, cols) and float32 scales
    (r, cols / group_size), scale = max|v| / 127 over each group of a row and
    q = round(v / scale), so that v ~ q * scale (model.h, "q8_0 tensors")."""
    r, cols = rows.shape
    g = rows.reshape(r, cols // group_size, group_size)
    scale = (np.abs(g).max(axis=2) / np.float32(127)).astype(np.float32)
    safe = np.where(scale > 0, scale, np.float32(1))[:, :, None]
    q = np.clip(np.rint(g / safe), -127, 127).astype(np.int8)
    return q.reshape(r, cols), scale


def _write_q8_tensor(f, name, t, group_size, scales_offset, on_block=None):
    """Write lazy tensor t as q8_0: every int8 value, zero padding up to
    scales_offset, then every scale. The source is read twice (once per part)
    so that memory stays at one block whatever the tensor's size."""
    n_rows, cols = _view_rows(t.shape), t.shape[-1]
    step = max(1, _CHUNK_BYTES // max(1, 4 * cols))
    for part in ("values", "scales"):
        if part == "scales":
            f.write(bytes(scales_offset - f.tell()))
        for r in range(0, n_rows, step):
            block = np.ascontiguousarray(t.rows(r, min(n_rows, r + step)), dtype=np.float32)
            if not np.isfinite(block).all():
                raise ExportError(f"tensor {name} contains NaN or infinite values")
            q, scale = quantize_q8(block, group_size)
            out = q if part == "values" else scale.astype("<f4")
            f.write(out.data)
            if on_block:
                on_block(out.nbytes)


def write_checkpoint(path, cfg, tensors):
    """Write a version-1 checkpoint.

    cfg: dict with dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size,
    seq_len, and optionally the keys of CONFIG_DEFAULTS.
    tensors: name -> array (any real dtype; written as float32) or lazy tensor
    (see "Lazy tensors" above), shapes as in TENSOR_TABLE; wcls is required
    exactly when shared_classifier is false. cfg's weight_type "q8_0" (and
    group_size) quantizes the matrices as they are written.
    The file is written atomically; raises ExportError (nothing written) when
    the config or a tensor is wrong. Progress goes to stderr when it takes
    more than 2 seconds."""
    c = normalize_config(cfg)
    names = tensor_names(c)
    extra = set(tensors) - set(names)
    if extra:
        hint = " (shared_classifier is true)" if "wcls" in extra else ""
        raise ExportError("unexpected tensor(s): " + ", ".join(sorted(extra)) + hint)
    missing = [n for n in names if n not in tensors]
    if missing:
        raise ExportError("missing tensor(s): " + ", ".join(missing))
    layout, size = tensor_layout(c)
    lazy = {name: _check_tensor(name, tensors[name], shape) for name, shape, _, _ in layout}

    progress = _Progress(f"writing {path}")
    total_mb, done = size / 2**20, [0]
    with _AtomicFile(path) as f:
        f.write(_pack_header(c))
        for i, (name, shape, offset, scales_offset) in enumerate(layout):
            f.write(bytes(offset - f.tell()))  # zero padding up to the aligned offset

            def on_block(nbytes, i=i, name=name):
                done[0] += nbytes
                progress.step(f"tensor {i + 1}/{len(layout)} ({name}), "
                              f"{done[0] / 2**20:.0f}/{total_mb:.0f} MB written")
            if scales_offset is None:
                _write_tensor(f, name, lazy[name], on_block)
            else:
                _write_q8_tensor(f, name, lazy[name], c["group_size"], scales_offset, on_block)
        assert f.tell() == size, (f.tell(), size)
        f.flush()
        os.fsync(f.fileno())  # on disk before the rename makes it visible
    progress.done(f"done, {len(layout)} tensors, {total_mb:.0f} MB")


def read_checkpoint(path):
    """Read a version-1 checkpoint written by write_checkpoint: (cfg, tensors),
    tensors as read-only float32 memory maps (q8_0 matrices: dequantized
    float32 arrays). Checks magic, version and size
    (for tests and round trips; run.c is the real loader)."""
    path = os.fspath(path)
    h = read_header(path)
    if h["magic"] != MAGIC or h["version"] != VERSION:
        raise ExportError(f"{path}: not a version-{VERSION} checkpoint")
    cfg = {k: h[k] for k in CONFIG_REQUIRED}
    for k in CONFIG_DEFAULTS:
        cfg[k] = h[k]
    cfg["shared_classifier"] = bool(h["shared_classifier"])
    c = normalize_config(cfg)
    layout, size = tensor_layout(c)
    actual = os.path.getsize(path)
    if actual != size:
        raise ExportError(f"{path}: expected {size} bytes, file has {actual}")
    tensors = {}
    for name, shape, offset, scales_offset in layout:
        if scales_offset is None:
            tensors[name] = np.memmap(path, dtype="<f4", mode="r", offset=offset, shape=shape)
            continue
        # q8_0: dequantized into memory, v = q * scale
        gs = c["group_size"]
        q = np.memmap(path, dtype=np.int8, mode="r", offset=offset, shape=(math.prod(shape),))
        scale = np.memmap(path, dtype="<f4", mode="r", offset=scales_offset,
                          shape=(math.prod(shape) // gs,))
        tensors[name] = (q.reshape(-1, gs) * scale[:, None]).astype(np.float32).reshape(shape)
    return c, tensors


def random_tensors(cfg, seed=0):
    """Random weights for cfg: matrices N(0, 1/fan_in) (so every projection
    keeps unit scale and attention scores are O(1)), embeddings and wcls
    N(0, 0.5^2), norm weights uniform in [0.5, 1.5] (so a norm that ignores its
    weight is visible). Deterministic for a given seed. float32."""
    c = normalize_config(cfg)
    rng = np.random.default_rng(seed)
    shapes = dict((name, fn(c)) for name, fn, _ in TENSOR_TABLE)
    out = {}
    for name in tensor_names(c):
        shape = shapes[name]
        if name.startswith("rms_"):
            out[name] = rng.uniform(0.5, 1.5, size=shape).astype(np.float32)
        elif name in ("token_embedding", "wcls"):
            out[name] = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.5)
        else:
            fan_in = shape[-1]
            out[name] = rng.standard_normal(shape, dtype=np.float32) * np.float32(fan_in ** -0.5)
    return out


# ---------------------------------------------------------------------------
# The legacy llama2.c format (version 0)

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
    """Read a llama2.c (version 0) checkpoint: (cfg, tensors), tensors as
    read-only memory maps (nothing is loaded until written). The file size must
    match the header exactly. Raises ExportError naming the file."""
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
        raise ExportError(f"{path}: already a version-{VERSION} (LRPE) checkpoint, "
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
    return cfg, tensors


# ---------------------------------------------------------------------------
# safetensors (read with numpy; no safetensors package)
#
# File: u64 little-endian N, then N bytes of JSON
#   {"NAME": {"dtype": "BF16", "shape": [rows, cols], "data_offsets": [begin, end]}, ...,
#    "__metadata__": {...}}
# then the raw data; offsets are relative to byte 8 + N, data row-major little-endian.

SAFETENSORS_DTYPES = {"F32": ("<f4", 4), "F16": ("<f2", 2), "BF16": ("<u2", 2), "F64": ("<f8", 8)}
_MAX_HEADER_BYTES = 100 << 20  # the safetensors library's own limit


def _bf16_to_f32(u16):
    """bfloat16 bit patterns (uint16) -> float32: they are the high half of a float32."""
    return (u16.astype(np.uint32) << 16).view(np.float32)


class _SafetensorsTensor:
    """One tensor in a safetensors file, read with pread on demand."""

    def __init__(self, path, name, dtype, shape, offset):
        self.path, self.name, self.dtype, self.offset = path, name, dtype, offset
        self.shape = tuple(shape)

    def rows(self, a, b):
        np_dtype, size = SAFETENSORS_DTYPES[self.dtype]
        cols = self.shape[-1] if self.shape else 1
        n = (b - a) * cols * size
        buf = np.empty(n, dtype=np.uint8)
        got = 0
        with open(self.path, "rb", buffering=0) as f:
            while got < n:
                start = self.offset + a * cols * size + got
                k = os.preadv(f.fileno(), [memoryview(buf)[got:]], start)
                if k <= 0:
                    raise ExportError(f"{self.path}: truncated inside tensor {self.name}")
                got += k
        x = buf.view(np_dtype)
        x = _bf16_to_f32(x) if self.dtype == "BF16" else x.astype(np.float32)
        x = x.reshape(b - a, cols)
        if not np.isfinite(x).all():
            raise ExportError(f"{self.path}: tensor {self.name} contains NaN or infinite values")
        return x


def read_safetensors_header(path):
    """{name: _SafetensorsTensor} for every tensor in a safetensors file, after
    checking the header against the file: JSON, dtypes, shapes, byte ranges
    inside the file. Raises ExportError naming the file."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise ExportError(f"{path}: is a directory, expected a safetensors file")
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ExportError(f"{path}: {size} bytes, too short for a safetensors file")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8 or n > _MAX_HEADER_BYTES:
            raise ExportError(f"{path}: header length {n} does not fit in the file ({size} bytes); "
                              "truncated, or not a safetensors file")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise ExportError(f"{path}: header is not JSON; not a safetensors file") from None
    if not isinstance(header, dict):
        raise ExportError(f"{path}: header is not a JSON object; not a safetensors file")
    data_start, out = 8 + n, {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
            ok = (isinstance(dtype, str) and isinstance(shape, list)
                  and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                          for v in shape + [begin, end]) and begin <= end)
        except (TypeError, KeyError, ValueError):
            ok = False
        if not ok:
            raise ExportError(f"{path}: malformed header entry for tensor {name}")
        if data_start + end > size:
            raise ExportError(f"{path}: truncated: tensor {name} ends at byte {data_start + end}, "
                              f"the file has {size}")
        if dtype in SAFETENSORS_DTYPES:
            want = math.prod(shape) * SAFETENSORS_DTYPES[dtype][1]
            if end - begin != want:
                raise ExportError(f"{path}: tensor {name}: {end - begin} data bytes, but "
                                  f"{dtype} {shape} needs {want}")
        out[name] = _SafetensorsTensor(path, name, dtype, shape, data_start + begin)
    return out


def _read_json(path, what):
    try:
        with open(path, "rb") as f:
            value = json.loads(f.read().decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        where = f" (line {e.lineno})" if hasattr(e, "lineno") else ""
        raise ExportError(f"{path}: not valid JSON{where}") from None
    if not isinstance(value, dict):
        raise ExportError(f"{path}: expected a JSON object ({what})")
    return value


def read_hf_weights(directory):
    """({name: _SafetensorsTensor}, listing) for a Hugging Face model directory:
    one model.safetensors, or the shards listed in model.safetensors.index.json
    (listing: the path of the file that lists the tensors, for messages)."""
    single = os.path.join(directory, "model.safetensors")
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.isfile(single):
        return read_safetensors_header(single), single
    if not os.path.isfile(index):
        others = [n for n in ("pytorch_model.bin", "pytorch_model.bin.index.json",
                              "consolidated.00.pth") if os.path.exists(os.path.join(directory, n))]
        hint = (f" (found {others[0]}: only safetensors weights are read; "
                "for consolidated.*.pth use --meta-llama)" if others else "")
        raise ExportError(f"{directory}: no model.safetensors or model.safetensors.index.json"
                          + hint)
    weight_map = _read_json(index, "a safetensors index").get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ExportError(f"{index}: no weight_map object")
    shards, out = {}, {}
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or os.path.basename(shard) != shard:
            raise ExportError(f"{index}: weight_map[{name!r}] is not a file name: {shard!r}")
        if shard not in shards:
            shard_path = os.path.join(directory, shard)
            if not os.path.isfile(shard_path):
                raise ExportError(f"{shard_path}: listed in {os.path.basename(index)} "
                                  "but missing")
            shards[shard] = read_safetensors_header(shard_path)
        if name not in shards[shard]:
            raise ExportError(f"{os.path.join(directory, shard)}: has no tensor {name}, "
                              f"which {os.path.basename(index)} maps to it")
        out[name] = shards[shard][name]
    return out, index


# ---------------------------------------------------------------------------
# Hugging Face config.json -> our header
#
# What is carried (docs/convert.md has the user's version):
#   hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
#   num_key_value_heads (default: num_attention_heads), vocab_size,
#   max_position_embeddings -> seq_len (the training context), rms_norm_eps,
#   rope_theta (top level or inside rope_parameters), partial_rotary_factor ->
#   rot_dim, bos/eos_token_id, tie_word_embeddings, rope_scaling (or v5
#   rope_parameters) with `rope_type` or the older `type`:
#     linear   factor
#     dynamic  factor; L = max_position_embeddings (as transformers does)
#     yarn     factor, original_max_position_embeddings, beta_fast, beta_slow,
#              attention_factor (or the mscale/mscale_all_dim ratio)
#     llama3   factor, low_freq_factor, high_freq_factor, original_max_position_embeddings

HF_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM")
HF_SCALING_KEYS = {
    "linear": {"factor"},
    "dynamic": {"factor"},
    "yarn": {"factor", "original_max_position_embeddings", "beta_fast", "beta_slow",
             "attention_factor", "mscale", "mscale_all_dim", "truncate"},
    "llama3": {"factor", "low_freq_factor", "high_freq_factor",
               "original_max_position_embeddings"},
}


def _js(v):
    """A config value as config.json writes it (true, null, "silu")."""
    try:
        return json.dumps(v)
    except (TypeError, ValueError):
        return repr(v)


def _number(where, key, v, positive=True):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
            or (positive and v <= 0):
        kind = "a positive number" if positive else "a number"
        raise ExportError(f"{where}: {key}={_js(v)} is not {kind}")
    return float(v)


def _integer(where, key, v, minimum=1):
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum or v > INT32_MAX:
        raise ExportError(f"{where}: {key}={_js(v)} is not an integer >= {minimum}")
    return v


def _head_counts(where, cfg, dim_key, heads_key, kv_key):
    """(dim, heads, kv_heads) from a source config, named by its own keys:
    heads must divide dim and kv_heads (default: heads) must divide heads."""
    dim, heads = cfg[dim_key], cfg[heads_key]
    kv = cfg.get(kv_key)
    kv = heads if kv is None else _integer(where, kv_key, kv)
    if dim % heads:
        raise ExportError(f"{where}: {heads_key}={heads} does not divide {dim_key}={dim}")
    if heads % kv:
        raise ExportError(f"{where}: {kv_key}={kv} does not divide {heads_key}={heads}")
    return dim, heads, kv


def _hf_token_id(where, config, key, default, notes):
    v = config.get(key)
    if v is None:
        notes.append(f"{key} absent: using {default}")
        return default
    if isinstance(v, list):
        if not v:
            notes.append(f"{key} is an empty list: using {default}")
            return default
        if len(v) > 1:
            notes.append(f"{key} is a list {v}: using the first, {v[0]}")
        v = v[0]
    return _integer(where, key, v, minimum=0)


def _hf_rope_scaling(where, config, seq_len, notes):
    """The RoPE scaling fields of our header from rope_scaling (or the v5
    rope_parameters), as a dict of CONFIG_DEFAULTS keys."""
    rs, rp = config.get("rope_scaling"), config.get("rope_parameters")
    for key, d in (("rope_scaling", rs), ("rope_parameters", rp)):
        if d is not None and not isinstance(d, dict):
            raise ExportError(f"{where}: {key} must be an object, got {_js(d)}")
    if isinstance(rp, dict) and any(isinstance(v, dict) for v in rp.values()):
        raise ExportError(f"{where}: rope_parameters per layer type (several RoPE settings in "
                          "one model) is not supported")

    def kind(d, key):
        if not d:
            return None
        if "rope_type" not in d and "type" not in d:
            if set(d) <= {"rope_theta", "partial_rotary_factor"}:
                return None  # v5 rope_parameters of an unscaled model may hold only these
            raise ExportError(f"{where}: {key} has neither rope_type nor type")
        t = d.get("rope_type", d.get("type"))
        if "rope_type" in d and "type" in d and d["type"] != d["rope_type"]:
            notes.append(f"{key} has type={_js(d['type'])} and rope_type={_js(d['rope_type'])}: "
                         "using rope_type, as transformers does")
        if t is not None and not isinstance(t, str):
            raise ExportError(f"{where}: {key} type {_js(t)} is not a string")
        return None if t in (None, "default") else t

    t_rs, t_rp = kind(rs, "rope_scaling"), kind(rp, "rope_parameters")
    if t_rs and t_rp and (t_rs != t_rp or any(rs.get(k) != rp.get(k) for k in
                                              ("factor", "original_max_position_embeddings"))):
        raise ExportError(f"{where}: rope_scaling ({t_rs}) and rope_parameters ({t_rp}) "
                          "disagree; remove one")
    t, d = (t_rs, rs) if t_rs else (t_rp, rp)
    if t is None:
        return {"rope_scaling": "none"}
    if t not in HF_SCALING_KEYS:
        raise ExportError(f"{where}: rope scaling type {_js(t)} is not supported "
                          f"(supported: {', '.join(HF_SCALING_KEYS)}, or none)")
    known = HF_SCALING_KEYS[t] | {"type", "rope_type", "rope_theta", "partial_rotary_factor"}
    for k in sorted(set(d) - known):
        notes.append(f"ignoring {k}={_js(d[k])} in the {t} rope scaling (transformers does not "
                     "use it for this type)")
    key = "rope_scaling" if d is rs else "rope_parameters"
    what = f"{where}: {key}"
    out = {"rope_scaling": t}

    def orig_ctx():
        v = d.get("original_max_position_embeddings")
        if v is None:
            notes.append(f"{t}: original_max_position_embeddings absent: using "
                         f"max_position_embeddings={seq_len}, as transformers v5 does")
            return seq_len
        return _integer(what, "original_max_position_embeddings", v)

    def factor(required=True):
        if "factor" not in d or d["factor"] is None:
            if required:
                raise ExportError(f"{what}: {t} scaling needs a factor")
            return None
        f = _number(what, "factor", d["factor"])
        if f < 1:
            raise ExportError(f"{what}: factor={_js(d['factor'])} < 1 (shrinking the context) "
                              "is not supported")
        return f

    if t in ("linear", "dynamic"):
        out["rope_factor"] = factor()
        if t == "dynamic":  # transformers' dynamic NTK uses max_position_embeddings as L
            out["rope_orig_ctx"] = seq_len
    elif t == "yarn":
        if d.get("truncate", True) is not True:
            raise ExportError(f"{what}: yarn truncate={_js(d['truncate'])} is not supported "
                              "(run rounds the correction range, transformers' default)")
        L = orig_ctx()
        s = factor(required=False)
        if s is None:
            if "original_max_position_embeddings" not in d:
                raise ExportError(f"{what}: yarn scaling needs a factor")
            s = seq_len / L
            notes.append(f"yarn: factor absent: using max_position_embeddings / "
                         f"original_max_position_embeddings = {s:g}")
            if s < 1:
                raise ExportError(f"{what}: yarn factor max_position_embeddings / "
                                  f"original_max_position_embeddings = {s:g} < 1")
        elif "original_max_position_embeddings" in d and not math.isclose(s, seq_len / L):
            notes.append(f"yarn: factor {s:g} differs from max_position_embeddings / "
                         f"original_max_position_embeddings = {seq_len / L:g}; using factor, "
                         "as current transformers does (some 4.4x/4.5x used the ratio)")
        out.update(rope_factor=s, rope_orig_ctx=L)
        for k, default in (("beta_fast", 32.0), ("beta_slow", 1.0)):
            v = d.get(k)  # transformers reads these with `or`: 0 and null mean the default
            out["yarn_" + k] = _number(what, k, v) if v else default
        if not out["yarn_beta_fast"] > out["yarn_beta_slow"]:
            raise ExportError(f"{what}: yarn beta_fast={out['yarn_beta_fast']:g} must be "
                              f"greater than beta_slow={out['yarn_beta_slow']:g}")
        att = d.get("attention_factor")
        if att is not None:
            att = _number(what, "attention_factor", att)
        elif d.get("mscale") and d.get("mscale_all_dim"):
            ms = _number(what, "mscale", d["mscale"])
            ms_all = _number(what, "mscale_all_dim", d["mscale_all_dim"])

            def mscale(m):
                return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0
            att = mscale(ms) / mscale(ms_all)
            notes.append(f"yarn: attention factor from mscale/mscale_all_dim: {att:.6g}")
        out["yarn_attn_factor"] = att if att is not None else 0.0  # 0: run uses 0.1 ln s + 1
    else:  # llama3
        for k in ("low_freq_factor", "high_freq_factor"):
            if d.get(k) is None:
                raise ExportError(f"{what}: llama3 scaling needs {k}")
        out.update(rope_factor=factor(), rope_orig_ctx=orig_ctx(),
                   llama3_low_freq=_number(what, "low_freq_factor", d["low_freq_factor"]),
                   llama3_high_freq=_number(what, "high_freq_factor", d["high_freq_factor"]))
        if not out["llama3_high_freq"] > out["llama3_low_freq"]:
            raise ExportError(f"{what}: llama3 high_freq_factor must be greater than "
                              "low_freq_factor")
    return out


def hf_config(config, where="config.json"):
    """Map a Hugging Face Llama config.json (a dict) to our config. Returns
    (cfg, notes): cfg for write_checkpoint (rope_layout "neox": the weights as
    Hugging Face stores them), notes: lines worth telling the user (defaults
    used, values ignored). Raises ExportError for anything that is not exactly
    the Llama architecture or that run cannot reproduce."""
    notes = []
    mt, archs = config.get("model_type"), config.get("architectures") or []
    if not isinstance(archs, list):
        archs = [archs]
    if mt not in ("llama", "mistral", None) or any(a not in HF_ARCHITECTURES for a in archs) \
            or (mt is None and not archs):
        name = ", ".join(map(str, archs)) or f"model_type {_js(mt)}"
        raise ExportError(f"{where}: {name} is not supported: only the Llama architecture "
                          "(LlamaForCausalLM) is")
    if config.get("sliding_window") is not None:
        raise ExportError(f"{where}: sliding_window={_js(config['sliding_window'])} "
                          "(sliding-window attention) is not supported")
    for key, what in (("attention_bias", "biases on q/k/v/o_proj"),
                      ("mlp_bias", "biases on the MLP"),
                      ("qk_norm", "RMSNorm on q and k"), ("use_qk_norm", "RMSNorm on q and k")):
        if config.get(key):
            raise ExportError(f"{where}: {key}={_js(config[key])} ({what}) is not supported")
    act = config.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ExportError(f"{where}: hidden_act={_js(act)} is not supported (only silu: SwiGLU)")

    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "vocab_size"):
        if config.get(key) is None:
            raise ExportError(f"{where}: {key} is missing")
        _integer(where, key, config[key])
    dim, heads, kv = _head_counts(where, config, "hidden_size", "num_attention_heads", "num_key_value_heads")
    hs = dim // heads
    if config.get("head_dim") is not None and config["head_dim"] != hs:
        raise ExportError(f"{where}: head_dim={_js(config['head_dim'])} differs from hidden_size / "
                          f"num_attention_heads = {hs} (not supported: our format derives it)")
    if hs % 2:
        raise ExportError(f"{where}: head size hidden_size / num_attention_heads = {hs} is odd "
                          "(RoPE rotates pairs)")

    seq_len = config.get("max_position_embeddings")
    if seq_len is None:
        seq_len = 2048
        notes.append("max_position_embeddings absent: using 2048 (the LlamaConfig default)")
    seq_len = _integer(where, "max_position_embeddings", seq_len)
    eps = config.get("rms_norm_eps")
    if eps is None:
        eps = 1e-6
        notes.append("rms_norm_eps absent: using 1e-6 (the LlamaConfig default)")
    eps = _number(where, "rms_norm_eps", eps)

    rp = config.get("rope_parameters") if isinstance(config.get("rope_parameters"), dict) else {}
    theta = config.get("rope_theta")
    if theta is not None and rp.get("rope_theta") is not None and rp["rope_theta"] != theta:
        raise ExportError(f"{where}: rope_theta={_js(theta)} but rope_parameters.rope_theta="
                          f"{_js(rp['rope_theta'])}")
    if theta is None:
        theta = rp.get("rope_theta")
    if theta is None:
        theta = 10000.0
        notes.append("rope_theta absent: using 10000 (the LlamaConfig default)")
    theta = _number(where, "rope_theta", theta)
    if theta <= 1:
        raise ExportError(f"{where}: rope_theta={_js(theta)} must be > 1")
    prf = config.get("partial_rotary_factor", rp.get("partial_rotary_factor"))
    rot = hs
    if prf is not None:
        prf = _number(where, "partial_rotary_factor", prf)
        rot = int(hs * prf)
        if prf > 1 or rot < 2 or rot % 2:
            raise ExportError(f"{where}: partial_rotary_factor={prf:g} gives {rot} rotary dims of "
                              f"head size {hs}; expected an even number in 2..{hs}")

    tie = config.get("tie_word_embeddings", False)
    if not isinstance(tie, bool):
        raise ExportError(f"{where}: tie_word_embeddings={_js(tie)} is not true or false")
    cfg = dict(dim=dim, hidden_dim=config["intermediate_size"],
               n_layers=config["num_hidden_layers"], n_heads=heads, n_kv_heads=kv,
               vocab_size=config["vocab_size"], seq_len=seq_len, shared_classifier=tie,
               bos_id=_hf_token_id(where, config, "bos_token_id", 1, notes),
               eos_id=_hf_token_id(where, config, "eos_token_id", 2, notes),
               norm_eps=eps, rope_theta=theta, rope_layout="neox", rot_dim=rot)
    cfg.update(_hf_rope_scaling(where, config, seq_len, notes))
    for k in ("bos_id", "eos_id"):
        if cfg[k] >= cfg["vocab_size"]:
            raise ExportError(f"{where}: {k.replace('_id', '_token_id')}={cfg[k]} is outside the "
                              f"vocabulary (vocab_size={cfg['vocab_size']})")
    try:
        normalize_config(cfg)
    except ExportError as e:
        raise ExportError(f"{where}: {e}") from None
    return cfg, notes


# ---------------------------------------------------------------------------
# Hugging Face model directories

def _hf_layer_names(i):
    p = f"model.layers.{i}."
    return {"rms_att_weight": p + "input_layernorm.weight",
            "wq": p + "self_attn.q_proj.weight", "wk": p + "self_attn.k_proj.weight",
            "wv": p + "self_attn.v_proj.weight", "wo": p + "self_attn.o_proj.weight",
            "rms_ffn_weight": p + "post_attention_layernorm.weight",
            "w1": p + "mlp.gate_proj.weight", "w2": p + "mlp.down_proj.weight",
            "w3": p + "mlp.up_proj.weight"}


def _unexpected_tensor(name, where):
    if name.endswith(".bias"):
        why = "biases are not part of the Llama architecture"
    elif "q_norm" in name or "k_norm" in name:
        why = "RMSNorm on q/k is not part of the Llama architecture"
    else:
        why = "not part of the Llama architecture"
    return ExportError(f"{where}: unexpected tensor {name} ({why})")


def _shape_checked(t, shape, where_name):
    if tuple(t.shape) != tuple(shape):
        raise ExportError(f"{where_name} has shape {list(t.shape)}, expected {list(shape)} "
                          "from the config")
    return t


def _source_file(directory, layout, name, expected_dir, expected_in):
    """The path of `name` inside a source model directory, after checking the
    requested RoPE layout and that the directory and the file exist."""
    if layout not in ROPE_LAYOUTS:
        raise ExportError(f"rope layout {layout!r}: expected one of {', '.join(ROPE_LAYOUTS)}")
    if not os.path.isdir(directory):
        raise ExportError(f"{directory}: not a directory (expected {expected_dir})")
    path = os.path.join(directory, name)
    if not os.path.isfile(path):
        raise ExportError(f"{directory}: no {name} (expected {expected_in})")
    return path


def read_hf(directory, layout="neox"):
    """A Hugging Face Llama model directory (config.json + safetensors) as
    (cfg, tensors, notes): tensors are lazy (see "Lazy tensors"), nothing is
    read until write_checkpoint streams them.

    layout "neox" keeps the q/k rows as Hugging Face stores them (and marks the
    checkpoint neox: run rotates halves, like rotate_half); "interleaved"
    un-permutes them per head (k with the KEY/VALUE head count) and marks the
    checkpoint interleaved. Both give the same logits."""
    directory = os.fspath(directory)
    config_path = _source_file(directory, layout, "config.json",
                               "a Hugging Face model directory with config.json",
                               "a Hugging Face model directory")
    cfg, notes = hf_config(_read_json(config_path, "a model config"), config_path)
    source, listing = read_hf_weights(directory)
    c = normalize_config(cfg)
    shapes = dict((name, fn(c)) for name, fn, _ in TENSOR_TABLE)
    used = set()

    def take(name, shape):
        if name not in source:
            raise ExportError(f"{listing}: missing tensor {name}")
        t = source[name]
        if t.dtype not in SAFETENSORS_DTYPES:
            raise ExportError(f"{t.path}: tensor {name} has dtype {t.dtype}; supported: "
                              f"{', '.join(SAFETENSORS_DTYPES)}")
        used.add(name)
        return _shape_checked(t, shape, f"{t.path}: tensor {name}")

    tensors = {"token_embedding": take("model.embed_tokens.weight", shapes["token_embedding"])}
    per_layer = {k: [] for k in _hf_layer_names(0)}
    for i in range(c["n_layers"]):
        for ours, theirs in _hf_layer_names(i).items():
            per_layer[ours].append(take(theirs, shapes[ours][1:]))
    if layout == "interleaved":
        rot = c["rot_dim"]
        per_layer["wq"] = [_HeadPermuted(t, c["n_heads"], rot, True) for t in per_layer["wq"]]
        per_layer["wk"] = [_HeadPermuted(t, c["n_kv_heads"], rot, True) for t in per_layer["wk"]]
    for k, parts in per_layer.items():
        tensors[k] = _Stacked(parts)
    tensors["rms_final_weight"] = take("model.norm.weight", shapes["rms_final_weight"])
    if "lm_head.weight" in source:
        if cfg["shared_classifier"]:
            used.add("lm_head.weight")
            notes.append("tie_word_embeddings is true: lm_head.weight is ignored (the "
                         "classifier is the embedding, as in transformers)")
        else:
            tensors["wcls"] = take("lm_head.weight", shapes["wcls"])
    elif not cfg["shared_classifier"]:
        cfg["shared_classifier"] = True
        notes.append("no lm_head.weight: the classifier is tied to the embedding")
    for name in sorted(set(source) - used):
        if name.endswith("rotary_emb.inv_freq"):  # a buffer older checkpoints saved; recomputed
            continue
        raise _unexpected_tensor(name, source[name].path)
    cfg["rope_layout"] = layout
    return cfg, tensors, notes


# ---------------------------------------------------------------------------
# Meta checkpoints: consolidated.NN.pth (one per model-parallel rank) + params.json

# Meta's names, and the axis along which model-parallel shards are split:
# column-parallel layers on 0, row-parallel ones on 1, None = replicated.
META_LAYER_NAMES = {
    "rms_att_weight": ("attention_norm.weight", None),
    "wq": ("attention.wq.weight", 0), "wk": ("attention.wk.weight", 0),
    "wv": ("attention.wv.weight", 0), "wo": ("attention.wo.weight", 1),
    "rms_ffn_weight": ("ffn_norm.weight", None),
    "w1": ("feed_forward.w1.weight", 0), "w2": ("feed_forward.w2.weight", 1),
    "w3": ("feed_forward.w3.weight", 0),
}
META_PARAMS = {"dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "multiple_of",
               "ffn_dim_multiplier", "norm_eps", "rope_theta", "use_scaled_rope", "max_seq_len",
               "max_batch_size", "rope_scaling_factor"}
# Meta's apply_scaling (Llama 3.1) hard-codes these
META_LLAMA3_SCALING = dict(rope_scaling="llama3", rope_factor=8.0, llama3_low_freq=1.0,
                           llama3_high_freq=4.0, rope_orig_ctx=8192)


class _TorchJoined:
    """One Meta tensor: its model-parallel shards (torch tensors) joined along
    `axis` (None: replicated, shard 0 is used), converted to float32 a block of
    rows at a time."""

    def __init__(self, parts, axis, name, paths):
        self.parts, self.axis, self.name, self.paths = parts, axis, name, paths
        shape = list(parts[0].shape)
        if axis is not None and len(parts) > 1:
            shape[axis] = sum(int(p.shape[axis]) for p in parts)
        self.shape = tuple(shape)
        self.starts = np.cumsum([0] + [int(p.shape[0]) for p in parts])

    def _f32(self, t):
        import torch
        return t.to(torch.float32).numpy()

    def rows(self, a, b):
        if len(self.shape) == 1:
            x = self._f32(self.parts[0]).reshape(1, -1) if self.axis is None or \
                len(self.parts) == 1 else np.concatenate([self._f32(p) for p in self.parts])[None]
        elif self.axis == 1 and len(self.parts) > 1:
            x = np.concatenate([self._f32(p[a:b]) for p in self.parts], axis=1)
        elif self.axis == 0 and len(self.parts) > 1:
            out = []
            for i, p in enumerate(self.parts):
                lo, hi = max(a, self.starts[i]), min(b, self.starts[i + 1])
                if lo < hi:
                    out.append(self._f32(p[lo - self.starts[i]:hi - self.starts[i]]))
            x = np.concatenate(out)
        else:
            x = self._f32(self.parts[0][a:b])
        if not np.isfinite(x).all():
            raise ExportError(f"{self.paths[0]}: tensor {self.name} contains NaN or infinite "
                              "values")
        return x


def _torch_load(path):
    """torch.load of one shard: memory-mapped where torch supports it (2.1 and
    later: tensors are read on demand), else read whole; weights_only where
    supported (no code runs from the pickle)."""
    import inspect
    import zipfile
    import torch
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic[:2] == b"PK":
        if not zipfile.is_zipfile(path):
            raise ExportError(f"{path}: truncated (a zip archive without its central directory)")
    elif magic[:1] != b"\x80":  # neither torch's zip format nor its older pickle format
        raise ExportError(f"{path}: not a torch checkpoint (neither a zip archive nor a pickle)")
    accepted = inspect.signature(torch.load).parameters
    kwargs = {k: True for k in ("mmap", "weights_only") if k in accepted}
    return torch.load(path, map_location="cpu", **kwargs)


def read_meta(directory, layout="interleaved", seq_len=None):
    """A Meta Llama checkpoint directory (params.json + consolidated.NN.pth) as
    (cfg, tensors, notes), tensors lazy. Meta's q/k rows are already
    interleaved; layout "neox" applies Hugging Face's permutation instead."""
    directory = os.fspath(directory)
    params_path = _source_file(directory, layout, "params.json", "params.json and consolidated.*.pth",
                               "a Meta Llama checkpoint directory")
    params = _read_json(params_path, "Meta model parameters")
    notes, where = [], params_path
    for k in sorted(params):
        if "moe" in k or "expert" in k or "vision" in k:
            raise ExportError(f"{where}: {k} (mixture of experts / vision) is not supported: "
                              "only the Llama architecture is")
        if k not in META_PARAMS:
            notes.append(f"ignoring {k}={params[k]!r} in params.json")
    for k in ("dim", "n_layers", "n_heads"):
        if params.get(k) is None:
            raise ExportError(f"{where}: {k} is missing")
        _integer(where, k, params[k])
    dim, heads, kv = _head_counts(where, params, "dim", "n_heads", "n_kv_heads")

    names = sorted(n for n in os.listdir(directory)
                   if n.startswith("consolidated.") and n.endswith(".pth"))
    if not names:
        raise ExportError(f"{directory}: no consolidated.*.pth files")
    want = [f"consolidated.{i:02d}.pth" for i in range(len(names))]
    if names != want:
        raise ExportError(f"{directory}: shards {', '.join(names)}; expected "
                          f"{', '.join(want)}")
    paths = [os.path.join(directory, n) for n in names]
    try:
        have_torch = importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        have_torch = False
    if not have_torch:
        raise ExportError("--meta-llama needs torch to read .pth files "
                          "(apt install python3-torch, or pip install torch)")
    shards = []
    for p in paths:
        try:
            sd = _torch_load(p)
        except ExportError:
            raise
        except OSError as e:
            if e.filename:  # no such file, permission denied: main names the file
                raise
            raise ExportError(f"{p}: cannot read as a torch checkpoint ({e.strerror or e}; "
                              "truncated?)") from None
        except Exception as e:  # torch raises RuntimeError/pickle errors with long texts
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
            raise ExportError(f"{p}: cannot read as a torch checkpoint ({first})") from None
        if not isinstance(sd, dict):
            raise ExportError(f"{p}: expected a dict of tensors, got {type(sd).__name__}")
        shards.append(sd)
    n = len(shards)

    def parts_of(name):
        parts = []
        for p, sd in zip(paths, shards):
            if name not in sd:
                raise ExportError(f"{p}: missing tensor {name}")
            t = sd[name]
            if not hasattr(t, "shape") or not hasattr(t, "dtype") or not t.is_floating_point():
                raise ExportError(f"{p}: {name} is not a floating-point tensor")
            parts.append(t)
        return parts

    def joined(name, axis, shape):
        parts = parts_of(name)
        if axis is not None and n > 1:
            for p, t in zip(paths, parts):
                want_shape = list(shape)
                if want_shape[axis] % n:
                    raise ExportError(f"{p}: {name}: {want_shape[axis]} does not split into "
                                      f"{n} shards")
                want_shape[axis] //= n
                if list(t.shape) != want_shape:
                    raise ExportError(f"{p}: tensor {name} has shape {list(t.shape)}, expected "
                                      f"{want_shape} (shard of {list(shape)})")
        else:
            for p, t in zip(paths, parts):
                if list(t.shape) != list(shape):
                    raise ExportError(f"{p}: tensor {name} has shape {list(t.shape)}, expected "
                                      f"{list(shape)}")
        return _TorchJoined(parts, axis, name, paths)

    # the embedding decides vocab_size (params may say -1) and its split axis
    emb = parts_of("tok_embeddings.weight")
    if len(emb[0].shape) != 2:
        raise ExportError(f"{paths[0]}: tok_embeddings.weight has shape {list(emb[0].shape)}")
    if n == 1 or all(int(t.shape[1]) == dim for t in emb):
        emb_axis, vocab = 0, sum(int(t.shape[0]) for t in emb) if n > 1 else int(emb[0].shape[0])
    else:
        emb_axis, vocab = 1, int(emb[0].shape[0])  # Llama 2: ParallelEmbedding splits dim
    pv = params.get("vocab_size", -1)
    if pv not in (-1, None) and pv != vocab:
        raise ExportError(f"{paths[0]}: tok_embeddings.weight has {vocab} rows but params.json "
                          f"says vocab_size={pv}")
    w1 = parts_of("layers.0.feed_forward.w1.weight")
    hidden = sum(int(t.shape[0]) for t in w1) if n > 1 else int(w1[0].shape[0])

    eps = params.get("norm_eps")
    if eps is None:
        eps = 1e-5
        notes.append("norm_eps absent: using 1e-5 (Meta's default)")
    theta = params.get("rope_theta")
    theta = 10000.0 if theta is None else _number(where, "rope_theta", theta)
    if seq_len is None:
        seq_len = params.get("max_seq_len")
    if seq_len is None:
        # params.json does not say: Meta passes max_seq_len when building the model.
        # The training contexts: Llama 3.1+ 131072 (scaled RoPE), Llama 3 8192
        # (theta 500000), Code Llama 16384 (theta 1e6), Llama 2 4096 (LLaMA 1: 2048).
        seq_len = (131072 if params.get("use_scaled_rope") else 16384 if theta >= 1e6
                   else 8192 if theta >= 5e5 else 4096)
        notes.append(f"params.json has no max_seq_len: using seq_len={seq_len} "
                     "(override with --seq-len)")
    seq_len = _integer(where, "max_seq_len", seq_len)
    bos, eos = 1, 2  # sentencepiece Llama 1/2, Code Llama
    if vocab >= 128256:  # Llama 3's tiktoken vocabulary: <|begin_of_text|>, <|end_of_text|>
        bos, eos = 128000, 128001
        notes.append("vocabulary of Llama 3: bos_id 128000, eos_id 128001 (<|end_of_text|>)")
    cfg = dict(dim=dim, hidden_dim=hidden, n_layers=params["n_layers"], n_heads=heads,
               n_kv_heads=kv, vocab_size=vocab, seq_len=seq_len,
               norm_eps=_number(where, "norm_eps", eps), rope_theta=theta, rope_layout=layout,
               bos_id=bos, eos_id=eos)
    if params.get("use_scaled_rope"):
        cfg.update(META_LLAMA3_SCALING)
        if params.get("rope_scaling_factor") is not None:
            cfg["rope_factor"] = _number(where, "rope_scaling_factor",
                                         params["rope_scaling_factor"])
        notes.append(f"use_scaled_rope: llama3 scaling, factor {cfg['rope_factor']:g}, "
                     "low 1, high 4, original context 8192 (Meta's apply_scaling)")
    try:
        c = normalize_config(cfg)
    except ExportError as e:
        raise ExportError(f"{where}: {e}") from None
    shapes = dict((name, fn(c)) for name, fn, _ in TENSOR_TABLE)

    tensors = {"token_embedding": joined("tok_embeddings.weight", emb_axis,
                                         shapes["token_embedding"])}
    expected = {"tok_embeddings.weight", "norm.weight", "output.weight"}
    for ours, (theirs, axis) in META_LAYER_NAMES.items():
        parts = []
        for i in range(c["n_layers"]):
            name = f"layers.{i}.{theirs}"
            expected.add(name)
            t = joined(name, axis, shapes[ours][1:])
            if ours in ("wq", "wk") and layout == "neox":
                t = _HeadPermuted(t, c["n_heads"] if ours == "wq" else c["n_kv_heads"],
                                  c["rot_dim"], False)
            parts.append(t)
        tensors[ours] = _Stacked(parts)
    tensors["rms_final_weight"] = joined("norm.weight", None, shapes["rms_final_weight"])
    if any("output.weight" in sd for sd in shards):  # then every shard must hold its part
        tensors["wcls"] = joined("output.weight", 0, shapes["wcls"])
        cfg["shared_classifier"] = False
    else:
        cfg["shared_classifier"] = True
        notes.append("no output.weight: the classifier is tied to the embedding")
    for p, sd in zip(paths, shards):
        for name in sorted(set(sd) - expected):
            if name == "rope.freqs":  # LLaMA 1 saved its RoPE table; recomputed
                continue
            raise _unexpected_tensor(name, p)
    return cfg, tensors, notes


# ---------------------------------------------------------------------------
# Tokenizers

def write_tokenizer(path, pieces, scores):
    """Write llama2.c's tokenizer.bin: i32 max_token_length, then per token
    f32 score, i32 length, the piece's bytes. Atomic; raises ExportError."""
    pieces = [bytes(p) for p in pieces]
    scores = [float(s) for s in scores]
    if len(pieces) != len(scores):
        raise ExportError(f"{len(pieces)} pieces but {len(scores)} scores")
    if not pieces:
        raise ExportError("empty vocabulary")
    for i, s in enumerate(scores):
        if not math.isfinite(s):
            raise ExportError(f"score of token {i} is {s}")
    with _AtomicFile(path) as f:
        f.write(struct.pack("<i", max(len(p) for p in pieces)))
        for piece, score in zip(pieces, scores):
            f.write(struct.pack("<fi", score, len(piece)))
            f.write(piece)


def read_tokenizer(path):
    """Read a tokenizer.bin back: (max_token_length, pieces, scores). The whole
    file must be consumed."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 4:
        raise ExportError(f"{path}: too short for a tokenizer")
    (max_len,), off = struct.unpack_from("<i", data), 4
    pieces, scores = [], []
    while off < len(data):
        if off + 8 > len(data):
            raise ExportError(f"{path}: truncated at byte {off}")
        score, n = struct.unpack_from("<fi", data, off)
        off += 8
        if n < 0 or off + n > len(data):
            raise ExportError(f"{path}: bad piece length {n} at byte {off - 4}")
        pieces.append(data[off:off + n])
        scores.append(score)
        off += n
    return max_len, pieces, scores


def sentencepiece_vocab(model_path):
    """(pieces, scores) from a sentencepiece .model, exactly as llama2.c's
    tokenizer.py exports them: "▁" becomes " ", BOS is "\\n<s>\\n", EOS is
    "\\n</s>\\n", scores from get_score."""
    model_path = os.fspath(model_path)
    if os.path.isdir(model_path):
        raise ExportError(f"{model_path}: is a directory, expected a sentencepiece model")
    if not os.path.exists(model_path):
        raise ExportError(f"{model_path}: no such file")
    try:
        import sentencepiece  # only this path needs it
    except ImportError:
        raise ExportError("--tokenizer needs the sentencepiece package "
                          "(pip install sentencepiece, or apt install python3-sentencepiece)") \
            from None
    sp = sentencepiece.SentencePieceProcessor()
    try:
        sp.Load(model_path)
    except Exception as e:  # sentencepiece raises OSError/RuntimeError with a multi-line text
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ExportError(f"{model_path}: not a sentencepiece model ({first})") from None
    pieces, scores = [], []
    for i in range(sp.GetPieceSize()):
        t = sp.IdToPiece(i)
        if i == sp.bos_id():
            t = "\n<s>\n"
        elif i == sp.eos_id():
            t = "\n</s>\n"
        pieces.append(t.replace("\u2581", " ").encode("utf-8"))
        scores.append(sp.GetScore(i))
    return pieces, scores


# ---------------------------------------------------------------------------
# Command line

def _parse_random_spec(spec):
    names = CONFIG_REQUIRED
    try:
        values = [int(v) for v in spec.split(",")]
    except ValueError:
        values = []
    if len(values) != len(names):
        raise ExportError(f"--random {spec}: expected {len(names)} comma-separated integers "
                          f"({','.join(names)})")
    return dict(zip(names, values))


def _describe(cfg, path):
    c = normalize_config(cfg)
    scaling = c["rope_scaling"]
    if scaling != "none":
        scaling += f" x{c['rope_factor']:g}"
        if c["rope_scaling"] in ("yarn", "llama3", "dynamic"):
            scaling += f" (orig ctx {c['rope_orig_ctx'] or c['seq_len']})"
    return (f"wrote {path}: dim {c['dim']}, hidden {c['hidden_dim']}, {c['n_layers']} layers, "
            f"{c['n_heads']} heads ({c['n_kv_heads']} kv), vocab {c['vocab_size']}, "
            f"seq_len {c['seq_len']}, {'tied' if c['shared_classifier'] else 'untied'} "
            f"classifier, rope {c['rope_layout']} theta {c['rope_theta']:g} rot_dim "
            f"{c['rot_dim']} scaling {scaling}, eps {c['norm_eps']:g}, bos {c['bos_id']} "
            f"eos {c['eos_id']}, weights {c['weight_type']}"
            + (f" (group size {c['group_size']})" if c["weight_type"] == "q8_0" else ""))


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="export.py",
        description="Write checkpoints (version 1, see model.h) and tokenizers for run. "
                    "docs/convert.md explains the conversions.")
    p.add_argument("out", help="output file")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--hf", metavar="DIR",
                     help="convert a Hugging Face Llama model directory (config.json and "
                          "model.safetensors, or sharded model-*.safetensors with "
                          "model.safetensors.index.json)")
    src.add_argument("--meta-llama", metavar="DIR",
                     help="convert a Meta Llama checkpoint directory (params.json and "
                          "consolidated.*.pth; needs torch)")
    src.add_argument("--llama2c", metavar="IN.bin", help="convert a llama2.c (version 0) checkpoint")
    src.add_argument("--checkpoint", metavar="IN.bin",
                     help="re-export a checkpoint of ours (version 1), e.g. with --dtype q8_0")
    src.add_argument("--tokenizer", metavar="FILE.model",
                     help="convert a sentencepiece model to tokenizer.bin")
    src.add_argument("--random", metavar="D,H,L,NH,NKV,V,S",
                     help="random weights: dim,hidden_dim,n_layers,n_heads,n_kv_heads,"
                          "vocab_size,seq_len")
    m = p.add_argument_group("options for --hf, --meta-llama and --random")
    m.add_argument("--rope-layout", choices=ROPE_LAYOUTS, default=None,
                   help="q/k layout to write. --hf: neox (default; the weights as Hugging Face "
                        "stores them) or interleaved (rows un-permuted per head). --meta-llama: "
                        "interleaved (default; Meta's layout) or neox. --random: default "
                        "interleaved. Both give the same logits")
    m.add_argument("--seq-len", type=int, default=None, metavar="N",
                   help="--hf/--meta-llama: training context to record (default: "
                        "max_position_embeddings, or params.json max_seq_len)")
    q = p.add_argument_group("weights (every checkpoint source)")
    q.add_argument("--dtype", choices=WEIGHT_TYPES, default="f32",
                   help="f32 (default) or q8_0: int8 matrices with a float32 scale per group of "
                        "values along a row; norm weights stay float32")
    q.add_argument("--group-size", type=int, default=0, metavar="N",
                   help=f"q8_0: values per scale, dividing dim and hidden_dim (default "
                        f"{Q8_DEFAULT_GROUP}, or the largest power of two below it that divides both)")
    r = p.add_argument_group("options for --random")
    r.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    r.add_argument("--unshared", action="store_true", help="separate classifier (wcls)")
    r.add_argument("--rot-dim", type=int, default=None, help="rotated dims per head (default: all)")
    r.add_argument("--rope-theta", type=float, default=10000.0)
    r.add_argument("--norm-eps", type=float, default=1e-5)
    args = p.parse_args(argv)
    if args.rope_layout and (args.llama2c or args.checkpoint or args.tokenizer):
        p.error("--rope-layout applies to --hf, --meta-llama and --random only")
    if args.seq_len is not None and not (args.hf or args.meta_llama):
        p.error("--seq-len applies to --hf and --meta-llama only")
    if args.seq_len is not None and not 0 < args.seq_len <= INT32_MAX:
        p.error(f"--seq-len {args.seq_len}: expected a positive integer")
    if args.tokenizer and (args.dtype != "f32" or args.group_size):
        p.error("--dtype and --group-size apply to checkpoints, not --tokenizer")
    if args.group_size and args.dtype != "q8_0":
        p.error("--group-size applies to --dtype q8_0 only")
    if args.group_size < 0:
        p.error(f"--group-size {args.group_size}: expected a positive integer")
    weights = dict(weight_type=args.dtype, group_size=args.group_size)

    source = args.hf or args.meta_llama or args.llama2c or args.checkpoint or args.tokenizer
    culprit = source or args.out
    try:
        if args.hf or args.meta_llama:
            if args.hf:
                cfg, tensors, notes = read_hf(args.hf, args.rope_layout or "neox")
            else:
                cfg, tensors, notes = read_meta(args.meta_llama, args.rope_layout or "interleaved",
                                                args.seq_len)
            if args.hf and args.seq_len is not None:
                cfg["seq_len"] = args.seq_len
            if cfg["seq_len"] > 32768:
                notes.append(f"seq_len {cfg['seq_len']}: run sizes its KV cache for the training "
                             "context unless told otherwise; pass run --ctx N to use less memory")
            cfg.update(weights)
            write_checkpoint(args.out, cfg, tensors)
            for note in notes:
                print(f"export.py: note: {note}", file=sys.stderr)
            print(f"export.py: {_describe(cfg, args.out)}", file=sys.stderr)
        elif args.llama2c or args.checkpoint:
            if args.llama2c:
                cfg, tensors = read_llama2c(args.llama2c)
            else:
                cfg, tensors = read_checkpoint(args.checkpoint)
                if os.path.exists(args.out) and os.path.samefile(args.checkpoint, args.out):
                    raise ExportError("OUT is the input file; write to another path")
            cfg.update(weights)
            write_checkpoint(args.out, cfg, tensors)
        elif args.tokenizer:
            pieces, scores = sentencepiece_vocab(args.tokenizer)
            write_tokenizer(args.out, pieces, scores)
        else:
            cfg = _parse_random_spec(args.random)
            cfg.update(shared_classifier=not args.unshared,
                       rope_layout=args.rope_layout or "interleaved",
                       rot_dim=args.rot_dim, rope_theta=args.rope_theta, norm_eps=args.norm_eps,
                       **weights)
            cfg = normalize_config(cfg)
            write_checkpoint(args.out, cfg, random_tensors(cfg, args.seed))
    except ExportError as e:
        msg = str(e)
        # name the file every message is about: the source, else the output
        if not msg.startswith(args.out) and not (source and msg.startswith(source)):
            msg = f"{culprit}: {msg}"
        print(f"export.py: {msg}", file=sys.stderr)
        return 1
    except OSError as e:
        name = e.filename if e.filename else culprit
        print(f"export.py: {name}: {e.strerror or e}", file=sys.stderr)
        return 1
    except MemoryError:
        print(f"export.py: {culprit}: out of memory", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"export.py: {args.out}: interrupted; nothing written", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
