"""Reads Hugging Face model directories (config.json + safetensors weights) of
the Llama, Mistral, Qwen2 and Phi-3 families."""

import os

import numpy as np

from convert.checkpoint import (
    MAX_CTX, ROPE_LAYOUTS, TENSOR_TABLE, _kv_dim, normalize_config, tensor_names)
from convert.common import INT32_MAX, ExportError, Source, _head_counts, _integer, _js, _number, _read_json
from convert.hf_rope import hf_rope_scaling
from convert.lazy import _HeadPermuted, _Stacked, head_permutation
from convert.safetensors import SAFETENSORS_DTYPES, read_safetensors_header


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
#   rot_dim (phi3 only: Llama, Mistral and Qwen2 rotate the whole head and
#   ignore it, with a note), bos/eos_token_id, tie_word_embeddings, rope_scaling (or v5
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
# The families whose transformers code reads partial_rotary_factor: Phi-3's
# default rotary embedding sizes inv_freq by it and its attention rotates only
# that share of each head. Llama, Mistral and Qwen2 size the default inv_freq
# by the whole head and rotate the whole head, whatever the factor says.
HF_PARTIAL_ROTARY = {"phi3"}


def _hf_token_id(where, config, key, default, notes):
    v = config.get(key)
    if v is None:
        notes.append(f"{key} absent: using {default}")
        return default
    if isinstance(v, list):
        if not v:
            notes.append(f"{key} is an empty list: using {default}")
            return default
        for k, x in enumerate(v):
            if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x <= INT32_MAX:
                raise ExportError(f"{where}: {key}[{k}]={_js(x)}: expected a token id (an "
                                  "integer >= 0)")
        if len(v) > 1:
            notes.append(f"{key} is a list {v}: using the first, {v[0]}")
        v = v[0]
    return _integer(where, key, v, minimum=0)


# config.json's torch_dtype (dtype in transformers v5): the float types weights are stored in
HF_TORCH_DTYPES = ("float32", "float16", "bfloat16", "float64")


def _hf_torch_dtype(where, config):
    """Refuse a torch_dtype (or dtype) that is not a float type (e.g. "int4")."""
    for key in ("torch_dtype", "dtype"):
        v = config.get(key)
        if v is None or (isinstance(v, str) and v.removeprefix("torch.") in HF_TORCH_DTYPES):
            continue
        raise ExportError(f"{where}: {key}={_js(v)}: expected one of "
                          f"{', '.join(HF_TORCH_DTYPES)} (or null)")


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
    v = config.get("sliding_window")
    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
        raise ExportError(f"{where}: sliding_window={_js(v)}: expected an integer >= 0 or null")
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
    _hf_torch_dtype(where, config)
    act = config.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ExportError(f"{where}: hidden_act={_js(act)} is not supported (only silu: SwiGLU)")
    config, dim, heads, kv = _hf_heads(where, config, family, notes)
    seq_len, eps = _hf_context_and_eps(where, config, family, notes)
    theta, rot, unread = _hf_rope_base(where, config, dim // heads, notes, family)
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
    scaling, rope_tensors = hf_rope_scaling(where, config, seq_len, notes, family, rot)
    if unread and scaling["rope_scaling"] != "none":
        # transformers' scaled inv_freq reads the factor, the attention does not
        raise ExportError(f"{where}: partial_rotary_factor={_js(unread)} with {scaling['rope_scaling']} "
                          f"rope scaling is not supported ({HF_FAMILIES[family]} in transformers "
                          "sizes the scaled frequencies by it but rotates the whole head)")
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


def _hf_defaults(family):
    """(the family's defaults, the name of its config class) for notes."""
    return HF_DEFAULTS[family], HF_FAMILIES[family].replace("ForCausalLM", "Config")


def _hf_heads(where, config, family, notes):
    """(config, dim, heads, kv_heads) after checking the required sizes and the
    head size; config gains the family's num_key_value_heads when it has none."""
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "vocab_size"):
        if config.get(key) is None:
            raise ExportError(f"{where}: {key} is missing")
        _integer(where, key, config[key])
    defaults, name = _hf_defaults(family)
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
    return config, dim, heads, kv


def _hf_context_and_eps(where, config, family, notes):
    """(seq_len, norm_eps): max_position_embeddings and rms_norm_eps, or the
    family's defaults."""
    defaults, name = _hf_defaults(family)
    seq_len = config.get("max_position_embeddings")
    if seq_len is None:
        seq_len = defaults["max_position_embeddings"]
        notes.append(f"max_position_embeddings absent: using {seq_len} (the {name} default)")
    seq_len = _integer(where, "max_position_embeddings", seq_len)
    eps = config.get("rms_norm_eps")
    if eps is None:
        eps = defaults["rms_norm_eps"]
        notes.append(f"rms_norm_eps absent: using {eps:g} (the {name} default)")
    return seq_len, _number(where, "rms_norm_eps", eps)


def _hf_rope_base(where, config, hs, notes, family="llama"):
    """(rope_theta, rot_dim, unread): rope_theta and partial_rotary_factor, at
    the top level or inside v5's rope_parameters. The factor sets rot_dim for
    the families in HF_PARTIAL_ROTARY; the others rotate the whole head and
    ignore it (a note), unread then being the factor when it would have
    changed rot_dim, else None."""
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
    if prf is None:
        return theta, hs, None
    if family not in HF_PARTIAL_ROTARY:
        if isinstance(prf, (int, float)) and not isinstance(prf, bool) and int(hs * prf) == hs:
            return theta, hs, None
        notes.append(f"ignoring partial_rotary_factor={_js(prf)}: {HF_FAMILIES[family]} rotates "
                     f"all {hs} dims of each head")
        return theta, hs, prf
    prf = _number(where, "partial_rotary_factor", prf)
    rot = int(hs * prf)
    if prf > 1 or rot < 2 or rot % 2:
        raise ExportError(f"{where}: partial_rotary_factor={prf:g} gives {rot} rotary dims of "
                          f"head size {hs}; expected an even number in 2..{hs}")
    return theta, rot, None


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
    HF_FAMILIES as a Source (no tokenizer): tensors are lazy (convert/lazy.py), nothing is read until write_checkpoint streams them; biases and
    LongRoPE's factors, which are small, are arrays. Phi-3's fused qkv_proj and
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
    take = _Take(*read_hf_weights(directory))
    c = normalize_config(cfg)
    shapes = dict((name, fn(c)) for name, fn, _ in TENSOR_TABLE)
    tensors = {"token_embedding": take("model.embed_tokens.weight", shapes["token_embedding"])}
    tensors.update(_hf_layer_tensors(take, c, shapes, family, layout))
    tensors.update(_hf_bias_tensors(take, c, shapes, layout))
    tensors.update(rope_tensors)
    tensors["rms_final_weight"] = take("model.norm.weight", shapes["rms_final_weight"])
    if "lm_head.weight" in take.source:
        if cfg["shared_classifier"]:
            take.used.add("lm_head.weight")
            notes.append("tie_word_embeddings is true: lm_head.weight is ignored (the "
                         "classifier is the embedding, as in transformers)")
        else:
            tensors["wcls"] = take("lm_head.weight", shapes["wcls"])
    elif not cfg["shared_classifier"]:
        cfg["shared_classifier"] = True
        notes.append("no lm_head.weight: the classifier is tied to the embedding")
    for name in sorted(set(take.source) - take.used):
        if name.endswith("rotary_emb.inv_freq"):  # a buffer older checkpoints saved; recomputed
            continue
        raise _unexpected_tensor(name, take.source[name].path, family)
    cfg["rope_layout"] = layout
    return Source(cfg, tensors, None, notes)


class _Take:
    """take(name, shape): the safetensors tensor name, checked (present, a
    dtype we read, the shape the config gives), remembered in used."""

    def __init__(self, source, listing):
        self.source, self.listing, self.used = source, listing, set()

    def __call__(self, name, shape):
        if name not in self.source:
            raise ExportError(f"{self.listing}: missing tensor {name}")
        t = self.source[name]
        if t.dtype not in SAFETENSORS_DTYPES:
            raise ExportError(f"{t.path}: tensor {name} has dtype {t.dtype}; supported: "
                              f"{', '.join(SAFETENSORS_DTYPES)}")
        self.used.add(name)
        return _shape_checked(t, shape, f"{t.path}: tensor {name}")


def _hf_layer_tensors(take, c, shapes, family, layout):
    """Our per-layer matrices and norms, each the layers' tensors stacked (q/k
    rows un-permuted for layout "interleaved")."""
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
    return {k: _Stacked(parts) for k, parts in per_layer.items()}


def _hf_bias_tensors(take, c, shapes, layout):
    """The biases the config has: small, read whole; q and k follow their rows' order."""
    tensors = {}
    for ours in tensor_names(c):
        if not ours.startswith("b") or ours not in _hf_bias_names(0):
            continue
        parts = []
        for i in range(c["n_layers"]):
            v = take(_hf_bias_names(i)[ours], shapes[ours][1:]).rows(0, 1)[0]
            if layout == "interleaved" and ours in ("bq", "bk"):
                heads = c["n_heads"] if ours == "bq" else c["n_kv_heads"]
                v = v[head_permutation(heads, c["dim"] // c["n_heads"], c["rot_dim"], True)]
            parts.append(v)
        tensors[ours] = np.stack(parts)
    return tensors
