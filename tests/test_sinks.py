"""Attention sinks (--sinks n, StreamingLLM): a rolling cache of --ctx tokens
that keeps its first n tokens and evicts the oldest of the rest, every key
rotated at its place in the cache (keys.c cache_slot / cache_place, docs/rope.md
§13).

The reference is a float64 numpy forward pass written here step by step with
the same eviction and position rule: each token's key and value are computed
once, when it arrives, given what the cache then holds; keys are stored
unrotated and rotated at their current place for every query; the query sits
at the newest place. It uses tests/reference/forward.py's model arrays,
rmsnorm and rotation. `run -m ppl --streaming` must give the same NLL on a text three
times the cache size (NLL_TOL 1e-4 on the mean, as tests/test_forward.py:
float32 against float64), for n = 4 and n = 0 (a plain sliding window) and
both layouts. Also: generation past --ctx with sinks runs to -n, and the flag
combinations that make no sense are refused.
"""

import json
import math

import numpy as np
import pytest

from conftest import TEXT, check_error, make_model, run, run_ok, tokenize
from reference.forward import Reference, apply_rope, rmsnorm, rope_cos_sin

NLL_TOL = 1e-4


def _softmax(x):
    x = x - x.max()
    e = np.exp(x)
    return e / e.sum()


def streaming_nll(ref, tokens, n_ctx, sinks):
    """NLL of tokens[1:] fed one by one through the rolling cache."""
    R = n_ctx - sinks
    w, nh, nkv, hs = ref.w, ref.n_heads, ref.n_kv_heads, ref.head_size
    n_layers = w["wq"].shape[0]
    K = np.zeros((n_layers, n_ctx, nkv, hs))
    V = np.zeros((n_layers, n_ctx, nkv, hs))
    cos, sin = rope_cos_sin(n_ctx, ref.rot_dim, ref.base)
    out = []
    for p, tok in enumerate(tokens[:-1]):
        slot = p if p < n_ctx else sinks + (p - sinks) % R
        n = min(p + 1, n_ctx)

        def place(j):
            if p < n_ctx or j < sinks:
                return j
            return n_ctx - 1 - (slot - j) % R

        places = np.array([place(j) for j in range(n)])
        x = w["token_embedding"][tok]
        for l in range(n_layers):
            h = rmsnorm(x, w["rms_att_weight"][l], ref.eps)
            q = (w["wq"][l] @ h).reshape(1, nh, hs)
            K[l, slot] = (w["wk"][l] @ h).reshape(nkv, hs)
            V[l, slot] = (w["wv"][l] @ h).reshape(nkv, hs)
            q = apply_rope(q, cos[[place(slot)]], sin[[place(slot)]], ref.rot_dim, ref.layout)[0]
            k = apply_rope(K[l, :n], cos[places], sin[places], ref.rot_dim, ref.layout)
            att = np.empty((nh, hs))
            for head in range(nh):
                kv = head // (nh // nkv)
                weights = _softmax(k[:, kv, :] @ q[head] / math.sqrt(hs))
                att[head] = weights @ V[l, :n, kv, :]
            x = x + w["wo"][l] @ att.reshape(-1)
            h = rmsnorm(x, w["rms_ffn_weight"][l], ref.eps)
            x = x + w["w2"][l] @ ((lambda a: a / (1 + np.exp(-a)))(w["w1"][l] @ h) * (w["w3"][l] @ h))
        logits = ref.wcls @ rmsnorm(x, w["rms_final_weight"], ref.eps)
        m = logits.max()
        out.append(m + math.log(np.exp(logits - m).sum()) - logits[tokens[p + 1]])
    return np.array(out)


@pytest.mark.parametrize("sinks, layout", [(4, "interleaved"), (0, "interleaved"), (4, "neox")])
def test_streaming_matches_reference(sinks, layout, tmp_path, syn_tokenizer):
    ckpt, cfg, tensors = make_model(tmp_path, seed=5, n_heads=4, n_kv_heads=2, seq_len=32,
                                    rope_layout=layout)
    ctx = 24
    text = tmp_path / "text.txt"
    text.write_text(TEXT[:110])
    ids = tokenize(ckpt, syn_tokenizer, TEXT[:110])  # BOS first
    assert len(ids) > 3 * ctx
    got = json.loads(run_ok(ckpt, "-z", syn_tokenizer, "-m", "ppl", "-f", text, "--ctx", str(ctx),
                            "--sinks", str(sinks), "--streaming", "--json", "--per-position").stdout)
    want = streaming_nll(Reference(cfg, tensors), ids, ctx, sinks)
    assert got["streaming"] is True and got["sinks"] == sinks and got["tokens"] == len(want)
    assert abs(got["nll"] - want.mean()) < NLL_TOL, (got["nll"], want.mean())
    per_pos = got["per_position"]  # by absolute position: token p + 1 at index p + 1
    assert per_pos[0] is None and len(per_pos) == len(ids)
    assert np.max(np.abs(np.array(per_pos[1:]) - want)) < 1e-3
    # the bucket past the cache holds only tokens scored after eviction started
    last = got["buckets"][-1]
    assert last["end"] == len(ids) and last["start"] >= ctx


def test_streaming_equals_plain_ppl_within_the_cache(tmp_path, syn_tokenizer):
    """While the text fits in the cache nothing is evicted: streaming gives
    plain ppl's numbers."""
    ckpt, _, _ = make_model(tmp_path, seed=6, seq_len=64)
    text = tmp_path / "short.txt"
    text.write_text(TEXT[:40])
    args = [ckpt, "-z", syn_tokenizer, "-m", "ppl", "-f", text, "--ctx", "64", "--json"]
    plain = json.loads(run_ok(*args).stdout)
    stream = json.loads(run_ok(*args, "--sinks", "4", "--streaming").stdout)
    assert plain["tokens"] == stream["tokens"]
    assert abs(plain["nll"] - stream["nll"]) < 1e-5


def test_generation_runs_past_the_cache(tmp_path, syn_tokenizer):
    ckpt, _, _ = make_model(tmp_path, seed=7, seq_len=32)
    p = run_ok(ckpt, "-z", syn_tokenizer, "--ctx", "16", "--sinks", "4", "-n", "60", "--ignore-eos",
               "-s", "1", "-i", "the cat")
    assert "+ 60 new tokens" in p.stderr.decode(), p.stderr
    p = run_ok(ckpt, "-z", syn_tokenizer, "--ctx", "16", "-n", "60", "--ignore-eos", "-s", "1", "-i",
               "the cat")
    err = p.stderr.decode()
    assert "the context of 16 tokens is full" in err and "--sinks" in err, err


@pytest.mark.parametrize("args, needles", [
    (["--ctx", "16", "--sinks", "16", "-n", "1"], ["--sinks 16", "16 tokens of the cache"]),
    (["--sinks", "2", "--self-extend", "2", "4", "-n", "1"], ["--sinks", "--self-extend"]),
    (["-m", "ppl", "--streaming"], ["--streaming", "--sinks"]),
    (["--sinks", "2", "--streaming", "-n", "1"], ["--streaming", "-m ppl"]),
    (["--sinks", "-1"], ["--sinks -1"]),
    (["-m", "ppl", "--sinks", "4"], ["--sinks", "--streaming"]),
    (["-m", "chat", "--sinks", "4"], ["--sinks"]),
    (["-m", "tokenize", "--sinks", "4"], ["--sinks"]),
])
def test_bad_flags(args, needles, tmp_path, syn_tokenizer):
    ckpt, _, _ = make_model(tmp_path, seed=8, seq_len=32)
    text = tmp_path / "t.txt"
    text.write_text(TEXT[:50])
    extra = ["-f", str(text)] if "-m" in args else []
    check_error(run(ckpt, "-z", syn_tokenizer, *args, *extra), 2, needles)
