"""The RoPE scaling of a GGUF file: the rope.scaling.* keys, a rope_freqs
tensor fitted to Llama 3's rule, or Phi-3's LongRoPE factor tensors."""

import math

import numpy as np

from convert.common import INT32_MAX, ExportError
from convert.gguf_file import _GGUFTensor, _gguf_can_dequantize
from convert.lazy import _view_rows


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


def _gguf_rope_scaling(meta, have, layout_table, gguf, theta, rot, used, notes, arch="llama"):
    """The RoPE scaling fields of our header from a GGUF: rope.scaling.type
    (none, linear, yarn), the older rope.scale_linear, or a rope_freqs tensor
    (Llama 3, fitted by fit_llama3_rope_freqs; the llama architecture only).
    Keys are <arch>.*; type "longrope" is left to gguf_longrope (phi3)."""
    path, a = meta.path, arch + "."
    kind = meta.get(a + "rope.scaling.type", "str", None)
    factor = meta.get(a + "rope.scaling.factor", "float", None)
    orig = meta.get(a + "rope.scaling.original_context_length", "int", None)
    linear = meta.get(a + "rope.scale_linear", "float", None)
    if kind is None and linear is not None and linear != 1.0:
        kind, factor = "linear", linear
    if kind == "longrope" and arch == "phi3":
        return {"rope_scaling": "none"}  # gguf_longrope reads it with the factor tensors
    if kind not in (None, "none", "linear", "yarn"):
        raise ExportError(f"{path}: {a}rope.scaling.type {kind!r} is not supported (none, "
                          "linear, yarn" + (", longrope" if arch == "phi3" else "") + ")")
    out = {"rope_scaling": "none"}
    if kind in ("linear", "yarn"):
        if factor is None:
            raise ExportError(f"{path}: {a}rope.scaling.type is {kind} but there is no "
                              f"{a}rope.scaling.factor")
        if factor < 1:
            raise ExportError(f"{path}: {a}rope.scaling.factor={factor:g} < 1 is not supported")
        out.update(rope_scaling=kind, rope_factor=factor)
    if kind == "yarn":
        out.update(_gguf_yarn(meta, a, orig, factor))
    elif kind in (None, "none") and factor not in (None, 1.0):
        notes.append(f"ignoring {a}rope.scaling.factor={factor:g}: no scaling type")
    freqs = have.get("rope_freqs.weight")
    if freqs is not None and arch == "llama":  # other architectures: an unexpected tensor
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


def _gguf_yarn(meta, a, orig, factor):
    """YaRN's fields from the <arch>.rope.scaling.* keys (a: "<arch>.")."""
    path, out = meta.path, {}
    if orig is not None:
        out["rope_orig_ctx"] = orig
    for key, default in (("yarn_beta_fast", 32.0), ("yarn_beta_slow", 1.0)):
        out[key] = meta.get(f"{a}rope.scaling.{key}", "float", default)
    if meta.get(a + "rope.scaling.yarn_log_multiplier", "float", 0.0):
        raise ExportError(f"{path}: {a}rope.scaling.yarn_log_multiplier (DeepSeek's YaRN "
                          "magnitude) is not supported")
    ext = meta.get(a + "rope.scaling.yarn_ext_factor", "float", None)
    if ext is not None and ext not in (-1.0, 1.0):
        raise ExportError(f"{path}: {a}rope.scaling.yarn_ext_factor={ext:g} (partial YaRN "
                          "extrapolation) is not supported")
    mult = (meta.get(a + "rope.scaling.attn_factor", "float", 1.0)
            * meta.get(a + "rope.scaling.yarn_attn_factor", "float", 1.0))
    # llama.cpp multiplies YaRN's own 0.1 ln s + 1 by these; 0 in our header means
    # "derive 0.1 ln s + 1"
    out["rope_attn_factor"] = 0.0 if mult == 1.0 else mult * (0.1 * math.log(factor) + 1.0)
    return out


GGUF_LONGROPE_TENSORS = {"rope_short_factor": "rope_factors_short.weight",
                         "rope_long_factor": "rope_factors_long.weight"}


def gguf_longrope(meta, arch, take, cfg, notes):
    """Phi-3's LongRoPE as llama.cpp's converter writes it: the short and long
    factors as tensors rope_factors_short / rope_factors_long (rot_dim / 2
    positive values each), L as <arch>.rope.scaling.original_context_length
    (required with them), the magnitude as <arch>.rope.scaling.attn_factor
    (the converter's sqrt(1 + ln s / ln L) for s = context_length / L > 1;
    absent: 0, which run derives the same way), and <arch>.rope.scaling.type
    "longrope" or absent. Returns (the header's scaling fields, {our tensor
    name: float32 values}); ({}, {}) when the file has neither tensor.
    take: convert/gguf.py's _GGUFTake (checks presence, shape and type)."""
    path, a = meta.path, arch + "."
    kind = meta.get(a + "rope.scaling.type", "str", None)
    present = [name for name in GGUF_LONGROPE_TENSORS.values() if name in take.have]
    if not present:
        if kind == "longrope":
            raise ExportError(f"{path}: {a}rope.scaling.type is longrope but there are no "
                              "rope_factors_short/rope_factors_long tensors")
        for key in ("rope.scaling.original_context_length", "rope.scaling.attn_factor"):
            if a + key in meta:
                notes.append(f"ignoring {a}{key}: no rope_factors tensors (no LongRoPE)")
        return {}, {}
    if len(present) == 1:
        missing = [n for n in GGUF_LONGROPE_TENSORS.values() if n not in present][0]
        raise ExportError(f"{path}: missing tensor {missing} (LongRoPE needs both "
                          f"rope_factors_short and rope_factors_long; the file has {present[0]})")
    if cfg["rope_scaling"] != "none":
        raise ExportError(f"{path}: both {a}rope.scaling.type {cfg['rope_scaling']} and "
                          "rope_factors tensors (LongRoPE): not supported")
    L = meta.get(a + "rope.scaling.original_context_length", "int")
    if not 0 < L <= INT32_MAX:
        raise ExportError(f"{path}: {a}rope.scaling.original_context_length={L} is not a "
                          "positive integer")
    att = meta.get(a + "rope.scaling.attn_factor", "float", None)
    if att is not None and not (math.isfinite(att) and att > 0):
        raise ExportError(f"{path}: {a}rope.scaling.attn_factor={att:g}: expected a finite "
                          "value > 0")
    if att is None:
        notes.append(f"no {a}rope.scaling.attn_factor: the LongRoPE magnitude is derived, "
                     "sqrt(1 + ln s / ln L), as transformers does")
    n = cfg["rot_dim"] // 2
    factors = {}
    for ours, name in GGUF_LONGROPE_TENSORS.items():
        v = take(name, (n,)).rows(0, 1).reshape(-1)
        bad = np.flatnonzero(~(v > 0))
        if bad.size:  # run divides frequencies by them
            raise ExportError(f"{path}: tensor {name}[{bad[0]}]={v[bad[0]]:g}: expected a "
                              "finite value > 0")
        factors[ours] = v.astype(np.float32)
    s = max(cfg["seq_len"] / L, 1.0)  # only the derived magnitude uses it
    return dict(rope_scaling="longrope", rope_factor=s, rope_orig_ctx=L,
                rope_attn_factor=att if att is not None else 0.0), factors
