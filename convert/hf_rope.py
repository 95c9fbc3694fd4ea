"""The RoPE scaling of a Hugging Face config.json (rope_scaling, or
transformers v5's rope_parameters) as the fields of our header.

hf_rope_scaling finds the scaling object and its type; then one small
function per type reads that type's keys, chosen from ROPE_TYPES as run.c's
rope_frequencies switches on the same types:

    linear    factor
    dynamic   factor; L = max_position_embeddings (as transformers does)
    yarn      factor, original_max_position_embeddings, beta_fast, beta_slow,
              attention_factor (or the mscale/mscale_all_dim ratio)
    llama3    factor, low_freq_factor, high_freq_factor,
              original_max_position_embeddings
    longrope  short_factor, long_factor (tensors rope_short_factor,
              rope_long_factor), original_max_position_embeddings, factor,
              attention_factor; also the old type name "su" (and Phi-3's "yarn")
"""

import math

import numpy as np

from convert.checkpoint import FLT_MAX, FLT_MIN_NORMAL
from convert.common import ExportError, _integer, _js, _number


# The keys each type reads (others get a note saying they are ignored)
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


def hf_rope_scaling(where, config, seq_len, notes, family="llama", rot=None):
    """The RoPE scaling fields of our header from rope_scaling (or the v5
    rope_parameters), as a dict of CONFIG_DEFAULTS keys, and LongRoPE's factor
    arrays as tensors ({} for every other type). rot: the rotated dims per head."""
    found = _scaling_object(where, config, notes)
    if found is None:
        return {"rope_scaling": "none"}, {}
    t, d, key = found
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
    s = _Scaling(where, config, seq_len, notes, family, rot, t, d, key)
    fields, arrays = ROPE_TYPES[t](s)
    return {"rope_scaling": t, **fields}, arrays


def _scaling_object(where, config, notes):
    """(type, object, its key) of the scaling a config asks for: rope_scaling,
    else rope_parameters (the two must agree when both name a type); None for
    none."""
    rs, rp = config.get("rope_scaling"), config.get("rope_parameters")
    for key, d in (("rope_scaling", rs), ("rope_parameters", rp)):
        if d is not None and not isinstance(d, dict):
            raise ExportError(f"{where}: {key} must be an object, got {_js(d)}")
    if isinstance(rp, dict) and any(isinstance(v, dict) for v in rp.values()):
        raise ExportError(f"{where}: rope_parameters per layer type (several RoPE settings in "
                          "one model) is not supported")
    t_rs = _scaling_type(where, rs, "rope_scaling", notes)
    t_rp = _scaling_type(where, rp, "rope_parameters", notes)
    if t_rs and t_rp and (t_rs != t_rp or any(rs.get(k) != rp.get(k) for k in
                                              ("factor", "original_max_position_embeddings"))):
        raise ExportError(f"{where}: rope_scaling ({t_rs}) and rope_parameters ({t_rp}) "
                          "disagree; remove one")
    if t_rs:
        return t_rs, rs, "rope_scaling"
    return (t_rp, rp, "rope_parameters") if t_rp else None


def _scaling_type(where, d, key, notes):
    """The type a scaling object names (rope_type, or the older type), or None
    for none ("default", or an object holding only the unscaled keys)."""
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


class _Scaling:
    """One scaling object being read: t its type, d the object, key where it
    is ("rope_scaling" or "rope_parameters"); what names it in messages.
    orig_ctx() and factor() read the two keys several types share."""

    def __init__(self, where, config, seq_len, notes, family, rot, t, d, key):
        self.where, self.seq_len, self.notes, self.rot = where, seq_len, notes, rot
        self.t, self.d, self.key, self.what = t, d, key, f"{where}: {key}"
        self.top = config.get("original_max_position_embeddings")
        if self.top is None and family == "phi3" and t == "longrope":
            self.top = PHI3_DEFAULT_ORIGINAL
            notes.append(f"original_max_position_embeddings absent: using {self.top}, "
                         "Phi3Config's default")
        self.has_orig = self.top is not None or d.get("original_max_position_embeddings") is not None

    def orig_ctx(self):
        """L: for llama3, yarn and longrope transformers v5 gives a top-level
        original_max_position_embeddings priority over the one in rope_scaling."""
        top, inner = self.top, self.d.get("original_max_position_embeddings")
        if top is not None:
            L = _integer(self.where, "original_max_position_embeddings", top)
            if inner is not None and inner != top:
                self.notes.append(f"{self.t}: original_max_position_embeddings is {_js(top)} at "
                                  f"the top level and {_js(inner)} in {self.key}: using the "
                                  f"top-level {L}, as transformers v5 does")
            return L
        if inner is None:
            self.notes.append(f"{self.t}: original_max_position_embeddings absent: using "
                              f"max_position_embeddings={self.seq_len}, as transformers v5 does")
            return self.seq_len
        return _integer(self.what, "original_max_position_embeddings", inner)

    def factor(self, required=True):
        """The factor (>= 1), or None when absent and not required."""
        d, what = self.d, self.what
        if "factor" not in d or d["factor"] is None:
            if required:
                raise ExportError(f"{what}: {self.t} scaling needs a factor")
            return None
        f = _number(what, "factor", d["factor"])
        if f < 1 and self.t == "longrope":  # it only sets the attention factor: 1 for any factor <= 1
            self.notes.append(f"longrope: factor {f:g} < 1: storing 1 (the same attention "
                              "factor, 1)")
            return 1.0
        if f < 1:
            raise ExportError(f"{what}: factor={_js(d['factor'])} < 1 (shrinking the context) "
                              "is not supported")
        return f


def _linear(s):
    return {"rope_factor": s.factor()}, {}


def _dynamic(s):
    # transformers' dynamic NTK uses max_position_embeddings as L
    return {"rope_factor": s.factor(), "rope_orig_ctx": s.seq_len}, {}


def _yarn(s):
    d, what, seq_len = s.d, s.what, s.seq_len
    if d.get("truncate", True) is not True:
        raise ExportError(f"{what}: yarn truncate={_js(d['truncate'])} is not supported "
                          "(run rounds the correction range, transformers' default)")
    L = s.orig_ctx()
    factor = s.factor(required=False)
    if factor is None:
        if not s.has_orig:
            raise ExportError(f"{what}: yarn scaling needs a factor")
        factor = seq_len / L
        s.notes.append(f"yarn: factor absent: using max_position_embeddings / "
                       f"original_max_position_embeddings = {factor:g}")
        if factor < 1:
            raise ExportError(f"{what}: yarn factor max_position_embeddings / "
                              f"original_max_position_embeddings = {factor:g} < 1")
    elif s.has_orig and not math.isclose(factor, seq_len / L):
        s.notes.append(f"yarn: factor {factor:g} differs from max_position_embeddings / "
                       f"original_max_position_embeddings = {seq_len / L:g}; using factor, "
                       "as current transformers does (some 4.4x/4.5x used the ratio)")
    out = dict(rope_factor=factor, rope_orig_ctx=L)
    for k, default in (("beta_fast", 32.0), ("beta_slow", 1.0)):
        v = d.get(k)  # transformers reads these with `or`: 0 and null mean the default
        out["yarn_" + k] = _number(what, k, v) if v else default
    if not out["yarn_beta_fast"] > out["yarn_beta_slow"]:
        raise ExportError(f"{what}: yarn beta_fast={out['yarn_beta_fast']:g} must be "
                          f"greater than beta_slow={out['yarn_beta_slow']:g}")
    out["rope_attn_factor"] = _yarn_attention_factor(s, factor)
    return out, {}


def _yarn_attention_factor(s, factor):
    """attention_factor, else the ratio of mscale and mscale_all_dim, else 0
    (run then uses 0.1 ln s + 1)."""
    d, what = s.d, s.what
    att = d.get("attention_factor")
    if att is not None:
        return _number(what, "attention_factor", att)
    if not (d.get("mscale") and d.get("mscale_all_dim")):
        return 0.0
    ms = _number(what, "mscale", d["mscale"])
    ms_all = _number(what, "mscale_all_dim", d["mscale_all_dim"])

    def mscale(m):
        return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0
    att = mscale(ms) / mscale(ms_all)
    s.notes.append(f"yarn: attention factor from mscale/mscale_all_dim: {att:.6g}")
    return att


def _llama3(s):
    d, what = s.d, s.what
    for k in ("low_freq_factor", "high_freq_factor"):
        if d.get(k) is None:
            raise ExportError(f"{what}: llama3 scaling needs {k}")
    out = dict(rope_factor=s.factor(), rope_orig_ctx=s.orig_ctx(),
               llama3_low_freq=_number(what, "low_freq_factor", d["low_freq_factor"]),
               llama3_high_freq=_number(what, "high_freq_factor", d["high_freq_factor"]))
    if not out["llama3_high_freq"] > out["llama3_low_freq"]:
        raise ExportError(f"{what}: llama3 high_freq_factor must be greater than "
                          "low_freq_factor")
    return out, {}


def _longrope(s):
    L = s.orig_ctx()
    arrays = {"rope_" + k: _longrope_factors(s, k) for k in ("short_factor", "long_factor")}
    factor = s.factor(required=False)
    if factor is None:
        factor = s.seq_len / L
        if factor < 1:
            s.notes.append(f"longrope: max_position_embeddings / original_max_position_embeddings "
                           f"= {factor:g} < 1: storing factor 1 (the factor only sets the attention "
                           "factor, which is 1 for any factor <= 1)")
            factor = 1.0
    att = s.d.get("attention_factor")
    return dict(rope_factor=factor, rope_orig_ctx=L,
                rope_attn_factor=_number(s.what, "attention_factor", att) if att is not None
                else 0.0), arrays


def _longrope_factors(s, k):
    """LongRoPE's list k (short_factor or long_factor) as float32: one positive
    divisor per rotated pair."""
    v, what, n = s.d.get(k), s.what, (s.rot or 0) // 2
    if not isinstance(v, list) or len(v) != n:
        got = f"a list of {len(v)}" if isinstance(v, list) else _js(v)
        raise ExportError(f"{what}: longrope {k} must be a list of {n} numbers (one per "
                          f"rotated pair), got {got}")
    values = [_number(what, f"{k}[{i}]", x) for i, x in enumerate(v)]
    for i, x in enumerate(values):  # run divides frequencies by them, as float32
        if not FLT_MIN_NORMAL <= x <= FLT_MAX:
            raise ExportError(f"{what}: longrope {k}[{i}]={x!r}: expected a positive value that "
                              f"float32 holds ({FLT_MIN_NORMAL:g} to {FLT_MAX:g})")
    return np.array(values, dtype=np.float32)


# One reader per type, as run.c's rope_frequencies has one case per type
ROPE_TYPES = {"linear": _linear, "dynamic": _dynamic, "yarn": _yarn, "llama3": _llama3,
              "longrope": _longrope}
assert ROPE_TYPES.keys() == HF_SCALING_KEYS.keys()
