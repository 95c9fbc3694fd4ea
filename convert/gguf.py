"""Reads GGUF files of the Llama, Qwen2 and Phi-3 architectures: metadata ->
our header, tensors -> lazy dequantized tensors, and the tokenizer
(convert/gguf_file.py reads the file itself).

Metadata (llama.cpp's keys, prefixed with the architecture's name: "llama.",
"qwen2." or "phi3."; below without it) -> our header:
  context_length -> seq_len, embedding_length -> dim, block_count ->
  n_layers, feed_forward_length -> hidden_dim, attention.head_count(_kv) ->
  n_heads, n_kv_heads, attention.layer_norm_rms_epsilon -> norm_eps,
  rope.freq_base -> rope_theta, rope.dimension_count -> rot_dim,
  rope.scaling.* -> linear / yarn scaling, the rope_freqs tensor -> llama3
  scaling (fitted, see fit_llama3_rope_freqs), tokenizer.ggml.* -> the
  version-3 tokenizer (tokenizer.chat_template -> its chat template) and
  the header's bos_id/eos_id.
Tensors (GGUF dims are innermost first; reversed they are our row-major shapes):
  token_embd, blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output,
  ffn_norm, ffn_gate, ffn_down, ffn_up}, output_norm, output (absent: tied).
What each architecture adds (GGUF_ARCHS), as llama.cpp's converter from
Hugging Face models writes it:
  llama  nothing; q/k rows in Meta's interleaved pair order (the converter
         undoes Hugging Face's permutation for this architecture only)
  qwen2  blk.N.attn_q/attn_k/attn_v.bias, required (Qwen2's attention always
         has them); q/k rows as Hugging Face stores them (neox)
  phi3   blk.N.attn_qkv (the q, k and v rows stacked, in that order) instead
         of attn_q/k/v, and blk.N.ffn_up holding the gate rows then the up
         rows (llama.cpp's SwiGLU takes silu of the first half, as Phi-3's
         gate_up_proj.chunk(2) does) instead of ffn_gate and ffn_up: both
         split by rows; q/k neox; LongRoPE from the rope_factors_long and
         rope_factors_short tensors (gguf_longrope in convert/gguf_rope.py);
         attention.sliding_window on every layer (0: none)
q/k rows: the default layout keeps them as the file stores them (interleaved
for llama, neox for qwen2 and phi3); the other layout permutes them per head
(k with the kv heads, the q and k biases with their rows).
"""

import os

import numpy as np

from convert.checkpoint import MAX_CTX, ROPE_LAYOUTS, TENSOR_TABLE, _kv_dim, normalize_config
from convert.common import INT32_MAX, ExportError, Source
from convert.gguf_file import (
    _GGUFMetadata, _GGUFTensor, _GGUF_ARRAY, _gguf_can_dequantize, _gguf_package_version,
    _open_gguf)
from convert.gguf_rope import _gguf_rope_scaling, gguf_longrope
from convert.gguf_tokenizer import gguf_tokenizer
from convert.hf import _RowSlice, _unexpected_tensor
from convert.lazy import _HeadPermuted, _Stacked, head_permutation


# The architectures read. layout: how llama.cpp's converter leaves the q/k
# rows; qkv_bias: attn_q/k/v.bias per layer; fused: attn_qkv and a gate|up
# ffn_up; window: attention.sliding_window is the model's (else refused
# unless 0); longrope: rope_factors_long/short tensors may follow.
GGUF_ARCHS = {
    "llama": dict(layout="interleaved", qkv_bias=False, fused=False, window=False, longrope=False),
    "qwen2": dict(layout="neox", qkv_bias=True, fused=False, window=False, longrope=False),
    "phi3": dict(layout="neox", qkv_bias=False, fused=True, window=True, longrope=True),
}
# <arch>.* keys read below; other <arch>.* keys get a note, these an error (run
# cannot reproduce what they change)
GGUF_ARCH_KEYS = {
    "context_length", "embedding_length", "block_count", "feed_forward_length",
    "attention.head_count", "attention.head_count_kv", "attention.layer_norm_rms_epsilon",
    "attention.key_length", "attention.value_length", "rope.freq_base", "rope.dimension_count",
    "rope.scaling.type", "rope.scaling.factor", "rope.scaling.original_context_length",
    "rope.scaling.attn_factor", "rope.scaling.yarn_attn_factor", "rope.scaling.yarn_beta_fast",
    "rope.scaling.yarn_beta_slow", "rope.scaling.yarn_ext_factor",
    "rope.scaling.yarn_log_multiplier", "rope.scaling.finetuned", "rope.scale_linear",
    "vocab_size", "expert_count", "expert_used_count"}
GGUF_REJECTED = {  # key: (what it does, the value that means "off")
    "attention.sliding_window": ("sliding-window attention", 0),  # phi3 maps it instead
    "attention.sliding_window_pattern": ("sliding-window attention on some layers", None),
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
GGUF_BIAS_TENSORS = {"bq": "attn_q", "bk": "attn_k", "bv": "attn_v"}


def read_gguf(path, layout=None):
    """A GGUF file of an architecture in GGUF_ARCHS as a Source: config for
    write_checkpoint, tensors lazy (dequantized a block at a time while the
    checkpoint is written), tokenizer its tokenizer (gguf_tokenizer).
    layout: None keeps the q/k rows as the file stores them (interleaved for
    llama, neox for qwen2 and phi3), "interleaved" or "neox" permutes them
    when the file has the other. Raises ExportError naming the file."""
    path = os.fspath(path)
    if layout is not None and layout not in ROPE_LAYOUTS:
        raise ExportError(f"rope layout {layout!r}: expected one of {', '.join(ROPE_LAYOUTS)}")
    gguf, layout_table, reader, meta = _open_gguf(path)
    notes = []
    arch = _check_arch(meta, notes)
    layout = layout or GGUF_ARCHS[arch]["layout"]
    cfg = _gguf_sizes(meta, arch, notes)
    take = _GGUFTake(path, gguf, layout_table, reader)
    tok = _gguf_vocab(meta, arch, take, cfg, notes)
    cfg.update(rope_layout=layout)
    cfg.update(_gguf_rope_scaling(meta, take.have, layout_table, gguf, cfg["rope_theta"],
                                  cfg["rot_dim"], take.used, notes, arch))
    factors = {}
    if GGUF_ARCHS[arch]["longrope"]:
        scaling, factors = gguf_longrope(meta, arch, take, cfg, notes)
        cfg.update(scaling)
    try:
        c = normalize_config(cfg)
    except ExportError as e:
        raise ExportError(f"{path}: {e}") from None
    shapes = dict((name, fn(c)) for name, fn, _ in TENSOR_TABLE)
    tensors = {"token_embedding": take("token_embd.weight", shapes["token_embedding"])}
    tensors.update(_gguf_layer_tensors(take, c, shapes, arch, layout))
    tensors.update(_gguf_bias_tensors(take, c, arch, layout))
    tensors.update(factors)
    tensors["rms_final_weight"] = take("output_norm.weight", shapes["rms_final_weight"])
    wcls = take("output.weight", shapes["wcls"], optional=True)
    cfg["shared_classifier"] = wcls is None
    if wcls is not None:
        tensors["wcls"] = wcls
    else:
        notes.append("no output.weight: the classifier is tied to the embedding")
    for name in sorted(set(take.have) - take.used):
        raise _unexpected_tensor(name, path, arch)
    return Source(cfg, tensors, tok, notes)


def _check_arch(meta, notes):
    """The architecture (a key of GGUF_ARCHS), after refusing what is not one
    model run can reproduce (another architecture, one part of a split file,
    GGUF_REJECTED, experts); notes the <arch>.* keys ignored."""
    path = meta.path
    arch = meta.get("general.architecture", "str")
    if arch not in GGUF_ARCHS:
        raise ExportError(f"{path}: general.architecture is {arch!r}: supported: "
                          + ", ".join(f'"{a}"' for a in GGUF_ARCHS))
    if meta.get("split.count", "int", 1) > 1:
        raise ExportError(f"{path}: one part of a split GGUF (split.count "
                          f"{meta.get('split.count', 'int')}); merge the parts first "
                          "(llama-gguf-split --merge)")
    prefix = arch + "."
    known = GGUF_ARCH_KEYS | ({"attention.sliding_window"} if GGUF_ARCHS[arch]["window"] else set())
    for key in meta.fields:
        if not key.startswith(prefix):
            continue
        k = key[len(prefix):]
        if k in known:
            continue
        if k in GGUF_REJECTED:
            what, off = GGUF_REJECTED[k]
            if off is None:
                raise ExportError(f"{path}: {key} ({what}) is not supported")
            value = meta.get(key, "float")
            if value != off:
                raise ExportError(f"{path}: {key}={value:g} ({what}) is not supported")
        else:
            notes.append(f"ignoring {key}")
    experts = meta.get(prefix + "expert_count", "int", 0)
    if experts > 0:
        raise ExportError(f"{path}: {prefix}expert_count={experts}: mixture of experts is not "
                          "supported")
    return arch


def _count(meta, key, default=_GGUFMetadata.REQUIRED):
    """A positive int32 metadata value (or default when absent)."""
    v = meta.get(key, "int", default)
    if v is not None and not 0 < v <= INT32_MAX:
        raise ExportError(f"{meta.path}: {key}={v} is not a positive integer")
    return v


def _gguf_sizes(meta, arch, notes):
    """Our config's sizes, norm_eps, RoPE base, biases and window from the
    <arch>.* metadata (vocab_size comes from the embedding, in _gguf_vocab)."""
    path, a = meta.path, arch + "."
    dim = _count(meta, a + "embedding_length")
    n_layers = _count(meta, a + "block_count")
    if a + "feed_forward_length" in meta and meta._types(a + "feed_forward_length")[0] == \
            _GGUF_ARRAY:
        raise ExportError(f"{path}: {a}feed_forward_length is an array (a width per layer); "
                          "our format has one FFN width")
    hidden = _count(meta, a + "feed_forward_length")
    heads = _count(meta, a + "attention.head_count")
    kv_heads = _count(meta, a + "attention.head_count_kv", heads)
    seq_len = _count(meta, a + "context_length")
    if dim % heads or heads % kv_heads:
        raise ExportError(f"{path}: {a}attention.head_count={heads}, head_count_kv={kv_heads} "
                          f"do not divide embedding_length={dim} and head_count")
    hs = dim // heads
    for key in (a + "attention.key_length", a + "attention.value_length"):
        v = _count(meta, key, None)
        if v is not None and v != hs:
            raise ExportError(f"{path}: {key}={v} differs from embedding_length / head_count = "
                              f"{hs} (not supported: our format derives the head size)")
    eps = meta.get(a + "attention.layer_norm_rms_epsilon", "float")
    theta = meta.get(a + "rope.freq_base", "float", None)
    if theta is None:
        theta = 10000.0
        notes.append(f"no {a}rope.freq_base: using 10000 (llama.cpp's default)")
    rot = _count(meta, a + "rope.dimension_count", hs)
    window = 0
    if GGUF_ARCHS[arch]["window"]:  # every layer slides; 0 means none (Phi-4 writes 0)
        window = meta.get(a + "attention.sliding_window", "int", 0)
        if not 0 <= window <= MAX_CTX:
            raise ExportError(f"{path}: {a}attention.sliding_window={window} is out of range "
                              f"(0 = none, or 1..{MAX_CTX})")
    return dict(dim=dim, hidden_dim=hidden, n_layers=n_layers, n_heads=heads,
                n_kv_heads=kv_heads, seq_len=seq_len, norm_eps=eps, rope_theta=theta,
                rot_dim=rot, qkv_bias=GGUF_ARCHS[arch]["qkv_bias"], sliding_window=window,
                window_first_layer=0)


def _gguf_vocab(meta, arch, take, cfg, notes):
    """The tokenizer (gguf_tokenizer), after checking it against the
    embedding's rows; sets cfg's vocab_size, bos_id and eos_id."""
    path = meta.path
    if "token_embd.weight" not in take.have:
        raise ExportError(f"{path}: missing tensor token_embd.weight")
    emb_dims = take.layout_table["token_embd.weight"][1]
    if len(emb_dims) != 2:
        raise ExportError(f"{path}: tensor token_embd.weight has shape "
                          f"{list(reversed(emb_dims))}, expected [vocab_size, {cfg['dim']}]")
    vocab = int(emb_dims[1])
    tok, tok_notes = gguf_tokenizer(meta)
    notes += tok_notes
    if len(tok["pieces"]) != vocab:
        raise ExportError(f"{path}: tokenizer.ggml.tokens has {len(tok['pieces'])} entries but "
                          f"token_embd.weight has {vocab} rows")
    v = _count(meta, f"{arch}.vocab_size", None)
    if v is not None and v != vocab:
        raise ExportError(f"{path}: {arch}.vocab_size={v} but token_embd.weight has {vocab} rows")
    bos, eos = tok["bos_id"], tok["eos_id"]
    if eos < 0:
        eos = tok["eot_id"] if tok["eot_id"] >= 0 else max(bos, 0)
        notes.append(f"no tokenizer.ggml.eos_token_id: the header's eos_id is {eos}")
    if bos < 0:
        bos = eos
        notes.append(f"no tokenizer.ggml.bos_token_id: the header's bos_id is the EOS id {eos} "
                     "(the tokenizer's add_bos is 0, so it never starts a prompt)")
    cfg.update(vocab_size=vocab, bos_id=bos, eos_id=eos)
    return tok


def _gguf_layer_tensors(take, c, shapes, arch, layout):
    """Our per-layer matrices and norms, each the layers' tensors stacked:
    phi3's fused attn_qkv and ffn_up split by rows, q/k rows permuted per head
    when layout is not the one the file stores."""
    dim, kv, hidden = c["dim"], _kv_dim(c), c["hidden_dim"]
    per_layer = {ours: [] for ours in GGUF_LAYER_TENSORS}
    for i in range(c["n_layers"]):
        b, fused = f"blk.{i}.", {}
        if GGUF_ARCHS[arch]["fused"]:  # q | k | v rows, and gate | up rows
            qkv = take(b + "attn_qkv.weight", (dim + 2 * kv, dim))
            up = take(b + "ffn_up.weight", (2 * hidden, dim))
            fused = {"wq": _RowSlice(qkv, 0, dim), "wk": _RowSlice(qkv, dim, kv),
                     "wv": _RowSlice(qkv, dim + kv, kv),
                     "w1": _RowSlice(up, 0, hidden), "w3": _RowSlice(up, hidden, hidden)}
        for ours, theirs in GGUF_LAYER_TENSORS.items():
            per_layer[ours].append(fused[ours] if ours in fused
                                   else take(f"{b}{theirs}.weight", shapes[ours][1:]))
    if layout != GGUF_ARCHS[arch]["layout"]:
        for ours, heads in (("wq", c["n_heads"]), ("wk", c["n_kv_heads"])):
            per_layer[ours] = [_HeadPermuted(t, heads, c["rot_dim"], layout == "interleaved")
                               for t in per_layer[ours]]
    return {ours: _Stacked(parts) for ours, parts in per_layer.items()}


def _gguf_bias_tensors(take, c, arch, layout):
    """qwen2's q, k and v biases (small: read whole), the q and k ones in
    their rows' order."""
    if not GGUF_ARCHS[arch]["qkv_bias"]:
        return {}
    hs, out = c["dim"] // c["n_heads"], {}
    for ours, theirs in GGUF_BIAS_TENSORS.items():
        heads = {"bq": c["n_heads"], "bk": c["n_kv_heads"]}.get(ours)
        rows = c["dim"] if ours == "bq" else _kv_dim(c)
        parts = []
        for i in range(c["n_layers"]):
            v = take(f"blk.{i}.{theirs}.bias", (rows,)).rows(0, 1)[0]
            if heads and layout != GGUF_ARCHS[arch]["layout"]:
                v = v[head_permutation(heads, hs, c["rot_dim"], layout == "interleaved")]
            parts.append(v)
        out[ours] = np.stack(parts)
    return out


class _GGUFTake:
    """take(name, shape): a GGUF tensor as a lazy tensor, checked (present,
    the shape the metadata gives, a type gguf dequantizes), remembered in used."""

    def __init__(self, path, gguf, layout_table, reader):
        self.path, self.gguf, self.layout_table = path, gguf, layout_table
        self.have, self.used = {t.name: t for t in reader.tensors}, set()

    def __call__(self, name, shape, optional=False):
        path, t = self.path, self.have.get(name)
        if t is None:
            if optional:
                return None
            raise ExportError(f"{path}: missing tensor {name}")
        self.used.add(name)
        qtype, dims = self.layout_table[name][0], self.layout_table[name][1]
        got = tuple(reversed(dims))
        if got != tuple(shape):
            raise ExportError(f"{path}: tensor {name} has shape {list(got)}, expected "
                              f"{list(shape)} from the metadata")
        if not _gguf_can_dequantize(self.gguf, qtype):
            raise ExportError(f"{path}: tensor {name} has type {qtype.name}, which gguf "
                              f"{_gguf_package_version()} cannot dequantize")
        return _GGUFTensor(path, name, qtype, dims, t.data, self.gguf)
