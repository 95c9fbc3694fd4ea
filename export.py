#!/usr/bin/env python3
"""export.py: the only writer of checkpoints and tokenizers for `run`.

The checkpoint format (versions 1 and 2, magic "LRPE") is documented field by
field in the top comment of model.h. In short:

    256-byte header  magic, version, dimensions, shared-classifier flag, BOS/EOS,
                     weight type, norm eps and every RoPE parameter; version 2 also
                     which projections have biases and the sliding window; the
                     rest zero. Version 1 is written whenever a file needs none of
                     version 2's fields (no biases, no window, no LongRoPE)
    tensors          float32, little-endian, row-major, in TENSOR_TABLE order,
                     each starting at a file offset that is a multiple of 64
                     (zero padding in between); the file ends where the last
                     tensor ends. With --dtype q8_0 (weight_type 1) the
                     matrices are int8 values, then float32 scales, one per
                     group_size values of a row (model.h, "q8_0 tensors")

Tokenizers come in two formats (model.h, "Tokenizer files"): llama2.c's
tokenizer.bin for sentencepiece vocabularies converted from a .model file

    i32 max_token_length, then per token: f32 score, i32 length, the bytes

and version 3 ("LTOK") for every other source (tokenizer.json, tiktoken, GGUF):
a 64-byte header (type, pre-tokenizer, vocab_size, merges, BOS/EOS/EOT/PAD,
add_bos, chat template, stop ids, system text lengths), then per piece f32
score, i32 kind, i32 length, the raw bytes, then the merges as pairs of ids,
the stop ids, the template's default system prompt and system prefix.

Python API (numpy only; torch for Meta .pth files, gguf for GGUF files):
    write_checkpoint(path, cfg, tensors)   cfg: dict (see CONFIG_DEFAULTS); tensors:
                                           arrays or lazy tensors, streamed
    write_tokenizer(path, pieces, scores)   llama2.c's format
    write_tokenizer_ltok(path, tok)        version 3; tok: a dict (see "Tokenizer files,
                                           version 3"); pack_tokenizer_ltok(tok) -> bytes
    recognize_chat_template(text) -> (name, system_default, system_prefix, notes)
    read_gguf(path, layout) -> (cfg, tensors, tok, notes)   GGUF (gguf package), lazy tensors
    read_gguf_tokenizer(path) -> (tok, notes)
    read_tokenizer_json(path, vocab_size) -> (tok, notes)   Hugging Face tokenizer.json
    read_tiktoken_tokenizer(path) -> (tok, notes)          tiktoken (Llama 3 tokenizer.model)
    tiktoken_merges(tokens) -> (merges, unreachable)       merges derived from ranks
    read_tokenizer_source(path, vocab_size) -> ("v1" | "ltok", ..., notes)   any tokenizer file
    fit_llama3_rope_freqs(where, freqs, base, rot_dim, orig_ctx) -> header fields | None
    read_llama2c(path) -> (cfg, tensors)   tensors are read-only memory maps
    read_hf(dir, layout) -> (cfg, tensors, notes)     Hugging Face Llama, Mistral, Qwen2,
                                                      Phi-3; lazy tensors
    read_meta(dir, layout, seq_len) -> (cfg, tensors, notes)   Meta consolidated.*.pth
    hf_config(config_dict) -> (cfg, notes) config.json -> our header fields
    read_safetensors_header(path) -> {name: lazy tensor}
    permute_heads(w, n_heads, rot_dim, to_interleaved)  the q/k row permutation
    random_tensors(cfg, seed) -> tensors   small random models for tests
    read_header(path) -> dict              the header of a version-1 or -2 file

Command line (docs/convert.md is the user's guide to the conversions):
    python3 export.py OUT --hf DIR                Hugging Face directory (config.json +
                                                  safetensors): Llama, Mistral, Qwen2, Phi-3
    python3 export.py OUT --meta-llama DIR        Meta params.json + consolidated.*.pth
        [--rope-layout neox|interleaved]          q/k layout to write (default: the
                                                  source's: neox for HF, interleaved for Meta)
        [--seq-len N]                             training context to record
    python3 export.py OUT --gguf FILE.gguf        llama.cpp GGUF (Llama architecture), any
                                                  tensor type gguf dequantizes; writes its
                                                  tokenizer too (default: tokenizer.bin beside OUT)
        [--rope-layout neox|interleaved]          (default interleaved, as GGUF stores q/k)
        [--tokenizer-out PATH]                    --gguf: the tokenizer's path; --hf/--meta-llama:
                                                  also convert DIR's tokenizer to PATH
    python3 export.py OUT --llama2c IN.bin        convert a llama2.c checkpoint
    python3 export.py OUT --checkpoint IN.bin     re-export one of ours (e.g. --dtype q8_0)
    python3 export.py OUT --tokenizer FILE        sentencepiece .model -> tokenizer.bin;
                                                  tokenizer.json, tiktoken, .gguf -> version 3
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
import re
import struct
import sys
import time

import numpy as np

MAGIC = 0x4550524C  # the bytes "LRPE" read as a little-endian u32
VERSION = 2       # the newest version; write_checkpoint writes 1 when that is enough
HEADER_BYTES = 256
ALIGN = 64
LEGACY_HEADER_BYTES = 28  # llama2.c: 7 int32
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

INT32_MAX = 2**31 - 1


class ExportError(Exception):
    """A problem with an input or an argument; str() is one line for the user."""


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
    for k in ("qkv_bias", "o_bias", "mlp_bias"):
        if not isinstance(c[k], (bool, np.bool_)):
            raise ExportError(f"config {k}={c[k]!r} is not true or false")
        c[k] = bool(c[k])
    for k, hi in (("sliding_window", MAX_CTX), ("window_first_layer", c["n_layers"])):
        v = c[k]
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= v <= hi:
            raise ExportError(f"config {k}={v!r} must be an integer in 0..{hi}")
        c[k] = int(v)

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
    """Write a checkpoint: version 1, or 2 when it has biases, a sliding window
    or LongRoPE (format_version).

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
    except RecursionError:
        raise ExportError(f"{path}: header JSON is nested too deeply; not a safetensors file") from None
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
    except RecursionError:  # json recurses once per nesting level
        raise ExportError(f"{path}: JSON nested too deeply ({what})") from None
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
#     longrope short_factor, long_factor (tensors rope_short_factor, rope_long_factor),
#              original_max_position_embeddings, factor (default max_position_embeddings /
#              original), attention_factor; the old type name "su" (and Phi-3's "yarn")
#   For llama3, yarn and longrope a top-level original_max_position_embeddings wins
#   over the one inside rope_scaling, as transformers v5's standardize_rope_params
#   decides (Phi-3's config class defaults it to 4096).
# The families differ in what their attention and MLP carry:
#   llama    attention_bias (q, k, v and o biases), mlp_bias (gate, up, down biases)
#   mistral  sliding_window on every layer (absent: 4096, MistralConfig's default)
#   qwen2    q, k, v biases always; with use_sliding_window, sliding_window on the
#            layers from max_window_layers on (or as layer_types lists them)
#   phi3     fused qkv_proj and gate_up_proj (split on export), sliding_window on every
#            layer, longrope

HF_FAMILIES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
               "qwen2": "Qwen2ForCausalLM", "phi3": "Phi3ForCausalLM"}
HF_ARCHITECTURES = tuple(HF_FAMILIES.values())
# What each family's config class gives a key the config.json leaves out
# (transformers' LlamaConfig, MistralConfig, Qwen2Config, Phi3Config);
# num_key_value_heads None: the number of attention heads.
HF_DEFAULTS = {
    "llama": dict(max_position_embeddings=2048, rms_norm_eps=1e-6, num_key_value_heads=None),
    "mistral": dict(max_position_embeddings=131072, rms_norm_eps=1e-6, num_key_value_heads=8),
    "qwen2": dict(max_position_embeddings=32768, rms_norm_eps=1e-6, num_key_value_heads=32),
    "phi3": dict(max_position_embeddings=4096, rms_norm_eps=1e-5, num_key_value_heads=None),
}
HF_SCALING_KEYS = {
    "linear": {"factor"},
    "dynamic": {"factor"},
    "yarn": {"factor", "original_max_position_embeddings", "beta_fast", "beta_slow",
             "attention_factor", "mscale", "mscale_all_dim", "truncate"},
    "llama3": {"factor", "low_freq_factor", "high_freq_factor",
               "original_max_position_embeddings"},
    "longrope": {"short_factor", "long_factor", "factor", "attention_factor",
                 "original_max_position_embeddings"},
}
PHI3_DEFAULT_ORIGINAL = 4096  # Phi3Config's original_max_position_embeddings


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


def _hf_rope_scaling(where, config, seq_len, notes, family="llama", rot=None):
    """The RoPE scaling fields of our header from rope_scaling (or the v5
    rope_parameters), as a dict of CONFIG_DEFAULTS keys, and LongRoPE's factor
    arrays as tensors ({} for every other type). rot: the rotated dims per head."""
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
        return {"rope_scaling": "none"}, {}
    if t == "su" or (family == "phi3" and t == "yarn"):
        notes.append(f"rope type {_js(t)} is LongRoPE (transformers reads it as \"longrope\""
                     + (" for Phi-3)" if t == "yarn" else ")"))
        t = "longrope"
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
    top = config.get("original_max_position_embeddings")
    if top is None and family == "phi3" and t == "longrope":
        top = PHI3_DEFAULT_ORIGINAL
        notes.append(f"original_max_position_embeddings absent: using {top}, Phi3Config's default")
    has_orig = top is not None or d.get("original_max_position_embeddings") is not None

    def orig_ctx():
        """L: for llama3, yarn and longrope transformers v5 gives a top-level
        original_max_position_embeddings priority over the one in rope_scaling."""
        inner = d.get("original_max_position_embeddings")
        if top is not None:
            L = _integer(where, "original_max_position_embeddings", top)
            if inner is not None and inner != top:
                notes.append(f"{t}: original_max_position_embeddings is {_js(top)} at the top level "
                             f"and {_js(inner)} in {key}: using the top-level {L}, as transformers "
                             "v5 does")
            return L
        if inner is None:
            notes.append(f"{t}: original_max_position_embeddings absent: using "
                         f"max_position_embeddings={seq_len}, as transformers v5 does")
            return seq_len
        return _integer(what, "original_max_position_embeddings", inner)

    def factor(required=True):
        if "factor" not in d or d["factor"] is None:
            if required:
                raise ExportError(f"{what}: {t} scaling needs a factor")
            return None
        f = _number(what, "factor", d["factor"])
        if f < 1 and t == "longrope":  # it only sets the attention factor: 1 for any factor <= 1
            notes.append(f"longrope: factor {f:g} < 1: storing 1 (the same attention factor, 1)")
            return 1.0
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
            if not has_orig:
                raise ExportError(f"{what}: yarn scaling needs a factor")
            s = seq_len / L
            notes.append(f"yarn: factor absent: using max_position_embeddings / "
                         f"original_max_position_embeddings = {s:g}")
            if s < 1:
                raise ExportError(f"{what}: yarn factor max_position_embeddings / "
                                  f"original_max_position_embeddings = {s:g} < 1")
        elif has_orig and not math.isclose(s, seq_len / L):
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
        out["rope_attn_factor"] = att if att is not None else 0.0  # 0: run uses 0.1 ln s + 1
    elif t == "longrope":
        L, n = orig_ctx(), (rot or 0) // 2
        arrays = {}
        for k in ("short_factor", "long_factor"):
            v = d.get(k)
            if not isinstance(v, list) or len(v) != n:
                got = f"a list of {len(v)}" if isinstance(v, list) else _js(v)
                raise ExportError(f"{what}: longrope {k} must be a list of {n} numbers (one per "
                                  f"rotated pair), got {got}")
            values = [_number(what, f"{k}[{i}]", x) for i, x in enumerate(v)]
            for i, x in enumerate(values):  # run divides frequencies by them, as float32
                if not FLT_MIN_NORMAL <= x <= FLT_MAX:
                    raise ExportError(f"{what}: longrope {k}[{i}]={x!r}: expected a positive value that "
                                      f"float32 holds ({FLT_MIN_NORMAL:g} to {FLT_MAX:g})")
            arrays["rope_" + k] = np.array(values, dtype=np.float32)
        s = factor(required=False)
        if s is None:
            s = seq_len / L
            if s < 1:
                notes.append(f"longrope: max_position_embeddings / original_max_position_embeddings "
                             f"= {s:g} < 1: storing factor 1 (the factor only sets the attention "
                             "factor, which is 1 for any factor <= 1)")
                s = 1.0
        att = d.get("attention_factor")
        out.update(rope_factor=s, rope_orig_ctx=L,
                   rope_attn_factor=_number(what, "attention_factor", att) if att is not None else 0.0)
        return out, arrays
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
    return out, {}


def hf_family(config, where="config.json"):
    """The family of a config.json (a key of HF_FAMILIES) from model_type and
    architectures, which must agree. Raises ExportError for any other model."""
    mt, archs = config.get("model_type"), config.get("architectures") or []
    if not isinstance(archs, list):
        archs = [archs]
    if (mt is not None and not isinstance(mt, str)) or not all(isinstance(a, str) for a in archs):
        raise ExportError(f"{where}: model_type={_js(mt)}, architectures={_js(archs)}: expected "
                          "strings")
    families = {f for f, a in HF_FAMILIES.items() if a in archs}
    family = mt if mt is not None else (families.pop() if len(families) == 1 else None)
    if family not in HF_FAMILIES or any(a != HF_FAMILIES[family] for a in archs):
        name = ", ".join(map(str, archs)) or f"model_type {_js(mt)}"
        raise ExportError(f"{where}: {name} is not supported (supported: "
                          f"{', '.join(HF_ARCHITECTURES)})")
    return family


def _hf_biases(where, config, family, notes):
    """(qkv_bias, o_bias, mlp_bias) as the family's modeling code builds its layers."""
    if family == "qwen2":  # Qwen2Attention: q, k, v with bias=True, o without, whatever the config
        return True, False, False
    if family == "llama":
        att, mlp = config.get("attention_bias"), config.get("mlp_bias")
        att, mlp = (False if v is None else v for v in (att, mlp))  # absent or null: no bias
        for key, v in (("attention_bias", att), ("mlp_bias", mlp)):
            if not isinstance(v, bool):
                raise ExportError(f"{where}: {key}={_js(v)} is not true or false")
        return att, att, mlp
    for key in ("attention_bias", "mlp_bias"):
        if config.get(key):
            notes.append(f"ignoring {key}={_js(config[key])}: {HF_FAMILIES[family]} has no biases")
    return False, False, False


def _hf_window(where, config, family, n_layers, notes):
    """(sliding_window, window_first_layer) as the family's attention applies it."""
    if family == "llama":
        if config.get("sliding_window") is not None:
            notes.append(f"ignoring sliding_window={_js(config['sliding_window'])}: Llama attends "
                         "to every position")
        return 0, 0
    if family == "mistral" and "sliding_window" not in config:
        notes.append("sliding_window absent: using 4096, MistralConfig's default")
        w = 4096
    elif family == "qwen2" and not config.get("use_sliding_window", False):
        return 0, 0  # Qwen2Config drops sliding_window unless use_sliding_window is true
    else:
        w = config.get("sliding_window", 4096 if family == "qwen2" else None)
    if w is None:
        return 0, 0
    if isinstance(w, bool) or not isinstance(w, int) or not 1 <= w <= MAX_CTX:
        raise ExportError(f"{where}: sliding_window={_js(w)} is not an integer in 1..{MAX_CTX}")
    if family != "qwen2":
        return w, 0
    types = config.get("layer_types")
    if types is None:  # Qwen2Config: layers from max_window_layers on slide
        first = _integer(where, "max_window_layers", config.get("max_window_layers", 28), minimum=0)
        first = min(first, n_layers)
    else:
        if not isinstance(types, list) or len(types) != n_layers or \
                any(x not in ("full_attention", "sliding_attention") for x in types):
            raise ExportError(f"{where}: layer_types must list \"full_attention\" or "
                              f"\"sliding_attention\" for each of the {n_layers} layers")
        first = types.index("sliding_attention") if "sliding_attention" in types else n_layers
        if any(x != "sliding_attention" for x in types[first:]):
            raise ExportError(f"{where}: layer_types has full-attention layers after sliding ones "
                              "(supported: the sliding layers are the last ones)")
    if first == n_layers:
        notes.append("use_sliding_window is true but no layer slides (max_window_layers >= "
                     "num_hidden_layers)")
        return 0, 0
    return w, first


def hf_config(config, where="config.json"):
    """Map a Hugging Face config.json (a dict) of a supported family (HF_FAMILIES)
    to our config. Returns (cfg, rope_tensors, notes): cfg for write_checkpoint
    (rope_layout "neox": the weights as Hugging Face stores them), rope_tensors:
    LongRoPE's factor arrays ({} for other scalings), notes: lines worth telling
    the user (defaults used, values ignored). Raises ExportError for anything
    that run cannot reproduce."""
    notes = []
    family = hf_family(config, where)
    for key, what in (("qk_norm", "RMSNorm on q and k"), ("use_qk_norm", "RMSNorm on q and k")):
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
    defaults, name = HF_DEFAULTS[family], HF_FAMILIES[family].replace("ForCausalLM", "Config")
    if config.get("num_key_value_heads") is None and defaults["num_key_value_heads"] is not None:
        config = dict(config, num_key_value_heads=defaults["num_key_value_heads"])
        notes.append(f"num_key_value_heads absent: using {defaults['num_key_value_heads']} (the {name} default)")
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
        seq_len = defaults["max_position_embeddings"]
        notes.append(f"max_position_embeddings absent: using {seq_len} (the {name} default)")
    seq_len = _integer(where, "max_position_embeddings", seq_len)
    eps = config.get("rms_norm_eps")
    if eps is None:
        eps = defaults["rms_norm_eps"]
        notes.append(f"rms_norm_eps absent: using {eps:g} (the {name} default)")
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
    qkv_bias, o_bias, mlp_bias = _hf_biases(where, config, family, notes)
    window, first = _hf_window(where, config, family, config["num_hidden_layers"], notes)
    cfg = dict(dim=dim, hidden_dim=config["intermediate_size"],
               n_layers=config["num_hidden_layers"], n_heads=heads, n_kv_heads=kv,
               vocab_size=config["vocab_size"], seq_len=seq_len, shared_classifier=tie,
               bos_id=_hf_token_id(where, config, "bos_token_id", 1, notes),
               eos_id=_hf_token_id(where, config, "eos_token_id", 2, notes),
               norm_eps=eps, rope_theta=theta, rope_layout="neox", rot_dim=rot,
               qkv_bias=qkv_bias, o_bias=o_bias, mlp_bias=mlp_bias,
               sliding_window=window, window_first_layer=first)
    scaling, rope_tensors = _hf_rope_scaling(where, config, seq_len, notes, family, rot)
    cfg.update(scaling)
    for k in ("bos_id", "eos_id"):
        if cfg[k] >= cfg["vocab_size"]:
            raise ExportError(f"{where}: {k.replace('_id', '_token_id')}={cfg[k]} is outside the "
                              f"vocabulary (vocab_size={cfg['vocab_size']})")
    try:
        normalize_config(cfg)
    except ExportError as e:
        raise ExportError(f"{where}: {e}") from None
    return cfg, rope_tensors, notes


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


def _hf_bias_names(i):
    """Our bias tensors and the HF names of layer i's parts."""
    p = f"model.layers.{i}."
    return {"bq": p + "self_attn.q_proj.bias", "bk": p + "self_attn.k_proj.bias",
            "bv": p + "self_attn.v_proj.bias", "bo": p + "self_attn.o_proj.bias",
            "b1": p + "mlp.gate_proj.bias", "b2": p + "mlp.down_proj.bias",
            "b3": p + "mlp.up_proj.bias"}


class _RowSlice:
    """Rows start..start+n-1 of a 2-D lazy tensor: one part of a fused projection
    (Phi-3's qkv_proj holds q, k and v; gate_up_proj holds gate and up)."""

    def __init__(self, src, start, n):
        self.src, self.start, self.shape = src, start, (n, src.shape[1])

    def rows(self, a, b):
        return self.src.rows(self.start + a, self.start + b)


def _unexpected_tensor(name, where, family="llama"):
    arch = HF_FAMILIES.get(family, "Llama")
    if name.endswith(".bias"):
        why = f"biases are not part of {arch} as configured"
    elif "q_norm" in name or "k_norm" in name:
        why = f"RMSNorm on q/k is not part of {arch}"
    else:
        why = f"not part of {arch}"
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
    """A Hugging Face model directory (config.json + safetensors) of a family in
    HF_FAMILIES as (cfg, tensors, notes): tensors are lazy (see "Lazy tensors"),
    nothing is read until write_checkpoint streams them; biases and LongRoPE's
    factors, which are small, are arrays. Phi-3's fused qkv_proj and
    gate_up_proj are split by rows into wq, wk, wv and w1 (gate), w3 (up).

    layout "neox" keeps the q/k rows as Hugging Face stores them (and marks the
    checkpoint neox: run rotates halves, like rotate_half); "interleaved"
    un-permutes them per head (k with the KEY/VALUE head count; the q and k
    biases with them) and marks the checkpoint interleaved. Both give the same
    logits."""
    directory = os.fspath(directory)
    config_path = _source_file(directory, layout, "config.json",
                               "a Hugging Face model directory with config.json",
                               "a Hugging Face model directory")
    config = _read_json(config_path, "a model config")
    cfg, rope_tensors, notes = hf_config(config, config_path)
    family = hf_family(config)
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
    dim, kv_dim, hidden = c["dim"], _kv_dim(c), c["hidden_dim"]
    for i in range(c["n_layers"]):
        names = _hf_layer_names(i)
        if family == "phi3":  # fused projections, split by rows: q | k | v and gate | up
            p = f"model.layers.{i}."
            qkv = take(p + "self_attn.qkv_proj.weight", (dim + 2 * kv_dim, dim))
            gate_up = take(p + "mlp.gate_up_proj.weight", (2 * hidden, dim))
            fused = {"wq": _RowSlice(qkv, 0, dim), "wk": _RowSlice(qkv, dim, kv_dim),
                     "wv": _RowSlice(qkv, dim + kv_dim, kv_dim),
                     "w1": _RowSlice(gate_up, 0, hidden), "w3": _RowSlice(gate_up, hidden, hidden)}
        else:
            fused = {}
        for ours, theirs in names.items():
            per_layer[ours].append(fused[ours] if ours in fused else take(theirs, shapes[ours][1:]))
    if layout == "interleaved":
        rot = c["rot_dim"]
        per_layer["wq"] = [_HeadPermuted(t, c["n_heads"], rot, True) for t in per_layer["wq"]]
        per_layer["wk"] = [_HeadPermuted(t, c["n_kv_heads"], rot, True) for t in per_layer["wk"]]
    for k, parts in per_layer.items():
        tensors[k] = _Stacked(parts)
    for ours in tensor_names(c):  # biases: small, read whole; q and k follow their rows' order
        if not ours.startswith("b") or ours not in _hf_bias_names(0):
            continue
        parts = []
        for i in range(c["n_layers"]):
            v = take(_hf_bias_names(i)[ours], shapes[ours][1:]).rows(0, 1)[0]
            if layout == "interleaved" and ours in ("bq", "bk"):
                heads = c["n_heads"] if ours == "bq" else c["n_kv_heads"]
                v = v[head_permutation(heads, dim // c["n_heads"], c["rot_dim"], True)]
            parts.append(v)
        tensors[ours] = np.stack(parts)
    tensors.update(rope_tensors)
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
        raise _unexpected_tensor(name, source[name].path, family)
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

def pack_tokenizer_v1(pieces, scores):
    """The bytes of llama2.c's tokenizer.bin: i32 max_token_length, then per
    token f32 score, i32 length, the piece's bytes. Raises ExportError."""
    pieces = [bytes(p) for p in pieces]
    scores = [float(s) for s in scores]
    if len(pieces) != len(scores):
        raise ExportError(f"{len(pieces)} pieces but {len(scores)} scores")
    if not pieces:
        raise ExportError("empty vocabulary")
    for i, s in enumerate(scores):
        if not math.isfinite(s):
            raise ExportError(f"score of token {i} is {s}")
    out = [struct.pack("<i", max(len(p) for p in pieces))]
    for piece, score in zip(pieces, scores):
        out.append(struct.pack("<fi", score, len(piece)))
        out.append(piece)
    return b"".join(out)


def write_tokenizer(path, pieces, scores):
    """Write llama2.c's tokenizer.bin (pack_tokenizer_v1). Atomic; raises
    ExportError."""
    _write_bytes(path, pack_tokenizer_v1(pieces, scores))


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
# Tokenizer files, version 3 ("LTOK"; model.h, "Tokenizer files")
#
# A tokenizer is handled as a dict:
#   type      "sentencepiece" (merge by score, <0xHH> byte fallback) or
#             "byte_bpe" (GPT-2 byte-level BPE, merge by rank)
#   pre       "none" (sentencepiece) or the pre-tokenizer of a byte_bpe one:
#             "gpt2", "llama3", "qwen2", "smollm"
#   pieces    [bytes], in id order: raw bytes (GPT-2's character mapping undone)
#   kinds     [PIECE_*] per piece
#   scores    [float] per piece (sentencepiece; None or zeros for byte_bpe)
#   merges    [(left id, right id)], rank 0 first (byte_bpe)
#   bos_id, eos_id, eot_id, pad_id   ids, -1 = none
#   add_bos   whether a prompt starts with BOS
#   chat      the chat template run renders, one of CHAT_TEMPLATES (absent:
#             "unstated"); recognize_chat_template names it from the source's
#   system_default   the system prompt the template puts in when a conversation
#                    has none ("" = none)
#   system_prefix    text the template puts before every system prompt ("" = none)
#   stop_ids  [int], each once: tokens that end a reply (absent: default_stop_ids)
#   chat_template   the source's chat template (str) or None: kept for the
#                   caller, not stored in the file (chat and the two texts are)
#
# Version 2 files (written before) are version 3 without the chat template,
# the stop ids and the system texts: header bytes 44..63 zero, nothing after
# the merges.

TOK_MAGIC = 0x4B4F544C  # the bytes "LTOK" read as a little-endian u32
TOK_VERSION = 3
TOK_HEADER_BYTES = 64
TOK_TYPES = ("sentencepiece", "byte_bpe")                # index = type in the header
PRE_TYPES = ("none", "gpt2", "llama3", "qwen2", "smollm")  # index = pre in the header
PIECE_KINDS = ("normal", "special", "byte", "unused")    # index = a piece's kind
PIECE_NORMAL, PIECE_SPECIAL, PIECE_BYTE, PIECE_UNUSED = range(4)
CHAT_TEMPLATES = ("unstated", "plain", "llama2", "chatml", "llama3")  # index = chat_template
MAX_PIECE_BYTES = 65536
TOK_MAX_STOP = 256
TOK_MAX_SYSTEM = 65536
# magic, version, type, pre, vocab_size, n_merges, bos, eos, eot, pad, add_bos,
# chat_template, n_stop, system_default_len, system_prefix_len; then 4 zero bytes
TOK_HEADER_STRUCT = struct.Struct("<Iiiiiiiiiiiiiii")
assert TOK_HEADER_STRUCT.size == 60
# Texts of end-of-turn pieces, for sources that do not name one (as llama.cpp guesses it)
EOT_TEXTS = (b"<|eot_id|>", b"<|im_end|>", b"<|end|>", b"<end_of_turn>")
# Special pieces that end a generated text wherever they appear (llama.cpp
# marks tokens with these texts end-of-generation the same way)
STOP_TEXTS = (b"<|endoftext|>", b"<|im_end|>", b"<|end_of_text|>", b"<|eot_id|>", b"<|eom_id|>",
              b"<end_of_turn>", b"<|end|>")
# The piece that ends a turn in each template run renders
CHAT_END_OF_TURN = {"chatml": b"<|im_end|>", "llama3": b"<|eot_id|>"}


def _show(piece, limit=40):
    """A piece for a message: its repr, shortened."""
    r = repr(bytes(piece)) if isinstance(piece, (bytes, bytearray)) else repr(piece)
    return r if len(r) <= limit else r[:limit - 3] + "..."


def _system_text(tok, key):
    """The UTF-8 bytes of tok[key] (a str; absent or None: empty), checked:
    at most TOK_MAX_SYSTEM bytes, no NUL. Raises ExportError."""
    text = tok.get(key)
    if text is None:
        return b""
    if not isinstance(text, str):
        raise ExportError(f"{key} {_show(text)} is not a string")
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:
        raise ExportError(f"{key} {_show(text)} is not valid Unicode (a lone surrogate)") from None
    if len(data) > TOK_MAX_SYSTEM:
        raise ExportError(f"{key} {_show(text)} is {len(data)} bytes of UTF-8 (at most "
                          f"{TOK_MAX_SYSTEM})")
    if b"\0" in data:
        raise ExportError(f"{key} {_show(text)} contains a NUL character")
    return data


def pack_tokenizer_ltok(tok):
    """The bytes of a version-3 tokenizer file for tok (the dict above), after
    checking everything model.h asks of one: known type/pre/kinds, piece
    lengths, unique normal pieces, finite float32 scores (zero for byte_bpe),
    merges that name two pieces whose bytes join into a normal piece, each
    merge once, special ids inside the vocabulary (or -1), add_bos only with a
    BOS, a known chat template, at most TOK_MAX_STOP stop ids inside the
    vocabulary, each once, system texts of at most TOK_MAX_SYSTEM bytes
    without NUL. Raises ExportError."""
    t, pre = tok.get("type"), tok.get("pre", "none")
    if t not in TOK_TYPES:
        raise ExportError(f"tokenizer type {t!r} must be one of {', '.join(TOK_TYPES)}")
    if pre not in PRE_TYPES:
        raise ExportError(f"pre-tokenizer {pre!r} must be one of {', '.join(PRE_TYPES)}")
    if t == "sentencepiece" and pre != "none":
        raise ExportError(f"a sentencepiece tokenizer has no pre-tokenizer (got {pre!r})")
    if t == "byte_bpe" and pre == "none":
        raise ExportError("a byte-level BPE tokenizer needs a pre-tokenizer "
                          f"({', '.join(PRE_TYPES[1:])})")
    pieces = [bytes(p) for p in tok["pieces"]]
    n = len(pieces)
    if n == 0:
        raise ExportError("empty vocabulary")
    if n > INT32_MAX:
        raise ExportError(f"{n} pieces do not fit in int32")
    kinds = list(tok.get("kinds") or [PIECE_NORMAL] * n)
    scores = tok.get("scores")
    scores = [0.0] * n if scores is None else [float(s) for s in scores]
    merges = list(tok.get("merges") or [])
    if len(kinds) != n or len(scores) != n:
        raise ExportError(f"{n} pieces but {len(kinds)} kinds and {len(scores)} scores")
    for i, (p, k, s) in enumerate(zip(pieces, kinds, scores)):
        if len(p) > MAX_PIECE_BYTES:
            raise ExportError(f"piece {i} is {len(p)} bytes long (at most {MAX_PIECE_BYTES})")
        if k not in range(len(PIECE_KINDS)):
            raise ExportError(f"piece {i} {_show(p)} has kind {k!r}; expected "
                              f"0..{len(PIECE_KINDS) - 1}")
        if k == PIECE_BYTE and t != "sentencepiece":
            raise ExportError(f"piece {i} {_show(p)} is a byte piece, which only sentencepiece "
                              "vocabularies have")
        if not math.isfinite(s) or abs(s) > 3.4e38:
            raise ExportError(f"piece {i} {_show(p)} has score {s}, not a finite float32")
        if t == "byte_bpe" and s != 0.0:
            raise ExportError(f"piece {i} {_show(p)} has score {s}; byte-level BPE pieces score 0 "
                              "(merges are ranked by their order)")
    normal = {}
    for i, (p, k) in enumerate(zip(pieces, kinds)):
        if k == PIECE_NORMAL:
            j = normal.setdefault(p, i)
            if j != i:
                raise ExportError(f"pieces {j} and {i} are both the normal piece {_show(p)}; "
                                  "normal pieces must be unique")
    if t == "sentencepiece" and merges:
        raise ExportError("a sentencepiece tokenizer has no merges (it merges by score)")
    seen = {}
    for rank, m in enumerate(merges):
        try:
            left, right = (int(v) for v in m)
        except (TypeError, ValueError):
            raise ExportError(f"merge {rank} is {m!r}, not a pair of ids") from None
        if not (0 <= left < n and 0 <= right < n):
            raise ExportError(f"merge {rank} ({left} {right}) names an id outside the vocabulary "
                              f"(0..{n - 1})")
        if pieces[left] + pieces[right] not in normal:
            raise ExportError(f"merge {rank} ({left} {right}): {_show(pieces[left])} + "
                              f"{_show(pieces[right])} = {_show(pieces[left] + pieces[right])} "
                              "is not a normal piece of the vocabulary")
        first = seen.setdefault((left, right), rank)
        if first != rank:
            raise ExportError(f"merge {rank} ({left} {right}) repeats merge {first}")
    ids = {}
    for key in ("bos_id", "eos_id", "eot_id", "pad_id"):
        v = tok.get(key, -1)
        v = -1 if v is None else v
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not -1 <= v < n:
            raise ExportError(f"{key} {v!r} is outside the vocabulary (0..{n - 1}, or -1 for none)")
        ids[key] = int(v)
    add_bos = tok.get("add_bos", False)
    if add_bos not in (0, 1):  # True, False, 0 or 1
        raise ExportError(f"add_bos {add_bos!r} must be true or false")
    if add_bos and ids["bos_id"] < 0:
        raise ExportError("add_bos is set but the vocabulary has no BOS")
    chat = tok.get("chat") or "unstated"
    if chat not in CHAT_TEMPLATES:
        raise ExportError(f"chat template {chat!r} must be one of {', '.join(CHAT_TEMPLATES)}")
    stops = tok.get("stop_ids")
    stops = default_stop_ids(tok) if stops is None else list(stops)
    if len(stops) > TOK_MAX_STOP:
        raise ExportError(f"{len(stops)} stop ids (at most {TOK_MAX_STOP})")
    seen_stops = set()
    for v in stops:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= v < n:
            raise ExportError(f"stop id {v!r} is outside the vocabulary (0..{n - 1})")
        if int(v) in seen_stops:
            raise ExportError(f"stop id {int(v)} is listed twice")
        seen_stops.add(int(v))
    system_default = _system_text(tok, "system_default")
    system_prefix = _system_text(tok, "system_prefix")

    header = TOK_HEADER_STRUCT.pack(TOK_MAGIC, TOK_VERSION, TOK_TYPES.index(t),
                                    PRE_TYPES.index(pre), n, len(merges), ids["bos_id"],
                                    ids["eos_id"], ids["eot_id"], ids["pad_id"], int(add_bos),
                                    CHAT_TEMPLATES.index(chat), len(stops), len(system_default),
                                    len(system_prefix))
    out = [header, bytes(TOK_HEADER_BYTES - len(header))]
    record = struct.Struct("<fii")
    for p, k, s in zip(pieces, kinds, scores):
        out.append(record.pack(s, k, len(p)))
        out.append(p)
    if merges:
        out.append(np.asarray(merges, dtype="<i4").reshape(-1, 2).tobytes())
    if stops:
        out.append(np.asarray([int(v) for v in stops], dtype="<i4").tobytes())
    out += [system_default, system_prefix]
    return b"".join(out)


def _same_tokenizer(old, new):
    """Whether old (a file's bytes) holds the tokenizer of new (a version-3
    file's bytes): the same bytes, or the version-2 file written before of
    the same vocabulary (new without its version-3 fields and what follows
    the merges), which converting again may replace."""
    if old == new:
        return True
    if len(new) < TOK_HEADER_BYTES or new[:4] != old[:4] or old[4:8] != struct.pack("<i", 2):
        return False
    n_stop, default_len, prefix_len = struct.unpack_from("<3i", new, 48)
    tail = 4 * n_stop + default_len + prefix_len
    v2 = new[:4] + struct.pack("<i", 2) + new[8:44] + bytes(20) + new[64:len(new) - tail]
    return old == v2


def _write_bytes(path, data):
    with _AtomicFile(path) as f:
        f.write(data)


def write_tokenizer_ltok(path, tok):
    """Write tok (see above) as a version-3 tokenizer file, atomically.
    Raises ExportError (nothing written) when tok breaks the format."""
    _write_bytes(path, pack_tokenizer_ltok(tok))


def describe_tokenizer(tok):
    """One line about tok for the user."""
    n = len(tok["pieces"])
    kinds = [sum(1 for k in tok["kinds"] if k == i) for i in range(len(PIECE_KINDS))]
    kind = ("sentencepiece" if tok["type"] == "sentencepiece"
            else f"byte-level BPE (pre-tokenizer {tok['pre']}), {len(tok['merges'])} merges")
    extra = ", ".join(f"{c} {name}" for c, name in zip(kinds[1:], PIECE_KINDS[1:]) if c)
    ids = " ".join(f"{k[:-3]} {tok.get(k, -1)}" for k in ("bos_id", "eos_id", "eot_id", "pad_id")
                   if tok.get(k, -1) not in (-1, None))
    chat = tok.get("chat") or "unstated"
    texts = [f"{key.replace('_', ' ')} {len(tok[key].encode('utf-8'))} bytes"
             for key in ("system_default", "system_prefix") if tok.get(key)]
    stops = tok.get("stop_ids")
    stops = sorted(default_stop_ids(tok) if stops is None else stops)
    shown = ",".join(str(v) for v in stops[:8]) + (",..." if len(stops) > 8 else "")
    return (f"{kind}, {n} pieces" + (f" ({extra})" if extra else "") + (f", {ids}" if ids else "")
            + f", add_bos {int(bool(tok.get('add_bos')))}, chat template {chat}"
            + (f" ({', '.join(texts)})" if texts else "")
            + (f", stop ids {shown}" if stops else ", no stop ids"))


# GPT-2's bytes_to_unicode: byte-level BPE vocabularies (tokenizer.json, GGUF
# "gpt2") write each byte as one printable character: the printable Latin-1
# bytes as themselves, the other 68 as U+0100.. in byte order (space -> "Ġ").

def _gpt2_byte_chars():
    direct = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in direct:
            table[b] = chr(b)
        else:
            table[b] = chr(0x100 + extra)
            extra += 1
    return table


GPT2_BYTE_CHARS = _gpt2_byte_chars()                      # byte -> character
GPT2_CHAR_BYTES = {c: b for b, c in GPT2_BYTE_CHARS.items()}  # character -> byte


def gpt2_to_bytes(text):
    """The raw bytes of a piece written in GPT-2's characters ("Ġthe" ->
    b" the"), or None when text has a character outside that alphabet."""
    try:
        return bytes(GPT2_CHAR_BYTES[c] for c in text)
    except KeyError:
        return None


def bytes_to_gpt2(data):
    """The inverse of gpt2_to_bytes: b" the" -> "Ġthe"."""
    return "".join(GPT2_BYTE_CHARS[b] for b in data)


def _eot_id(pieces, kinds):
    """The id of a special piece that ends a turn (EOT_TEXTS, in that order), or -1."""
    special = {p: i for i, (p, k) in enumerate(zip(pieces, kinds)) if k == PIECE_SPECIAL}
    for text in EOT_TEXTS:
        if text in special:
            return special[text]
    return -1


def _find_piece(pieces, kinds, text):
    """The id of the special piece text, else of a piece text of any kind, else -1."""
    found = -1
    for i, (p, k) in enumerate(zip(pieces, kinds)):
        if bytes(p) == text:
            if k == PIECE_SPECIAL:
                return i
            found = i if found < 0 else found
    return found


# ---------------------------------------------------------------------------
# Chat templates and stop ids
#
# A source's chat template is a Jinja program. run renders a few fixed
# templates (run.c, render_chat), so export.py names the one a source's
# template is by markers in its text, without evaluating any Jinja, and keeps
# the two texts a template may add on its own: a default system prompt
# (SmolLM2, Qwen2.5) and a fixed text before every system prompt (Llama 3.1's
# knowledge dates). The stop ids are every token that ends a reply: EOS, end
# of turn, the ids Hugging Face's generation config names, and the special
# pieces llama.cpp treats as end of generation by their text.

def _jinja_unescape(raw):
    """A Jinja (Python-style) string literal's source text with the escapes
    \\n \\t \\r \\\\ \\' \\" undone; other backslashes stay as they are."""
    table = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "'": "'", '"': '"'}
    return re.sub(r"\\(.)", lambda m: table.get(m.group(1), m.group(0)), raw, flags=re.S)


def _jinja_string_literals(text):
    """The values of the string literals inside text's Jinja tags ({{ }} and
    {% %}; comments {# #} skipped), in order, escapes undone. A literal may
    hold real newlines; quotes inside it do not end the tag."""
    out, i, n = [], 0, len(text)
    while i < n:
        j = text.find("{", i)
        if j < 0 or j + 1 >= n:
            break
        c = text[j + 1]
        if c == "#":
            k = text.find("#}", j + 2)
            i = n if k < 0 else k + 2
            continue
        if c not in "{%":
            i = j + 1
            continue
        close = "}}" if c == "{" else "%}"
        k = j + 2
        while k < n:
            if text[k] in "'\"":
                quote, m = text[k], k + 1
                while m < n and text[m] != quote:
                    m += 2 if text[m] == "\\" else 1
                if m < n:
                    out.append(_jinja_unescape(text[k + 1:m]))
                k = m + 1
            elif text.startswith(close, k):
                k += 2
                break
            else:
                k += 1
        i = k
    return out


def _chatml_default_system(literals):
    """The default system prompt of a ChatML template: the text of a literal
    "<|im_start|>system\n...<|im_end|>" (newline real or escaped), or ""."""
    for value in literals:
        m = re.match(r"<\|im_start\|>system\n(.+?)<\|im_end\|>", value, re.S)
        if m:
            return m.group(1)
    return ""


def _llama3_system_prefix(text, literals):
    """The text Llama 3.1-style templates put before every system prompt,
    "Cutting Knowledge Date: CUTOFF\nToday Date: DATE\n\n", with the cutoff of
    the template's "Cutting Knowledge Date: ...\n" literal and DATE its default
    date_string (set date_string = "26 Jul 2024"). None when a part is missing."""
    marker = "Cutting Knowledge Date:"
    cutoff = None
    for value in literals:
        at = value.find(marker)
        if at >= 0:
            rest = value[at + len(marker):].lstrip(" ")
            end = rest.find("\n")
            if end > 0:
                cutoff = rest[:end].strip()
            break
    m = re.search(r"""set\s+date_string\s*=\s*(["'])((?:\\.|(?!\1)[^\\])*)\1""", text, re.S)
    if not cutoff or m is None or not any("Today Date:" in v for v in literals):
        return None
    date = _jinja_unescape(m.group(2))
    if "\n" in date or "\n" in cutoff:
        return None
    return f"Cutting Knowledge Date: {cutoff}\nToday Date: {date}\n\n"


CHAT_TEMPLATE_CHOICES = "|".join(CHAT_TEMPLATES[1:])


def recognize_chat_template(text):
    """(name, system_default, system_prefix, notes) for a source's chat
    template text (None or "" for none), by markers, evaluating no Jinja:
      no template                              -> unstated
      <|im_start|> and <|im_end|>              -> chatml; with <think> (Qwen3's
                                                  reasoning templates) unstated
      <|start_header_id|> and <|eot_id|>       -> llama3; with "Cutting Knowledge
                                                  Date" (Llama 3.1 style) the
                                                  system prefix of knowledge dates
      [INST] and <<SYS>>                       -> llama2
      anything else                            -> unstated, with a note
    system_default: the prompt a ChatML literal "<|im_start|>system\n...<|im_end|>"
    puts in when there is no system message."""
    if not text:
        return "unstated", "", "", []
    flat = text.replace("\n", "\\n")
    head = flat[:60] + ("..." if len(flat) > 60 else "")
    need = f"run -m chat will need --chat-template {CHAT_TEMPLATE_CHOICES}"
    if "<|im_start|>" in text and "<|im_end|>" in text:
        if "<think>" in text:
            return "unstated", "", "", [
                "chat template is ChatML with <think> (a reasoning template, as Qwen3's), whose "
                f"thinking sections run does not reproduce: stored as unstated; {need}"]
        return "chatml", _chatml_default_system(_jinja_string_literals(text)), "", []
    if "<|start_header_id|>" in text and "<|eot_id|>" in text:
        if "Cutting Knowledge Date" not in text:
            return "llama3", "", "", []
        prefix = _llama3_system_prefix(text, _jinja_string_literals(text))
        if prefix is None:
            return "unstated", "", "", [
                "chat template is Llama 3's with a knowledge date, but its cutoff "
                "(\"Cutting Knowledge Date: ...\\n\") or default date (set date_string = "
                f"\"...\") was not found: stored as unstated; {need}"]
        date = prefix.split("Today Date: ", 1)[1].rstrip("\n")
        return "llama3", "", prefix, [
            f"chat template llama3 with Llama 3.1's system text (knowledge dates); its date is "
            f"the template's fixed default {date!r} (Llama 3.2's template puts today's date "
            "there under Hugging Face), and its tool sections are not reproduced"]
    if "[INST]" in text and "<<SYS>>" in text:
        return "llama2", "", "", []
    return "unstated", "", "", [f"chat template not recognized ({head}): {need}"]


def default_stop_ids(tok, extra=()):
    """tok's stop ids, sorted, each once: eos_id, eot_id, the ids in extra,
    the end-of-turn piece of tok's chat template (<|im_end|> for chatml,
    <|eot_id|> for llama3) when the vocabulary has it, and every special
    piece whose text is one of STOP_TEXTS."""
    pieces = tok["pieces"]
    kinds = tok.get("kinds") or [PIECE_NORMAL] * len(pieces)
    ids = {int(v) for v in (tok.get("eos_id"), tok.get("eot_id")) if v is not None and v >= 0}
    ids.update(int(v) for v in extra)
    end = CHAT_END_OF_TURN.get(tok.get("chat"))
    if end is not None and _find_piece(pieces, kinds, end) >= 0:
        ids.add(_find_piece(pieces, kinds, end))
    ids.update(i for i, (p, k) in enumerate(zip(pieces, kinds))
               if k == PIECE_SPECIAL and bytes(p) in STOP_TEXTS)
    return sorted(ids)


def _hf_eos_ids(directory, n, notes):
    """Every id of Hugging Face's eos_token_id (an int or a list) in
    generation_config.json and config.json in directory, when they exist.
    Ids outside 0..n-1 and values of another type are left out with a note."""
    ids = []
    for name in ("generation_config.json", "config.json"):
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            continue
        v = _read_json(path, "a model config").get("eos_token_id")
        if v is None:
            continue
        values = v if isinstance(v, list) else [v]
        for x in values:
            if isinstance(x, bool) or not isinstance(x, int):
                notes.append(f"{path}: eos_token_id {_js(v)} is not an id or a list of ids: "
                             "not used as stop ids")
                break
            if not 0 <= x < n:
                notes.append(f"{path}: eos_token_id {x} is outside the vocabulary (0..{n - 1}): "
                             "not a stop id")
                continue
            ids.append(x)
    return ids


def set_chat_and_stops(tok, notes, extra_stops=()):
    """Fill in tok's chat, system_default and system_prefix from its
    chat_template (recognize_chat_template; its notes go to notes) unless tok
    names chat already, then its stop_ids (default_stop_ids with extra_stops)."""
    if tok.get("chat") is None:
        name, default, prefix, chat_notes = recognize_chat_template(tok.get("chat_template"))
        tok.update(chat=name, system_default=default, system_prefix=prefix)
        notes += chat_notes
    tok.setdefault("system_default", "")
    tok.setdefault("system_prefix", "")
    tok["stop_ids"] = default_stop_ids(tok, extra_stops)
    return tok


# ---------------------------------------------------------------------------
# Hugging Face tokenizer.json (byte-level BPE)
#
# What is read: model (type BPE: vocab, merges), added_tokens (special pieces,
# stored as their literal text), pre_tokenizer (which of the four splitting
# rules run implements), normalizer (none, or NFC with a note), post_processor
# (whether a template puts BOS first); and from tokenizer_config.json beside it
# bos_token, eos_token, pad_token and add_bos_token.

# The Split regexes of Llama 3 and Qwen2 tokenizer.json files (the two differ in
# digits: runs of up to three, or one at a time)
LLAMA3_SPLIT_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                      r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_SPLIT_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                     r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def _describe_pre(node):
    """A short text for a tokenizer.json pre_tokenizer (for messages)."""
    if not isinstance(node, dict):
        return _js(node)
    kind = node.get("type")
    if kind == "Sequence":
        steps = node.get("pretokenizers") or []
        return "Sequence[" + ", ".join(_describe_pre(s) for s in steps) + "]"
    if kind == "Split":
        pat = node.get("pattern") or {}
        pat = pat.get("Regex", pat.get("String")) if isinstance(pat, dict) else pat
        pat = pat if not isinstance(pat, str) or len(pat) <= 50 else pat[:47] + "..."
        return f"Split({pat!r}, {node.get('behavior')})"
    if kind == "ByteLevel":
        return (f"ByteLevel(use_regex={_js(node.get('use_regex', True))}, "
                f"add_prefix_space={_js(node.get('add_prefix_space', False))})")
    if kind == "Digits":
        return f"Digits(individual_digits={_js(node.get('individual_digits', False))})"
    return str(kind)


def _is_byte_level(node, use_regex):
    return (isinstance(node, dict) and node.get("type") == "ByteLevel"
            and node.get("use_regex", True) is use_regex
            and node.get("add_prefix_space", False) is False)


def _is_split(node, regex):
    return (isinstance(node, dict) and node.get("type") == "Split"
            and node.get("pattern") == {"Regex": regex}
            and node.get("behavior") == "Isolated" and node.get("invert", False) is False)


def hf_pre_tokenizer(where, pre, normalizer, notes):
    """The PRE_TYPES name of a tokenizer.json pre_tokenizer (and normalizer):
        ByteLevel (its own GPT-2 regex)                         -> gpt2
        Sequence[Digits(individual), ByteLevel(GPT-2 regex)]    -> smollm
        Sequence[Split(Llama 3 regex), ByteLevel(no regex)]     -> llama3
        Sequence[Split(Qwen2 regex), ByteLevel(no regex)]       -> qwen2
    Anything else raises ExportError naming what was found."""
    if normalizer is not None:
        if isinstance(normalizer, dict) and normalizer.get("type") == "NFC":
            notes.append("tokenizer.json normalizes text to NFC; run does not: give it NFC text "
                         "(most text already is)")
        else:
            kind = normalizer.get("type") if isinstance(normalizer, dict) else _js(normalizer)
            raise ExportError(f"{where}: normalizer {kind} is not supported (run applies none)")
    steps = pre.get("pretokenizers") if isinstance(pre, dict) and pre.get("type") == "Sequence" \
        else [pre]
    steps = steps if isinstance(steps, list) else [steps]
    if len(steps) == 1 and _is_byte_level(steps[0], True):
        return "gpt2"
    if len(steps) == 2 and _is_byte_level(steps[1], True) and steps[0] == \
            {"type": "Digits", "individual_digits": True}:
        return "smollm"
    if len(steps) == 2 and _is_byte_level(steps[1], False):
        if _is_split(steps[0], LLAMA3_SPLIT_REGEX):
            return "llama3"
        if _is_split(steps[0], QWEN2_SPLIT_REGEX):
            return "qwen2"
    raise ExportError(f"{where}: pre_tokenizer {_describe_pre(pre)} is not one run implements "
                      "(ByteLevel: gpt2; Digits + ByteLevel: smollm; Split with the Llama 3 or "
                      "Qwen2 regex + ByteLevel: llama3, qwen2)")


def _has_byte_level(node):
    if isinstance(node, dict):
        return node.get("type") == "ByteLevel" or any(_has_byte_level(v) for v in node.values())
    if isinstance(node, list):
        return any(_has_byte_level(v) for v in node)
    return False


def _template_bos(pp):
    """What a tokenizer.json post_processor says about BOS: the content of the
    special token a TemplateProcessing puts first, False when its template
    starts with the text, None when it has no template."""
    if not isinstance(pp, dict):
        return None
    if pp.get("type") == "Sequence":
        for sub in pp.get("processors") or []:
            r = _template_bos(sub)
            if r is not None:
                return r
        return None
    if pp.get("type") == "TemplateProcessing":
        single = pp.get("single") or []
        first = single[0] if single and isinstance(single[0], dict) else {}
        if "SpecialToken" in first and isinstance(first["SpecialToken"], dict):
            return first["SpecialToken"].get("id")
        return False
    return None


def _token_text(v):
    """tokenizer_config.json's bos_token etc.: a string, {"content": ...} or null."""
    if isinstance(v, dict):
        v = v.get("content")
    return v if isinstance(v, str) else None


def _hf_chat_template(directory, config, notes):
    """The chat template of a Hugging Face tokenizer: tokenizer_config.json's
    chat_template (a string, or a list of {"name", "template"}: the one named
    "default"), else the file chat_template.jinja in directory, else None."""
    where = os.path.join(directory, "tokenizer_config.json")
    v = config.get("chat_template")
    if isinstance(v, str):
        return v
    if isinstance(v, list):
        for entry in v:
            if isinstance(entry, dict) and entry.get("name") == "default" \
                    and isinstance(entry.get("template"), str):
                return entry["template"]
        names = [e.get("name") for e in v if isinstance(e, dict)]
        notes.append(f"{where}: chat_template lists no template named \"default\" "
                     f"({', '.join(_js(x) for x in names)}): none used")
    elif v is not None:
        notes.append(f"{where}: chat_template is {_js(v)[:40]}, neither a string nor a list: "
                     "not used")
    jinja = os.path.join(directory, "chat_template.jinja")
    if os.path.isfile(jinja):
        try:
            with open(jinja, "rb") as f:
                return f.read().decode("utf-8")
        except UnicodeDecodeError:
            raise ExportError(f"{jinja}: not UTF-8 text") from None
    return None


def read_tokenizer_json(path, vocab_size=None):
    """A Hugging Face tokenizer.json of a byte-level BPE model (GPT-2, Llama 3,
    SmolLM, Qwen2 style), with tokenizer_config.json from the same directory
    when it exists, as (tok, notes). The chat template comes from
    tokenizer_config.json or chat_template.jinja beside it, stop ids also from
    the eos_token_id of generation_config.json and config.json there.
    vocab_size: the model's; ids the tokenizer does not use up to it become
    unused pieces (a note says how many), more ids than it is an error.
    Raises ExportError naming the file."""
    path = os.fspath(path)
    j = _read_json(path, "a tokenizer.json")
    notes = []
    model = j.get("model")
    if not isinstance(model, dict) or model.get("type") != "BPE":
        kind = model.get("type") if isinstance(model, dict) else _js(model)
        raise ExportError(f"{path}: model type {kind} is not supported (only BPE)")
    if not _has_byte_level(j.get("pre_tokenizer")):
        raise ExportError(f"{path}: not a byte-level BPE tokenizer (pre_tokenizer "
                          f"{_describe_pre(j.get('pre_tokenizer'))}); for a sentencepiece model "
                          "convert its tokenizer.model")
    pre = hf_pre_tokenizer(path, j.get("pre_tokenizer"), j.get("normalizer"), notes)
    for key in ("continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key):
            raise ExportError(f"{path}: model.{key}={_js(model[key])} is not supported")
    if model.get("byte_fallback"):
        raise ExportError(f"{path}: model.byte_fallback is set: not a byte-level BPE vocabulary")
    if model.get("ignore_merges") and pre != "llama3":
        notes.append(f"tokenizer.json sets ignore_merges (a pre-tokenized chunk that is a piece "
                     f"is that piece); run implies it for llama3 only, not {pre}")
    vocab, raw_merges = model.get("vocab"), model.get("merges")
    if not isinstance(vocab, dict) or not vocab:
        raise ExportError(f"{path}: model.vocab is not a non-empty object")
    if not isinstance(raw_merges, list):
        raise ExportError(f"{path}: model.merges is not a list")
    added = j.get("added_tokens") or []
    if not isinstance(added, list):
        raise ExportError(f"{path}: added_tokens is not a list")

    ids = {}
    for text, i in vocab.items():
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i <= INT32_MAX:
            raise ExportError(f"{path}: model.vocab[{text!r}] = {_js(i)} is not an id")
        ids[text] = i
    specials = {}
    for a in added:
        if not isinstance(a, dict) or not isinstance(a.get("content"), str) \
                or isinstance(a.get("id"), bool) or not isinstance(a.get("id"), int) \
                or not 0 <= a["id"] <= INT32_MAX:
            raise ExportError(f"{path}: malformed added_tokens entry {_js(a)[:80]}")
        specials[a["id"]] = a["content"]
    n = max(max(ids.values()), max(specials, default=-1)) + 1
    if vocab_size is not None:
        if n > vocab_size:
            raise ExportError(f"{path}: uses ids up to {n - 1}, but the model has vocab_size "
                              f"{vocab_size}")
        n = vocab_size
    pieces, kinds = [None] * n, [PIECE_UNUSED] * n
    for text, i in ids.items():
        if pieces[i] is not None:
            raise ExportError(f"{path}: model.vocab gives id {i} to two pieces")
        b = gpt2_to_bytes(text)
        if b is None:
            raise ExportError(f"{path}: vocabulary piece {text!r} (id {i}) has characters outside "
                              "GPT-2's byte alphabet: not a byte-level BPE vocabulary")
        pieces[i], kinds[i] = b, PIECE_NORMAL
    for i, content in specials.items():  # literal text, not byte-mapped; overrides the vocab entry
        pieces[i], kinds[i] = content.encode("utf-8"), PIECE_SPECIAL
    unused = sum(1 for p in pieces if p is None)
    if unused:
        notes.append(f"{unused} ids have no piece in tokenizer.json (the model's vocabulary is "
                     "larger): stored as unused pieces")
    pieces = [b"" if p is None else p for p in pieces]

    merges = []
    for rank, m in enumerate(raw_merges):
        if isinstance(m, str):
            parts = m.split(" ")
        elif isinstance(m, list):
            parts = m
        else:
            parts = None
        if not parts or len(parts) != 2 or not all(isinstance(s, str) for s in parts):
            raise ExportError(f"{path}: merge {rank} is {_js(m)[:60]}, not two pieces")
        a, b = parts
        for side in (a, b):
            if side not in ids:
                raise ExportError(f"{path}: merge {rank} ({a!r} {b!r}) names {side!r}, "
                                  "which is not in the vocabulary")
        if a + b not in ids:
            raise ExportError(f"{path}: merge {rank} ({a!r} {b!r}): the result {a + b!r} is not "
                              "in the vocabulary")
        merges.append((ids[a], ids[b]))

    by_text = {}
    for i, (p, k) in enumerate(zip(pieces, kinds)):
        if k == PIECE_SPECIAL:
            by_text.setdefault(p.decode("utf-8"), i)
    for text, i in ids.items():
        by_text.setdefault(text, i)
    directory = os.path.dirname(path)
    config_path = os.path.join(directory, "tokenizer_config.json")
    config = _read_json(config_path, "a tokenizer config") if os.path.isfile(config_path) else {}
    tok = dict(type="byte_bpe", pre=pre, pieces=pieces, kinds=kinds, scores=None, merges=merges,
               bos_id=-1, eos_id=-1, eot_id=_eot_id(pieces, kinds), pad_id=-1,
               chat_template=_hf_chat_template(directory, config, notes))
    for key in ("bos", "eos", "pad"):
        text = _token_text(config.get(f"{key}_token"))
        if text is None:
            continue
        if text not in by_text:
            raise ExportError(f"{config_path}: {key}_token {text!r} is not in the vocabulary")
        tok[f"{key}_id"] = by_text[text]
    template = _template_bos(j.get("post_processor"))
    if template and tok["bos_id"] < 0 and template in by_text:
        tok["bos_id"] = by_text[template]
    add_bos = config.get("add_bos_token")
    if isinstance(add_bos, bool):
        tok["add_bos"] = add_bos
        if template is not None and bool(template) != add_bos:
            notes.append(f"add_bos_token is {_js(add_bos)} in tokenizer_config.json but the "
                         "post_processor template says otherwise: using add_bos_token")
    else:
        tok["add_bos"] = bool(template)
    if tok["add_bos"] and tok["bos_id"] < 0:
        raise ExportError(f"{path}: prompts start with BOS, but no BOS token is named")
    set_chat_and_stops(tok, notes, _hf_eos_ids(directory, n, notes))
    return tok, notes


# ---------------------------------------------------------------------------
# tiktoken BPE files (Meta's Llama 3 tokenizer.model)
#
# One line per token: the token's bytes in base64, a space, its rank. Encoding
# starts from single bytes and repeatedly joins the adjacent pair whose joined
# bytes have the lowest rank. The merges of our format (rank = order) are
# derived from the ranks: for each token, run that procedure on the token's own
# bytes; if it ends in the token, the last join is the token's merge (left,
# right). Why this reproduces tiktoken exactly: inside any stretch of text
# that ends up as one token t, the joins are those of t's bytes alone (a join
# across the stretch's edge would have prevented t), so the last join of t is
# always that pair; a pair of other pieces that also spells t never gets
# joined, so listing it changes nothing. Merges are ordered by the rank of
# their result, so "lowest merge rank" and "lowest result rank" pick the same
# pair. Tokens the procedure does not reach from their bytes get no merge
# (tiktoken produces them only when a whole pre-tokenized chunk is that token,
# which run implies for the llama3 pre-tokenizer).

# Llama 3's 256 special tokens, ids 128000..128255, named as in Hugging Face's
# Llama 3.1 tokenizer.json (Llama 3.0 names 128004, 128005, 128008 and 128010
# <|reserved_special_token_2..5|>; the ids that matter, 128000/1/6/7/9, agree)
LLAMA3_SPECIAL_TOKENS = (
    ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
     "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>",
     "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]
    + [f"<|reserved_special_token_{i}|>" for i in range(3, 248)])
assert len(LLAMA3_SPECIAL_TOKENS) == 256
LLAMA3_RANKS = 128000


def is_tiktoken_file(path):
    """Whether path starts like a tiktoken BPE file (`base64 rank` lines)."""
    with open(path, "rb") as f:
        head = f.read(256)
    first = head.split(b"\n", 1)[0].rstrip(b"\r")
    return re.fullmatch(rb"[A-Za-z0-9+/]+={0,2} [0-9]+", first) is not None


def read_tiktoken(path):
    """The tokens (bytes) of a tiktoken BPE file, in rank order. Ranks must be
    0..N-1, each once; tokens unique; every single byte a token."""
    import base64
    import binascii
    path = os.fspath(path)
    with open(path, "rb") as f:
        data = f.read()
    by_rank = {}
    seen = set()
    for lineno, line in enumerate(data.split(b"\n"), 1):
        line = line.strip()
        if not line:
            continue
        parts = line.split(b" ")
        try:
            if len(parts) != 2:
                raise ValueError
            token, rank = base64.b64decode(parts[0], validate=True), int(parts[1])
        except (binascii.Error, ValueError):
            raise ExportError(f"{path}: line {lineno} is not `base64-token rank`; not a "
                              "tiktoken file") from None
        if rank in by_rank or token in seen or not token:
            what = "rank" if rank in by_rank else "token"
            raise ExportError(f"{path}: line {lineno}: {what} repeated (or an empty token)")
        by_rank[rank] = token
        seen.add(token)
    if not by_rank:
        raise ExportError(f"{path}: no tokens")
    if sorted(by_rank) != list(range(len(by_rank))):
        raise ExportError(f"{path}: ranks are not 0..{len(by_rank) - 1}")
    tokens = [by_rank[r] for r in range(len(by_rank))]
    missing = [b for b in range(256) if bytes([b]) not in seen]
    if missing:
        raise ExportError(f"{path}: {len(missing)} single bytes are not tokens "
                          f"(e.g. 0x{missing[0]:02x}); byte-level BPE needs all 256")
    return tokens


def tiktoken_merges(tokens):
    """(merges, unreachable) for tiktoken tokens in rank order: merges as
    (left id, right id) in the order of their result's rank (see the section
    comment for why this encodes exactly as tiktoken does), unreachable the
    number of multi-byte tokens that merging their own bytes does not produce."""
    rank = {t: i for i, t in enumerate(tokens)}
    merges, unreachable = [], 0
    for t in tokens:
        if len(t) < 2:
            continue
        parts, last = [t[i:i + 1] for i in range(len(t))], None
        while len(parts) > 1:
            best, at = None, -1
            for i in range(len(parts) - 1):
                r = rank.get(parts[i] + parts[i + 1])
                if r is not None and (best is None or r < best):
                    best, at = r, i
            if best is None:
                break
            last = (parts[at], parts[at + 1])
            parts[at:at + 2] = [parts[at] + parts[at + 1]]
        if len(parts) == 1:
            merges.append((rank[last[0]], rank[last[1]]))
        else:
            unreachable += 1
    return merges, unreachable


def read_tiktoken_tokenizer(path, specials=None):
    """A tiktoken file as (tok, notes): byte-level BPE with the llama3
    pre-tokenizer, merges from tiktoken_merges, then the special tokens
    (default: Llama 3's 256 when the file has Llama 3's 128000 ranks, else
    none) with BOS <|begin_of_text|>, EOS <|end_of_text|>, EOT <|eot_id|>
    when present; add_bos when there is a BOS; chat template llama3 when
    Llama 3's header and end-of-turn tokens are among the special ones; stop
    ids as default_stop_ids, with the eos_token_id of generation_config.json
    and config.json beside the file when they exist."""
    tokens = read_tiktoken(path)
    notes = []
    if specials is None:
        specials = LLAMA3_SPECIAL_TOKENS if len(tokens) == LLAMA3_RANKS else []
        if not specials:
            notes.append(f"{len(tokens)} ranks is not Llama 3's {LLAMA3_RANKS}: "
                         "no special tokens added")
    merges, unreachable = tiktoken_merges(tokens)
    pieces = tokens + [s.encode("utf-8") for s in specials]
    kinds = [PIECE_NORMAL] * len(tokens) + [PIECE_SPECIAL] * len(specials)
    index = {s: len(tokens) + i for i, s in enumerate(specials)}
    bos = index.get("<|begin_of_text|>", -1)
    notes.append(f"tiktoken: {len(merges)} merges derived from {len(tokens)} ranks"
                 + (f" ({unreachable} tokens are made only as whole pre-tokenized chunks)"
                    if unreachable else ""))
    tok = dict(type="byte_bpe", pre="llama3", pieces=pieces, kinds=kinds, scores=None,
               merges=merges, bos_id=bos, eos_id=index.get("<|end_of_text|>", -1),
               eot_id=index.get("<|eot_id|>", -1), pad_id=-1, add_bos=bos >= 0,
               chat_template=None)
    if "<|start_header_id|>" in index and "<|eot_id|>" in index:
        tok["chat"] = "llama3"
        notes.append("chat template llama3: a tiktoken file names none, and Llama 3's special "
                     "tokens are its; without Llama 3.1's knowledge-date system text")
    set_chat_and_stops(tok, notes, _hf_eos_ids(os.path.dirname(os.fspath(path)), len(pieces),
                                               notes))
    return tok, notes


# ---------------------------------------------------------------------------
# Finding and reading a tokenizer source

def _is_gguf_file(path):
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"


def read_tokenizer_source(path, vocab_size=None):
    """Any tokenizer file export.py converts, by its content: a tokenizer.json
    (JSON), a GGUF file, a tiktoken file or a sentencepiece model. Returns
    ("v1", (pieces, scores), notes) for sentencepiece (llama2.c's format, as
    before) or ("ltok", tok, notes) (version 3). vocab_size: the model's, when known (checked
    against, and tokenizer.json padded to it)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise ExportError(f"{path}: is a directory, expected a tokenizer file")
    if not os.path.exists(path):
        raise ExportError(f"{path}: no such file")
    with open(path, "rb") as f:
        head = f.read(64)
    if head.lstrip()[:1] == b"{":
        tok, notes = read_tokenizer_json(path, vocab_size)
    elif head[:4] == b"GGUF":
        tok, notes = read_gguf_tokenizer(path)
    elif is_tiktoken_file(path):
        tok, notes = read_tiktoken_tokenizer(path)
    else:
        pieces, scores = sentencepiece_vocab(path)
        if vocab_size is not None and len(pieces) != vocab_size:
            raise ExportError(f"{path}: {len(pieces)} pieces, but the model has vocab_size "
                              f"{vocab_size}")
        return "v1", (pieces, scores), []
    if vocab_size is not None and len(tok["pieces"]) != vocab_size:
        raise ExportError(f"{path}: {len(tok['pieces'])} pieces, but the model has vocab_size "
                          f"{vocab_size}")
    return "ltok", tok, notes


def model_dir_tokenizer(directory, vocab_size):
    """The tokenizer of a Hugging Face or Meta model directory: tokenizer.json
    when it is byte-level BPE, else tokenizer.model (sentencepiece, or
    tiktoken for Llama 3). Returns what read_tokenizer_source returns."""
    tj = os.path.join(directory, "tokenizer.json")
    tm = os.path.join(directory, "tokenizer.model")
    if os.path.isfile(tj):
        try:
            j = _read_json(tj, "a tokenizer.json")
        except ExportError:
            if not os.path.isfile(tm):
                raise
            j = None
        if j is not None and _has_byte_level(j.get("pre_tokenizer")):
            return read_tokenizer_source(tj, vocab_size)
        if not os.path.isfile(tm):
            raise ExportError(f"{tj}: not a byte-level BPE tokenizer, and {directory} has no "
                              "tokenizer.model")
    if os.path.isfile(tm):
        return read_tokenizer_source(tm, vocab_size)
    raise ExportError(f"{directory}: no tokenizer.json or tokenizer.model")


# ---------------------------------------------------------------------------
# GGUF (llama.cpp's format), read with the gguf package
#
# gguf.GGUFReader parses the file and gguf.quants.dequantize turns every tensor
# type it knows into float32; export.py has no dequantizer of its own. Before
# the reader sees a file, _gguf_layout walks its structure (header, metadata,
# tensor table) and checks every length and offset against the file size: the
# reader trusts them (a corrupt array length can keep it looping for hours, a
# short file fails deep inside numpy), and this way a bad file gets one line
# saying what is wrong where. Whatever the reader or the dequantizer still
# raises is turned into an ExportError naming the file.
#
# Metadata (llama.cpp's keys, "llama." prefix) -> our header:
#   context_length -> seq_len, embedding_length -> dim, block_count ->
#   n_layers, feed_forward_length -> hidden_dim, attention.head_count(_kv) ->
#   n_heads, n_kv_heads, attention.layer_norm_rms_epsilon -> norm_eps,
#   rope.freq_base -> rope_theta, rope.dimension_count -> rot_dim,
#   rope.scaling.* -> linear / yarn scaling, the rope_freqs tensor -> llama3
#   scaling (fitted, see fit_llama3_rope_freqs), tokenizer.ggml.* -> the
#   version-3 tokenizer (tokenizer.chat_template -> its chat template) and
#   the header's bos_id/eos_id.
# Tensors (GGUF dims are innermost first; reversed they are our row-major shapes):
#   token_embd, blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output,
#   ffn_norm, ffn_gate, ffn_down, ffn_up}, output_norm, output (absent: tied).
# q/k rows: llama.cpp's converter stores them in Meta's interleaved pair order
# (it undoes Hugging Face's permutation), so the default layout keeps them;
# "neox" applies Hugging Face's permutation per head (k with the kv heads).

GGUF_VERSIONS = (2, 3)
_GGUF_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_GGUF_STRING, _GGUF_ARRAY, _GGUF_UINT32 = 8, 9, 4
_GGUF_INTS = {0, 1, 2, 3, 4, 5, 10, 11}
_GGUF_FLOATS = {6, 12}
_GGUF_BOOL = 7
_GGUF_MAX_DIMS = 4
_GGUF_DEFAULT_ALIGNMENT = 32

# llama.* keys read below; other llama.* keys get a note, these an error (run
# cannot reproduce what they change)
GGUF_LLAMA_KEYS = {
    "context_length", "embedding_length", "block_count", "feed_forward_length",
    "attention.head_count", "attention.head_count_kv", "attention.layer_norm_rms_epsilon",
    "attention.key_length", "attention.value_length", "rope.freq_base", "rope.dimension_count",
    "rope.scaling.type", "rope.scaling.factor", "rope.scaling.original_context_length",
    "rope.scaling.attn_factor", "rope.scaling.yarn_attn_factor", "rope.scaling.yarn_beta_fast",
    "rope.scaling.yarn_beta_slow", "rope.scaling.yarn_ext_factor",
    "rope.scaling.yarn_log_multiplier", "rope.scaling.finetuned", "rope.scale_linear",
    "vocab_size", "expert_count", "expert_used_count"}
GGUF_LLAMA_REJECTED = {  # key: (what it does, the value that means "off")
    "attention.sliding_window": ("sliding-window attention", 0),
    "attention.scale": ("a custom attention scale", 0),
    "logit_scale": ("scaled logits", 1),
    "embedding_scale": ("a scaled embedding", 1),
    "residual_scale": ("scaled residuals", 1),
    "attention.clamp_kqv": ("clamped q/k/v", 0),
    "attention.max_alibi_bias": ("ALiBi", 0),
    "rope.scaling.alpha": ("NTK-alpha RoPE scaling", 1),
}
GGUF_LAYER_TENSORS = {"rms_att_weight": "attn_norm", "wq": "attn_q", "wk": "attn_k",
                      "wv": "attn_v", "wo": "attn_output", "rms_ffn_weight": "ffn_norm",
                      "w1": "ffn_gate", "w2": "ffn_down", "w3": "ffn_up"}
# tokenizer.ggml.token_type values (gguf.TokenType)
GGUF_TOKEN_NORMAL, GGUF_TOKEN_UNKNOWN, GGUF_TOKEN_CONTROL, GGUF_TOKEN_USER_DEFINED, \
    GGUF_TOKEN_UNUSED, GGUF_TOKEN_BYTE = range(1, 7)
GGUF_PRE_NAMES = {"gpt-2": "gpt2", "llama-bpe": "llama3", "llama3": "llama3",
                  "qwen2": "qwen2", "smollm": "smollm"}


def _import_gguf():
    try:
        import gguf  # only the GGUF paths need it
        import gguf.quants  # noqa: F401
    except ImportError:
        raise ExportError("reading GGUF needs the gguf package (pip install gguf, "
                          "or make venv)") from None
    return gguf


def _gguf_package_version():
    try:
        import importlib.metadata
        return importlib.metadata.version("gguf")
    except Exception:  # a source checkout without metadata
        return "?"


class _Cursor:
    """Reads little-endian numbers and strings from a buffer, checking each
    against the end: a read past it raises ExportError naming what was read."""

    def __init__(self, path, buf, size, pos):
        self.path, self.buf, self.size, self.pos = path, buf, size, pos

    def need(self, n, what):
        if n > self.size - self.pos:
            raise ExportError(f"{self.path}: truncated in {what} (byte {self.pos}: {n} bytes "
                              f"needed, the file has {self.size})")

    def unpack(self, fmt, what):
        n = struct.calcsize("<" + fmt)
        self.need(n, what)
        v = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += n
        return v[0] if len(v) == 1 else v

    def string(self, what):
        n = self.unpack("Q", what)
        self.need(n, what)
        s = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return s


def _gguf_layout(path, gguf):
    """Walk a GGUF file's header, metadata and tensor table, checking every
    length and offset against the file size; returns {name: (type, dims,
    absolute data offset, bytes)}. Raises ExportError for a file that is not
    GGUF, a version other than 2 or 3, a truncated header, metadata or tensor
    table, an unknown value or tensor type, a tensor whose data lies (partly)
    past the end of the file, duplicate names."""
    import mmap
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(24)
    if head[:4] != b"GGUF":
        raise ExportError(f"{path}: not a GGUF file (it starts with {head[:4]!r}, not b'GGUF')")
    if len(head) < 24:
        raise ExportError(f"{path}: truncated: {size} bytes, less than the 24-byte GGUF header")
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", head, 4)
    if version not in GGUF_VERSIONS:
        hint = " (a big-endian file?)" if version and not version & 0xFFFF else ""
        raise ExportError(f"{path}: GGUF version {version} is not supported (versions "
                          f"{' and '.join(map(str, GGUF_VERSIONS))} are){hint}")
    # (counts are not trusted: each entry read below is checked against the file's end, so
    # a corrupt count ends in a "truncated" message after at most size / 13 entries)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        cur = _Cursor(path, mm, size, 24)
        keys, alignment = set(), _GGUF_DEFAULT_ALIGNMENT

        def skip_value(vtype, what, depth=0):
            if vtype in _GGUF_SCALAR_SIZES:
                cur.need(_GGUF_SCALAR_SIZES[vtype], what)
                cur.pos += _GGUF_SCALAR_SIZES[vtype]
            elif vtype == _GGUF_STRING:
                cur.string(what)
            elif vtype == _GGUF_ARRAY and depth < 4:
                etype, count = cur.unpack("IQ", what)
                if etype in _GGUF_SCALAR_SIZES:
                    cur.need(count * _GGUF_SCALAR_SIZES[etype], what)
                    cur.pos += count * _GGUF_SCALAR_SIZES[etype]
                elif etype in (_GGUF_STRING, _GGUF_ARRAY):
                    if count > (size - cur.pos) // 8:
                        raise ExportError(f"{path}: truncated in {what} (an array of {count} "
                                          f"entries at byte {cur.pos}, the file has {size})")
                    for _ in range(count):
                        skip_value(etype, what, depth + 1)
                else:
                    raise ExportError(f"{path}: {what} is an array of unknown type {etype}")
            else:
                raise ExportError(f"{path}: {what} has unknown value type {vtype}")

        for k in range(n_kv):
            raw = cur.string(f"the name of metadata entry {k} of {n_kv}")
            try:
                key = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise ExportError(f"{path}: metadata entry {k} has a name that is not UTF-8") \
                    from None
            if key in keys:
                raise ExportError(f"{path}: metadata key {key} appears twice")
            keys.add(key)
            vtype = cur.unpack("I", f"metadata {key}")
            start = cur.pos
            skip_value(vtype, f"metadata {key}")
            if key == "general.alignment":
                if vtype != _GGUF_UINT32:
                    raise ExportError(f"{path}: general.alignment must be a uint32")
                alignment = struct.unpack_from("<I", mm, start)[0]
                if alignment == 0 or alignment & (alignment - 1):
                    raise ExportError(f"{path}: general.alignment {alignment} is not a power "
                                      "of two")
        table = []
        for k in range(n_tensors):
            raw = cur.string(f"the name of tensor {k} of {n_tensors}")
            try:
                name = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise ExportError(f"{path}: tensor {k} has a name that is not UTF-8") from None
            n_dims = cur.unpack("I", f"tensor {name}")
            if not 1 <= n_dims <= _GGUF_MAX_DIMS:
                raise ExportError(f"{path}: tensor {name} has {n_dims} dimensions "
                                  f"(1..{_GGUF_MAX_DIMS})")
            dims = list(cur.unpack(f"{n_dims}Q", f"tensor {name}")) if n_dims > 1 \
                else [cur.unpack("Q", f"tensor {name}")]
            ttype, offset = cur.unpack("IQ", f"tensor {name}")
            table.append((name, dims, ttype, offset))
        data_start = -(-cur.pos // alignment) * alignment
    out = {}
    for name, dims, ttype, offset in table:
        if name in out:
            raise ExportError(f"{path}: tensor {name} appears twice")
        try:
            qtype = gguf.GGMLQuantizationType(ttype)
            block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise ExportError(f"{path}: tensor {name} has unknown type {ttype} (gguf "
                              f"{_gguf_package_version()} does not know it)") from None
        if any(d == 0 for d in dims) or math.prod(dims) >= 1 << 48:
            raise ExportError(f"{path}: tensor {name} has dimensions {dims}")
        if dims[0] % block:
            raise ExportError(f"{path}: tensor {name}: rows of {dims[0]} values are not whole "
                              f"{qtype.name} blocks of {block}")
        nbytes = math.prod(dims) // block * type_size
        if offset % alignment:
            raise ExportError(f"{path}: tensor {name}: data offset {offset} is not a multiple of "
                              f"the alignment {alignment}")
        begin = data_start + offset
        if begin + nbytes > size:
            where = "starts" if begin >= size else "ends"
            raise ExportError(f"{path}: tensor {name}: its data {where} past the end of the file "
                              f"(bytes {begin}..{begin + nbytes}, the file has {size}); truncated?")
        out[name] = (qtype, dims, begin, nbytes)
    return out


_DEQUANTIZABLE = {}


def _gguf_can_dequantize(gguf, qtype):
    """Whether gguf.quants.dequantize handles qtype (asked once per type, on one
    zero block)."""
    if qtype not in _DEQUANTIZABLE:
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        try:
            x = gguf.quants.dequantize(np.zeros((1, type_size), dtype=np.uint8), qtype)
            _DEQUANTIZABLE[qtype] = np.asarray(x).size == block
        except Exception:  # NotImplementedError for the types it has no code for
            _DEQUANTIZABLE[qtype] = False
    return _DEQUANTIZABLE[qtype]


class _GGUFTensor:
    """A GGUF tensor behind the lazy interface: rows a..b of its 2-D view
    dequantized by gguf.quants.dequantize, a block at a time."""

    def __init__(self, path, name, qtype, dims, data, gguf):
        self.path, self.name, self.qtype, self.gguf = path, name, qtype, gguf
        self.shape = tuple(int(d) for d in reversed(dims))
        self.raw = data.reshape(_view_rows(self.shape), -1)

    def rows(self, a, b):
        try:
            x = self.gguf.quants.dequantize(np.ascontiguousarray(self.raw[a:b]), self.qtype)
            x = np.asarray(x, dtype=np.float32).reshape(b - a, self.shape[-1])
        except Exception as e:  # whatever the package raises on data it cannot take
            raise ExportError(f"{self.path}: tensor {self.name}: gguf could not dequantize its "
                              f"{self.qtype.name} data ({type(e).__name__}: {_one_line(e)})") \
                from None
        if not np.isfinite(x).all():
            raise ExportError(f"{self.path}: tensor {self.name} contains NaN or infinite values")
        return x


def _one_line(e, limit=160):
    s = " ".join(str(e).split())
    return s if len(s) <= limit else s[:limit - 3] + "..."


class _GGUFMetadata:
    """Typed access to a GGUFReader's metadata; every wrong type or missing
    required key is an ExportError naming the file and the key."""

    REQUIRED = object()

    def __init__(self, path, reader, gguf):
        self.path, self.fields, self.gguf = path, reader.fields, gguf

    def __contains__(self, key):
        return key in self.fields

    def _types(self, key):
        return [int(t) for t in self.fields[key].types]

    def get(self, key, kind, default=REQUIRED):
        """kind: "int", "float", "str", "bool", "int[]", "float[]", "bytes[]"."""
        f = self.fields.get(key)
        if f is None:
            if default is self.REQUIRED:
                raise ExportError(f"{self.path}: missing required key {key}")
            return default
        types = self._types(key)
        try:
            if kind in ("int", "float", "bool") and len(types) == 1:
                t, v = types[0], f.parts[-1][0]
                if kind == "int" and t in _GGUF_INTS:
                    return int(v)
                if kind == "float" and t in _GGUF_INTS | _GGUF_FLOATS:
                    return float(v)
                if kind == "bool" and t in _GGUF_INTS | {_GGUF_BOOL} and int(v) in (0, 1):
                    return bool(v)
            elif kind == "str" and types == [_GGUF_STRING]:
                return bytes(f.parts[-1]).decode("utf-8")
            elif kind.endswith("[]") and types[0] == _GGUF_ARRAY:
                if not f.data or len(types) == 1:
                    return []
                sub = types[1]
                if kind == "bytes[]" and sub == _GGUF_STRING:
                    return [bytes(f.parts[i]) for i in f.data]
                if kind in ("int[]", "float[]") and sub in _GGUF_INTS | _GGUF_FLOATS and \
                        (kind == "float[]" or sub in _GGUF_INTS):
                    return np.concatenate([f.parts[i] for i in f.data]).astype(
                        np.int64 if kind == "int[]" else np.float64)
        except UnicodeDecodeError:
            raise ExportError(f"{self.path}: {key} is not UTF-8 text") from None
        except Exception as e:  # the reader's parts are not what its types say
            raise ExportError(f"{self.path}: cannot read {key} ({type(e).__name__}: "
                              f"{_one_line(e)})") from None
        names = []
        for t in types:
            try:
                names.append(self.gguf.GGUFValueType(t).name)
            except ValueError:
                names.append(str(t))
        want = {"int": "an integer", "float": "a number", "str": "a string", "bool": "a bool",
                "int[]": "an array of integers", "float[]": "an array of numbers",
                "bytes[]": "an array of strings"}[kind]
        raise ExportError(f"{self.path}: {key} is {'/'.join(names)}, expected {want}")


def _open_gguf(path):
    """(gguf module, layout, reader, metadata) of a GGUF file, after
    _gguf_layout's checks."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise ExportError(f"{path}: is a directory, expected a GGUF file")
    if not os.path.exists(path):
        raise ExportError(f"{path}: no such file")
    gguf = _import_gguf()
    layout = _gguf_layout(path, gguf)
    try:
        reader = gguf.GGUFReader(path)
    except Exception as e:  # the reader raises ValueError, KeyError, IndexError, ... on bad input
        raise ExportError(f"{path}: gguf could not read it ({type(e).__name__}: "
                          f"{_one_line(e)})") from None
    return gguf, layout, reader, _GGUFMetadata(path, reader, gguf)


def read_gguf_tokenizer(path):
    """The tokenizer of a GGUF file as (tok, notes) (see gguf_tokenizer)."""
    _, _, _, meta = _open_gguf(path)
    return gguf_tokenizer(meta)


def gguf_tokenizer(meta):
    """The tokenizer in a GGUF file's metadata as (tok, notes).

    tokenizer.ggml.model "gpt2" -> byte_bpe: pieces of normal and unused tokens
    are GPT-2 characters, turned back into bytes; control, user-defined and
    unknown tokens are special, stored as their literal text; merges "a b"
    become the ids of a and b; tokenizer.ggml.pre names the pre-tokenizer.
    "llama" -> sentencepiece: "▁" becomes a space (as llama2.c's export does),
    byte tokens <0xHH> stay as they are, with their kind; scores are required.
    Ids: tokenizer.ggml.{bos,eos,eot,padding}_token_id (EOT, when absent, is
    guessed from the special pieces' text as llama.cpp does); add_bos_token
    (default true for "llama", false for "gpt2"). tokenizer.chat_template ->
    chat, system_default, system_prefix (recognize_chat_template); stop ids
    as default_stop_ids, with tokenizer.ggml.eom_token_id."""
    path, notes = meta.path, []
    model = meta.get("tokenizer.ggml.model", "str")
    if model not in ("gpt2", "llama"):
        raise ExportError(f"{path}: tokenizer.ggml.model is {model!r}; supported: \"gpt2\" "
                          "(byte-level BPE) and \"llama\" (sentencepiece)")
    texts = meta.get("tokenizer.ggml.tokens", "bytes[]")
    n = len(texts)
    if n == 0:
        raise ExportError(f"{path}: tokenizer.ggml.tokens is empty")
    types = meta.get("tokenizer.ggml.token_type", "int[]", None)
    if types is None:
        types = np.full(n, GGUF_TOKEN_NORMAL, dtype=np.int64)
        notes.append("no tokenizer.ggml.token_type: every token is taken as normal")
    if len(types) != n:
        raise ExportError(f"{path}: tokenizer.ggml.token_type has {len(types)} entries but "
                          f"tokenizer.ggml.tokens has {n}")
    bad = [int(t) for t in types if not 1 <= int(t) <= 6]
    if bad:
        raise ExportError(f"{path}: tokenizer.ggml.token_type has the unknown type {bad[0]} "
                          "(1..6: normal, unknown, control, user defined, unused, byte)")
    pieces, kinds = [], []
    if model == "gpt2":
        pre_name = meta.get("tokenizer.ggml.pre", "str", None)
        if pre_name in (None, "default"):  # llama.cpp's fallback rules are not GPT-2's split
            raise ExportError(f"{path}: tokenizer.ggml.pre is {pre_name or 'absent'} (llama.cpp's "
                              "fallback pre-tokenizer), which this program does not implement; supported: "
                              f"{', '.join(sorted(GGUF_PRE_NAMES))}")
        if pre_name not in GGUF_PRE_NAMES:
            raise ExportError(f"{path}: tokenizer.ggml.pre is {pre_name!r}; supported: "
                              f"{', '.join(sorted(GGUF_PRE_NAMES))}")
        if meta.get("tokenizer.ggml.add_space_prefix", "bool", False):
            raise ExportError(f"{path}: tokenizer.ggml.add_space_prefix is true: a space before "
                              "the text is not supported for byte-level BPE")
        by_text = {}
        for i, (text, t) in enumerate(zip(texts, types)):
            if t in (GGUF_TOKEN_NORMAL, GGUF_TOKEN_UNUSED):
                try:
                    b = gpt2_to_bytes(text.decode("utf-8"))
                except UnicodeDecodeError:
                    b = None
                if b is None and t == GGUF_TOKEN_NORMAL:
                    raise ExportError(f"{path}: token {i} {_show(text)} is normal but not written "
                                      "in GPT-2's byte alphabet: not a byte-level BPE vocabulary")
                pieces.append(text if b is None else b)
                kinds.append(PIECE_NORMAL if t == GGUF_TOKEN_NORMAL else PIECE_UNUSED)
                if t == GGUF_TOKEN_NORMAL:
                    by_text.setdefault(text, i)
            elif t == GGUF_TOKEN_BYTE:
                raise ExportError(f"{path}: token {i} {_show(text)} has type byte (6), which a "
                                  "gpt2 vocabulary does not use")
            else:  # control, user defined, unknown: literal text
                pieces.append(text)
                kinds.append(PIECE_SPECIAL)
        raw_merges = meta.get("tokenizer.ggml.merges", "bytes[]")
        if not raw_merges:
            raise ExportError(f"{path}: tokenizer.ggml.merges is empty")
        merges = []
        for rank, m in enumerate(raw_merges):
            parts = m.split(b" ")
            if len(parts) != 2 or not parts[0] or not parts[1]:
                raise ExportError(f"{path}: merge {rank} {_show(m)} is not two pieces "
                                  "separated by one space")
            for side in parts:
                if side not in by_text:
                    raise ExportError(f"{path}: merge {rank} {_show(m)} names {_show(side)}, "
                                      "which is not a normal token")
            if parts[0] + parts[1] not in by_text:
                raise ExportError(f"{path}: merge {rank} {_show(m)}: the result "
                                  f"{_show(parts[0] + parts[1])} is not a normal token")
            merges.append((by_text[parts[0]], by_text[parts[1]]))
        tok = dict(type="byte_bpe", pre=GGUF_PRE_NAMES[pre_name], scores=None, merges=merges)
        add_bos_default = False
    else:
        scores = meta.get("tokenizer.ggml.scores", "float[]")
        if len(scores) != n:
            raise ExportError(f"{path}: tokenizer.ggml.scores has {len(scores)} entries but "
                              f"tokenizer.ggml.tokens has {n}")
        pre_name = meta.get("tokenizer.ggml.pre", "str", None)
        if pre_name not in (None, "default"):
            notes.append(f"tokenizer.ggml.pre {pre_name!r} ignored: a sentencepiece vocabulary "
                         "has no pre-tokenizer")
        if not meta.get("tokenizer.ggml.add_space_prefix", "bool", True):
            raise ExportError(f"{path}: tokenizer.ggml.add_space_prefix is false: run's "
                              "sentencepiece tokenizer always puts a space before the text")
        for i, (text, t) in enumerate(zip(texts, types)):
            if t == GGUF_TOKEN_BYTE:
                if not re.fullmatch(rb"<0x[0-9A-Fa-f]{2}>", text):
                    raise ExportError(f"{path}: token {i} {_show(text)} has type byte but is not "
                                      "<0xHH>")
                pieces.append(text)
                kinds.append(PIECE_BYTE)
                continue
            text = text.replace("\u2581".encode("utf-8"), b" ")
            pieces.append(text)
            kinds.append({GGUF_TOKEN_NORMAL: PIECE_NORMAL,
                          GGUF_TOKEN_UNUSED: PIECE_UNUSED}.get(int(t), PIECE_SPECIAL))
        tok = dict(type="sentencepiece", pre="none", scores=[float(s) for s in scores], merges=[])
        add_bos_default = True
    tok.update(pieces=pieces, kinds=kinds)

    def token_id(key):
        v = meta.get(key, "int", None)
        if v is None or v < 0:
            return -1
        if v >= n:
            raise ExportError(f"{path}: {key}={v} is outside the vocabulary ({n} tokens)")
        return v
    tok.update(bos_id=token_id("tokenizer.ggml.bos_token_id"),
               eos_id=token_id("tokenizer.ggml.eos_token_id"),
               eot_id=token_id("tokenizer.ggml.eot_token_id"),
               pad_id=token_id("tokenizer.ggml.padding_token_id"))
    eom = token_id("tokenizer.ggml.eom_token_id")
    if tok["eot_id"] < 0:
        tok["eot_id"] = _eot_id(pieces, kinds)
        if tok["eot_id"] >= 0:
            notes.append(f"no tokenizer.ggml.eot_token_id: end of turn is "
                         f"{_show(pieces[tok['eot_id']])} ({tok['eot_id']})")
    add_bos = meta.get("tokenizer.ggml.add_bos_token", "bool", None)
    if add_bos is None:
        add_bos = add_bos_default and tok["bos_id"] >= 0
        notes.append(f"no tokenizer.ggml.add_bos_token: {'' if add_bos else 'no '}BOS before "
                     f"prompts (llama.cpp's default for {model})")
    elif add_bos and tok["bos_id"] < 0:
        raise ExportError(f"{path}: tokenizer.ggml.add_bos_token is true but there is no "
                          "tokenizer.ggml.bos_token_id")
    tok["add_bos"] = add_bos
    tok["chat_template"] = meta.get("tokenizer.chat_template", "str", None)
    set_chat_and_stops(tok, notes, [eom] if eom >= 0 else [])
    return tok, notes


def llama3_rope_factors(base, rot_dim, factor, low_freq, high_freq, orig_ctx):
    """The rope_freqs values llama.cpp's converter writes for Llama 3 scaling:
    per pair i the divisor of its frequency inv_i = base^(-2i/rot_dim): 1
    where the wavelength 2 pi / inv_i is below orig_ctx / high_freq, factor
    above orig_ctx / low_freq, and 1 / ((1 - a) / factor + a) in between,
    a = (orig_ctx / wavelength - low_freq) / (high_freq - low_freq)."""
    inv = float(base) ** (-np.arange(0, rot_dim, 2, dtype=np.float64) / rot_dim)
    wavelen = 2 * math.pi / inv
    a = (orig_ctx / wavelen - low_freq) / (high_freq - low_freq)
    out = 1.0 / ((1 - a) / factor + a)
    out = np.where(wavelen < orig_ctx / high_freq, 1.0, out)
    return np.where(wavelen > orig_ctx / low_freq, float(factor), out)


def _snap(v, step):
    """v rounded to a multiple of step when that is within 1e-4 relative."""
    r = round(v / step) * step
    return r if abs(r - v) <= 1e-4 * max(abs(v), 1.0) else v


def fit_llama3_rope_freqs(where, freqs, base, rot_dim, orig_ctx=None, tol=1e-5):
    """Recover Llama 3's scaling parameters from a rope_freqs tensor and check
    them. Returns header fields (rope_scaling "llama3", rope_factor,
    llama3_low_freq, llama3_high_freq, rope_orig_ctx), or None when every
    value is 1 (no scaling). Raises ExportError when the values do not follow
    the rule (llama3_rope_factors) to `tol` relative.

    The factor is the largest value (the pairs of lowest frequency). Between
    the two plateaus, a = (1/r - 1/factor) / (1 - 1/factor) is linear in
    x = 1/wavelength: a = A x + B with A = L / (high - low), B = -low /
    (high - low). A and B fix high and low given the original context L: L
    comes from rope.scaling.original_context_length when the file has it, else
    low = 1 (Meta's value for every Llama 3) gives L = -A / B. With fewer than
    two smooth pairs the missing numbers are Meta's (L 8192, low 1, high 4),
    which must then reproduce the plateaus."""
    r = np.asarray(freqs, dtype=np.float64).reshape(-1)
    if r.size != rot_dim // 2:
        raise ExportError(f"{where}: rope_freqs has {r.size} values, expected rot_dim / 2 = "
                          f"{rot_dim // 2}")
    if not np.isfinite(r).all() or (r <= 0).any():
        raise ExportError(f"{where}: rope_freqs has values that are not positive numbers")
    if np.all(np.abs(r - 1) <= tol):
        return None
    factor = float(r.max())
    x = float(base) ** (-np.arange(0, rot_dim, 2, dtype=np.float64) / rot_dim) / (2 * math.pi)
    smooth = (np.abs(r - 1) > tol) & (np.abs(r - factor) > tol * factor)
    a = (1 / r - 1 / factor) / (1 - 1 / factor)
    L, low, high = (float(orig_ctx) if orig_ctx else None), None, None
    if smooth.sum() >= 2 and factor > 1 + tol:
        A, B = np.polyfit(x[smooth], a[smooth], 1)
        if L is None and B < 0:
            low, width = 1.0, -1.0 / B
            L = float(round(A * width))
        elif L is not None and A > 0:
            width = L / A
            low = -B * width
        if low is not None:
            high = low + width
    elif smooth.sum() == 1:
        L, low = L or 8192.0, 1.0
        i = int(np.argmax(smooth))
        if a[i] > 0:
            high = low + (L * x[i] - low) / a[i]
    else:
        L, low, high = L or 8192.0, 1.0, 4.0
    if low is None or high is None or L is None or not (L >= 1 and 0 < low < high and factor > 1):
        raise ExportError(f"{where}: rope_freqs does not follow Llama 3's RoPE scaling rule: no "
                          f"low_freq_factor < high_freq_factor and original context fit its "
                          f"{int(smooth.sum())} values between 1 and the factor {factor:g}; run "
                          "cannot reproduce arbitrary per-frequency factors")
    # round to 3 decimals (the values of real configs) when that still reproduces the tensor
    snapped = (_snap(low, 1e-3), _snap(high, 1e-3))
    if np.max(np.abs(llama3_rope_factors(base, rot_dim, factor, *snapped, L) - r) / r) <= tol:
        low, high = snapped
    err = np.abs(llama3_rope_factors(base, rot_dim, factor, low, high, L) - r) / r
    if err.max() > tol:
        i = int(np.argmax(err))
        raise ExportError(f"{where}: rope_freqs does not follow Llama 3's RoPE scaling rule: the "
                          f"best fit (factor {factor:g}, low_freq_factor {low:g}, high_freq_factor "
                          f"{high:g}, original context {L:g}) misses pair {i} by {err[i]:.2g} "
                          f"relative ({r[i]:.7g}); run cannot reproduce arbitrary per-frequency "
                          "factors")
    return dict(rope_scaling="llama3", rope_factor=factor, llama3_low_freq=low,
                llama3_high_freq=high, rope_orig_ctx=int(L))


def read_gguf(path, layout="interleaved"):
    """A GGUF file of the Llama architecture as (cfg, tensors, tok, notes):
    cfg for write_checkpoint, tensors lazy (dequantized a block at a time
    while the checkpoint is written), tok its tokenizer (gguf_tokenizer).
    layout: "interleaved" keeps the q/k rows (GGUF's order), "neox" applies
    Hugging Face's permutation. Raises ExportError naming the file."""
    path = os.fspath(path)
    if layout not in ROPE_LAYOUTS:
        raise ExportError(f"rope layout {layout!r}: expected one of {', '.join(ROPE_LAYOUTS)}")
    gguf, layout_table, reader, meta = _open_gguf(path)
    notes = []
    arch = meta.get("general.architecture", "str")
    if arch != "llama":
        raise ExportError(f"{path}: general.architecture is {arch!r}: only \"llama\" is supported")
    if meta.get("split.count", "int", 1) > 1:
        raise ExportError(f"{path}: one part of a split GGUF (split.count "
                          f"{meta.get('split.count', 'int')}); merge the parts first "
                          "(llama-gguf-split --merge)")
    for key in meta.fields:
        if key.startswith("llama."):
            k = key[len("llama."):]
            if k in GGUF_LLAMA_REJECTED:
                what, off = GGUF_LLAMA_REJECTED[k]
                value = meta.get(key, "float")
                if value != off:
                    raise ExportError(f"{path}: {key}={value:g} ({what}) is not supported")
            elif k not in GGUF_LLAMA_KEYS:
                notes.append(f"ignoring {key}")
    if meta.get("llama.expert_count", "int", 0) > 0:
        raise ExportError(f"{path}: llama.expert_count={meta.get('llama.expert_count', 'int')}: "
                          "mixture of experts is not supported")

    def count(key, default=_GGUFMetadata.REQUIRED):
        v = meta.get(key, "int", default)
        if v is not None and not 0 < v <= INT32_MAX:
            raise ExportError(f"{path}: {key}={v} is not a positive integer")
        return v
    dim = count("llama.embedding_length")
    n_layers = count("llama.block_count")
    if "llama.feed_forward_length" in meta and meta._types("llama.feed_forward_length")[0] == \
            _GGUF_ARRAY:
        raise ExportError(f"{path}: llama.feed_forward_length is an array (a width per layer); "
                          "our format has one FFN width")
    hidden = count("llama.feed_forward_length")
    heads = count("llama.attention.head_count")
    kv_heads = count("llama.attention.head_count_kv", heads)
    seq_len = count("llama.context_length")
    if dim % heads or heads % kv_heads:
        raise ExportError(f"{path}: llama.attention.head_count={heads}, head_count_kv={kv_heads} "
                          f"do not divide embedding_length={dim} and head_count")
    hs = dim // heads
    for key in ("llama.attention.key_length", "llama.attention.value_length"):
        v = count(key, None)
        if v is not None and v != hs:
            raise ExportError(f"{path}: {key}={v} differs from embedding_length / head_count = "
                              f"{hs} (not supported: our format derives the head size)")
    eps = meta.get("llama.attention.layer_norm_rms_epsilon", "float")
    theta = meta.get("llama.rope.freq_base", "float", None)
    if theta is None:
        theta = 10000.0
        notes.append("no llama.rope.freq_base: using 10000 (llama.cpp's default)")
    rot = count("llama.rope.dimension_count", hs)

    # tensors
    have = {t.name: t for t in reader.tensors}
    used = set()

    def tensor(name, shape, optional=False):
        t = have.get(name)
        if t is None:
            if optional:
                return None
            raise ExportError(f"{path}: missing tensor {name}")
        used.add(name)
        qtype, dims = layout_table[name][0], layout_table[name][1]
        got = tuple(reversed(dims))
        if got != tuple(shape):
            raise ExportError(f"{path}: tensor {name} has shape {list(got)}, expected "
                              f"{list(shape)} from the metadata")
        if not _gguf_can_dequantize(gguf, qtype):
            raise ExportError(f"{path}: tensor {name} has type {qtype.name}, which gguf "
                              f"{_gguf_package_version()} cannot dequantize")
        return _GGUFTensor(path, name, qtype, dims, t.data, gguf)

    emb = have.get("token_embd.weight")
    if emb is None:
        raise ExportError(f"{path}: missing tensor token_embd.weight")
    emb_dims = layout_table["token_embd.weight"][1]
    if len(emb_dims) != 2:
        raise ExportError(f"{path}: tensor token_embd.weight has shape "
                          f"{list(reversed(emb_dims))}, expected [vocab_size, {dim}]")
    vocab = int(emb_dims[1])
    tok, tok_notes = gguf_tokenizer(meta)
    notes += tok_notes
    if len(tok["pieces"]) != vocab:
        raise ExportError(f"{path}: tokenizer.ggml.tokens has {len(tok['pieces'])} entries but "
                          f"token_embd.weight has {vocab} rows")
    v = count("llama.vocab_size", None)
    if v is not None and v != vocab:
        raise ExportError(f"{path}: llama.vocab_size={v} but token_embd.weight has {vocab} rows")

    bos, eos = tok["bos_id"], tok["eos_id"]
    if eos < 0:
        eos = tok["eot_id"] if tok["eot_id"] >= 0 else max(bos, 0)
        notes.append(f"no tokenizer.ggml.eos_token_id: the header's eos_id is {eos}")
    if bos < 0:
        bos = eos
        notes.append(f"no tokenizer.ggml.bos_token_id: the header's bos_id is the EOS id {eos} "
                     "(the tokenizer's add_bos is 0, so it never starts a prompt)")
    cfg = dict(dim=dim, hidden_dim=hidden, n_layers=n_layers, n_heads=heads, n_kv_heads=kv_heads,
               vocab_size=vocab, seq_len=seq_len, bos_id=bos, eos_id=eos, norm_eps=eps,
               rope_theta=theta, rope_layout=layout, rot_dim=rot)
    cfg.update(_gguf_rope_scaling(meta, have, layout_table, gguf, theta, rot, used, notes))
    try:
        c = normalize_config(cfg)
    except ExportError as e:
        raise ExportError(f"{path}: {e}") from None
    shapes = dict((name, fn(c)) for name, fn, _ in TENSOR_TABLE)
    tensors = {"token_embedding": tensor("token_embd.weight", shapes["token_embedding"])}
    for ours, theirs in GGUF_LAYER_TENSORS.items():
        parts = [tensor(f"blk.{i}.{theirs}.weight", shapes[ours][1:]) for i in range(n_layers)]
        if layout == "neox" and ours in ("wq", "wk"):
            parts = [_HeadPermuted(t, heads if ours == "wq" else kv_heads, c["rot_dim"], False)
                     for t in parts]
        tensors[ours] = _Stacked(parts)
    tensors["rms_final_weight"] = tensor("output_norm.weight", shapes["rms_final_weight"])
    wcls = tensor("output.weight", shapes["wcls"], optional=True)
    cfg["shared_classifier"] = wcls is None
    if wcls is not None:
        tensors["wcls"] = wcls
    else:
        notes.append("no output.weight: the classifier is tied to the embedding")
    for name in sorted(set(have) - used):
        raise _unexpected_tensor(name, path)
    return cfg, tensors, tok, notes


def _gguf_rope_scaling(meta, have, layout_table, gguf, theta, rot, used, notes):
    """The RoPE scaling fields of our header from a GGUF: rope.scaling.type
    (none, linear, yarn), the older rope.scale_linear, or a rope_freqs tensor
    (Llama 3, fitted by fit_llama3_rope_freqs)."""
    path = meta.path
    kind = meta.get("llama.rope.scaling.type", "str", None)
    factor = meta.get("llama.rope.scaling.factor", "float", None)
    orig = meta.get("llama.rope.scaling.original_context_length", "int", None)
    linear = meta.get("llama.rope.scale_linear", "float", None)
    if kind is None and linear is not None and linear != 1.0:
        kind, factor = "linear", linear
    if kind not in (None, "none", "linear", "yarn"):
        raise ExportError(f"{path}: llama.rope.scaling.type {kind!r} is not supported (none, "
                          "linear, yarn)")
    out = {"rope_scaling": "none"}
    if kind in ("linear", "yarn"):
        if factor is None:
            raise ExportError(f"{path}: llama.rope.scaling.type is {kind} but there is no "
                              "llama.rope.scaling.factor")
        if factor < 1:
            raise ExportError(f"{path}: llama.rope.scaling.factor={factor:g} < 1 is not supported")
        out.update(rope_scaling=kind, rope_factor=factor)
    if kind == "yarn":
        if orig is not None:
            out["rope_orig_ctx"] = orig
        for key, field, default in (("yarn_beta_fast", "yarn_beta_fast", 32.0),
                                    ("yarn_beta_slow", "yarn_beta_slow", 1.0)):
            out[field] = meta.get(f"llama.rope.scaling.{key}", "float", default)
        if meta.get("llama.rope.scaling.yarn_log_multiplier", "float", 0.0):
            raise ExportError(f"{path}: llama.rope.scaling.yarn_log_multiplier (DeepSeek's YaRN "
                              "magnitude) is not supported")
        ext = meta.get("llama.rope.scaling.yarn_ext_factor", "float", None)
        if ext is not None and ext not in (-1.0, 1.0):
            raise ExportError(f"{path}: llama.rope.scaling.yarn_ext_factor={ext:g} (partial YaRN "
                              "extrapolation) is not supported")
        mult = (meta.get("llama.rope.scaling.attn_factor", "float", 1.0)
                * meta.get("llama.rope.scaling.yarn_attn_factor", "float", 1.0))
        # llama.cpp multiplies YaRN's own 0.1 ln s + 1 by these; 0 in our header means
        # "derive 0.1 ln s + 1"
        out["rope_attn_factor"] = 0.0 if mult == 1.0 else mult * (0.1 * math.log(factor) + 1.0)
    elif kind in (None, "none") and factor not in (None, 1.0):
        notes.append(f"ignoring llama.rope.scaling.factor={factor:g}: no scaling type")
    freqs = have.get("rope_freqs.weight")
    if freqs is not None:
        used.add("rope_freqs.weight")
        qtype = layout_table["rope_freqs.weight"][0]
        if not _gguf_can_dequantize(gguf, qtype):
            raise ExportError(f"{path}: tensor rope_freqs.weight has type {qtype.name}, which "
                              f"gguf cannot dequantize")
        values = _GGUFTensor(path, "rope_freqs.weight", qtype, layout_table["rope_freqs.weight"][1],
                             freqs.data, gguf)
        values = values.rows(0, _view_rows(values.shape)).reshape(-1)
        fitted = fit_llama3_rope_freqs(f"{path}: tensor rope_freqs.weight", values, theta, rot,
                                       orig)
        if fitted is None:
            notes.append("rope_freqs is all ones: no scaling")
        elif out["rope_scaling"] != "none":
            raise ExportError(f"{path}: both llama.rope.scaling.type {kind} and a rope_freqs "
                              "tensor: not supported")
        else:
            out = fitted
            notes.append(f"rope_freqs follows Llama 3's rule: llama3 scaling, factor "
                         f"{fitted['rope_factor']:g}, low {fitted['llama3_low_freq']:g}, high "
                         f"{fitted['llama3_high_freq']:g}, original context "
                         f"{fitted['rope_orig_ctx']}")
    return out


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


def _default_tokenizer_path(out):
    return os.path.join(os.path.dirname(os.path.abspath(out)), "tokenizer.bin")


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
    src.add_argument("--gguf", metavar="FILE.gguf",
                     help="convert a llama.cpp GGUF file of the Llama architecture (any tensor "
                          "type the gguf package dequantizes), and write its tokenizer too")
    src.add_argument("--llama2c", metavar="IN.bin", help="convert a llama2.c (version 0) checkpoint")
    src.add_argument("--checkpoint", metavar="IN.bin",
                     help="re-export a checkpoint of ours (version 1), e.g. with --dtype q8_0")
    src.add_argument("--tokenizer", metavar="FILE",
                     help="convert a tokenizer: a sentencepiece model (-> llama2.c's "
                          "tokenizer.bin), or a tokenizer.json, a tiktoken file (Llama 3's "
                          "tokenizer.model) or a GGUF file's vocabulary (-> version 3)")
    src.add_argument("--random", metavar="D,H,L,NH,NKV,V,S",
                     help="random weights: dim,hidden_dim,n_layers,n_heads,n_kv_heads,"
                          "vocab_size,seq_len")
    m = p.add_argument_group("options for --hf, --meta-llama, --gguf and --random")
    m.add_argument("--rope-layout", choices=ROPE_LAYOUTS, default=None,
                   help="q/k layout to write. --hf: neox (default; the weights as Hugging Face "
                        "stores them) or interleaved (rows un-permuted per head). --meta-llama "
                        "and --gguf: interleaved (default; the layout they store) or neox. "
                        "--random: default interleaved. Both give the same logits")
    m.add_argument("--seq-len", type=int, default=None, metavar="N",
                   help="--hf/--meta-llama/--gguf: training context to record (default: "
                        "max_position_embeddings, params.json max_seq_len, llama.context_length)")
    m.add_argument("--tokenizer-out", metavar="PATH", default=None,
                   help="--gguf: where its tokenizer goes (default: tokenizer.bin beside OUT, "
                        "which run finds on its own). --hf/--meta-llama: also convert the "
                        "directory's tokenizer (tokenizer.json, or tokenizer.model) to PATH")
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
        p.error("--rope-layout applies to --hf, --meta-llama, --gguf and --random only")
    if args.seq_len is not None and not (args.hf or args.meta_llama or args.gguf):
        p.error("--seq-len applies to --hf, --meta-llama and --gguf only")
    if args.seq_len is not None and not 0 < args.seq_len <= INT32_MAX:
        p.error(f"--seq-len {args.seq_len}: expected a positive integer")
    if args.tokenizer_out is not None and not (args.hf or args.meta_llama or args.gguf):
        p.error("--tokenizer-out applies to --hf, --meta-llama and --gguf only")
    if args.tokenizer_out is not None and os.path.abspath(args.tokenizer_out) == \
            os.path.abspath(args.out):
        p.error("--tokenizer-out must differ from OUT")
    if args.tokenizer and (args.dtype != "f32" or args.group_size):
        p.error("--dtype and --group-size apply to checkpoints, not --tokenizer")
    if args.group_size and args.dtype != "q8_0":
        p.error("--group-size applies to --dtype q8_0 only")
    if args.group_size < 0:
        p.error(f"--group-size {args.group_size}: expected a positive integer")
    weights = dict(weight_type=args.dtype, group_size=args.group_size)

    source = (args.hf or args.meta_llama or args.gguf or args.llama2c or args.checkpoint
              or args.tokenizer)
    culprit = source or args.out
    try:
        if args.hf or args.meta_llama or args.gguf:
            tokenizer = None  # (path, bytes, description): checked before anything is written
            if args.hf:
                cfg, tensors, notes = read_hf(args.hf, args.rope_layout or "neox")
            elif args.meta_llama:
                cfg, tensors, notes = read_meta(args.meta_llama, args.rope_layout or "interleaved",
                                                args.seq_len)
            else:
                cfg, tensors, tok, notes = read_gguf(args.gguf, args.rope_layout or "interleaved")
                path = args.tokenizer_out or _default_tokenizer_path(args.out)
                data = pack_tokenizer_ltok(tok)
                if args.tokenizer_out is None and os.path.isfile(path):
                    with open(path, "rb") as f:
                        if not _same_tokenizer(f.read(), data):
                            raise ExportError(f"{path} exists and holds another tokenizer; pass "
                                              "--tokenizer-out PATH, or remove it")
                tokenizer = (path, data, describe_tokenizer(tok))
            if args.tokenizer_out is not None and not args.gguf:
                kind, value, tok_notes = model_dir_tokenizer(args.hf or args.meta_llama,
                                                             cfg["vocab_size"])
                notes += tok_notes
                if kind == "v1":
                    tokenizer = (args.tokenizer_out, pack_tokenizer_v1(*value),
                                 f"sentencepiece, {len(value[0])} pieces (llama2.c's format)")
                else:
                    tokenizer = (args.tokenizer_out, pack_tokenizer_ltok(value),
                                 describe_tokenizer(value))
            if args.seq_len is not None and not args.meta_llama:
                cfg["seq_len"] = args.seq_len
            if cfg["seq_len"] > 32768:
                notes.append(f"seq_len {cfg['seq_len']}: run sizes its KV cache for the training "
                             "context unless told otherwise; pass run --ctx N to use less memory")
            cfg.update(weights)
            if tokenizer:  # a folder that cannot take the tokenizer fails before the checkpoint exists
                tok_dir = os.path.dirname(os.path.abspath(tokenizer[0]))
                if not os.path.isdir(tok_dir) or not os.access(tok_dir, os.W_OK):
                    raise ExportError(f"{tokenizer[0]}: cannot write the tokenizer there "
                                      f"({tok_dir} is not a writable folder)")
            write_checkpoint(args.out, cfg, tensors)
            if tokenizer:
                try:
                    _write_bytes(tokenizer[0], tokenizer[1])
                except BaseException:  # no checkpoint without its tokenizer
                    os.remove(args.out)
                    raise
            for note in notes:
                print(f"export.py: note: {note}", file=sys.stderr)
            print(f"export.py: {_describe(cfg, args.out)}", file=sys.stderr)
            if tokenizer:
                print(f"export.py: wrote {tokenizer[0]}: {tokenizer[2]}", file=sys.stderr)
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
            kind, value, notes = read_tokenizer_source(args.tokenizer)
            if kind == "v1":
                write_tokenizer(args.out, *value)
            else:
                write_tokenizer_ltok(args.out, value)
                for note in notes:
                    print(f"export.py: note: {note}", file=sys.stderr)
                print(f"export.py: wrote {args.out}: {describe_tokenizer(value)}", file=sys.stderr)
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
    except RecursionError:  # a structure nested deeper than Python's stack allows
        print(f"export.py: {culprit}: nested too deeply to read", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"export.py: {args.out}: interrupted; nothing written", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
