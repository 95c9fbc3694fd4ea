"""Our checkpoint format ("LRPE", versions 1 and 2; model.h documents it field
by field): the header fields, the tensor table, config validation
(normalize_config), the writer (write_checkpoint, float32 or q8_0) and a
reader for tests and round trips (read_checkpoint), plus random weights
(random_tensors) for tests and benchmarks."""

import math
import os
import struct

import numpy as np

from convert.common import ExportError, INT32_MAX, _AtomicFile, _Progress
from convert.lazy import _as_lazy, _view_rows


MAGIC = 0x4550524C  # the bytes "LRPE" read as a little-endian u32
VERSION = 2       # the newest version; write_checkpoint writes 1 when that is enough
HEADER_BYTES = 256
ALIGN = 64
WEIGHT_F32 = 0
WEIGHT_TYPES = ("f32", "q8_0")  # index = weight_type in the header
Q8_DEFAULT_GROUP = 32

ROPE_LAYOUTS = ("interleaved", "neox")  # index = value in the header
ROPE_SCALINGS = ("none", "linear", "ntk", "dynamic", "yarn", "llama3", "longrope")
BIAS_QKV, BIAS_O, BIAS_MLP = 1, 2, 4  # bias_flags bits (model.h)
MAX_CTX = 1 << 24  # run.c's limit on any context length
MAX_ATTN_FACTOR = 1e3  # run.c's limit on rope_attn_factor
MAX_ROPE_PARAM = 1e6   # run.c's limit on yarn_beta_fast/slow and llama3_low/high_freq
FLT_MAX = float(np.finfo(np.float32).max)
FLT_MIN_NORMAL = float(np.finfo(np.float32).tiny)

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
    ("rope_attn_factor", "f"),
    ("llama3_low_freq", "f"),
    ("llama3_high_freq", "f"),
    ("bias_flags", "i"),          # version 2 from here
    ("sliding_window", "i"),
    ("window_first_layer", "i"),
]
HEADER_STRUCT = struct.Struct("<" + "".join(code for _, code in HEADER_FIELDS))
assert HEADER_STRUCT.size == 116  # fields end at offset 116; 116..255 reserved, zero
V1_HEADER_END = 104               # version 1's fields end here; its 104..255 are zero

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
    "rope_attn_factor": 0.0,     # YaRN's and LongRoPE's mscale; 0 = derive it from the factor
    "llama3_low_freq": 1.0,
    "llama3_high_freq": 4.0,
    "weight_type": "f32",        # f32 | q8_0 (or the header's 0 | 1)
    "group_size": 0,             # q8_0: values per scale; 0 = the default (Q8_DEFAULT_GROUP,
                                 # or the largest power of two below it dividing dim and hidden_dim)
    "qkv_bias": False,           # tensors bq, bk, bv (Qwen2)
    "o_bias": False,             # tensor bo
    "mlp_bias": False,           # tensors b1, b2, b3
    "sliding_window": 0,         # W: a query sees the W most recent positions; 0 = all
    "window_first_layer": 0,     # layers l >= this use the window (Qwen2's max_window_layers)
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
    ("bq",               lambda c: (c["n_layers"], c["dim"]), False),
    ("bk",               lambda c: (c["n_layers"], _kv_dim(c)), False),
    ("bv",               lambda c: (c["n_layers"], _kv_dim(c)), False),
    ("bo",               lambda c: (c["n_layers"], c["dim"]), False),
    ("b1",               lambda c: (c["n_layers"], c["hidden_dim"]), False),
    ("b2",               lambda c: (c["n_layers"], c["dim"]), False),
    ("b3",               lambda c: (c["n_layers"], c["hidden_dim"]), False),
    ("rope_short_factor", lambda c: (c["rot_dim"] // 2,), False),
    ("rope_long_factor", lambda c: (c["rot_dim"] // 2,), False),
]
# The tensors only some checkpoints hold, and which ones.
OPTIONAL_TENSORS = {
    "wcls": lambda c: not c["shared_classifier"],
    **{n: lambda c: c["qkv_bias"] for n in ("bq", "bk", "bv")},
    "bo": lambda c: c["o_bias"],
    **{n: lambda c: c["mlp_bias"] for n in ("b1", "b2", "b3")},
    **{n: lambda c: c["rope_scaling"] == "longrope" for n in ("rope_short_factor", "rope_long_factor")},
}


def _kv_dim(c):
    return c["n_kv_heads"] * (c["dim"] // c["n_heads"])


def tensor_names(cfg):
    """The tensor names a checkpoint with this config (normalized) holds, in file order."""
    return [name for name, _, _ in TENSOR_TABLE
            if name not in OPTIONAL_TENSORS or OPTIONAL_TENSORS[name](cfg)]


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

    _check_sizes(c)
    _check_rope_names(c)
    _check_numbers(c)
    _check_flags(c)
    _check_weights(c)
    return c


def _check_sizes(c):
    """The integer fields: positive sizes, heads that divide, rot_dim resolved
    (None: the head size), ids inside the vocabulary."""
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


def _check_rope_names(c):
    """rope_layout and rope_scaling as names (the header's integers accepted)."""
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


def _check_numbers(c):
    """The float fields: finite float32 values in the ranges run's loader accepts."""
    for k in ("norm_eps", "rope_theta", "rope_factor", "yarn_beta_fast", "yarn_beta_slow",
              "rope_attn_factor", "llama3_low_freq", "llama3_high_freq"):
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
    for k in ("yarn_beta_fast", "yarn_beta_slow", "llama3_low_freq", "llama3_high_freq"):
        if not 0 <= c[k] <= MAX_ROPE_PARAM:
            raise ExportError(f"config {k}={c[k]:g} must be in [0, {MAX_ROPE_PARAM:g}] (run refuses larger values)")
    if not 0 <= c["rope_attn_factor"] <= MAX_ATTN_FACTOR:
        raise ExportError(f"config rope_attn_factor={c['rope_attn_factor']} must be in [0, {MAX_ATTN_FACTOR:g}] "
                          "(0 = derive from the factor; run refuses larger values)")


def _check_flags(c):
    """The bias flags (booleans) and the sliding window's two integers."""
    for k in ("qkv_bias", "o_bias", "mlp_bias"):
        if not isinstance(c[k], (bool, np.bool_)):
            raise ExportError(f"config {k}={c[k]!r} is not true or false")
        c[k] = bool(c[k])
    for k, hi in (("sliding_window", MAX_CTX), ("window_first_layer", c["n_layers"])):
        v = c[k]
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= v <= hi:
            raise ExportError(f"config {k}={v!r} must be an integer in 0..{hi}")
        c[k] = int(v)


def _check_weights(c):
    """weight_type as a name, and q8_0's group_size (0: the default)."""
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


def bias_flags(c):
    """The header's bias_flags of a normalized config."""
    return BIAS_QKV * c["qkv_bias"] | BIAS_O * c["o_bias"] | BIAS_MLP * c["mlp_bias"]


def format_version(c):
    """The oldest format version that holds a checkpoint with this (normalized)
    config: 2 for biases, a sliding window or LongRoPE, else 1."""
    needs_2 = bias_flags(c) or c["sliding_window"] or c["window_first_layer"] \
        or c["rope_scaling"] == "longrope"
    return 2 if needs_2 else 1


def _pack_header(c):
    values = dict(c)
    values.update(magic=MAGIC, version=format_version(c),
                  weight_type=WEIGHT_TYPES.index(c["weight_type"]),
                  shared_classifier=int(c["shared_classifier"]),
                  rope_layout=ROPE_LAYOUTS.index(c["rope_layout"]),
                  rope_scaling=ROPE_SCALINGS.index(c["rope_scaling"]), bias_flags=bias_flags(c))
    packed = HEADER_STRUCT.pack(*(values[name] for name, _ in HEADER_FIELDS))
    return packed + bytes(HEADER_BYTES - len(packed))


def read_header(path):
    """Read the header of a version-1 checkpoint back into a dict (every
    HEADER_FIELDS entry, rope_layout/rope_scaling as integers, plus
    'reserved_zero': whether the bytes after the version's fields (version 1:
    104..255, version 2: 116..255) are all zero). No validation."""
    with open(path, "rb") as f:
        raw = f.read(HEADER_BYTES)
    if len(raw) < HEADER_BYTES:
        raise ExportError(f"{path}: {len(raw)} bytes, shorter than the {HEADER_BYTES}-byte header")
    h = dict(zip((name for name, _ in HEADER_FIELDS), HEADER_STRUCT.unpack_from(raw)))
    h["reserved_zero"] = not any(raw[V1_HEADER_END if h["version"] == 1 else HEADER_STRUCT.size:])
    return h


# write_checkpoint asks each lazy tensor (convert/lazy.py) for this much at a time
_CHUNK_BYTES = 16 << 20  # convert and write at most this much at a time


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
    """Write a checkpoint: version 1, or 2 when it has biases, a sliding window
    or LongRoPE (format_version).

    cfg: dict with dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size,
    seq_len, and optionally the keys of CONFIG_DEFAULTS.
    tensors: name -> array (any real dtype; written as float32) or lazy tensor
    (see convert/lazy.py), shapes as in TENSOR_TABLE; wcls is required
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
                              f"{done[0] / 2**20:.0f}/{total_mb:.0f} MiB written")
            if scales_offset is None:
                _write_tensor(f, name, lazy[name], on_block)
            else:
                _write_q8_tensor(f, name, lazy[name], c["group_size"], scales_offset, on_block)
        assert f.tell() == size, (f.tell(), size)
        f.flush()
        os.fsync(f.fileno())  # on disk before the rename makes it visible
    progress.done(f"done, {len(layout)} tensors, {total_mb:.0f} MiB")


def read_checkpoint(path):
    """Read a checkpoint written by write_checkpoint: (cfg, tensors),
    tensors as read-only float32 memory maps (q8_0 matrices: dequantized
    float32 arrays). Checks magic, version and size
    (for tests and round trips; run.c is the real loader)."""
    path = os.fspath(path)
    h = read_header(path)
    if h["magic"] != MAGIC or h["version"] not in (1, VERSION):
        raise ExportError(f"{path}: not a version-1 or -{VERSION} checkpoint")
    cfg = {k: h[k] for k in CONFIG_REQUIRED}
    for k in CONFIG_DEFAULTS:
        if k in h:
            cfg[k] = h[k]
    cfg["shared_classifier"] = bool(h["shared_classifier"])
    flags = h["bias_flags"] if h["version"] >= 2 else 0
    cfg.update(qkv_bias=bool(flags & BIAS_QKV), o_bias=bool(flags & BIAS_O),
               mlp_bias=bool(flags & BIAS_MLP))
    if h["version"] == 1:
        cfg.update(sliding_window=0, window_first_layer=0)
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
        elif name.startswith("rope_"):  # LongRoPE's divisors of the frequencies
            out[name] = rng.uniform(1.0, 4.0, size=shape).astype(np.float32)
        elif name in ("token_embedding", "wcls") or name in ("bq", "bk", "bv", "bo", "b1", "b2", "b3"):
            out[name] = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.5)
        else:
            fan_in = shape[-1]
            out[name] = rng.standard_normal(shape, dtype=np.float32) * np.float32(fan_in ** -0.5)
    return out
