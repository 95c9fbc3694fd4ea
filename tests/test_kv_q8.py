"""The q8_0 KV cache (--kv q8_0): blocks of 32 values along each cache row,
one float32 scale each (kernels.h). The kernels against a float64 reference
are in tests/test_kernels.c (test_kv_q8, and test_attention_block's q8_0
cases); the fast build against the reference build with every key strategy in
tests/test_reference.py. Here: what a user sees.

Bounds, and why:
- Threads: every output is computed by the same code whatever the thread
  count (kernels.h), so 1 and 4 threads give the same bytes, generation and
  ppl's saved logits alike.
- NLL at 4x the training context: a value comes back within scale / 2 =
  max|x| / 254 of its block's largest value; on the bundled model that
  moves the NLL by at most 0.003% at 4x with any scaling method on 16,383
  tokens of held-out text (docs/long-context.md, "A q8_0 KV cache"). The
  bound is the issue's 0.5% of the float32 cache's NLL; the NLL must also
  differ (the cache is really quantized).
"""
import json
import re

import pytest

from conftest import ROOT, TEXT, check_error, make_model, run, run_ok, run_ppl

BUNDLED = ROOT / "models" / "model.bin"
BUNDLED_TOK = ROOT / "models" / "tokenizer.bin"


def test_threads_give_the_same_bytes(tmp_path, syn_tokenizer):
    """Generation and ppl's logits with a q8_0 cache: --threads 1 and 4 agree
    bit for bit (a prompt of several blocks, and single tokens after it)."""
    ckpt, _, _ = make_model(tmp_path, seed=3, dim=128, hidden_dim=192, n_heads=8, n_kv_heads=2, seq_len=256)
    prompt = TEXT * 2
    outs = [run_ok(ckpt, "-z", syn_tokenizer, "-t", "0", "-n", "60", "-i", prompt, "--kv", "q8_0", "--threads", n,
                   "--ctx", "1024").stdout for n in ("1", "4")]
    assert outs[0] == outs[1] and len(outs[0]) > len(prompt)
    text = tmp_path / "text.txt"
    text.write_text(TEXT * 6)
    logits = []
    for n in ("1", "4"):
        path = tmp_path / f"t{n}.logits"
        run_ok(ckpt, "-z", syn_tokenizer, "-m", "ppl", "-f", text, "--ctx", "256", "--kv", "q8_0", "--threads", n,
               "--save-logits", path)
        logits.append(path.read_bytes())
    assert logits[0] == logits[1] and len(logits[0]) > 100_000


def test_bytes_per_position(tmp_path, syn_tokenizer):
    """-m info (text and JSON: the default run's cache, f32, and what each
    --kv would take), the load line and ppl's JSON state the cache type and
    its bytes per position: 2 layers x keys and values x kv_dim 64, 4 bytes
    each in float32, 36 per 32 in q8_0; the load line's MiB follow."""
    ckpt, _, _ = make_model(tmp_path)
    per_position = {"f32": 2 * 2 * 64 * 4, "f16": 2 * 2 * 64 * 2, "q8_0": 2 * 2 * 64 // 32 * 36}
    info = run_ok(ckpt, "-z", syn_tokenizer, "-m", "info").stdout.decode()
    assert "KV cache f32, 1024 bytes per position" in info, info
    assert "with --kv f32 1024, f16 512, q8_0 288\n" in info, info
    got = json.loads(run_ok(ckpt, "-z", syn_tokenizer, "-m", "info", "--json").stdout)
    assert (got["position"]["kv"], got["position"]["kv_bytes_per_position"]) == ("f32", 1024), got["position"]
    assert got["kv_cache_bytes_per_position"] == per_position, got
    for kv, want in per_position.items():
        err = run_ok(ckpt, "-z", syn_tokenizer, "-n", "1", "--ctx", "4096", "--kv", kv).stderr.decode()
        mib = re.search(rf"KV cache {kv}, {want} bytes per position, ([0-9.]+) MiB;", err)
        assert mib and float(mib.group(1)) == pytest.approx(want * 4096 / 2**20, abs=0.05), err
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    assert run_ppl(ckpt, syn_tokenizer, text, 32, extra=("--kv", "q8_0"))["position"]["kv_bytes_per_position"] == 288


@pytest.mark.parametrize("mode", [[], ["-m", "ppl", "-f", "TEXT"]])
def test_kv_dim_not_a_multiple_of_32_is_refused(tmp_path, syn_tokenizer, mode):
    """kv_dim 48 (2 kv heads of 24) cannot hold whole blocks: one line naming
    --kv, the expected and the actual value, exit 2 as other flag errors;
    f16 runs the same model, and -m info says q8_0 has no size there."""
    ckpt, _, _ = make_model(tmp_path, dim=96, hidden_dim=128, n_heads=4, n_kv_heads=2)
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    mode = [text if m == "TEXT" else m for m in mode]
    p = run(ckpt, "-z", syn_tokenizer, *mode, "--kv", "q8_0")
    check_error(p, 2, ["--kv q8_0"])
    first = p.stderr.decode().splitlines()[0]
    assert "multiple of 32" in first and "got 48" in first and "n_kv_heads 2 x head_size 24" in first, first
    run_ok(ckpt, "-z", syn_tokenizer, *mode, "--kv", "f16")
    info = run_ok(ckpt, "-z", syn_tokenizer, "-m", "info").stdout.decode()
    assert "q8_0 none (kv_dim 48 is no multiple of 32)" in info, info


@pytest.fixture(scope="module")
def window_text(tmp_path_factory):
    """One window of the bundled model's own card, about 4x its training
    context (256 tokens)."""
    path = tmp_path_factory.mktemp("q8-text") / "card.txt"
    path.write_bytes((ROOT / "models" / "README.md").read_bytes()[:2100])
    return path


METHODS = {
    "none": [],
    "linear": ["--rope-scaling", "linear", "--rope-factor", "4"],
    "ntk": ["--rope-scaling", "ntk", "--rope-factor", "8"],
    "dynamic-hf": ["--rope-scaling", "dynamic", "--rope-factor", "4"],
    "dynamic-exact": ["--rope-scaling", "dynamic", "--rope-factor", "4", "--rope-dynamic", "exact"],
    "yarn": ["--rope-scaling", "yarn", "--rope-factor", "4"],
    "llama3": ["--rope-scaling", "llama3", "--rope-factor", "4"],
    "self-extend": ["--self-extend", "8", "128"],
    "window": ["--window", "256"],
}


@pytest.mark.parametrize("method", list(METHODS))
def test_nll_at_4x_within_half_a_percent(window_text, method):
    """The bundled model at --ctx 1024 (4x its training context) in one window
    with each scaling method and key strategy: the q8_0 cache's NLL within
    0.5% of the float32 cache's, and not equal to it (the cache is really
    quantized)."""
    a = run_ppl(BUNDLED, BUNDLED_TOK, window_text, 1024, extra=METHODS[method])
    b = run_ppl(BUNDLED, BUNDLED_TOK, window_text, 1024, extra=METHODS[method] + ["--kv", "q8_0"])
    assert a["windows"] == 1 and a["tokens"] > 900, a["tokens"]
    assert 0 < abs(a["nll"] - b["nll"]) < 0.005 * a["nll"], (method, a["nll"], b["nll"])


def test_sinks_streamed_within_half_a_percent(window_text):
    """Attention sinks streaming the same text through a 256-token cache (the
    rolling cache overwrites q8_0 rows in place)."""
    flags = ["--sinks", "4", "--streaming"]
    a = run_ppl(BUNDLED, BUNDLED_TOK, window_text, 256, extra=flags)
    b = run_ppl(BUNDLED, BUNDLED_TOK, window_text, 256, extra=flags + ["--kv", "q8_0"])
    assert a["tokens"] > 900
    assert 0 < abs(a["nll"] - b["nll"]) < 0.005 * a["nll"], (a["nll"], b["nll"])
