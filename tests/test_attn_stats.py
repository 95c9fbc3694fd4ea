"""-m ppl --attn-stats FILE: attention statistics against a float64 numpy
computation of the same statistics.

For each layer and head, run writes the mean entropy of the attention weights
by query position bucket and the attention mass by query-key distance bucket
(ppl's buckets [0, L/2), [L/2, L), [L, 2L), ...), averaged over every scored
query, and with sinks the mass on the sink keys. The reference is
tests/reference/forward.py's trace_attention: the model in float64, one token
at a time through a KV cache with the key strategy of each case (keys
rotated once, exact dynamic NTK's keys re-rotated for every length,
Self-Extend's grouped positions, the rolling cache of sinks, a sliding window,
an f16 cache), with RoPE angles from test_extrapolation.py's rules (written
from docs/rope.md). The statistics are computed from its weights here, with
numpy, from their definitions; the distance of a key is taken from the text
position of the token its slot holds, not from the cache's places.

Every case also checks the reference itself: its mean NLL must match run's
(NLL_TOL, as tests/test_forward.py), so both ran the same model.

Tolerances. run's weights are float32 (scores summed in float32, exp_fast
within 2 ulp), the reference's float64: a weight differs by a few times 1e-7
relative, and so do an entropy (a weighted mean of -ln p_j, at most ln 128 =
4.9 nats) and a mass (a sum of weights, at most 1). Observed with the f32
cache, over every case below: under 3e-7 (entropy) and 4e-8 (mass);
ENTROPY_TOL = 3e-6 and MASS_TOL = 5e-7 leave about 10x. With the f16 cache the
reference rounds keys and values to half as run does, but it rounds float64
values where run rounds float32 ones, so now and then one element lands on
the other side of a half-precision step (1e-3 relative in one key): observed
under 5e-5 (entropy) and 1e-5 (mass); F16_TOL = 5e-4 on both. Each case also
asserts that the statistics are not trivial: the entropies differ from those
of uniform weights by more than 100x the tolerance (observed: 1.8 nats or
more), and a distance off by one token moves the mass by more than 10x the
tolerance (observed: 0.025 or more).
"""

import json
import math
import os
import stat

import numpy as np
import pytest

from conftest import TEXT, check_error, make_model, run, run_ok, tokenize
from reference.forward import Reference, bucket_bounds, trace_attention
from test_extrapolation import dynamic_angles, inv_freq, self_extend_angles, static_angles

NLL_TOL = 1e-4
ENTROPY_TOL, MASS_TOL = 3e-6, 5e-7
F16_TOL = 5e-4
ONE_QUERY_ENTROPY_TOL = 2e-5
L = 32  # the random models' training context


def sharpened_model(directory, seed, **overrides):
    """A random checkpoint whose queries are scaled 3x, so that its attention
    is far from uniform (random weights give scores of order 1)."""
    cfg_over = dict(dim=32, hidden_dim=48, n_layers=2, n_heads=4, n_kv_heads=2, seq_len=L)
    cfg_over.update(overrides)
    _, cfg, tensors = make_model(directory, name="plain.bin", seed=seed, **cfg_over)
    tensors = dict(tensors, wq=tensors["wq"] * np.float32(3))
    return make_model(directory, name="model.bin", tensors=tensors, **cfg_over)


def text_of(path, ckpt, tok, n_chars):
    """Write TEXT's first n_chars to path; return their ids (BOS first)."""
    path.write_text(TEXT[:n_chars])
    return tokenize(ckpt, tok, TEXT[:n_chars])


def window_records(model, ids, ctx, stride, **trace):
    """run -m ppl's windows over the text ids (BOS first), each traced from
    position 0: a window reads BOS and then its span but the last token; the
    queries of tokens no earlier window scored count (docs/rope.md §12.2)."""
    bos, text = ids[0], ids[1:]
    span, start, scored_until, counted, nlls = ctx - 1, 0, 0, [], []
    while True:
        chunk = text[start:start + span]
        records = trace_attention(model, [bos] + chunk, ctx, **trace)[:-1]  # the last token is not fed
        for q, r in enumerate(records):  # input position q predicts text token start + q
            if start + q >= scored_until:
                counted.append(r)
                nlls.append(r["nll"])
        scored_until = start + len(chunk)
        if scored_until == len(text):
            return counted, nlls
        start += stride


def stream_records(model, ids, ctx, sinks, **trace):
    """--streaming: the whole text through the rolling cache; every fed token's
    query counts but the last's (it predicts nothing)."""
    records = trace_attention(model, ids, ctx, sinks=sinks, **trace)[:-1]
    return records, [r["nll"] for r in records]


def reference_stats(records, n_positions, ctx, shift=0):
    """The statistics of the counted queries, from the definitions: per layer
    and head, H = -sum_j p_j ln p_j averaged by query position bucket; the
    weight on the keys at distance q - j in each distance bucket and on the
    sink keys, averaged over the queries. shift adds to every distance (a
    deliberate error, to show the comparison can fail)."""
    pos_b, dist_b = bucket_bounds(L, n_positions), bucket_bounds(L, ctx)
    n_layers, n_heads, _ = records[0]["weights"].shape
    entropy = np.zeros((n_layers, n_heads, len(pos_b)))
    queries = np.zeros(len(pos_b), dtype=np.int64)
    mass = np.zeros((n_layers, n_heads, len(dist_b)))
    sink_mass = np.zeros((n_layers, n_heads))
    sink_by_position = np.zeros((n_layers, n_heads, len(pos_b)))
    for r in records:
        p = r["weights"]
        k = next(i for i, (a, b) in enumerate(pos_b) if a <= r["pos"] < b)
        logs = np.log(np.where(p > 0, p, 1.0))  # 0 ln 0 = 0: keys a window leaves out
        entropy[:, :, k] += -(p * logs).sum(-1)
        queries[k] += 1
        dist = r["dist"] + shift
        for i, (a, b) in enumerate(dist_b):
            mass[:, :, i] += p[:, :, ~r["sink"] & (dist >= a) & (dist < b)].sum(-1)
        sink_mass += p[:, :, r["sink"]].sum(-1)
        sink_by_position[:, :, k] += p[:, :, r["sink"]].sum(-1)
    kept = queries > 0
    return {"queries": len(records),
            "position_buckets": [{"start": a, "end": b, "queries": int(n)}
                                 for (a, b), n in zip(pos_b, queries) if n],
            "distance_buckets": [{"start": a, "end": b} for a, b in dist_b],
            "entropy": entropy[:, :, kept] / queries[kept], "mass": mass / len(records),
            "sink_mass": sink_mass / len(records),
            "sink_mass_by_position": sink_by_position[:, :, kept] / queries[kept]}


def uniform_entropy(records, n_positions):
    """The mean entropy by position bucket if every query spread its weight
    evenly over the keys it sees."""
    pos_b = bucket_bounds(L, n_positions)
    sums, counts = np.zeros(len(pos_b)), np.zeros(len(pos_b))
    for r in records:
        k = next(i for i, (a, b) in enumerate(pos_b) if a <= r["pos"] < b)
        sums[k] += math.log((r["weights"][-1, 0] > 0).sum())
        counts[k] += 1
    return sums[counts > 0] / counts[counts > 0]


def attn_stats(ckpt, tok, text, ctx, flags, out):
    """Run -m ppl --attn-stats out; return (ppl's JSON, the statistics' JSON)."""
    p = run_ok(ckpt, "-z", tok, "-m", "ppl", "-f", text, "--ctx", str(ctx), "--json", "--attn-stats", out, *flags)
    return json.loads(p.stdout), json.loads(out.read_text())


def angles_of(case, cfg):
    d, base = cfg["rot_dim"], float(np.float32(cfg["rope_theta"]))
    rules = {
        "none": lambda: static_angles(*inv_freq("none", d, base)),
        "yarn": lambda: static_angles(*inv_freq("yarn", d, base, 4)),
        "dynamic-hf": lambda: dynamic_angles(d, base, 4, exact=False),
        "dynamic-exact": lambda: dynamic_angles(d, base, 4, exact=True),
        "self-extend": lambda: self_extend_angles(inv_freq("none", d, base)[0], 4, 8),
    }
    return rules[case]()


# name: (run's flags, angle rule, keys rotated once, window, kv cache)
WINDOW_CASES = {
    "none": ([], "none", True, 0, "f32"),
    "none-f16": (["--kv", "f16"], "none", True, 0, "f16"),
    "yarn": (["--rope-scaling", "yarn", "--rope-factor", "4"], "yarn", True, 0, "f32"),
    "dynamic-hf": (["--rope-scaling", "dynamic", "--rope-factor", "4"], "dynamic-hf", True, 0, "f32"),
    "dynamic-exact": (["--rope-scaling", "dynamic", "--rope-factor", "4", "--rope-dynamic", "exact"],
                      "dynamic-exact", False, 0, "f32"),
    "dynamic-exact-f16": (["--rope-scaling", "dynamic", "--rope-factor", "4", "--rope-dynamic", "exact", "--kv",
                           "f16"], "dynamic-exact", False, 0, "f16"),
    "self-extend": (["--self-extend", "4", "8"], "self-extend", False, 0, "f32"),
    "self-extend-f16": (["--self-extend", "4", "8", "--kv", "f16"], "self-extend", False, 0, "f16"),
    "window": (["--window", "20"], "none", True, 20, "f32"),
}


def check_against_reference(got, ppl, want, nlls, records, n_positions, f16, entropy_tol=None):
    """run's statistics (got) against the reference's (want), with the checks
    that the comparison can fail."""
    entropy_tol, mass_tol = (F16_TOL, F16_TOL) if f16 else (entropy_tol or ENTROPY_TOL, MASS_TOL)
    assert abs(ppl["nll"] - np.mean(nlls)) < NLL_TOL, (ppl["nll"], np.mean(nlls))
    assert got["queries"] == want["queries"] == ppl["tokens"]
    assert got["position_buckets"] == want["position_buckets"]
    assert got["distance_buckets"] == want["distance_buckets"]
    entropy, mass = np.array(got["entropy"]), np.array(got["mass"])
    assert entropy.shape == want["entropy"].shape and mass.shape == want["mass"].shape
    assert np.max(np.abs(entropy - want["entropy"])) < entropy_tol, np.max(np.abs(entropy - want["entropy"]))
    assert np.max(np.abs(mass - want["mass"])) < mass_tol, np.max(np.abs(mass - want["mass"]))
    if "sink_mass" in want and got.get("sinks") is not None:
        sink_mass = np.array(got["sink_mass"])
        assert np.max(np.abs(sink_mass - want["sink_mass"])) < mass_tol
        by_position = np.array(got["sink_mass_by_position"])
        assert by_position.shape == want["sink_mass_by_position"].shape
        assert np.max(np.abs(by_position - want["sink_mass_by_position"])) < mass_tol
    # not trivial: far from uniform attention, and a distance off by one shows
    assert np.max(np.abs(want["entropy"] - uniform_entropy(records, n_positions))) > 100 * entropy_tol
    shifted = reference_stats(records, n_positions, got["ctx"], shift=1)
    assert np.max(np.abs(shifted["mass"] - want["mass"])) > 10 * mass_tol


@pytest.mark.parametrize("case", sorted(WINDOW_CASES))
def test_windows_match_reference(case, tmp_path, syn_tokenizer):
    """One window of 4L tokens (the buckets up to [2L, 4L)) under each key
    strategy."""
    flags, rule, rotated_once, window, kv = WINDOW_CASES[case]
    ckpt, cfg, tensors = sharpened_model(tmp_path, seed=21)
    ctx = 4 * L
    ids = text_of(tmp_path / "text.txt", ckpt, syn_tokenizer, 400)
    assert len(ids) > ctx, "the text must fill the window"
    ppl, got = attn_stats(ckpt, syn_tokenizer, tmp_path / "text.txt", ctx, flags, tmp_path / "stats.json")
    records, nlls = window_records(Reference(cfg, tensors), ids, ctx, ctx - 1, angles=angles_of(rule, cfg),
                                   rotated_once=rotated_once, window=window, kv=kv)
    want = reference_stats(records, ctx, ctx)
    check_against_reference(got, ppl, want, nlls, records, ctx, kv == "f16")
    assert "sink_mass" not in got and got["streaming"] is False and got["kv"] == kv and got["window"] == window
    assert got["keys"] == ("rotated-once" if rotated_once else "self-extend" if "self-extend" in rule
                           else "per-length")
    assert got["attn_factor"] == pytest.approx(angles_of(rule, cfg)(0, 0)[2], rel=1e-6)


@pytest.mark.parametrize("case", ["none", "dynamic-exact", "self-extend"])
def test_long_window_blocks_and_one_query(case, tmp_path, syn_tokenizer):
    """A window of 514 positions (16L + 2) is fed as four blocks of 128
    queries and one of a single query (FORWARD_BLOCK 128): the blocks' numbers
    come from attention_block's tally inside the online softmax, both from
    tiles that lie in one distance bucket (queries 384..511 against keys
    0..47: distances 337..511, all in [256, 512)) and from tiles across a
    bucket's edge, and the last query's from the one-query path's weights.
    That query, at 512, is alone in its position bucket [512, 514): its
    entropy is one query's, over 513 keys, not a mean over many in which the
    float errors of the scores partly cancel (observed 4.7e-6);
    ONE_QUERY_ENTROPY_TOL = 2e-5. The blocks' buckets keep ENTROPY_TOL
    (observed 2.5e-7 none, 6.0e-7 exact dynamic NTK, 3.5e-7 Self-Extend;
    mass under 4.5e-8)."""
    flags, rule, rotated_once, window, kv = WINDOW_CASES[case]
    ckpt, cfg, tensors = sharpened_model(tmp_path, seed=25)
    ctx = 16 * L + 2
    text = (TEXT * 3)[:1000]
    (tmp_path / "text.txt").write_text(text)
    ids = tokenize(ckpt, syn_tokenizer, text)
    assert len(ids) > ctx, "the text must fill the window"
    ppl, got = attn_stats(ckpt, syn_tokenizer, tmp_path / "text.txt", ctx, flags, tmp_path / "stats.json")
    records, nlls = window_records(Reference(cfg, tensors), ids, ctx, ctx - 1, angles=angles_of(rule, cfg),
                                   rotated_once=rotated_once, window=window, kv=kv)
    want = reference_stats(records, ctx, ctx)
    check_against_reference(got, ppl, want, nlls, records, ctx, False, entropy_tol=ONE_QUERY_ENTROPY_TOL)
    assert got["position_buckets"][-1] == {"start": 512, "end": ctx, "queries": 1}
    blocks = np.array(got["entropy"])[:, :, :-1] - want["entropy"][:, :, :-1]  # the buckets of the blocks' queries
    assert np.max(np.abs(blocks)) < ENTROPY_TOL
    assert [b["end"] for b in got["distance_buckets"]][-3:] == [256, 512, ctx]


def test_overlapping_windows_count_scored_queries_only(tmp_path, syn_tokenizer):
    """--stride 8 at ctx 2L: each later window's first tokens are context
    only; their queries are not counted (position bucket [0, L/2) holds only
    the first window's)."""
    ckpt, cfg, tensors = sharpened_model(tmp_path, seed=22, n_kv_heads=1)
    ctx, stride = 2 * L, 8
    ids = text_of(tmp_path / "text.txt", ckpt, syn_tokenizer, 200)
    ppl, got = attn_stats(ckpt, syn_tokenizer, tmp_path / "text.txt", ctx, ["--stride", str(stride)],
                          tmp_path / "stats.json")
    assert ppl["windows"] > 3
    records, nlls = window_records(Reference(cfg, tensors), ids, ctx, stride,
                                   angles=angles_of("none", cfg), rotated_once=True)
    want = reference_stats(records, ctx, ctx)
    check_against_reference(got, ppl, want, nlls, records, ctx, False)
    assert got["position_buckets"][0]["queries"] == L // 2  # the first window's positions 0..L/2-1 only


@pytest.mark.parametrize("sinks, kv", [(4, "f32"), (4, "f16"), (0, "f32")])
def test_sinks_streaming_match_reference(sinks, kv, tmp_path, syn_tokenizer):
    """--sinks S --streaming: a text 3x the cache, positions by place in the
    rolling cache; the query positions are the text's, the distances the
    tokens' (the cache's places give them), and the weight on the sink keys
    is reported apart."""
    ckpt, cfg, tensors = sharpened_model(tmp_path, seed=23)
    ctx = 24
    ids = text_of(tmp_path / "text.txt", ckpt, syn_tokenizer, 110)
    assert len(ids) > 3 * ctx
    ppl, got = attn_stats(ckpt, syn_tokenizer, tmp_path / "text.txt", ctx,
                          ["--sinks", str(sinks), "--streaming", "--kv", kv], tmp_path / "stats.json")
    records, nlls = stream_records(Reference(cfg, tensors), ids, ctx, sinks, angles=angles_of("none", cfg),
                                   rotated_once=False, kv=kv)
    want = reference_stats(records, len(ids), ctx)
    check_against_reference(got, ppl, want, nlls, records, len(ids), kv == "f16")
    assert got["sinks"] == sinks and got["streaming"] is True
    sink_mass = np.array(got["sink_mass"])
    assert (sinks == 0) == (np.max(sink_mass) == 0)
    # the mass on the sinks and on the distance buckets is all the weight
    assert np.max(np.abs(np.array(got["mass"]).sum(-1) + sink_mass - 1)) < 1e-5


def test_same_nll_as_without_statistics(tmp_path, syn_tokenizer):
    """Statistics are tallied beside the attention, which computes what it
    computes without them: the same blocks, the same NLL to the last digit.
    The file gets a new file's permissions, and no temporary is left beside
    it."""
    ckpt, _, _ = sharpened_model(tmp_path, seed=24)
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    base = json.loads(run_ok(ckpt, "-z", syn_tokenizer, "-m", "ppl", "-f", text, "--ctx", "64", "--json").stdout)
    got, stats = attn_stats(ckpt, syn_tokenizer, text, 64, [], tmp_path / "stats.json")
    assert got["tokens"] == base["tokens"] == stats["queries"]
    assert got["nll"] == base["nll"]
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE((tmp_path / "stats.json").stat().st_mode) == 0o666 & ~umask  # as a new file's
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.bin", "plain.bin", "stats.json", "text.txt"]


@pytest.mark.parametrize("args, code, needles", [
    (["-m", "generate", "-i", "the", "--attn-stats", "OUT"], 2, ["--attn-stats"]),
    (["-m", "ppl", "-f", "TEXT", "--attn-stats", "OUT", "--save-logits", "OUT"], 2, ["--attn-stats"]),
    (["-m", "ppl", "-f", "TEXT", "--attn-stats", "DIR"], 1, ["--attn-stats"]),
    (["-m", "ppl", "-f", "TEXT", "--attn-stats", "TEXT"], 1, ["--attn-stats"]),
    (["-m", "ppl", "-f", "TEXT", "--attn-stats", "DIR/missing/out.json"], 1, ["--attn-stats"]),
])
def test_bad_flags(args, code, needles, tmp_path, syn_tokenizer):
    """Refused in one line naming the flag: another mode, the --save-logits
    path, a directory, an input of the run, a folder that does not exist.
    Nothing is left behind."""
    ckpt, _, _ = make_model(tmp_path)
    (tmp_path / "text.txt").write_text(TEXT)
    subst = {"OUT": tmp_path / "out.json", "TEXT": tmp_path / "text.txt", "DIR": tmp_path}
    args = [str(subst.get(a, a)).replace("DIR", str(tmp_path)) for a in args]
    before = sorted(tmp_path.iterdir())
    check_error(run(ckpt, "-z", syn_tokenizer, *args), code, needles)
    assert sorted(tmp_path.iterdir()) == before


def test_failed_run_leaves_no_file(tmp_path, syn_tokenizer):
    """A run that fails after the statistics' file was opened (a --save-logits
    path that is a directory is refused after it) leaves neither file nor its
    temporary behind."""
    ckpt, _, _ = make_model(tmp_path)
    (tmp_path / "text.txt").write_text(TEXT)
    (tmp_path / "dir").mkdir()
    before = sorted(tmp_path.iterdir())
    check_error(run(ckpt, "-z", syn_tokenizer, "-m", "ppl", "-f", tmp_path / "text.txt", "--attn-stats",
                    tmp_path / "out.json", "--save-logits", tmp_path / "dir"), 1, ["--save-logits"])
    assert sorted(tmp_path.iterdir()) == before
