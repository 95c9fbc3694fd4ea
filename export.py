#!/usr/bin/env python3
"""export.py: the only writer of checkpoints and tokenizers for `run`.

The checkpoint format (version 1, magic "LRPE") is documented field by field in
the top comment of model.h. In short:

    256-byte header  magic, version, dimensions, shared-classifier flag, BOS/EOS,
                     weight type, norm eps and every RoPE parameter; the rest zero
    tensors          float32, little-endian, row-major, in TENSOR_TABLE order,
                     each starting at a file offset that is a multiple of 64
                     (zero padding in between); the file ends where the last
                     tensor ends

The tokenizer is llama2.c's tokenizer.bin layout:

    i32 max_token_length, then per token: f32 score, i32 length, the bytes

Python API (numpy only):
    write_checkpoint(path, cfg, tensors)   cfg: dict (see CONFIG_DEFAULTS)
    write_tokenizer(path, pieces, scores)
    read_llama2c(path) -> (cfg, tensors)   tensors are read-only memory maps
    random_tensors(cfg, seed) -> tensors   small random models for tests
    read_header(path) -> dict              the header of a version-1 file

Command line:
    python3 export.py OUT --llama2c IN.bin        convert a llama2.c checkpoint
    python3 export.py OUT --tokenizer FILE.model  sentencepiece -> tokenizer.bin
    python3 export.py OUT --random D,H,L,NH,NKV,V,S [--seed N] [--unshared] ...
                                                   random weights (tests, benchmarks)

Every file is written atomically: into a temporary file beside OUT, renamed
over OUT only when complete. On any error the temporary file is removed, OUT is
left as it was, one line naming the file and the problem goes to stderr, and
the exit status is 1.
"""

import argparse
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
}

# The tensor order of the format. run.c's `weight_table` walks the same list to
# assign its pointers: reordering one side without the other is a format change.
# Each entry: (name, shape as a function of the config).
TENSOR_TABLE = [
    ("token_embedding",  lambda c: (c["vocab_size"], c["dim"])),
    ("rms_att_weight",   lambda c: (c["n_layers"], c["dim"])),
    ("wq",               lambda c: (c["n_layers"], c["dim"], c["dim"])),
    ("wk",               lambda c: (c["n_layers"], _kv_dim(c), c["dim"])),
    ("wv",               lambda c: (c["n_layers"], _kv_dim(c), c["dim"])),
    ("wo",               lambda c: (c["n_layers"], c["dim"], c["dim"])),
    ("rms_ffn_weight",   lambda c: (c["n_layers"], c["dim"])),
    ("w1",               lambda c: (c["n_layers"], c["hidden_dim"], c["dim"])),  # gate
    ("w2",               lambda c: (c["n_layers"], c["dim"], c["hidden_dim"])),  # down
    ("w3",               lambda c: (c["n_layers"], c["hidden_dim"], c["dim"])),  # up
    ("rms_final_weight", lambda c: (c["dim"],)),
    ("wcls",             lambda c: (c["vocab_size"], c["dim"])),  # only when not shared
]

INT32_MAX = 2**31 - 1


class ExportError(Exception):
    """A problem with an input or an argument; str() is one line for the user."""


def _kv_dim(c):
    return c["n_kv_heads"] * (c["dim"] // c["n_heads"])


def tensor_names(cfg):
    """The tensor names a checkpoint with this config holds, in file order."""
    return [name for name, _ in TENSOR_TABLE
            if name != "wcls" or not cfg["shared_classifier"]]


def _align(offset):
    return (offset + ALIGN - 1) // ALIGN * ALIGN


def tensor_layout(cfg):
    """[(name, shape, file offset)] in file order, and the file size.

    The file size is the end of the last tensor: header, then each tensor at
    the next multiple of ALIGN."""
    cfg = normalize_config(cfg)
    shapes = dict((name, fn(cfg)) for name, fn in TENSOR_TABLE)
    layout, offset = [], HEADER_BYTES
    for name in tensor_names(cfg):
        offset = _align(offset)
        layout.append((name, shapes[name], offset))
        offset += 4 * math.prod(shapes[name])
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
    return c


def _pack_header(c):
    values = dict(c)
    values.update(magic=MAGIC, version=VERSION, weight_type=WEIGHT_F32, group_size=0,
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
    """Reports on stderr, but only once a job has taken more than 2 seconds."""

    def __init__(self, what):
        self.what, self.start, self.last = what, time.monotonic(), None

    def step(self, text):
        now = time.monotonic()
        if now - self.start > 2.0 and (self.last is None or now - self.last > 1.0):
            print(f"{self.what}: {text} ({now - self.start:.0f} s)", file=sys.stderr, flush=True)
            self.last = now

    def done(self):
        if self.last is not None or time.monotonic() - self.start > 2.0:
            print(f"{self.what}: done ({time.monotonic() - self.start:.0f} s)", file=sys.stderr,
                  flush=True)


# ---------------------------------------------------------------------------
# Checkpoints

_CHUNK_BYTES = 16 << 20  # convert and write at most this much at a time


def _check_tensor(name, value, shape):
    a = value if isinstance(value, np.ndarray) else np.asarray(value)
    if a.shape != tuple(shape):
        raise ExportError(f"tensor {name} has shape {a.shape}, expected {tuple(shape)}")
    if not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
        raise ExportError(f"tensor {name} has dtype {a.dtype}, expected a real number type")
    return a


def _write_tensor(f, name, a):
    """Write a as little-endian float32, in row blocks so that a large tensor
    (or a memory map) is never converted or copied all at once."""
    flat = a.reshape(a.shape[0], -1) if a.ndim > 1 else a.reshape(1, -1)
    rows = max(1, _CHUNK_BYTES // max(1, 4 * flat.shape[1]))
    for r in range(0, flat.shape[0], rows):
        block = np.ascontiguousarray(flat[r:r + rows], dtype="<f4")
        if not np.isfinite(block).all():
            raise ExportError(f"tensor {name} contains NaN or infinite values")
        f.write(block.data)


def write_checkpoint(path, cfg, tensors):
    """Write a version-1 checkpoint.

    cfg: dict with dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size,
    seq_len, and optionally the keys of CONFIG_DEFAULTS.
    tensors: name -> array (any real dtype; written as float32), shapes as in
    TENSOR_TABLE; wcls is required exactly when shared_classifier is false.
    The file is written atomically; raises ExportError (nothing written) when
    the config or a tensor is wrong."""
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
    arrays = {name: _check_tensor(name, tensors[name], shape) for name, shape, _ in layout}

    progress = _Progress(f"writing {path}")
    with _AtomicFile(path) as f:
        f.write(_pack_header(c))
        for i, (name, shape, offset) in enumerate(layout):
            f.write(bytes(offset - f.tell()))  # zero padding up to the aligned offset
            _write_tensor(f, name, arrays[name])
            progress.step(f"{name} ({i + 1}/{len(layout)})")
        assert f.tell() == size, (f.tell(), size)
        f.flush()
        os.fsync(f.fileno())  # on disk before the rename makes it visible
    progress.done()


def read_checkpoint(path):
    """Read a version-1 checkpoint written by write_checkpoint: (cfg, tensors),
    tensors as read-only float32 memory maps. Checks magic, version and size
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
    tensors = {name: np.memmap(path, dtype="<f4", mode="r", offset=offset, shape=shape)
               for name, shape, offset in layout}
    return c, tensors


def random_tensors(cfg, seed=0):
    """Random weights for cfg: matrices N(0, 1/fan_in) (so every projection
    keeps unit scale and attention scores are O(1)), embeddings and wcls
    N(0, 0.5^2), norm weights uniform in [0.5, 1.5] (so a norm that ignores its
    weight is visible). Deterministic for a given seed. float32."""
    c = normalize_config(cfg)
    rng = np.random.default_rng(seed)
    shapes = dict((name, fn(c)) for name, fn in TENSOR_TABLE)
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


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="export.py",
        description="Write checkpoints (version 1, see model.h) and tokenizers for run.")
    p.add_argument("out", help="output file")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--llama2c", metavar="IN.bin", help="convert a llama2.c (version 0) checkpoint")
    src.add_argument("--tokenizer", metavar="FILE.model",
                     help="convert a sentencepiece model to tokenizer.bin")
    src.add_argument("--random", metavar="D,H,L,NH,NKV,V,S",
                     help="random weights: dim,hidden_dim,n_layers,n_heads,n_kv_heads,"
                          "vocab_size,seq_len")
    r = p.add_argument_group("options for --random")
    r.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    r.add_argument("--unshared", action="store_true", help="separate classifier (wcls)")
    r.add_argument("--rope-layout", choices=ROPE_LAYOUTS, default="interleaved")
    r.add_argument("--rot-dim", type=int, default=None, help="rotated dims per head (default: all)")
    r.add_argument("--rope-theta", type=float, default=10000.0)
    r.add_argument("--norm-eps", type=float, default=1e-5)
    args = p.parse_args(argv)

    culprit = args.llama2c or args.tokenizer or args.out
    try:
        if args.llama2c:
            cfg, tensors = read_llama2c(args.llama2c)
            try:
                write_checkpoint(args.out, cfg, tensors)
            except ExportError as e:
                if str(e).startswith(args.out):
                    raise
                raise ExportError(f"{args.llama2c}: {e}") from None
        elif args.tokenizer:
            pieces, scores = sentencepiece_vocab(args.tokenizer)
            write_tokenizer(args.out, pieces, scores)
        else:
            cfg = _parse_random_spec(args.random)
            cfg.update(shared_classifier=not args.unshared, rope_layout=args.rope_layout,
                       rot_dim=args.rot_dim, rope_theta=args.rope_theta, norm_eps=args.norm_eps)
            cfg = normalize_config(cfg)
            write_checkpoint(args.out, cfg, random_tensors(cfg, args.seed))
    except ExportError as e:
        msg = str(e)
        if args.llama2c is None and args.tokenizer is None and not msg.startswith(args.out):
            msg = f"{args.out}: {msg}"  # name the file every message is about
        print(f"export.py: {msg}", file=sys.stderr)
        return 1
    except OSError as e:
        name = e.filename if e.filename else culprit
        print(f"export.py: {name}: {e.strerror or e}", file=sys.stderr)
        return 1
    except MemoryError:
        print(f"export.py: {culprit}: out of memory", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
