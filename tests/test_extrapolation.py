"""Long-context behaviour against an independent numpy reference.

For every RoPE scaling method, both dynamic-NTK variants and Self-Extend,
`run -m ppl --json` at a context 4x the training length must give the NLL
of a float64 reference written here from docs/rope.md (§8.3-§8.7 and
§10), not from run.c.

The reference is general on purpose: for each query position p it rotates
the query and every key t <= p with whatever angles the method assigns, so
one forward covers static tables, dynamic NTK (a base that depends on the
length), and Self-Extend (grouped positions for far keys).

Tolerance: 2e-4 on the mean NLL and 5e-4 per bucket. run computes in float32
(tables stored as float, sums in float); the reference in float64. Observed
differences are ~1e-5; a wrong frequency, a factor applied twice, or a
mis-grouped position moves the NLL by 1e-2 or more (checked below: every case
also asserts that the method changes the NLL by more than 10x the tolerance).
"""

import math

import numpy as np
import pytest

from conftest import TEXT, make_model, run_ppl, tokenize
from reference import _silu, _softmax, rmsnorm

TOL_MEAN, TOL_BUCKET = 2e-4, 5e-4
L = 32  # training context of the random models; ctx = 4L below


# --------------------------------------------------------------------------
# Inverse frequencies (docs/rope.md §8), written independently.

def inv_freq(method, d, base, s=1.0, L=L, seq_len=1, beta_fast=32.0, beta_slow=1.0,
             low=1.0, high=4.0, attn=0.0):
    """(inv_freq (d/2,), attention factor) for one method."""
    i = np.arange(d // 2, dtype=np.float64)
    f = base ** (-2 * i / d)
    if method == "none":
        return f, 1.0
    if method == "linear":
        return f / s, 1.0
    if method in ("ntk", "dynamic"):
        alpha = s
        if method == "dynamic":
            S = max(seq_len, L)
            alpha = s * S / L - (s - 1)
        b2 = base * alpha ** (d / (d - 2))
        return b2 ** (-2 * i / d), 1.0
    if method == "yarn":
        def corr(n_rot):
            return d * math.log(L / (n_rot * 2 * math.pi)) / (2 * math.log(base))
        lo, hi = max(math.floor(corr(beta_fast)), 0), min(math.ceil(corr(beta_slow)), d - 1)
        if lo == hi:
            hi += 0.001
        ramp = np.clip((i - lo) / (hi - lo), 0, 1)
        extrapolation = 1 - ramp  # 1: keep f (fast pairs)
        inv = f / s * (1 - extrapolation) + f * extrapolation
        return inv, attn if attn > 0 else (0.1 * math.log(s) + 1 if s > 1 else 1.0)
    if method == "llama3":
        wavelen = 2 * math.pi / f
        low_wl, high_wl = L / low, L / high
        smooth = (L / wavelen - low) / (high - low)
        inv = np.where(wavelen > low_wl, f / s, f)
        band = (wavelen >= high_wl) & (wavelen <= low_wl)
        return np.where(band, (1 - smooth) * f / s + smooth * f, inv), 1.0
    raise ValueError(method)


def rotate(x, angles, att, layout, rot_dim):
    """x (..., heads, head_size) rotated by angles (..., rot_dim/2), times att."""
    half = rot_dim // 2
    out = np.array(x, dtype=np.float64)
    if layout == "interleaved":
        ia, ib = np.arange(0, rot_dim, 2), np.arange(1, rot_dim, 2)
    else:
        ia, ib = np.arange(half), np.arange(half, rot_dim)
    a, b = out[..., ia], out[..., ib]
    c, s = att * np.cos(angles)[..., None, :], att * np.sin(angles)[..., None, :]
    out[..., ia], out[..., ib] = a * c - b * s, a * s + b * c
    return out


class ScaledReference:
    """Full-sequence float64 forward where each (query, key) pair is rotated
    as the method prescribes.

    angles(p, t) -> (query angles, key angles, att): the rotation applied to
    the query at position p and the key at t (t <= p)."""

    def __init__(self, cfg, tensors, angles):
        self.cfg, self.angles = cfg, angles
        self.w = {k: np.asarray(v, dtype=np.float64) for k, v in tensors.items()}
        self.eps = float(np.float32(cfg["norm_eps"]))

    def nll(self, tokens):
        c, w = self.cfg, self.w
        T = len(tokens) - 1
        nh, nkv = c["n_heads"], c["n_kv_heads"]
        hs = c["dim"] // nh
        rot, layout = c["rot_dim"], c["rope_layout"]
        x = w["token_embedding"][np.asarray(tokens[:-1])]
        for l in range(c["n_layers"]):
            h = rmsnorm(x, w["rms_att_weight"][l], self.eps)
            q = (h @ w["wq"][l].T).reshape(T, nh, hs)
            k = (h @ w["wk"][l].T).reshape(T, nkv, hs)
            v = (h @ w["wv"][l].T).reshape(T, nkv, hs)
            out = np.empty((T, nh, hs))
            for p in range(T):
                pairs = [self.angles(p, t) for t in range(p + 1)]
                qa = np.array([a[0] for a in pairs])  # (p+1, rot/2): the query's angles per key
                ka = np.array([a[1] for a in pairs])  # (p+1, rot/2)
                att = pairs[0][2]
                qr = rotate(np.broadcast_to(q[p], (p + 1, nh, hs)), qa, att, layout, rot)
                kr = np.repeat(rotate(k[:p + 1], ka, att, layout, rot), nh // nkv, axis=1)
                scores = np.einsum("thd,thd->ht", qr, kr) / math.sqrt(hs)
                a = _softmax(scores)
                out[p] = np.einsum("ht,thd->hd", a, np.repeat(v[:p + 1], nh // nkv, axis=1))
            x = x + out.reshape(T, -1) @ w["wo"][l].T
            h = rmsnorm(x, w["rms_ffn_weight"][l], self.eps)
            x = x + (_silu(h @ w["w1"][l].T) * (h @ w["w3"][l].T)) @ w["w2"][l].T
        x = rmsnorm(x, w["rms_final_weight"], self.eps)
        wcls = w["token_embedding"] if c["shared_classifier"] else w["wcls"]
        logits = x @ wcls.T
        m = logits.max(-1, keepdims=True)
        logz = (m + np.log(np.exp(logits - m).sum(-1, keepdims=True)))[:, 0]
        return logz - logits[np.arange(T), np.asarray(tokens[1:])]


def static_angles(inv, att):
    return lambda p, t: (p * inv, t * inv, att)


def dynamic_angles(d, base, s, exact):
    cache = {}

    def inv_for(n):  # frequencies for a sequence of length n
        if n not in cache:
            cache[n] = inv_freq("dynamic", d, base, s, seq_len=n)[0]
        return cache[n]

    if exact:  # every key re-rotated with the base of the current length p+1
        return lambda p, t: (p * inv_for(p + 1), t * inv_for(p + 1), 1.0)
    # HF: each token rotated once, with the base of its own length
    return lambda p, t: (p * inv_for(p + 1), t * inv_for(t + 1), 1.0)


def self_extend_angles(inv, G, W):
    def angles(p, t):
        if p - t < W:  # neighbours: normal positions
            return p * inv, t * inv, 1.0
        return (p // G + W - W // G) * inv, (t // G) * inv, 1.0  # grouped positions
    return angles


# --------------------------------------------------------------------------

CASES = {
    # name: (model overrides, run flags, angle function maker)
    "none": ({}, [], lambda d, b: static_angles(*inv_freq("none", d, b))),
    "linear4": ({}, ["--rope-scaling", "linear", "--rope-factor", "4"],
                lambda d, b: static_angles(*inv_freq("linear", d, b, 4))),
    "ntk5": ({}, ["--rope-scaling", "ntk", "--rope-factor", "5"],
             lambda d, b: static_angles(*inv_freq("ntk", d, b, 5))),
    "dynamic4-hf": ({}, ["--rope-scaling", "dynamic", "--rope-factor", "4"],
                    lambda d, b: dynamic_angles(d, b, 4, exact=False)),
    "dynamic4-exact": ({}, ["--rope-scaling", "dynamic", "--rope-factor", "4", "--rope-dynamic", "exact"],
                       lambda d, b: dynamic_angles(d, b, 4, exact=True)),
    "yarn4": ({}, ["--rope-scaling", "yarn", "--rope-factor", "4"],
              lambda d, b: static_angles(*inv_freq("yarn", d, b, 4))),
    "yarn4-betas-attn": ({}, ["--rope-scaling", "yarn", "--rope-factor", "4", "--yarn-beta-fast", "8",
                              "--yarn-beta-slow", "2", "--yarn-attn-factor", "1.3"],
                         lambda d, b: static_angles(*inv_freq("yarn", d, b, 4, beta_fast=8, beta_slow=2,
                                                              attn=1.3))),
    "llama3-4": ({}, ["--rope-scaling", "llama3", "--rope-factor", "4"],
                 lambda d, b: static_angles(*inv_freq("llama3", d, b, 4))),
    "llama3-neox-base": ({"rope_layout": "neox", "rope_theta": 500.0},
                         ["--rope-scaling", "llama3", "--rope-factor", "8", "--llama3-low-freq", "1.5",
                          "--llama3-high-freq", "3"],
                         lambda d, b: static_angles(*inv_freq("llama3", d, b, 8, low=1.5, high=3))),
    "yarn-partial-gqa": ({"rot_dim": 8, "n_kv_heads": 1}, ["--rope-scaling", "yarn", "--rope-factor", "3"],
                         lambda d, b: static_angles(*inv_freq("yarn", d, b, 3))),
    "self-extend-4-8": ({}, ["--self-extend", "4", "8"],
                        lambda d, b: self_extend_angles(inv_freq("none", d, b)[0], 4, 8)),
    "self-extend-3-5-gqa": ({"n_kv_heads": 2}, ["--self-extend", "3", "5"],
                            lambda d, b: self_extend_angles(inv_freq("none", d, b)[0], 3, 5)),
}


def one_window_text(path, ckpt, tok, n_tokens):
    """Write the longest prefix of TEXT that encodes to at most n_tokens
    (without BOS), so that run scores it in a single window; returns its ids."""
    lo, hi = 1, len(TEXT)
    while lo < hi:  # binary search on the prefix length
        mid = (lo + hi + 1) // 2
        if len(tokenize(ckpt, tok, TEXT[:mid])) - 1 <= n_tokens:
            lo = mid
        else:
            hi = mid - 1
    path.write_text(TEXT[:lo])
    return tokenize(ckpt, tok, TEXT[:lo])[1:]


@pytest.mark.parametrize("case", sorted(CASES))
def test_ppl_at_4x_training_length_matches_reference(case, tmp_path, syn_tokenizer):
    overrides, flags, make_angles = CASES[case]
    cfg_over = dict(dim=32, hidden_dim=48, n_layers=2, n_heads=4, n_kv_heads=4, seq_len=L)
    cfg_over.update(overrides)
    ckpt, cfg, tensors = make_model(tmp_path, seed=11, **cfg_over)
    ctx = 4 * L
    text = tmp_path / "text.txt"
    ids = one_window_text(text, ckpt, syn_tokenizer, ctx - 1)
    assert len(ids) >= ctx - 4, "the text must (nearly) fill a 4x window"
    got = run_ppl(ckpt, syn_tokenizer, text, ctx, extra=flags)
    assert got["windows"] == 1 and got["ctx"] == ctx and got["tokens"] == len(ids)

    d, base = cfg["rot_dim"], float(np.float32(cfg["rope_theta"]))
    nll = ScaledReference(cfg, tensors, make_angles(d, base)).nll([cfg["bos_id"]] + ids)
    assert abs(got["nll"] - nll.mean()) < TOL_MEAN, (got["nll"], nll.mean())
    for b in got["buckets"]:  # nll[j] scores the token at in-window position j+1
        seg = nll[max(b["start"], 1) - 1:b["end"] - 1]
        assert b["tokens"] == len(seg) and abs(b["nll"] - seg.mean()) < TOL_BUCKET, (b, seg.mean())

    # The method must matter at this length, or the comparison proves nothing.
    if case != "none":
        plain = ScaledReference(cfg, tensors, static_angles(*inv_freq("none", d, base))).nll(
            [cfg["bos_id"]] + ids)
        assert abs(plain.mean() - nll.mean()) > 10 * TOL_MEAN, f"{case} does not change the NLL"


def test_methods_are_identity_inside_training_length(tmp_path, syn_tokenizer):
    """Dynamic NTK (both variants) and Self-Extend with W >= ctx change nothing
    within the training length: ppl at ctx = L equals none's. Methods that run
    in blocks as none does must match bit for bit; the pre-RoPE cache (dynamic
    exact, Self-Extend) goes one token at a time through generation's one-row
    matmul kernel, which sums in another order: 1e-6 on NLLs of ~10 (float32
    rounding is ~1e-7 relative), far below what any real change moves."""
    ckpt, cfg, _ = make_model(tmp_path, seed=5, dim=32, hidden_dim=48, n_layers=2, n_heads=4,
                              n_kv_heads=2, seq_len=L)
    text_file = tmp_path / "text.txt"
    text_file.write_text(TEXT)
    base = run_ppl(ckpt, syn_tokenizer, text_file, L)
    for flags in (["--rope-scaling", "dynamic", "--rope-factor", "4"],
                  ["--rope-scaling", "dynamic", "--rope-factor", "4", "--rope-dynamic", "exact"],
                  ["--self-extend", "4", str(L)],
                  ["--rope-scaling", "yarn", "--rope-factor", "1"],
                  ["--rope-scaling", "llama3", "--rope-factor", "1"],
                  ["--rope-scaling", "linear", "--rope-factor", "1"]):
        got = run_ppl(ckpt, syn_tokenizer, text_file, L, extra=flags)
        if "exact" in flags or "--self-extend" in flags:
            assert abs(got["nll"] - base["nll"]) <= 1e-6, flags
            for a, b in zip(got["buckets"], base["buckets"]):
                assert a["tokens"] == b["tokens"] and abs(a["nll"] - b["nll"]) <= 1e-6, flags
        else:
            assert got["nll"] == base["nll"] and got["buckets"] == base["buckets"], flags


def test_exact_dynamic_equals_a_full_recompute(tmp_path, syn_tokenizer):
    """The exact variant scores token p as a fresh full forward of length p+1
    (one base for all its positions) scores its last token. The reference's
    exact angles are checked against such recomputes at a few p, and run
    against the reference."""
    ckpt, cfg, tensors = make_model(tmp_path, seed=2, dim=32, hidden_dim=48, n_layers=1, n_heads=2,
                                    n_kv_heads=2, seq_len=L)
    text_file = tmp_path / "text.txt"
    ids = one_window_text(text_file, ckpt, syn_tokenizer, 3 * L)
    d, base = cfg["rot_dim"], float(np.float32(cfg["rope_theta"]))
    seq = [cfg["bos_id"]] + ids
    exact = ScaledReference(cfg, tensors, dynamic_angles(d, base, 4, exact=True)).nll(seq)
    for p in (L + 3, 2 * L + 7, len(ids) - 1):  # fresh full forwards of length p+1 with one base
        inv = inv_freq("dynamic", d, base, 4, seq_len=p + 1)[0]
        fresh = ScaledReference(cfg, tensors, static_angles(inv, 1.0)).nll(seq[:p + 2])
        assert abs(fresh[p] - exact[p]) < 1e-9, p
    got = run_ppl(ckpt, syn_tokenizer, text_file, 3 * L + 1,
                  extra=["--rope-scaling", "dynamic", "--rope-factor", "4", "--rope-dynamic", "exact"])
    assert got["windows"] == 1 and abs(got["nll"] - exact.mean()) < TOL_MEAN


def test_stored_scaling_is_applied_and_flags_override(tmp_path, syn_tokenizer):
    """A checkpoint that stores yarn is run with yarn by default; flags win."""
    _, cfg, tensors = make_model(tmp_path, name="plain.bin", seed=4, dim=32, hidden_dim=48, n_layers=2,
                                 n_heads=4, n_kv_heads=4, seq_len=L)
    stored, _, _ = make_model(tmp_path, name="yarn.bin", tensors=tensors, dim=32, hidden_dim=48,
                              n_layers=2, n_heads=4, n_kv_heads=4, seq_len=L, rope_scaling="yarn",
                              rope_factor=4.0)
    plain = tmp_path / "plain.bin"
    text_file = tmp_path / "text.txt"
    text_file.write_text(TEXT)
    ctx = 4 * L
    a = run_ppl(stored, syn_tokenizer, text_file, ctx)
    b = run_ppl(plain, syn_tokenizer, text_file, ctx, extra=["--rope-scaling", "yarn", "--rope-factor", "4"])
    c = run_ppl(stored, syn_tokenizer, text_file, ctx, extra=["--rope-scaling", "none"])
    d = run_ppl(plain, syn_tokenizer, text_file, ctx)
    assert a["scaling"] == "yarn" and a["nll"] == b["nll"]
    assert c["nll"] == d["nll"] and c["nll"] != a["nll"]
