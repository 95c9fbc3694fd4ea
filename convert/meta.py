"""Reads Meta's Llama checkpoints: params.json + consolidated.NN.pth (one per
model-parallel rank), with torch."""

import importlib.util
import os

import numpy as np

from convert.checkpoint import TENSOR_TABLE, normalize_config
from convert.common import ExportError, Source, _head_counts, _integer, _number, _read_json
from convert.hf import _source_file, _unexpected_tensor
from convert.lazy import _HeadPermuted, _Stacked


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
    a Source (no tokenizer), tensors lazy. Meta's q/k rows are already
    interleaved; layout "neox" applies Hugging Face's permutation instead."""
    directory = os.fspath(directory)
    params_path = _source_file(directory, layout, "params.json", "params.json and consolidated.*.pth",
                               "a Meta Llama checkpoint directory")
    params = _read_json(params_path, "Meta model parameters")
    notes, where = [], params_path
    dim, heads, kv = _meta_heads(where, params, notes)
    shards = _MetaShards(directory)
    # the embedding decides vocab_size (params may say -1) and its split axis
    emb_axis, vocab, hidden = _meta_vocab_and_hidden(shards, params, dim)
    cfg = _meta_config(where, params, notes, seq_len,
                       dict(dim=dim, hidden_dim=hidden, n_layers=params["n_layers"], n_heads=heads,
                            n_kv_heads=kv, vocab_size=vocab, rope_layout=layout))
    try:
        c = normalize_config(cfg)
    except ExportError as e:
        raise ExportError(f"{where}: {e}") from None
    shapes = dict((name, fn(c)) for name, fn, _ in TENSOR_TABLE)
    tensors = {"token_embedding": shards.joined("tok_embeddings.weight", emb_axis,
                                                shapes["token_embedding"])}
    expected = {"tok_embeddings.weight", "norm.weight", "output.weight"}
    for ours, (theirs, axis) in META_LAYER_NAMES.items():
        parts = []
        for i in range(c["n_layers"]):
            name = f"layers.{i}.{theirs}"
            expected.add(name)
            t = shards.joined(name, axis, shapes[ours][1:])
            if ours in ("wq", "wk") and layout == "neox":
                t = _HeadPermuted(t, c["n_heads"] if ours == "wq" else c["n_kv_heads"],
                                  c["rot_dim"], False)
            parts.append(t)
        tensors[ours] = _Stacked(parts)
    tensors["rms_final_weight"] = shards.joined("norm.weight", None, shapes["rms_final_weight"])
    if any("output.weight" in sd for sd in shards.dicts):  # then every shard must hold its part
        tensors["wcls"] = shards.joined("output.weight", 0, shapes["wcls"])
        cfg["shared_classifier"] = False
    else:
        cfg["shared_classifier"] = True
        notes.append("no output.weight: the classifier is tied to the embedding")
    for p, sd in zip(shards.paths, shards.dicts):
        for name in sorted(set(sd) - expected):
            if name == "rope.freqs":  # LLaMA 1 saved its RoPE table; recomputed
                continue
            raise _unexpected_tensor(name, p)
    return Source(cfg, tensors, None, notes)


def _meta_heads(where, params, notes):
    """(dim, heads, kv_heads) of params.json, after noting the keys it ignores
    and refusing mixtures of experts and vision models."""
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
    return _head_counts(where, params, "dim", "n_heads", "n_kv_heads")


class _MetaShards:
    """The consolidated.NN.pth files of a directory, loaded (torch, memory
    mapped where it can): paths and dicts, one per model-parallel rank."""

    def __init__(self, directory):
        names = sorted(n for n in os.listdir(directory)
                       if n.startswith("consolidated.") and n.endswith(".pth"))
        if not names:
            raise ExportError(f"{directory}: no consolidated.*.pth files")
        want = [f"consolidated.{i:02d}.pth" for i in range(len(names))]
        if names != want:
            raise ExportError(f"{directory}: shards {', '.join(names)}; expected "
                              f"{', '.join(want)}")
        self.paths = [os.path.join(directory, n) for n in names]
        try:
            have_torch = importlib.util.find_spec("torch") is not None
        except (ImportError, ValueError):
            have_torch = False
        if not have_torch:
            raise ExportError("--meta-llama needs torch to read .pth files "
                              "(apt install python3-torch, or pip install torch)")
        self.dicts = [_load_shard(p) for p in self.paths]
        self.n = len(self.dicts)

    def parts_of(self, name):
        """Tensor name of every shard (torch tensors), checked to be floating point."""
        parts = []
        for p, sd in zip(self.paths, self.dicts):
            if name not in sd:
                raise ExportError(f"{p}: missing tensor {name}")
            t = sd[name]
            if not hasattr(t, "shape") or not hasattr(t, "dtype") or not t.is_floating_point():
                raise ExportError(f"{p}: {name} is not a floating-point tensor")
            parts.append(t)
        return parts

    def joined(self, name, axis, shape):
        """Tensor name of shape `shape`, its shards joined along axis (None:
        replicated), as a lazy tensor."""
        parts, n = self.parts_of(name), self.n
        if axis is not None and n > 1:
            for p, t in zip(self.paths, parts):
                want_shape = list(shape)
                if want_shape[axis] % n:
                    raise ExportError(f"{p}: {name}: {want_shape[axis]} does not split into "
                                      f"{n} shards")
                want_shape[axis] //= n
                if list(t.shape) != want_shape:
                    raise ExportError(f"{p}: tensor {name} has shape {list(t.shape)}, expected "
                                      f"{want_shape} (shard of {list(shape)})")
        else:
            for p, t in zip(self.paths, parts):
                if list(t.shape) != list(shape):
                    raise ExportError(f"{p}: tensor {name} has shape {list(t.shape)}, expected "
                                      f"{list(shape)}")
        return _TorchJoined(parts, axis, name, self.paths)


def _load_shard(p):
    """One consolidated.NN.pth as a dict of tensors; whatever torch raises
    becomes an ExportError naming the file (main names the file of an OSError
    that has one)."""
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
    return sd


def _meta_vocab_and_hidden(shards, params, dim):
    """(the embedding's split axis, vocab_size, hidden_dim) from the tensors:
    params.json may say vocab_size -1 and gives the FFN width only as a rule."""
    emb, n, paths = shards.parts_of("tok_embeddings.weight"), shards.n, shards.paths
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
    w1 = shards.parts_of("layers.0.feed_forward.w1.weight")
    hidden = sum(int(t.shape[0]) for t in w1) if n > 1 else int(w1[0].shape[0])
    return emb_axis, vocab, hidden


def _meta_config(where, params, notes, seq_len, cfg):
    """cfg (the sizes) completed from params.json: norm_eps, rope_theta,
    seq_len (the argument, else max_seq_len, else the model's known training
    context), bos/eos, and Llama 3.1's scaled RoPE."""
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
    if cfg["vocab_size"] >= 128256:  # Llama 3's tiktoken vocabulary: <|begin_of_text|>, <|end_of_text|>
        bos, eos = 128000, 128001
        notes.append("vocabulary of Llama 3: bos_id 128000, eos_id 128001 (<|end_of_text|>)")
    cfg = dict(cfg, seq_len=seq_len, norm_eps=_number(where, "norm_eps", eps), rope_theta=theta,
               bos_id=bos, eos_id=eos)
    if params.get("use_scaled_rope"):
        cfg.update(META_LLAMA3_SCALING)
        if params.get("rope_scaling_factor") is not None:
            cfg["rope_factor"] = _number(where, "rope_scaling_factor",
                                         params["rope_scaling_factor"])
        notes.append(f"use_scaled_rope: llama3 scaling, factor {cfg['rope_factor']:g}, "
                     "low 1, high 4, original context 8192 (Meta's apply_scaling)")
    return cfg
