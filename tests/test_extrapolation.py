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
import re

import numpy as np
import pytest

from conftest import TEXT, make_model, run_ppl, tokenize
from reference.forward import _silu, _softmax, rmsnorm
from reference.forward import rotate_angles as rotate

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


def test_self_extend_over_several_blocks_matches_reference(tmp_path, syn_tokenizer):
    """Self-Extend goes in blocks of 128 tokens: a 280-token window (three
    blocks; key tiles wholly grouped, wholly not and across the line; W = 34
    puts key 95, the last of a 48-key tile, W - 1 before query 128, the
    first of the second block), f32 and f16 caches, against the float64
    reference, the TOL_MEAN of the cases above (f16: 2e-3, the rounding of
    keys and values to half)."""
    ckpt, cfg, tensors = make_model(tmp_path, seed=13, dim=32, hidden_dim=48, n_layers=2, n_heads=4, n_kv_heads=2,
                                    seq_len=L)
    ctx, flags = 280, ["--self-extend", "4", "34"]
    text = tmp_path / "text.txt"
    ids = one_window_text(text, ckpt, syn_tokenizer, ctx - 1)
    assert len(ids) >= ctx - 4
    d, base = cfg["rot_dim"], float(np.float32(cfg["rope_theta"]))
    nll = ScaledReference(cfg, tensors, self_extend_angles(inv_freq("none", d, base)[0], 4, 34)).nll(
        [cfg["bos_id"]] + ids)
    for kv, tol in (("f32", TOL_MEAN), ("f16", 2e-3)):
        got = run_ppl(ckpt, syn_tokenizer, text, ctx, extra=flags + ["--kv", kv])
        assert got["windows"] == 1 and got["tokens"] == len(ids)
        assert abs(got["nll"] - nll.mean()) < tol, (kv, got["nll"], nll.mean())


def test_methods_are_identity_inside_training_length(tmp_path, syn_tokenizer):
    """Dynamic NTK (both variants) and Self-Extend with W >= ctx change nothing
    within the training length: ppl at ctx = L equals none's, bit for bit.
    Every method runs in blocks as none does; Self-Extend and exact dynamic
    NTK (whose queries within L share one table) rotate raw keys with the same
    float operations as none rotates them on their way into the cache."""
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


# --------------------------------------------------------------------------
# tools/extrapolation.py, the study: its plan, commands, statistics and
# writers, on small synthetic results (no model runs; a few seconds).

import json as _json
import sys as _sys
from pathlib import Path as _Path

_sys.path.insert(0, str(_Path(__file__).resolve().parent.parent / "tools"))
import extrapolation as ex  # noqa: E402
# The module of Where and passkey_by_trials, and of the ROOT and run_json they read:
# a test that replaces one of those replaces it there (ex.ROOT and ex.run_json are
# the front's own names for them, which those functions never read).
from extrapolation_study import commands as ex_commands  # noqa: E402


def _study(kind="ppl", name="bundled", L=256, factors=(1, 4), rows=ex.ROWS, **kw):
    """A Study whose files sit where the real ones do (nothing is run)."""
    ckpt = ex.ROOT / "models" / ("retrieval/model.bin" if kind == "passkey" else "model.bin")
    if kind == "ppl":
        kw.setdefault("text", _Path("/nonexistent-work/books.txt"))
        kw.setdefault("text_recipe", ["head -c 100 heldout.txt > books.txt"])
    else:
        kw.setdefault("filler", _Path("/nonexistent-work/heldout.txt"))
        kw.setdefault("depths", (0, 0.5, 1))
        kw.setdefault("trials", 2)
    return ex.Study(name, kind, kw.pop("ckpt", ckpt), kw.pop("tok", None), L, factors, rows, **kw)


def test_method_flags_at_each_factor():
    assert ex.method_flags("yarn", 4, 256) == ["--rope-scaling", "yarn", "--rope-factor", "4"]
    assert ex.method_flags("ntk", 2, 8192) == ["--rope-scaling", "ntk", "--rope-factor", "4"]
    assert ex.method_flags("ntk", 0.5, 8192) == [] and ex.method_flags("yarn", 1, 256) == []
    assert ex.method_flags("sinks", 16, 256) == ["--sinks", "4"]
    # Self-Extend: G = 2k when W = L/2 divides evenly; at 2 x 8192, G = 3 reaches 16383 < 16384
    assert ex.method_flags("self-extend", 16, 256) == ["--self-extend", "32", "128"]
    assert ex.self_extend_reach(3, 8192, 4096) == 16383
    assert ex.method_flags("self-extend", 2, 8192) == ["--self-extend", "4", "4096"]
    assert ex.method_flags("self-extend", 0.25, 8192) == ["--self-extend", "1", "4096"]
    assert [ex.factor_label(k) for k in (0.25, 0.5, 1, 16)] == ["1/4x", "1/2x", "1x", "16x"]
    with pytest.raises(ValueError):
        ex.method_flags("rope-magic", 2, 256)


def test_commands_are_exact_and_carry_no_machine_paths():
    where = ex.Where("/nonexistent-work")
    jobs = {(j["method"], j["k"]): j["shown"] for j in ex.ppl_jobs(_study(), where)}
    assert len(jobs) == len(ex.ROWS) * 2
    assert jobs[("yarn", 4)] == ("./run models/model.bin -m ppl -f books.txt --ctx 1024 --json --per-position "
                                 "--rope-scaling yarn --rope-factor 4")
    assert jobs[("none", 1)] == "./run models/model.bin -m ppl -f books.txt --ctx 256 --json --per-position"
    assert jobs[("sinks", 4)] == (".venv/bin/python tools/extrapolation.py --stream-cell models/model.bin books.txt "
                                  "--window 1024 --ctx 256")
    stories = _study(name="stories260K", L=512, ckpt=ex.SHARED / "models" / "stories260K.bin",
                     tok=ex.SHARED / "models" / "tok512.bin", text=_Path("/nonexistent-work/stories.txt"))
    shown = {(j["method"], j["k"]): j["shown"] for j in ex.ppl_jobs(stories, where)}
    assert shown[("none", 4)] == ("./run ../shared/models/stories260K.bin -z ../shared/models/tok512.bin -m ppl "
                                  "-f stories.txt --ctx 2048 --json --per-position")
    assert shown[("sinks", 1)].endswith("--window 512 --ctx 512 -z ../shared/models/tok512.bin")
    pk = {(j["method"], j["k"]): j["shown"] for j in ex.passkey_jobs(_study("passkey", "retrieval"), where)}
    assert pk[("llama3", 4)] == ("./run models/retrieval/model.bin -m passkey -f heldout.txt --ctx 1024 --lengths 1015 "
                                 "--depths 0,0.5,1 --trials 2 --json --rope-scaling llama3 --rope-factor 4")
    assert pk[("sinks", 4)] == ("./run models/retrieval/model.bin -m passkey -f heldout.txt --ctx 256 --lengths 1015 "
                                "--depths 0,0.5,1 --trials 2 --json --sinks 4")
    for cmd in list(jobs.values()) + list(shown.values()) + list(pk.values()):
        assert "nonexistent-work" not in cmd and "/work" not in cmd and "/tmp" not in cmd, cmd


def test_smollm2_runs_none_alone_up_to_its_training_context():
    cfg = ex.FULL["smollm2"]
    s = _study(name="smollm2", L=8192, factors=cfg["factors"], rows=cfg["rows"])
    jobs = ex.ppl_jobs(s, ex.Where())
    ran = sorted((j["method"], j["k"]) for j in jobs)
    assert ran == sorted([("none", k) for k in ex.SMOL_FACTORS] + [(m, k) for m in ex.ROWS if m != "none"
                                                                    for k in (2, 4)])
    assert cfg["tokens"] >= 3 * 4 * 8192  # at least 3 windows at 4x
    fake = [dict(model="smollm2", method=j["method"], k=j["k"], ppl=10.0 + j["k"]) for j in jobs]
    filled = ex.fill_same_as_none(fake, [s])
    assert len(filled) == len(ex.ROWS) * len(ex.SMOL_FACTORS)
    copy = [r for r in filled if r["method"] == "yarn" and r["k"] == 0.5][0]
    assert copy["same_as"] == "none" and copy["ppl"] == 10.5
    assert not any(r.get("same_as") for r in filled if r["k"] == 2)


def test_quick_subset_is_small_and_covers_every_kind_of_cell():
    def count(config, L=256):
        n = 0
        for name, cfg in config.items():
            s = _study(cfg["kind"], name, 8192 if name.startswith("smollm2") else L, cfg["factors"], cfg["rows"],
                       **({"depths": cfg["depths"], "trials": cfg["trials"]} if cfg["kind"] == "passkey" else {}))
            jobs = ex.ppl_jobs(s, ex.Where()) if cfg["kind"] == "ppl" else ex.passkey_jobs(s, ex.Where())
            n += sum(j["cost"] for j in jobs)
        return n
    assert set(ex.QUICK["bundled"]["rows"]) == set(ex.ROWS) and set(ex.QUICK["retrieval"]["rows"]) == set(ex.ROWS)
    assert any(k > 1 for k in ex.QUICK["bundled"]["factors"]) and 1 in ex.QUICK["bundled"]["factors"]
    assert set(ex.QUICK) <= set(ex.FULL)
    assert count(ex.QUICK) * 20 < count(ex.FULL)  # the quick plan's estimated work is under 5% of the study's


def _segment_parts(token_nlls, round6=True):
    """What run -m ppl --json reports for each segment (6 significant digits)."""
    parts = []
    for seg in token_nlls:
        a = np.asarray(seg, dtype=np.float64)
        se = a.std(ddof=1) / math.sqrt(len(a))
        r6 = (lambda v: float(f"{v:.6g}")) if round6 else (lambda v: v)
        parts.append(dict(tokens=len(a), nll=r6(a.mean()), nll_se=r6(se), ctx=8, sinks=4,
                          per_position=[None] + [float(x) for x in a]))
    return parts


def test_combined_segments_equal_one_run_over_all_tokens():
    rng = np.random.default_rng(3)
    segs = [rng.gamma(2.0, 2.0, n) for n in (40, 40, 17)]
    got = ex.combine_scores(_segment_parts(segs))
    allv = np.concatenate(segs)
    n = len(allv)
    assert got["tokens"] == n and got["windows"] == 3 and got["streaming"] is True
    assert abs(got["nll"] - allv.mean()) < 1e-5
    assert abs(got["nll_se"] - allv.std(ddof=1) / math.sqrt(n)) < 1e-5
    m = allv.mean()
    se_w = math.sqrt(3 / 2 * sum((s.sum() - m * len(s)) ** 2 for s in segs)) / n  # run's nll_se_windows
    assert abs(got["nll_se_windows"] - se_w) < 1e-5
    assert abs(got["ppl_lo"] - math.exp(m - 1.96 * got["nll_se"])) < 1e-6 * got["ppl"]
    # position 10: the mean of the three segments' tokens there; position 30: the two long ones only
    assert abs(got["per_position"][10] - np.mean([s[9] for s in segs])) < 1e-9
    assert abs(got["per_position"][30] - np.mean([segs[0][29], segs[1][29]])) < 1e-9
    assert got["per_position"][0] is None and got["ctx"] == 8


def _words(text):  # a fake tokenizer: every word is two tokens
    return 2 * len(text.split())


def test_segments_are_the_longest_pieces_cut_at_white_space():
    text = " ".join(f"w{i}" for i in range(101)) + "\n\nend  of\ttext"
    segs = ex.split_segments(text, 20, _words)
    assert all(_words(s) <= 20 for s in segs) and all(s == s.strip() for s in segs)
    assert all(_words(s) == 20 for s in segs[:-1])  # each as long as fits (10 words)
    assert " ".join(segs).split() == text.split()
    with pytest.raises(ValueError):
        ex.split_segments("short averyveryverylongword", 1, lambda t: len(t))


def test_prefix_bytes_is_what_head_c_cuts():
    text = "Café déjà vu. " * 300
    prefix, nbytes = ex.prefix_bytes(text, 50, _words)
    assert _words(prefix) <= 50 and _words(text[:len(prefix) + 8]) > 50
    assert text.encode("utf-8")[:nbytes].decode("utf-8") == prefix and nbytes > len(prefix)


def test_wilson_interval():
    assert ex.wilson(0, 10) == (0.0, pytest.approx(0.2775, abs=1e-4))
    lo, hi = ex.wilson(5, 10)
    assert lo == pytest.approx(0.2366, abs=1e-4) and hi == pytest.approx(0.7634, abs=1e-4)
    assert ex.wilson(10, 10)[1] == 1.0 and ex.wilson(10, 10)[0] == pytest.approx(0.7225, abs=1e-4)
    assert ex.passkey_cell(7, 10) == "7/10" and ex.passkey_cell(7, 10, interval=True) == "7/10 [40%, 89%]"


def test_log_bins():
    values = [None, 1.0, 2.0, 3.0, 5.0, 7.0, None, 9.0, 11.0]
    bins = ex.log_bins(values, per_octave=1)  # [1], [2, 3], [4..7], [8]
    assert bins == [(1, 1, [1.0]), (2, 3, [2.0, 3.0]), (4, 7, [5.0, 7.0, 9.0]), (8, 8, [11.0])]
    pb = ex.position_bins(values, per_octave=1)
    assert [(b["first"], b["last"], b["n"], b["mean"]) for b in pb] == \
        [(1, 1, 1, 1.0), (2, 3, 2, 2.5), (4, 7, 3, 7.0), (8, 8, 1, 11.0)]
    assert pb[0]["lo"] is None and pb[0]["hi"] is None
    assert 5.0 <= pb[2]["lo"] < 7.0 < pb[2]["hi"] <= 9.0


def test_position_band_never_below_zero_and_follows_the_skew():
    """One window's per-position NLLs: mostly near 0, a few tokens far above
    (one token's NLL). In a bin of 8 such values mean - 1.96 se is below 0;
    the bootstrap band is not: it lies within the values, contains the mean,
    reaches further above the mean than below, and is the same on every call."""
    bin_values = [0.01, 0.02, 0.05, 0.03, 0.01, 0.04, 9.0, 0.02]  # positions 8..15: one bin at 1 per octave
    values = [None] * 8 + bin_values
    m = sum(bin_values) / 8
    se = math.sqrt(sum((v - m) ** 2 for v in bin_values) / 7 / 8)
    assert m - ex.Z95 * se < 0  # the symmetric band would go below 0 nats
    (b,) = [b for b in ex.position_bins(values, per_octave=1) if b["first"] == 8]
    assert b["n"] == 8 and b["mean"] == pytest.approx(m)
    assert 0 < min(bin_values) <= b["lo"] < b["mean"] < b["hi"] <= max(bin_values)
    assert b["hi"] - b["mean"] > b["mean"] - b["lo"]
    assert ex.position_bins(values, per_octave=1) == ex.position_bins(values, per_octave=1)
    # and on many random long-tailed bins
    rng = np.random.default_rng(1)
    for _ in range(20):
        scale = 10.0 if rng.random() < 0.5 else 1.0
        v = list(rng.exponential(0.3, size=int(rng.integers(2, 40))) * scale)
        for b in ex.position_bins([None] + v):
            assert b["lo"] is None or 0 <= b["lo"] <= b["mean"] <= b["hi"]


def test_log_axes_are_labelled_with_plain_numbers(tmp_path):
    """Every log axis of the plots: tick labels are plain numbers (256, 90),
    never 2^8 or 9x10^1, on the major ticks; none on the minor ones."""
    assert ex.nice_log_ticks(78, 190) == [80, 90, 100, 120, 150]
    assert ex.nice_log_ticks(3.5, 260) == [5, 10, 20, 50, 100, 200]
    assert ex.nice_log_ticks(33, 105) == [40, 50, 60, 70, 80, 90, 100]
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    s = _study(factors=(1, 2, 4, 16), rows=("none", "yarn"))
    ppl = [_ppl_row("bundled", m, k, 256, 85.0 * k ** 0.2 + (m == "none") * 10, 3,
                    per_position=[None] + [3.0 + (p % 7) / 7 for p in range(1, 4096)])
           for m in ("none", "yarn") for k in (1, 2, 4, 16)]
    ex.add_position_bins(ppl, [s])
    seen = []
    real_savefig = plt.Figure.savefig

    def savefig(fig, *a, **kw):
        fig.canvas.draw()
        for ax in fig.axes:
            for axis in (ax.xaxis, ax.yaxis):
                if axis.get_scale() == "log":
                    labels = [t.get_text() for t in axis.get_majorticklabels() if t.get_text()]
                    minor = [t.get_text() for t in axis.get_minorticklabels() if t.get_text()]
                    seen.append((labels, minor))
        return real_savefig(fig, *a, **kw)
    plt.Figure.savefig = savefig
    try:
        assert ex.plot_ppl(ppl, [s], tmp_path) == ["ppl_vs_ctx.png", "nll_vs_position.png"]
    finally:
        plt.Figure.savefig = real_savefig
    assert len(seen) == 3, seen  # ppl_vs_ctx: x and y; nll_vs_position: x
    for labels, minor in seen:
        assert labels and not minor, (labels, minor)
        for t in labels:
            assert re.fullmatch(r"[0-9]+(\.[0-9]+)?", t), labels
    assert ["256", "512", "1024", "4096"] in [labels for labels, _ in seen]
    assert ["1", "4", "16", "64", "256", "1024", "4096"] in [labels for labels, _ in seen]


def test_replot_draws_the_plots_again_from_results_json(tmp_path):
    """--replot redraws every plot from results.json alone, the same bytes as
    the study drew; results.json without position bins (made before they were
    saved) leaves nll_vs_position.png as it is and says so."""
    ppl_s = _study(factors=(1, 4), rows=("none", "sinks"))
    pk_s = _study("passkey", "retrieval", factors=(1, 4), rows=("none", "sinks"), depths=(0, 1), trials=2)
    ppl = [_ppl_row("bundled", m, k, 256, 80.0 + k, 3, per_position=[None] + [1.0 + (p % 5) for p in range(1, 1024)])
           for m in ("none", "sinks") for k in (1, 4)]
    passkey = [dict(model="retrieval", method=m, k=k, ctx=256 * k, length=256 * k - 9, command="cmd",
                    train_ctx=256, cells=[dict(depth=d, correct=1, trials=2, runs=[]) for d in (0, 1)])
               for m in ("none", "sinks") for k in (1, 4)]
    meta = dict(command="extrapolation.py", wall_s=90.0, jobs=2, cpus=2, run_seconds={}, load_before=0.5, cpu_s=170)
    ex.write_outputs(ppl, passkey, [ppl_s, pk_s], tmp_path, meta)
    saved = _json.loads((tmp_path / "results.json").read_text())
    assert [bool(r.get("position_bins")) for r in saved["ppl"]] == [r["k"] == 4 for r in saved["ppl"]]
    pngs = ["ppl_vs_ctx.png", "nll_vs_position.png", "passkey_retrieval.png"]
    drawn = {n: (tmp_path / n).read_bytes() for n in pngs}
    for n in pngs:
        (tmp_path / n).unlink()
    files, messages = ex.replot(tmp_path)
    assert sorted(files) == sorted(pngs) and messages == []
    assert {n: (tmp_path / n).read_bytes() for n in pngs} == drawn
    for r in saved["ppl"]:
        r.pop("position_bins", None)
    (tmp_path / "results.json").write_text(_json.dumps(saved))
    (tmp_path / "nll_vs_position.png").write_bytes(b"old")
    files, messages = ex.replot(tmp_path)
    assert "nll_vs_position.png" not in files and "ppl_vs_ctx.png" in files
    assert len(messages) == 1 and "no position bins" in messages[0]
    assert (tmp_path / "nll_vs_position.png").read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == []  # no temporary folder left


def _ppl_row(model, method, k, L, ppl, windows, tokens=1000, se_w=0.05, **kw):
    nll = math.log(ppl)
    r = dict(model=model, method=method, k=k, ctx=round(k * L), train_ctx=L, flags="", tokens=tokens,
             windows=windows, nll=nll, ppl=ppl, nll_se=0.01, nll_se_windows=se_w if windows > 1 else None,
             ppl_lo=math.exp(nll - 0.0196), ppl_hi=math.exp(nll + 0.0196),
             command=f"./run m -m ppl --ctx {round(k * L)} # {method}", per_position=[None, 5.0, 4.0, 3.0])
    r.update(kw)
    return r


def test_ppl_table_shows_intervals_windows_and_commands():
    s = _study(name="smollm2", L=8192, factors=(0.25, 2), rows=("none", "yarn", "sinks"),
               text_recipe=["make the text"], data="books")
    rows = [_ppl_row("smollm2", "none", 0.25, 8192, 21.3, 8), _ppl_row("smollm2", "none", 2, 8192, 25.0, 1),
            _ppl_row("smollm2", "yarn", 2, 8192, 19.04, 1),
            _ppl_row("smollm2", "sinks", 2, 8192, 150.5, 1, streaming=True, segment_command="./run seg")]
    rows = ex.fill_same_as_none(rows, [s])
    text = "\n".join(ex.ppl_table(s, rows))
    assert "| method | 1/4x (2048) | 2x (16384) |" in text
    assert "| none | 21.30 [20.89, 21.72] | 25.00 [24.51, 25.49] |" in text
    assert "| yarn | = none | 19.04 [18.67, 19.42] |" in text and "| sinks (4) | = none | 150.5 [" in text
    assert "| windows per cell | 8 | 1 |" in text and "n/a (1 window)" in text and "±0.098" in text
    assert "The 2x column rests on fewer than 4 windows" in text
    cmds = text.split("```")[1].splitlines()
    assert cmds[1] == "make the text"
    assert cmds.count("./run m -m ppl --ctx 16384 # yarn") == 1 and "# yarn, 1/4x" not in text
    assert "# ./run seg" in text


def test_passkey_table_counts_and_intervals():
    s = _study("passkey", "retrieval", factors=(1, 2), rows=("none", "sinks"), depths=(0, 1), trials=5)

    def res(method, k, correct):
        return dict(model="retrieval", method=method, k=k, ctx=256 * k, length=256 * k - 9, command=f"cmd {method} {k}",
                    cells=[dict(depth=d, correct=c, trials=5) for d, c in zip((0, 1), correct)])
    rows = [res("none", 1, (5, 4)), res("none", 2, (0, 1)), res("sinks", 1, (5, 5)), res("sinks", 2, (0, 5))]
    text = "\n".join(ex.passkey_table(s, rows))
    assert "| method | 1x (247) | 2x (503) |" in text
    assert "| none | 9/10 [60%, 98%] | 1/10 [2%, 40%] |" in text
    assert "| sinks | 1 | 5/5 | 5/5 |" in text and "| sinks | 0 | 5/5 | 0/5 |" in text
    assert "cmd sinks 2" in text and "5 trials per (length, depth)" in text


def test_write_outputs_makes_every_file_without_machine_paths(tmp_path):
    ppl_s = _study(factors=(1, 4), rows=("none", "sinks"))
    pk_s = _study("passkey", "retrieval", factors=(1, 4), rows=("none", "sinks"), depths=(0, 1), trials=2)
    ppl = [_ppl_row("bundled", m, k, 256, 80.0 + k, 9 if k == 1 else 3) for m in ("none", "sinks") for k in (1, 4)]
    passkey = [dict(model="retrieval", method=m, k=k, ctx=256 * k, length=256 * k - 9, command="cmd",
                    cells=[dict(depth=d, correct=1, trials=2, runs=[]) for d in (0, 1)])
               for m in ("none", "sinks") for k in (1, 4)]
    meta = dict(command="extrapolation.py", wall_s=90.0, jobs=2, cpus=2, run_seconds={}, load_before=0.5, cpu_s=170)
    files = ex.write_outputs(ppl, passkey, [ppl_s, pk_s], tmp_path, meta)
    for name in ("results.json", "results.csv", "passkey.csv", "table.md", "ppl_vs_ctx.png", "nll_vs_position.png",
                 "passkey_retrieval.png"):
        assert name in files and (tmp_path / name).stat().st_size > 100, name
    saved = _json.loads((tmp_path / "results.json").read_text())
    assert "per_position" not in saved["ppl"][0] and len(saved["passkey"]) == 4
    assert "1.5 minutes" in (tmp_path / "table.md").read_text()
    for name in ("results.json", "results.csv", "passkey.csv", "table.md"):
        body = (tmp_path / name).read_text()
        assert "/tmp" not in body and "/work" not in body and str(tmp_path) not in body, name


@pytest.mark.parametrize("argv, message", [
    (["--studies", "bundled,nope"], "unknown study nope"),
    (["--stream-cell", "a.bin", "b.txt"], "--stream-cell needs --window E and --ctx L"),
    (["--stream-cell", "no-such.bin", "b.txt", "--window", "8", "--ctx", "4"], "no-such.bin: no such file"),
])
def test_bad_arguments_exit_with_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        ex.main(argv)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_smollm2_passkey_plan_runs_every_method_at_2x():
    """Every method's 2x passkey cell is in the plan (5 keys per depth; at k <= 1
    only none runs), nothing is left out; a cell not collected yet shows as
    missing, with its command."""
    cfg = ex.FULL["smollm2-passkey"]
    s = _study("passkey", "smollm2-passkey", 8192, cfg["factors"], cfg["rows"], depths=cfg["depths"],
               trials=cfg["trials"], at=cfg["at"], note=cfg["note"],
               ckpt=ex.SMOLLM2)
    ran = {(j["method"], j["k"]): j for j in ex.passkey_jobs(s, ex.Where())}
    assert set(ran) == {("none", k) for k in ex.SMOL_PASSKEY_FACTORS} | {(m, 2) for m in ex.ROWS}
    assert ran[("none", 2)]["shown"].endswith("--ctx 16384 --lengths 16375 --depths 0,0.5,1 --trials 5 --json")
    assert "--depths 0,0.5,1 --trials 10 --json" in ran[("none", 0.5)]["shown"]
    assert ran[("sinks", 2)]["shown"].endswith("--ctx 8192 --lengths 16375 --depths 0,0.5,1 --trials 5 --json "
                                               "--sinks 4")
    gone = {("sinks", 2), ("ntk", 2)}  # not collected yet
    results = [dict(model=s.name, method=m, k=k, cells=[dict(depth=d, correct=0, trials=s.trials_at(k))
                                                        for d in s.depths_at(k)], command=j["shown"])
               for (m, k), j in ran.items() if (m, k) not in gone]
    results += [dict(model=s.name, method=m, k=k, cells=[], missing=True, command=ran[(m, k)]["shown"])
                for m, k in gone]
    text = "\n".join(ex.passkey_table(s, ex.fill_same_as_none(results, [s])))
    assert text.startswith("### smollm2: passkey accuracy")
    assert "| ntk | = none | = none | = none | missing |" in text
    assert "| yarn | = none | = none | = none | 0/15 [0%, 20%] |" in text
    assert "| llama3 | = none | = none | = none | 0/15 [0%, 20%] |" in text
    assert "| none | 0.5 | 0/10 | 0/10 | 0/10 | 0/5 |" in text
    assert "prompts of k L - 9 tokens, plain text" in text
    assert "at 2x 5 trials (a 16k-token prompt costs" in text and "methods " not in text
    assert "# sinks, 2x: missing\n" + ran[("sinks", 2)]["shown"] in text
    assert "not run" not in text


def test_chat_form_passkey_cells():
    """smollm2-chat: the same cells as smollm2-passkey, each prompt in the chat template
    (--chat) and 21 tokens short of k L (room for a reply that restates the question)."""
    cfg = ex.FULL["smollm2-chat"]
    s = _study("passkey", "smollm2-chat", 8192, cfg["factors"], cfg["rows"], depths=cfg["depths"],
               trials=cfg["trials"], at=cfg["at"], ckpt=ex.SMOLLM2,
               chat=cfg["chat"])
    ran = {(j["method"], j["k"]): j for j in ex.passkey_jobs(s, ex.Where())}
    assert set(ran) == {("none", k) for k in ex.SMOL_PASSKEY_FACTORS} | {(m, 2) for m in ex.ROWS}
    assert ran[("none", 1)]["shown"].endswith("--ctx 8192 --lengths 8171 --depths 0,0.5,1 --trials 10 --json --chat")
    assert ran[("yarn", 2)]["shown"].endswith("--lengths 16363 --depths 0,0.5,1 --trials 5 --json --chat "
                                              "--rope-scaling yarn --rope-factor 2")
    results = [dict(model=s.name, method=m, k=k, cells=[dict(depth=d, correct=1, trials=s.trials_at(k))
                                                        for d in s.depths_at(k)], command=j["shown"])
               for (m, k), j in ran.items()]
    text = "\n".join(ex.passkey_table(s, ex.fill_same_as_none(results, [s])))
    assert text.startswith("### smollm2-chat: passkey accuracy")
    assert "prompts of k L - 21 tokens in the chat template (--chat)" in text
    assert "| none | 2043 | 4075 | 8171 | 16363 |" not in text and "(2027)" in text  # 1/4x: 2048 - 21


# --------------------------------------------------------------------------
# The study fanned out: --list's commands, the cell files, --collect. Cells
# are run by fake runners (no model) except in the last test.

import shlex as _shlex
import shutil as _shutil
import subprocess as _subprocess


def _plan_studies():
    """Studies shaped like the full plan's: every method, a sinks row, SmolLM2's
    '= none' cells, a passkey study with its factors' own depths."""
    smol = ex.FULL["smollm2-passkey"]
    return [_study(factors=(1, 4)), _study("passkey", "retrieval", factors=(1, 4), depths=(0, 1), trials=2),
            _study("passkey", "smollm2-passkey", 8192, smol["factors"], smol["rows"], depths=smol["depths"],
                   trials=smol["trials"], at=smol["at"], ckpt=ex.SMOLLM2)]


def _fake_run(job):
    """What run would print for the job, made up but fixed by the cell's name."""
    seed = sum(map(ord, job["name"]))
    if job["study"].kind == "ppl":
        nll = 3 + seed % 100 / 100
        return dict(tokens=1000, windows=4, nll=nll, ppl=math.exp(nll), nll_se=0.01, nll_se_windows=0.03,
                    ppl_lo=math.exp(nll - 0.0196), ppl_hi=math.exp(nll + 0.0196), ctx=job["ctx"],
                    per_position=[None] + [nll + (i % 7) / 10 for i in range(1, job["ctx"])])
    s, k = job["study"], job["k"]
    return dict(cells=[dict(length=job["length"], depth=d, correct=(seed + i) % 2,
                            trials=[dict(key="12345", answer="12345", correct=True)] * s.trials_at(k))
                       for i, d in enumerate(s.depths_at(k))])


def _fake_jobs(studies):
    jobs = ex.all_jobs(studies, ex.Where("/nonexistent-work"))
    for j in jobs:
        j["run"] = lambda threads, parts, j=j: _fake_run(j)
    return jobs


_PLAN = ex.make_plan(studies=["bundled", "retrieval", "smollm2-passkey"])


def test_list_commands_are_well_formed_and_unique_per_cell():
    jobs = _fake_jobs(_plan_studies())
    cmds = [ex.cell_command(_PLAN, j["name"], 2, _Path("results")) for j in jobs]
    assert len(set(cmds)) == len(cmds) == len({j["name"] for j in jobs}) == 18 + 18 + 12
    for j, cmd in zip(jobs, cmds):
        argv = _shlex.split(cmd)
        assert argv[:2] == [".venv/bin/python", "tools/extrapolation.py"], cmd
        args = ex.build_parser().parse_args(argv[2:])  # the tool's own options, nothing else
        assert args.cell == j["name"] and args.threads == 2 and args.results == _Path("results")
        assert ex.plan_from_args(args) == _PLAN
        assert ex.parse_cell_name(args.cell) == (j["study"].name, j["method"], j["k"])
        assert "/work" not in cmd and "/tmp" not in cmd and "nonexistent" not in cmd
    # the cells that are none's run (k <= 1) are not cells of their own
    names = {j["name"] for j in jobs}
    assert "smollm2-passkey_none_0.25x" in names and "smollm2-passkey_yarn_2x" in names
    assert "smollm2-passkey_sinks_2x" in names and "smollm2-passkey_yarn_0.5x" not in names
    assert ex.make_plan(studies=list(ex.FULL)) == ex.make_plan()  # one plan, however it is typed
    for bad in ("bundled_yarn", "bundled_yarn_4", "bundled_yarn_fourx", "bundled_yarn_4x_b"):
        with pytest.raises(ValueError):
            ex.parse_cell_name(bad)


def _run_all(tmp_path, capsys):
    """Every cell of the plan run (fake runs) into one folder, 2 at a time."""
    folder = tmp_path / "all"
    ex.run_cells(_fake_jobs(_plan_studies()), _PLAN, folder, 2, 1)
    return folder


def _outputs(folder_list, out, plots=False):
    """What --collect writes from the folders, table.md without its opening
    sentence; with plots, by --collect itself, else without the plots (the
    same functions, quicker)."""
    if plots:
        ex.main(["--collect"] + [str(f) for f in folder_list] + ["--out", str(out)])
        for name in ("ppl_vs_ctx.png", "nll_vs_position.png", "passkey_retrieval.png"):
            assert (out / name).stat().st_size > 1000, name
    else:
        cells, _ = ex.read_cells(folder_list)
        ppl, passkey, studies, meta = ex.collect(cells, dict(command="collect", collected_files=len(cells),
                                                             collected_folders=len(folder_list)))
        ex.add_position_bins(ppl, studies)  # as write_outputs does, for results.json
        out.mkdir()
        lines = ["# Extrapolation study: tables", "", ex.made_by(meta), ""] + ex.PREAMBLE
        for s in studies:
            lines += ex.ppl_table(s, ppl) if s.kind == "ppl" else ex.passkey_table(s, passkey)
        (out / "table.md").write_text("\n".join(lines + ex.absent_studies(meta) + ex.cost_table(meta)))
        ex.write_csvs(ppl, passkey, out)
        (out / "results.json").write_text(_json.dumps(dict(meta=meta, ppl=ppl, passkey=passkey)))
    table = (out / "table.md").read_text().splitlines()
    saved = _json.loads((out / "results.json").read_text())
    ppl_rows = [{k: v for k, v in r.items() if k != "per_position"} for r in saved["ppl"]]
    return dict(table=[table[0]] + table[3:], csv=(out / "results.csv").read_text(),
                passkey=(out / "passkey.csv").read_text(), ppl_rows=ppl_rows, pk_rows=saved["passkey"],
                meta=saved["meta"])


def test_run_cells_writes_a_file_per_cell_and_prints_progress(tmp_path, capsys):
    folder = _run_all(tmp_path, capsys)
    progress = capsys.readouterr().err.splitlines()
    assert len(progress) == 48 and progress[-1].startswith("[48/48]")
    assert all("elapsed, about" in line and "left" in line for line in progress)
    files = sorted(folder.iterdir())
    assert len(files) == 48 and all(f.suffix == ".json" for f in files)  # no temporary file left
    rec = _json.loads((folder / "bundled_yarn_4x.json").read_text())
    assert rec["cell"] == "bundled_yarn_4x" and rec["plan"] == _PLAN and rec["threads"] == 1
    assert rec["wall_s"] >= 0 and rec["study"]["L"] == 256 and rec["study"]["ckpt"] == "models/model.bin"
    assert rec["result"]["command"].endswith("--ctx 1024 --json --per-position --rope-scaling yarn --rope-factor 4")
    # a cell that fails leaves no file
    job = _fake_jobs(_plan_studies())[0]

    def fail(threads, parts):
        raise RuntimeError("./run: exit 1: boom")
    job["run"] = fail
    with pytest.raises(RuntimeError):
        ex.run_cell(job, _PLAN, 1, tmp_path / "failed")
    failed = tmp_path / "failed"
    assert not failed.exists() or not any(failed.iterdir())


def test_collect_from_two_folders_equals_one_folder(tmp_path, capsys):
    folder = _run_all(tmp_path, capsys)
    a, b = tmp_path / "machine-a", tmp_path / "machine-b"
    a.mkdir()
    b.mkdir()
    for i, f in enumerate(sorted(folder.iterdir())):
        _shutil.copy(f, (a if i % 3 else b) / f.name)
    one = _outputs([folder], tmp_path / "one", plots=True)
    two = _outputs([a, b], tmp_path / "two")
    swapped = _outputs([b, a], tmp_path / "swapped")
    for got in (two, swapped):
        for key in ("table", "csv", "passkey", "ppl_rows", "pk_rows"):
            assert got[key] == one[key], key
        assert got["meta"]["cost"] == one["meta"]["cost"] and got["meta"]["missing"] == []
    assert two["meta"]["collected_files"] == 48 and two["meta"]["collected_folders"] == 2
    text = "\n".join(one["table"])
    assert "missing" not in text.replace("| missing |", "")  # the cost table's column, nothing else
    assert "| smollm2-passkey | 2x | 9 | 0 |" in text and "not run" not in text  # every method at 2x
    assert "| yarn | = none | = none | = none |" in text


def test_a_missing_cell_shows_as_missing(tmp_path, capsys):
    folder = _run_all(tmp_path, capsys)
    (folder / "bundled_yarn_4x.json").unlink()
    (folder / "retrieval_sinks_1x.json").unlink()
    (folder / "smollm2-passkey_none_0.5x.json").unlink()  # also none's run for the other methods at 1/2x
    got = _outputs([folder], tmp_path / "out")
    text = "\n".join(got["table"])
    yarn = [line for line in got["table"] if line.startswith("| yarn |")][0]  # bundled's table comes first
    assert [c.strip() for c in yarn.strip("|").split("|")][1:] == ["%s [%s, %s]" % tuple(
        ex.fmt(math.exp(3 + sum(map(ord, "bundled_yarn_1x")) % 100 / 100 + d)) for d in (0, -0.0196, 0.0196)),
        "missing"]
    assert "| sinks | missing | " in text and "| sinks | 0 | missing | " in text
    smol = text.split("### smollm2")[1].splitlines()
    for m in ("none", "ntk"):  # ntk at 1/2x is none's run: missing with it
        line = [x for x in smol if x.startswith(f"| {m} | ")][0]
        assert [c.strip() for c in line.strip("|").split("|")][2] == "missing", line
    assert "# yarn, 4x: missing\n./run models/model.bin -m ppl -f books.txt --ctx 1024" in text
    assert "\"missing\": no file of this cell" in text and "without the 3 missing cells" in text
    assert sorted(got["meta"]["missing"]) == ["bundled_yarn_4x", "retrieval_sinks_1x", "smollm2-passkey_none_0.5x"]
    assert [r for r in got["ppl_rows"] if r["method"] == "yarn" and r["k"] == 4][0]["missing"] is True
    assert [line.split(",")[2] for line in got["csv"].splitlines() if line.startswith("bundled,yarn,")] == ["1"]
    # a study of which no cell came is named, with the cells its plan gives it (the full study's: 9 methods x 5)
    for f in folder.glob("retrieval_*.json"):
        f.unlink()
    got = _outputs([folder], tmp_path / "out2")
    text = "\n".join(got["table"])
    assert "### retrieval: no cell collected" in text and "All 45 cells of this study are missing" in text
    assert "retrieval_yarn_16x" in text and "without the 47 missing cells" in text


def test_smollm2_cells_of_the_converted_q8_0_file_are_of_the_gguf_study(tmp_path, capsys):
    """SmolLM2's cells made when make smollm2 converted the GGUF name
    models/smollm2/model-q8_0.bin; run reads the GGUF as those weights, so a
    cell of each, otherwise alike, is of one study (read_cells, the resumed
    study's check); another checkpoint is not."""
    folder = _run_all(tmp_path, capsys)
    f = folder / "smollm2-passkey_yarn_2x.json"
    rec = _json.loads(f.read_text())
    assert rec["study"]["ckpt"] == "models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    before = dict(rec["study"], ckpt=ex.SMOLLM2_BEFORE)
    assert ex.same_study(before, rec["study"]) and ex.same_study(rec["study"], before)
    assert not ex.same_study(dict(rec["study"], ckpt="models/smollm2/model-f32.bin"), rec["study"])
    assert not ex.same_study(dict(before, L=4096), rec["study"])
    f.write_text(_json.dumps(dict(rec, study=before)))
    cells, _ = ex.read_cells([folder])
    assert cells["smollm2-passkey_yarn_2x"]["study"]["ckpt"] == ex.SMOLLM2_BEFORE
    f.write_text(_json.dumps(dict(rec, study=dict(rec["study"], ckpt="models/smollm2/model-f32.bin"))))
    with pytest.raises(ValueError, match="describes study smollm2-passkey unlike"):
        ex.read_cells([folder])


def test_collect_refuses_what_is_not_one_plan_of_cells(tmp_path, capsys):
    folder = _run_all(tmp_path, capsys)
    other = tmp_path / "other"
    other.mkdir()

    def refused(folders, message):
        with pytest.raises(SystemExit) as e:
            ex.main(["--collect"] + [str(f) for f in folders] + ["--out", str(tmp_path / "x")])
        assert message in str(e.value) and "\n" not in str(e.value), str(e.value)

    refused([other], "no cell files (*.json) there")
    refused([tmp_path / "nowhere"], "no such folder")
    _shutil.copy(folder / "bundled_none_1x.json", other)
    refused([folder, other], "bundled_none_1x.json: cell bundled_none_1x is also in")
    rec = _json.loads((other / "bundled_none_1x.json").read_text())
    (other / "bundled_none_1x.json").unlink()
    (other / "bundled_none_4x.json").write_text(_json.dumps(rec))
    refused([other], "holds cell bundled_none_1x, expected bundled_none_4x")
    (other / "bundled_none_4x.json").unlink()
    (folder / "bundled_none_1x.json").unlink()  # now only in other, of another plan
    (other / "bundled_none_1x.json").write_text(_json.dumps(dict(rec, plan=dict(rec["plan"], quick=True))))
    refused([folder, other], "made by the plan '--quick --studies bundled,retrieval,smollm2-passkey', expected")
    (other / "bundled_none_1x.json").write_text("{\"ppl\": 3}")
    refused([other], "expected a cell file of format 'extrapolation-cell/1', got format None")
    (other / "bundled_none_1x.json").write_text("not json")
    refused([other], "expected a cell file (JSON), got unreadable JSON")
    (other / "bundled_none_1x.json").unlink()
    (folder / "bundled_ntk_4x.json").write_text(_json.dumps(dict(
        _json.loads((folder / "bundled_ntk_4x.json").read_text()),
        study=dict(rec["study"], text_recipe=["head -c 99 heldout.txt > books.txt"]))))
    refused([folder], "describes study bundled unlike")
    (folder / "bundled_ntk_4x.json").unlink()
    as_none = _json.loads((folder / "smollm2-passkey_yarn_2x.json").read_text())  # yarn at 1x: none's run
    (other / "smollm2-passkey_yarn_1x.json").write_text(_json.dumps(dict(as_none, cell="smollm2-passkey_yarn_1x",
                                                                         result=dict(as_none["result"], k=1))))
    refused([folder, other], "cell smollm2-passkey_yarn_1x: expected a cell of its plan")
    (other / "smollm2-passkey_yarn_1x.json").write_text(_json.dumps(dict(as_none, cell="smollm2-passkey_yarn_1x")))
    refused([folder, other], "expected the result of smollm2-passkey_yarn_1x, got that of smollm2-passkey_yarn_2x")
    with pytest.raises(SystemExit) as e:
        ex.main(["--collect", str(folder), "--quick"])
    assert "takes its plan from the cell files" in str(e.value)


def test_listed_command_runs_one_cell_and_collect_shows_the_rest_missing(tmp_path):
    """End to end on the bundled model: --list, one listed command run as a
    shell would, then --collect; the cell's score is the one `run` prints
    for the command its file records."""
    from conftest import run_bin
    run_bin()
    if not (ex.SHARED / "data" / "books").is_dir():
        pytest.skip(f"{ex.SHARED / 'data' / 'books'} not found (set SHARED_DIR to the shared folder)")
    listed = _subprocess.run([_sys.executable, "tools/extrapolation.py", "--list", "--quick", "--studies", "bundled",
                              "--tokens", "64", "--results", str(tmp_path / "cells")], cwd=ex.ROOT,
                             capture_output=True, text=True, check=True).stdout.splitlines()
    assert len(listed) == 18 and len(set(listed)) == 18
    cmd = [c for c in listed if " --cell bundled_yarn_4x " in c][0]
    p = _subprocess.run(cmd, shell=True, cwd=ex.ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    rec = _json.loads((tmp_path / "cells" / "bundled_yarn_4x.json").read_text())
    assert rec["threads"] == 1 and rec["wall_s"] > 0 and rec["plan"]["tokens"] == 64
    # the recorded command, run on the text its study's recipe makes, gives the recorded score
    work = tmp_path / "work"
    work.mkdir()
    for step in ["make_heldout"] + rec["study"]["text_recipe"][1:]:
        if step == "make_heldout":
            _sys.path.insert(0, str(ex.ROOT / "tools"))
            import prepare_data
            (work / "heldout.txt").write_text(prepare_data.heldout_text(ex.SHARED), encoding="utf-8")
        else:
            _subprocess.run(step, shell=True, cwd=work, check=True)
    argv = _shlex.split(rec["result"]["command"])
    argv = [str(ex.RUN), str(ex.ROOT / argv[1])] + argv[2:]
    direct = _json.loads(_subprocess.run(argv, cwd=work, capture_output=True, check=True).stdout)
    assert direct["nll"] == rec["result"]["nll"] and direct["tokens"] == rec["result"]["tokens"]
    out = tmp_path / "out"
    for n in (0, 1):  # a missing cell's trials kept by a run that stopped (passkey_by_trials) are named
        (tmp_path / "cells" / "bundled_none_4x.parts").mkdir(exist_ok=True)
        (tmp_path / "cells" / "bundled_none_4x.parts" / f"trial-{n}.json").write_text("{}")
    ex.main(["--collect", str(tmp_path / "cells"), "--out", str(out)])
    table = (out / "table.md").read_text()
    assert f"| yarn | missing | {ex.fmt(rec['result']['ppl'])} [" in table
    assert len(_json.loads((out / "results.json").read_text())["meta"]["missing"]) == 17
    assert _json.loads((out / "results.json").read_text())["meta"]["kept_trials"] == {"bundled_none_4x": 2}
    assert "Missing cells with finished trials kept" in table and "bundled_none_4x (2 trials)" in table
    _shutil.rmtree(tmp_path / "cells" / "bundled_none_4x.parts")
    # the file keeps the NLL curve's bins, not a value per position
    assert "per_position" not in rec["result"] and rec["result"]["position_bins"][0]["first"] == 1
    # a cell made with other settings of its study is refused before anything runs
    other = _json.loads(_json.dumps(rec))
    other["study"]["tokens"] = 999
    (tmp_path / "cells" / "bundled_yarn_4x.json").write_text(_json.dumps(other))
    with pytest.raises(SystemExit) as e:
        ex.main(["--quick", "--studies", "bundled", "--tokens", "64", "--results", str(tmp_path / "cells"),
                 "--out", str(tmp_path / "out2")])
    assert "made with other settings of study bundled" in str(e.value)
    assert not (tmp_path / "out2").exists() and len(list((tmp_path / "cells").glob("*.json"))) == 1
    # the whole plan run into the folder: the cell there is not run again, and trials kept beside its file
    # (a run stopped between writing the file and removing them) are removed
    (tmp_path / "cells" / "bundled_yarn_4x.json").write_text(_json.dumps(rec))
    (tmp_path / "cells" / "bundled_yarn_4x.parts").mkdir()
    (tmp_path / "cells" / "bundled_yarn_4x.parts" / "trial-0.json").write_text("{}")
    ex.main(["--quick", "--studies", "bundled", "--tokens", "64", "--results", str(tmp_path / "cells"),
             "--out", str(tmp_path / "out-all"), "--jobs", "2"])
    assert _json.loads((tmp_path / "cells" / "bundled_yarn_4x.json").read_text()) == rec
    assert sorted(f.suffix for f in (tmp_path / "cells").iterdir()) == [".json"] * 18


def test_shown_paths_keep_a_linked_model_folder(tmp_path, monkeypatch):
    """models/smollm2 may be a link to a folder outside the checkout: commands still
    name it models/smollm2/..., as a reader's checkout has it (not the file's bare name)."""
    root, elsewhere = tmp_path / "checkout", tmp_path / "elsewhere"
    (root / "models").mkdir(parents=True)
    elsewhere.mkdir()
    (elsewhere / "model-q8_0.bin").write_bytes(b"")
    (root / "models" / "smollm2").symlink_to(elsewhere)
    monkeypatch.setattr(ex_commands, "ROOT", root)
    assert ex.Where().path(root / "models" / "smollm2" / "model-q8_0.bin") == "models/smollm2/model-q8_0.bin"
    assert ex.Where().path(elsewhere / "model-q8_0.bin") == "model-q8_0.bin"  # truly outside: its name


def test_position_plot_takes_the_largest_factor_with_cells():
    """nll_vs_position.png draws a study at its largest k that has results: with
    every 4x cell missing, the 2x cells (their bins kept in results.json)."""
    s = _study(factors=(1, 2, 4))
    rows = [dict(model="bundled", method="none", k=k, missing=(k == 4)) for k in (1, 2, 4)]
    assert ex.plotted_factor(s, rows) == 2
    rows[2]["missing"] = False
    assert ex.plotted_factor(s, rows) == 4
    rows = [dict(model="bundled", method="none", k=k, position_bins=[1], per_position=None) for k in (1, 2)]
    rows.append(dict(model="bundled", method="none", k=4, missing=True))
    ex.add_position_bins(rows, [s])
    assert [("position_bins" in r) for r in rows] == [False, True, False]


def test_passkey_cell_runs_a_trial_at_a_time_and_resumes(tmp_path):
    """passkey_by_trials: the bundled model's trials one run each give what the
    whole command gives; a cell stopped partway goes on from its kept trials,
    and a kept trial of another command is refused, naming its file."""
    filler = tmp_path / "filler.txt"
    filler.write_text(TEXT * 3)
    depths, trials = (0, 0.5, 1), 2
    cmd = ex.passkey_command(ex.ROOT / "models" / "model.bin", None, filler, 256, 200, depths, trials,
                             ["--rope-scaling", "linear", "--rope-factor", "2"])
    whole = ex.run_json(cmd)
    parts, where = tmp_path / "cell.parts", ex.Where(tmp_path)
    got = ex.passkey_by_trials(cmd, depths, trials, 1, parts, where)
    for a, b in zip(got["cells"], whole["cells"], strict=True):
        assert (a["length"], a["depth"], a["correct"]) == (b["length"], b["depth"], b["correct"])
        assert a["trials"] == b["trials"]
    assert got["resumed"] == 0 and got["wall_s"] > 0 and len(list(parts.glob("trial-*.json"))) == 6
    # stopped after four trials: the other two run again, the four are read
    for n in (4, 5):
        (parts / f"trial-{n}.json").unlink()
    again = ex.passkey_by_trials(cmd, depths, trials, 1, parts, where)
    assert again["cells"] == got["cells"] and again["resumed"] == 4
    part = _json.loads((parts / "trial-2.json").read_text())
    assert part["command"].endswith("--depths 0.5 --trials 1 --json --rope-scaling linear --rope-factor 2 "
                                    "--skip-draws 2") and "tmp" not in part["command"]
    # the same folder for a cell with other flags
    other = [c if c != "linear" else "ntk" for c in cmd]
    with pytest.raises(RuntimeError, match=r"trial-0\.json: a trial of .*linear.*expected .*ntk"):
        ex.passkey_by_trials(other, depths, trials, 1, parts, where)


def test_run_cell_resumes_a_stopped_passkey_cell(tmp_path, monkeypatch):
    """run_cell on a passkey cell stopped after two trials (a run that fails
    the third): no cell file, two trials kept; run again, the file equals a
    cell run at one go, says resumed_trials 2, and the kept trials are gone."""
    filler = tmp_path / "heldout.txt"
    filler.write_text(TEXT * 3)
    s = _study("passkey", "retrieval", factors=(1,), depths=(0, 1), trials=2, filler=filler)
    job = ex.passkey_jobs(s, ex.Where(tmp_path))[0]
    one_go = ex.run_cell(job, _PLAN, 1, tmp_path / "one-go")["result"]
    real, calls = ex.run_json, []

    def stops_at_the_third(cmd, threads=1):
        calls.append(cmd)
        if len(calls) == 3:
            raise RuntimeError("./run: exit 130: stopped")
        return real(cmd, threads)
    monkeypatch.setattr(ex_commands, "run_json", stops_at_the_third)
    results = tmp_path / "cells"
    with pytest.raises(RuntimeError, match="stopped"):
        ex.run_cell(job, _PLAN, 1, results)
    assert [f.name for f in results.iterdir()] == [f"{job['name']}.parts"]
    assert len(list((results / f"{job['name']}.parts").iterdir())) == 2
    monkeypatch.setattr(ex_commands, "run_json", real)
    rec = ex.run_cell(job, _PLAN, 1, results)
    assert rec["result"] == one_go and rec["resumed_trials"] == 2
    assert [f.name for f in results.iterdir()] == [f"{job['name']}.json"]
