"""The RoPE scaling of a Hugging Face config.json (rope_scaling, or
transformers v5's rope_parameters) as the fields of our header: one small
function per rope type, chosen from ROPE_TYPES as run.c's rope_frequencies
switches on the same types."""

import math

import numpy as np

from convert.checkpoint import FLT_MAX, FLT_MIN_NORMAL
from convert.common import ExportError, _integer, _js, _number


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
