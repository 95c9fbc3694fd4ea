"""-m ppl --save-logits / --kl-base: comparing a run with a saved baseline.

The baseline file holds every scored token's logits; a second run reports the
mean KL divergence KL(base || run), the mean NLL difference and the top-1
agreement. Checked here: a run against itself (exactly 0, 0 and 1: the same
binary computes the same float32 logits); two different random models
against a float64 numpy computation from tests/reference/forward.py's
forward pass (tolerance 1e-4 nats: run's float32 logits differ from float64 by ~1e-6
relative, and KL and delta NLL are smooth in them); the file layout; and bad
baselines (another ctx, another text, a truncated or foreign file), each a
one-line error that leaves no file behind when saving.
"""

import json
import struct

import numpy as np
import pytest

from conftest import TEXT, check_error, make_model, run, run_ok, tokenize
from reference.forward import Reference


@pytest.fixture(scope="module")
def setup(tmp_path_factory, syn_tokenizer):
    d = tmp_path_factory.mktemp("kl")
    a = make_model(d, "a.bin", seed=1, seq_len=64)
    b = make_model(d, "b.bin", seed=2, seq_len=64)
    text = d / "text.txt"
    text.write_text(TEXT[:300])
    return d, a, b, text


def ppl(ckpt, tok, text, *args):
    return json.loads(run_ok(ckpt, "-z", tok, "-m", "ppl", "-f", text, "--ctx", "256", "--json",
                             *args).stdout)


def test_self_comparison_is_exact(setup, syn_tokenizer):
    d, (a, _, _), _, text = setup
    base = d / "self.logits"
    first = ppl(a, syn_tokenizer, text, "--save-logits", base)
    r = ppl(a, syn_tokenizer, text, "--kl-base", base)
    k = r["kl_base"]
    assert k["tokens"] == first["tokens"] == r["tokens"]
    assert k["kl"] == 0 and k["delta_nll"] == 0 and k["top1"] == 1
    assert r["nll"] == first["nll"]


def test_two_models_against_float64(setup, syn_tokenizer):
    d, (a, cfg_a, w_a), (b, cfg_b, w_b), text = setup
    base = d / "a.logits"
    ppl(a, syn_tokenizer, text, "--save-logits", base)
    r = ppl(b, syn_tokenizer, text, "--kl-base", base)["kl_base"]
    ids = tokenize(a, syn_tokenizer, TEXT[:300])  # BOS first; one window (ctx 256)
    assert len(ids) <= 256
    la = Reference(cfg_a, w_a).logits(ids)[:-1]
    lb = Reference(cfg_b, w_b).logits(ids)[:-1]

    def log_softmax(x):
        x = x - x.max(axis=1, keepdims=True)
        return x - np.log(np.exp(x).sum(axis=1, keepdims=True))

    pa, pb = log_softmax(la), log_softmax(lb)
    target = np.array(ids[1:])
    rows = np.arange(len(target))
    kl = (np.exp(pa) * (pa - pb)).sum(axis=1)
    dnll = -pb[rows, target] + pa[rows, target]
    top1 = (la.argmax(axis=1) == lb.argmax(axis=1)).mean()
    assert r["tokens"] == len(target)
    assert abs(r["kl"] - kl.mean()) < 1e-4 and kl.mean() > 0.01, (r["kl"], kl.mean())
    assert abs(r["delta_nll"] - dnll.mean()) < 1e-4, (r["delta_nll"], dnll.mean())
    assert r["kl_se"] == pytest.approx(kl.std(ddof=1) / np.sqrt(len(kl)), rel=1e-2)
    assert r["top1"] == pytest.approx(top1, abs=1.5 / len(target))  # a near-tie may flip one token


def test_file_layout(setup, syn_tokenizer):
    d, (a, cfg, _), _, text = setup
    base = d / "layout.logits"
    r = ppl(a, syn_tokenizer, text, "--save-logits", base)
    data = base.read_bytes()
    magic, version, vocab, ctx, stride, add_bos, n = struct.unpack_from("<4siiiiiq", data)
    assert (magic, version, vocab, ctx, stride, add_bos) == (b"LLOG", 1, cfg["vocab_size"], 256, 255, 1)
    assert n == r["tokens"] and len(data) == 64 + n * (4 + 4 * vocab)
    assert struct.unpack_from("<ii", data, 32) == (0, -1)  # not streaming, no sinks
    assert data[40:64] == bytes(24)
    ids = tokenize(a, syn_tokenizer, TEXT[:300])
    first = struct.unpack_from("<i", data, 64)[0]
    assert first == ids[1]  # the first record predicts the first text token
    assert not (d / "layout.logits.tmp").exists()


def test_bad_baselines(setup, syn_tokenizer, tmp_path):
    d, (a, _, _), _, text = setup
    base = d / "bad_base.logits"
    ppl(a, syn_tokenizer, text, "--save-logits", base)
    args = [a, "-z", syn_tokenizer, "-m", "ppl", "-f", text]
    check_error(run(*args, "--ctx", "64", "--kl-base", base), 1, ["saved with ctx 256, this run has 64"])
    other = tmp_path / "other.txt"
    other.write_text(TEXT[300:600])
    check_error(run(*args[:-1], other, "--ctx", "256", "--kl-base", base), 1, ["another text"])
    data = base.read_bytes()
    cut = tmp_path / "cut.logits"
    cut.write_bytes(data[:-10])
    check_error(run(*args, "--ctx", "256", "--kl-base", cut), 1, [str(cut), "bytes, expected"])
    foreign = tmp_path / "foreign.logits"
    foreign.write_bytes(b"\0" * 100)
    check_error(run(*args, "--ctx", "256", "--kl-base", foreign), 1, ["not a logits file"])
    check_error(run(*args, "--ctx", "256", "--kl-base", tmp_path / "missing"), 1, ["missing"])
    # a failing run that was also saving leaves nothing behind
    out = tmp_path / "new.logits"
    check_error(run(*args, "--ctx", "64", "--kl-base", base, "--save-logits", out), 1, ["ctx"])
    assert not out.exists() and not (tmp_path / "new.logits.tmp").exists()
    check_error(run(*args[:-1], other, "--ctx", "256", "--kl-base", base, "--save-logits", out), 1,
                ["another text"])
    assert not out.exists() and not (tmp_path / "new.logits.tmp").exists()
    check_error(run(*args, "--save-logits", tmp_path / "no" / "dir.logits"), 1, ["--save-logits"])
    check_error(run(a, "-z", syn_tokenizer, "-i", "x", "--kl-base", base), 2, ["--kl-base", "-m ppl"])
    # a baseline scored another way (streamed through a rolling cache) is refused
    check_error(run(*args, "--ctx", "256", "--sinks", "4", "--streaming", "--kl-base", base), 1,
                ["saved with streaming 0, this run has 1"])
    streamed = tmp_path / "streamed.logits"
    run_ok(*args, "--ctx", "256", "--sinks", "4", "--streaming", "--save-logits", streamed)
    check_error(run(*args, "--ctx", "256", "--kl-base", streamed), 1, ["saved with streaming 1, this run has 0"])
    r = json.loads(run_ok(*args, "--ctx", "256", "--sinks", "4", "--streaming", "--json", "--kl-base",
                          streamed).stdout)
    assert r["kl_base"]["kl"] == 0 and r["kl_base"]["top1"] == 1
