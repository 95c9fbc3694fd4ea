"""Reference parity: run's forward pass against tests/reference/forward.py
(tests/README.md, "Forward pass").

Random-weight checkpoints written by export.py cover MHA, GQA and MQA, both
RoPE layouts, tied and untied classifiers, partial rotary, and non-default
norm eps and RoPE base. `run -m ppl --json` must report the same mean NLL, and
the same NLL per position bucket, as the float64 numpy reference applied to
the ids `run -m tokenize` gives, with the same windowing.

Tolerances. run computes in float32 (weights, activations, the RoPE table
stored as float), the reference in float64 from the same float32 weights. With
these small models the per-token NLL error of float32 is of order 1e-6 (a few
ulps of logits of size ~10, times sum lengths of 64..96); averaging shrinks it
further. NLL_TOL = 1e-4 on the mean and BUCKET_TOL = 2e-4 per bucket leave a
margin of about 100x for reduction-order differences, and are still at least 10x
smaller than the effect of every setting these tests exercise: each case
asserts that the reference NLL moves by more than 10x the tolerance when that
setting is ignored (a wrong layout, full rotary, default eps or base, tied
instead of untied classifier, wrong kv-head grouping), so a run that ignores it
fails the test.
"""

import math

import numpy as np
import pytest

import export
from conftest import (SYN_PIECES, TEXT, hf_permute, make_model, run_ok, run_ppl, tokenize)
from reference.forward import (Reference, apply_rope, bucket_bounds, decode_llama2c, ppl_reference,
                               rope_cos_sin)

NLL_TOL = 1e-4      # mean NLL, nats (see the module docstring)
BUCKET_TOL = 2e-4   # per bucket: fewer tokens per mean, so less averaging
LAYOUT_TOL = 1e-5   # same math, only the order of float32 sums changes


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "text.txt"
    path.write_bytes(TEXT.encode())  # no trailing newline: -i TEXT and -f give the same ids
    return path


@pytest.fixture(scope="module")
def text_ids(tmp_path_factory, syn_tokenizer):
    """The text's ids as run tokenizes them, without the leading BOS."""
    ckpt, _, _ = make_model(tmp_path_factory.mktemp("tokmodel"))
    ids = tokenize(ckpt, syn_tokenizer, TEXT)
    assert ids[0] == 1, f"tokenize output does not start with BOS: {ids[:5]}"
    assert len(ids) > 150, f"the test text is too short: {len(ids)} tokens"
    return ids[1:]


def perturbed(cfg, tensors, change):
    """(cfg, tensors) with one setting changed, to show the tests can fail."""
    cfg, tensors = dict(cfg), dict(tensors)
    if change == "layout":
        cfg["rope_layout"] = "neox" if cfg["rope_layout"] == "interleaved" else "interleaved"
    elif change == "full_rotary":
        cfg["rot_dim"] = cfg["dim"] // cfg["n_heads"]
    elif change == "eps":
        cfg["norm_eps"] = 1e-5
    elif change == "base":
        cfg["rope_theta"] = 10000.0
    elif change == "tied":
        cfg["shared_classifier"] = True
    elif change == "kv_interleaved":
        # query head h on kv head h % n_kv_heads: the grouping docs/rope.md §2.4 calls wrong
        nkv, hs = cfg["n_kv_heads"], cfg["dim"] // cfg["n_heads"]
        group = cfg["n_heads"] // nkv
        order = [h % nkv for h in range(cfg["n_heads"])]
        # a model with duplicated kv heads laid out so that contiguous grouping
        # equals h % nkv grouping of the original
        for w in ("wk", "wv"):
            t = tensors[w].reshape(cfg["n_layers"], nkv, hs, cfg["dim"])
            tensors[w] = t[:, order].reshape(cfg["n_layers"], cfg["n_heads"] * hs, cfg["dim"])
        cfg["n_kv_heads"] = cfg["n_heads"]
        assert group > 1
    else:
        raise ValueError(change)
    return cfg, tensors


# (id, config overrides, settings a wrong implementation could ignore)
CASES = [
    ("mha-interleaved-tied", dict(), ["layout"]),
    ("mha-neox-untied", dict(rope_layout="neox", shared_classifier=False), ["layout", "tied"]),
    ("gqa-interleaved-untied", dict(n_heads=8, n_kv_heads=2, shared_classifier=False),
     ["layout", "kv_interleaved", "tied"]),
    ("gqa-neox-tied", dict(n_heads=8, n_kv_heads=4, rope_layout="neox"), ["layout", "kv_interleaved"]),
    ("mqa-neox-untied", dict(n_heads=4, n_kv_heads=1, rope_layout="neox", shared_classifier=False),
     ["layout", "tied"]),
    ("partial-rotary-interleaved", dict(n_heads=4, n_kv_heads=2, rot_dim=6),
     ["layout", "full_rotary"]),
    ("partial-rotary-neox", dict(n_heads=2, n_kv_heads=1, rot_dim=8, rope_layout="neox"),
     ["layout", "full_rotary"]),
    ("eps-base-3layers", dict(dim=32, hidden_dim=80, n_layers=3, n_heads=2, n_kv_heads=1,
                              norm_eps=0.05, rope_theta=500.0), ["layout", "eps", "base"]),
]


@pytest.mark.parametrize("case", range(len(CASES)), ids=[c[0] for c in CASES])
def test_ppl_matches_reference(case, tmp_path, syn_tokenizer, text_file, text_ids):
    name, overrides, can_ignore = CASES[case]
    ckpt, cfg, tensors = make_model(tmp_path, seed=100 + case, **overrides)
    L, ctx = cfg["seq_len"], 2 * cfg["seq_len"]
    ref = ppl_reference(Reference(cfg, tensors), text_ids, ctx, cfg["bos_id"], L)
    got = run_ppl(ckpt, syn_tokenizer, text_file, ctx)

    assert got["ctx"] == ctx
    assert got["tokens"] == ref["tokens"] == len(text_ids)
    assert max(pos for _, pos, _ in ref["per_token"]) == ctx - 1 >= 60
    assert abs(got["nll"] - ref["nll"]) < NLL_TOL, (got["nll"], ref["nll"])
    assert math.isclose(got["ppl"], math.exp(got["nll"]), rel_tol=1e-3)
    check_buckets(got, ref)

    # the setup can fail: ignoring any of these settings moves the NLL far more
    for change in can_ignore:
        wrong = ppl_reference(Reference(*perturbed(cfg, tensors, change)), text_ids, ctx,
                              cfg["bos_id"], L)
        assert abs(wrong["nll"] - ref["nll"]) > 10 * NLL_TOL, f"{change} is not visible"


def check_buckets(got, ref):
    bounds = [(b["start"], b["end"]) for b in ref["buckets"]]
    got_bounds = [(b["start"], b["end"]) for b in got["buckets"]]
    assert got_bounds == bounds, f"buckets {got_bounds}, expected {bounds}"
    for g, r in zip(got["buckets"], ref["buckets"]):
        assert g["tokens"] == r["tokens"], (g, r)
        if r["tokens"]:
            assert abs(g["nll"] - r["nll"]) < BUCKET_TOL, (g, r)


@pytest.mark.parametrize("ctx,stride", [(100, None), (48, 20), (40, 39), (17, 5)],
                         ids=["ctx100", "ctx48-stride20", "ctx40-stride39", "ctx17-stride5"])
def test_ppl_windows_and_buckets(ctx, stride, tmp_path, syn_tokenizer, text_file, text_ids):
    """Other windowings: a ctx that is not a power-of-two multiple of L (the
    last bucket is capped at ctx), overlapping windows with --stride, and a
    ctx shorter than L (one bucket)."""
    ckpt, cfg, tensors = make_model(tmp_path, seed=7, n_heads=4, n_kv_heads=2)
    L = cfg["seq_len"]
    ref = ppl_reference(Reference(cfg, tensors), text_ids, ctx, cfg["bos_id"], L, stride)
    got = run_ppl(ckpt, syn_tokenizer, text_file, ctx, stride)
    assert got["ctx"] == ctx
    assert got["tokens"] == ref["tokens"] == len(text_ids)
    assert abs(got["nll"] - ref["nll"]) < NLL_TOL, (got["nll"], ref["nll"])
    check_buckets(got, ref)
    check_standard_errors(got, ref)


def check_standard_errors(got, ref):
    """run's standard errors against a direct computation on the reference's
    per-token NLLs: the sample standard deviation over sqrt(n) (tokens taken
    as independent), the same per bucket, and the windows-as-units estimate
    for a ratio of sums, sqrt(W/(W-1) sum_w (S_w - m n_w)^2) / N, here as
    the weighted spread of the window means. Every NLL agrees within NLL_TOL,
    so each standard error agrees within a relative 1e-3 (+ 1e-6 absolute)."""
    vals = np.array([v for _, _, v in ref["per_token"]])
    assert got["nll_se"] == pytest.approx(vals.std(ddof=1) / np.sqrt(len(vals)), rel=1e-3, abs=1e-6)
    m = vals.mean()
    assert got["ppl_lo"] == pytest.approx(np.exp(m - 1.96 * got["nll_se"]), rel=1e-3)
    assert got["ppl_hi"] == pytest.approx(np.exp(m + 1.96 * got["nll_se"]), rel=1e-3)
    windows = [np.array(w) for w in ref["per_window"]]
    W, N = len(windows), len(vals)
    if W < 2:
        assert got["nll_se_windows"] is None
    else:
        sizes = np.array([len(w) for w in windows])
        means = np.array([w.mean() if len(w) else 0.0 for w in windows])
        spread = np.sum((sizes * (means - m)) ** 2)
        assert got["nll_se_windows"] == pytest.approx(np.sqrt(W / (W - 1) * spread) / N, rel=1e-3, abs=1e-6)
    for g in got["buckets"]:
        a, b = g["start"], g["end"]
        inside = np.array([v for _, pos, v in ref["per_token"] if a <= pos < b])
        want = inside.std(ddof=1) / np.sqrt(len(inside)) if len(inside) > 1 else None
        assert (g["nll_se"] is None) if want is None else g["nll_se"] == pytest.approx(want, rel=1e-3, abs=1e-6)


def test_short_text_single_window(tmp_path, syn_tokenizer):
    """A text that fits in one window is scored token by token after BOS."""
    ckpt, cfg, tensors = make_model(tmp_path, seed=3)
    text = "the cat sat on the mat."
    (tmp_path / "short.txt").write_bytes(text.encode())
    ids = tokenize(ckpt, syn_tokenizer, text)
    got = run_ppl(ckpt, syn_tokenizer, tmp_path / "short.txt", 64)
    nll = Reference(cfg, tensors).nll(ids)
    assert got["tokens"] == len(ids) - 1
    assert abs(got["nll"] - float(np.mean(nll))) < NLL_TOL


def test_layouts_agree_under_hf_permutation(tmp_path, syn_tokenizer, text_file, text_ids):
    """docs/rope.md §4.2 and §4.4: a model exported interleaved, and the same
    model with HF-permuted q/k rows exported neox, give the same NLL. GQA, so
    that wk must be permuted with n_kv_heads, not n_heads."""
    cfg = dict(n_heads=8, n_kv_heads=2, shared_classifier=False)
    a_path, a_cfg, tensors = make_model(tmp_path, "interleaved.bin", seed=11, **cfg)
    hf = dict(tensors)
    hf["wq"] = np.stack([hf_permute(w, a_cfg["n_heads"]) for w in tensors["wq"]])
    hf["wk"] = np.stack([hf_permute(w, a_cfg["n_kv_heads"]) for w in tensors["wk"]])
    b_path, b_cfg, _ = make_model(tmp_path, "neox.bin", tensors=hf, rope_layout="neox", **cfg)

    ctx = 2 * a_cfg["seq_len"]
    a = run_ppl(a_path, syn_tokenizer, text_file, ctx)
    b = run_ppl(b_path, syn_tokenizer, text_file, ctx)
    assert abs(a["nll"] - b["nll"]) < LAYOUT_TOL, (a["nll"], b["nll"])
    for ba, bb in zip(a["buckets"], b["buckets"]):
        assert abs(ba["nll"] - bb["nll"]) < 2 * LAYOUT_TOL, (ba, bb)
    # and the permuted weights read with the wrong (interleaved) layout differ
    ref_ok = ppl_reference(Reference(b_cfg, hf), text_ids, ctx, 1, a_cfg["seq_len"])
    ref_bad = ppl_reference(Reference(dict(b_cfg, rope_layout="interleaved"), hf), text_ids, ctx,
                            1, a_cfg["seq_len"])
    assert abs(ref_ok["nll"] - a["nll"]) < NLL_TOL
    assert abs(ref_bad["nll"] - ref_ok["nll"]) > 100 * LAYOUT_TOL


# Generation --------------------------------------------------------------

PROMPT = "the cat"
N_NEW = 20
MIN_GAP = 0.02  # top-1 minus top-2 logit: far above float32 error (~1e-5), so no near-ties


def printable(token):
    """A token whose llama2.c decoding is plain printable ASCII."""
    text = decode_llama2c(SYN_PIECES, 0, token)
    return token > 2 and all(32 <= c < 127 for c in text)


def test_greedy_generation_matches_reference(tmp_path, syn_tokenizer):
    """`-t 0` picks the argmax at each step: for a random model whose
    continuation has no near-tied logits, no end token and only printable
    pieces, stdout is the prompt, the reference continuation decoded with
    llama2.c's rule, and one newline."""
    ckpt0, _, _ = make_model(tmp_path, "tok.bin")
    prompt_ids = tokenize(ckpt0, syn_tokenizer, PROMPT)
    cfg = export.normalize_config(dict(dim=64, hidden_dim=96, n_layers=2, n_heads=4,
                                       n_kv_heads=2, vocab_size=len(SYN_PIECES), seq_len=32,
                                       rope_layout="neox", shared_classifier=False))
    # zero classifier rows give logit 0, below the maximum of the others, so the
    # model only ever picks printable tokens (most byte tokens are not)
    keep = np.array([printable(t) for t in range(len(SYN_PIECES))])
    for seed in range(200):  # deterministic search for a well-conditioned model
        tensors = export.random_tensors(cfg, 1000 + seed)
        tensors["wcls"][~keep] = 0.0
        new, gap = Reference(cfg, tensors).greedy(prompt_ids, N_NEW)
        if gap > MIN_GAP and all(printable(t) for t in new) and len(set(new)) > 3:
            break
    else:
        pytest.fail("no well-conditioned random model found")
    ckpt = tmp_path / "gen.bin"
    export.write_checkpoint(ckpt, cfg, tensors)
    expected = PROMPT.encode()
    prev = prompt_ids[-1]
    for t in new:
        expected += decode_llama2c(SYN_PIECES, prev, t)
        prev = t
    p = run_ok(ckpt, "-z", syn_tokenizer, "-t", "0", "-n", str(N_NEW), "-i", PROMPT)
    assert p.stdout == expected + b"\n", (p.stdout, expected)


# Self-checks of the reference (no binary needed) ---------------------------

def test_reference_rope_matches_spec_worked_example():
    """docs/rope.md §3.1: d=4, b=10000, q=[1,2,3,4] at position 1 and 2."""
    cos, sin = rope_cos_sin(3, 4, 10000.0)
    q = np.array([1.0, 2.0, 3.0, 4.0])[None, None, :].repeat(3, axis=0)
    inter = apply_rope(q, cos, sin, 4, "interleaved")[:, 0]
    neox = apply_rope(q, cos, sin, 4, "neox")[:, 0]
    np.testing.assert_allclose(inter[0], [1, 2, 3, 4])
    np.testing.assert_allclose(inter[1], [-1.1426396637, 1.9220755965, 2.9598506679,
                                          4.0297995017], atol=1e-9)
    np.testing.assert_allclose(neox[1], [-1.9841106486, 1.9599006675, 2.4623779024,
                                         4.0197996683], atol=1e-9)
    np.testing.assert_allclose(inter[2], [-2.2347416902, 0.0770037537, 2.9194053532,
                                          4.0591960267], atol=1e-9)
    np.testing.assert_allclose(neox[2], [-3.1440391170, 1.9196053466, -0.3391430828,
                                         4.0391973601], atol=1e-9)


def test_reference_layouts_agree_under_permutation():
    cfg = export.normalize_config(dict(dim=32, hidden_dim=48, n_layers=2, n_heads=4,
                                       n_kv_heads=2, vocab_size=50, seq_len=16))
    t = export.random_tensors(cfg, 5)
    hf = dict(t)
    hf["wq"] = np.stack([hf_permute(w, 4) for w in t["wq"]])
    hf["wk"] = np.stack([hf_permute(w, 2) for w in t["wk"]])
    ids = list(np.random.default_rng(0).integers(0, 50, 20))
    a = Reference(cfg, t).logits(ids)
    b = Reference(dict(cfg, rope_layout="neox"), hf).logits(ids)
    np.testing.assert_allclose(a, b, atol=1e-12)


def test_reference_windowing():
    """The windowing helper itself: no overlap, stride, and the buckets."""
    class Fake:  # nll = position in the window, so the buckets are easy to check
        def nll(self, ids):
            return np.arange(1, len(ids), dtype=float)
    r = ppl_reference(Fake(), list(range(10)), ctx=5, bos_id=1, seq_len=4)
    assert [p for _, p, _ in r["per_token"]] == [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]
    r = ppl_reference(Fake(), list(range(10)), ctx=5, bos_id=1, seq_len=4, stride=2)
    assert [(i, p) for i, p, _ in r["per_token"]] == [
        (0, 1), (1, 2), (2, 3), (3, 4), (4, 3), (5, 4), (6, 3), (7, 4), (8, 3), (9, 4)]
    assert bucket_bounds(32, 64) == [(0, 16), (16, 32), (32, 64)]
    assert bucket_bounds(32, 100) == [(0, 16), (16, 32), (32, 64), (64, 100)]
    assert bucket_bounds(32, 17) == [(0, 16), (16, 17)]
    assert bucket_bounds(32, 8) == [(0, 8)]
