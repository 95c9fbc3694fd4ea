"""Reads GGUF files of the Llama architecture: metadata -> our header, tensors
-> lazy dequantized tensors, and the tokenizer (convert/gguf_file.py reads
the file itself).

Metadata (llama.cpp's keys, "llama." prefix) -> our header:
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
q/k rows: llama.cpp's converter stores them in Meta's interleaved pair order
(it undoes Hugging Face's permutation), so the default layout keeps them;
"neox" applies Hugging Face's permutation per head (k with the kv heads).
"""

import os

from convert.checkpoint import ROPE_LAYOUTS, TENSOR_TABLE, normalize_config
from convert.common import INT32_MAX, ExportError, Source
from convert.gguf_file import (
    _GGUFMetadata, _GGUFTensor, _GGUF_ARRAY, _gguf_can_dequantize, _gguf_package_version,
    _open_gguf)
from convert.gguf_rope import _gguf_rope_scaling
from convert.gguf_tokenizer import gguf_tokenizer
from convert.hf import _unexpected_tensor
from convert.lazy import _HeadPermuted, _Stacked


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


def read_gguf(path, layout="interleaved"):
    """A GGUF file of the Llama architecture as a Source: config for
    write_checkpoint, tensors lazy (dequantized a block at a time while the
    checkpoint is written), tokenizer its tokenizer (gguf_tokenizer).
    layout: "interleaved" keeps the q/k rows (GGUF's order), "neox" applies
    Hugging Face's permutation. Raises ExportError naming the file."""
    path = os.fspath(path)
    if layout not in ROPE_LAYOUTS:
        raise ExportError(f"rope layout {layout!r}: expected one of {', '.join(ROPE_LAYOUTS)}")
    gguf, layout_table, reader, meta = _open_gguf(path)
    notes = []
    _check_llama(meta, notes)
    cfg = _gguf_sizes(meta, notes)
    take = _GGUFTake(path, gguf, layout_table, reader)
    tok = _gguf_vocab(meta, take, cfg, notes)
    cfg.update(rope_layout=layout)
    cfg.update(_gguf_rope_scaling(meta, take.have, layout_table, gguf, cfg["rope_theta"],
                                  cfg["rot_dim"], take.used, notes))
    try:
        c = normalize_config(cfg)
    except ExportError as e:
        raise ExportError(f"{path}: {e}") from None
    shapes = dict((name, fn(c)) for name, fn, _ in TENSOR_TABLE)
    tensors = {"token_embedding": take("token_embd.weight", shapes["token_embedding"])}
    for ours, theirs in GGUF_LAYER_TENSORS.items():
        parts = [take(f"blk.{i}.{theirs}.weight", shapes[ours][1:]) for i in range(c["n_layers"])]
        if layout == "neox" and ours in ("wq", "wk"):
            parts = [_HeadPermuted(t, c["n_heads"] if ours == "wq" else c["n_kv_heads"],
                                   c["rot_dim"], False) for t in parts]
        tensors[ours] = _Stacked(parts)
    tensors["rms_final_weight"] = take("output_norm.weight", shapes["rms_final_weight"])
    wcls = take("output.weight", shapes["wcls"], optional=True)
    cfg["shared_classifier"] = wcls is None
    if wcls is not None:
        tensors["wcls"] = wcls
    else:
        notes.append("no output.weight: the classifier is tied to the embedding")
    for name in sorted(set(take.have) - take.used):
        raise _unexpected_tensor(name, path)
    return Source(cfg, tensors, tok, notes)


def _check_llama(meta, notes):
    """Refuse what is not one Llama model run can reproduce (another
    architecture, one part of a split file, GGUF_LLAMA_REJECTED, experts);
    note the llama.* keys ignored."""
    path = meta.path
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


def _count(meta, key, default=_GGUFMetadata.REQUIRED):
    """A positive int32 metadata value (or default when absent)."""
    v = meta.get(key, "int", default)
    if v is not None and not 0 < v <= INT32_MAX:
        raise ExportError(f"{meta.path}: {key}={v} is not a positive integer")
    return v


def _gguf_sizes(meta, notes):
    """Our config's sizes, norm_eps and RoPE base from the llama.* metadata
    (vocab_size comes from the embedding, in _gguf_vocab)."""
    path = meta.path
    dim = _count(meta, "llama.embedding_length")
    n_layers = _count(meta, "llama.block_count")
    if "llama.feed_forward_length" in meta and meta._types("llama.feed_forward_length")[0] == \
            _GGUF_ARRAY:
        raise ExportError(f"{path}: llama.feed_forward_length is an array (a width per layer); "
                          "our format has one FFN width")
    hidden = _count(meta, "llama.feed_forward_length")
    heads = _count(meta, "llama.attention.head_count")
    kv_heads = _count(meta, "llama.attention.head_count_kv", heads)
    seq_len = _count(meta, "llama.context_length")
    if dim % heads or heads % kv_heads:
        raise ExportError(f"{path}: llama.attention.head_count={heads}, head_count_kv={kv_heads} "
                          f"do not divide embedding_length={dim} and head_count")
    hs = dim // heads
    for key in ("llama.attention.key_length", "llama.attention.value_length"):
        v = _count(meta, key, None)
        if v is not None and v != hs:
            raise ExportError(f"{path}: {key}={v} differs from embedding_length / head_count = "
                              f"{hs} (not supported: our format derives the head size)")
    eps = meta.get("llama.attention.layer_norm_rms_epsilon", "float")
    theta = meta.get("llama.rope.freq_base", "float", None)
    if theta is None:
        theta = 10000.0
        notes.append("no llama.rope.freq_base: using 10000 (llama.cpp's default)")
    rot = _count(meta, "llama.rope.dimension_count", hs)
    return dict(dim=dim, hidden_dim=hidden, n_layers=n_layers, n_heads=heads,
                n_kv_heads=kv_heads, seq_len=seq_len, norm_eps=eps, rope_theta=theta,
                rot_dim=rot)


def _gguf_vocab(meta, take, cfg, notes):
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
    v = _count(meta, "llama.vocab_size", None)
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
    cfg.update(vocab_size=vocab, bos_id=bos, eos_id=eos)
    return tok


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
