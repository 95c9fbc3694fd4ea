"""tools/finetune.py against run: the RoPE it trains with, the checkpoint it writes.

- RoPE: for every method the fine-tune offers (none with a larger base, linear, ntk,
  yarn), its inverse frequencies per pair and its magnitude (YaRN's attention factor,
  1 for the others) equal `./run CKPT --ctx E --rope-scaling M --rope-factor k -m rope
  --json` on the bundled model. Both compute in double with the same formulas (run.c's
  rope_frequencies, docs/rope.md section 8), so they agree to float rounding:
  REL_TOL is a few units in the last place of a double, room for another libm.
- A 2-step fine-tune of the bundled model (batch 1, one training book, yarn at
  E = 1024 = 4L) writes a checkpoint that run loads with its scaling and no flags
  (-m rope, -m info, the load line), and `./run OUT/model.bin -m ppl -f EXCERPT` gives
  the NLL finetune.py computed on the same windows within NLL_TOL.
- The same seed and thread count give the same model.bin, byte for byte.
- The retrieval model keeps its passkey mix: a 1-step run with --passkey-mix logs the
  answer tokens' NLL.
- Bad flags and checkpoints: one line, exit 2 (usage) or 1 (input).

Needs the books of ../shared (or $SHARED_DIR); skipped with a message without them.
"""
import argparse
import json
import subprocess
import sys

import pytest

from conftest import HANG_GUARD_S, ROOT, SHARED, run_ok

sys.path.insert(0, str(ROOT / "tools"))
import finetune  # noqa: E402  (tools/finetune.py)
import prepare_data  # noqa: E402

BUNDLED = ROOT / "models" / "model.bin"
RETRIEVAL = ROOT / "models" / "retrieval" / "model.bin"
TOKENIZER = ROOT / "models" / "tokenizer.model"
BOOK = "cranford"  # a small training book: the stream encodes in about a second
REL_TOL = 1e-14
# Why 1e-5 nats/token: torch and run both evaluate in float32, in different summation
# orders (measured difference 1.2e-7 on this excerpt); the fine-tuned weights evaluated
# without YaRN's magnitude, or with it applied twice, move the mean NLL by 0.016 and 0.029.
NLL_TOL = 1e-5

# (method, --rope-factor or None for finetune's default, the factor run is given, --rope-theta, E)
ROPE_CASES = [
    ("none", None, None, None, 1024),
    ("none", None, None, 40000.0, 1024),
    ("linear", None, 4.0, None, 1024),
    ("linear", 2.5, 2.5, None, 640),
    ("ntk", None, 8.0, None, 1024),
    ("ntk", 3.0, 3.0, 20000.0, 512),
    ("yarn", None, 4.0, None, 1024),
    ("yarn", None, 16.0, None, 4096),
    ("yarn", 2.0, 2.0, 500000.0, 512),
]


def need_books():
    if not (SHARED / "data" / "books" / f"{BOOK}.txt").is_file():
        pytest.skip(f"{SHARED / 'data' / 'books'} not found (set SHARED_DIR to the shared folder)")


@pytest.mark.parametrize("method,ft_factor,run_factor,theta,ctx", ROPE_CASES)
def test_rope_equals_run(method, ft_factor, run_factor, theta, ctx):
    base, _ = finetune.load_base(str(BUNDLED))
    args = argparse.Namespace(seq_len=ctx, rope_scaling=method, rope_factor=ft_factor, rope_theta=theta)
    inv, mscale = finetune.rope_frequencies(finetune.finetuned_config(base, args))
    flags = ["--ctx", str(ctx), "--rope-scaling", method]
    flags += ["--rope-factor", str(run_factor)] if run_factor else []
    flags += ["--rope-base", str(theta)] if theta else []
    ref = json.loads(run_ok(BUNDLED, *flags, "-m", "rope", "--json").stdout)
    assert ref["scaling"] == method and len(inv) == len(ref["inv_freq"]) == 16
    assert inv == pytest.approx(ref["inv_freq"], rel=REL_TOL, abs=0)
    assert mscale == pytest.approx(ref["attn_factor"], rel=REL_TOL, abs=0)
    if method == "yarn":
        assert mscale > 1.0  # the case that exercises the magnitude


def finetune_cmd(out, cache, *extra):
    return [sys.executable, str(ROOT / "tools" / "finetune.py"), str(BUNDLED), "--seq-len", "1024",
            "--rope-scaling", "yarn", "--max-steps", "2", "--batch-size", "1", "--books", BOOK,
            "--cache-dir", str(cache), "--eval-every", "0", "--no-final-eval", "--threads", "1",
            "--out-dir", str(out), *extra]


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """Two identical 2-step fine-tunes (seed 1337, 1 thread): their output folders and the excerpt."""
    need_books()
    tmp = tmp_path_factory.mktemp("finetune")
    excerpt = tmp / "excerpt.txt"
    excerpt.write_text(prepare_data.excerpt_text(SHARED), encoding="utf-8")
    outs = []
    for name in ("a", "b"):
        p = subprocess.run(finetune_cmd(tmp / name, tmp / "cache", "--eval-text", str(excerpt)),
                           capture_output=True, text=True, timeout=HANG_GUARD_S)
        assert p.returncode == 0, p.stderr[-3000:]
        assert "step     2/2 | loss" in p.stderr  # progress on stderr
        outs.append(tmp / name)
    return outs, excerpt


def test_checkpoint_carries_its_scaling(two_runs):
    (out, _), _ = two_runs
    model = out / "model.bin"
    rope = json.loads(run_ok(model, "-m", "rope", "--json").stdout)
    assert (rope["scaling"], rope["factor"], rope["orig_ctx"], rope["ctx"], rope["base"]) == ("yarn", 4, 256, 1024,
                                                                                              10000)
    summary = json.loads((out / "summary.json").read_text())
    assert rope["attn_factor"] == pytest.approx(summary["rope"]["mscale"], rel=REL_TOL)
    info = json.loads(run_ok(model, "-m", "info", "--json").stdout)
    assert info["train_ctx"] == 1024
    assert {k: info["rope"][k] for k in ("scaling", "factor", "orig_ctx", "theta")} == \
        dict(scaling="yarn", factor=4, orig_ctx=256, theta=10000)
    load_line = run_ok(model, "-n", "4", "-i", "It was").stderr.decode()
    assert "train_ctx 1024" in load_line and "scaling yarn (factor 4, orig_ctx 256" in load_line
    assert (out / "loss.png").stat().st_size > 0 and (out / "tokenizer.bin").is_file()
    assert model.read_bytes()[256:] != BUNDLED.read_bytes()[256:]  # the weights were trained


def test_ppl_equals_finetune_evaluation(two_runs):
    (out, _), excerpt = two_runs
    ours = json.loads((out / "summary.json").read_text())["eval_text"]
    theirs = json.loads(run_ok(out / "model.bin", "-m", "ppl", "-f", excerpt, "--json").stdout)
    assert theirs["ctx"] == ours["ctx"] == 1024 and theirs["scaling"] == "yarn"
    assert (theirs["tokens"], theirs["windows"]) == (ours["tokens"], ours["windows"])
    assert theirs["nll"] == pytest.approx(ours["nll"], abs=NLL_TOL)


def test_same_seed_and_threads_same_bytes(two_runs):
    (a, b), _ = two_runs
    for name in ("model.bin", "tokenizer.bin"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_retrieval_keeps_passkey_mix(tmp_path):
    need_books()
    finetune.main([str(RETRIEVAL), "--tokenizer", str(TOKENIZER), "--seq-len", "512", "--rope-scaling", "linear",
                   "--max-steps", "1", "--batch-size", "2", "--passkey-mix", "0.5", "--passkey-answer-weight", "8",
                   "--passkey-eval", "0", "--books", BOOK, "--cache-dir", str(tmp_path / "cache"),
                   "--eval-every", "0", "--no-final-eval", "--threads", "1", "--out-dir", str(tmp_path / "out")])
    recs = [json.loads(line) for line in (tmp_path / "out" / "log.jsonl").read_text().splitlines()]
    assert any("answer_nll" in r for r in recs)  # a passkey window was in the batch
    info = json.loads(run_ok(tmp_path / "out" / "model.bin", "-m", "info", "--json").stdout)
    assert (info["rope"]["scaling"], info["rope"]["factor"], info["train_ctx"]) == ("linear", 2, 512)


def test_save_at_is_the_shorter_run(tmp_path):
    """--save-at 2 of a 3-step run with a constant rate (--min-lr-ratio 1, no warmup) writes the
    bytes a 2-step run writes; with the default cosine decay the rate of step 2 depends on
    --max-steps, and the bytes differ (so the equality is the schedule's, not an accident)."""
    need_books()
    flat = ["--warmup", "0", "--min-lr-ratio", "1"]
    runs = {"three": flat + ["--max-steps", "3", "--save-at", "2"], "two": flat,
            "cosine": ["--warmup", "0", "--max-steps", "3", "--save-at", "2"]}
    for name, extra in runs.items():
        # finetune_cmd runs 2 steps; a later --max-steps replaces that
        p = subprocess.run(finetune_cmd(tmp_path / name, tmp_path / "cache", *extra), capture_output=True, text=True, timeout=HANG_GUARD_S)
        assert p.returncode == 0, p.stderr[-3000:]
    saved = (tmp_path / "three" / "step-2" / "model.bin").read_bytes()
    assert saved == (tmp_path / "two" / "model.bin").read_bytes()
    assert (tmp_path / "cosine" / "step-2" / "model.bin").read_bytes() != saved
    assert (tmp_path / "three" / "model.bin").read_bytes() != saved  # the third step moved it
    rope = json.loads(run_ok(tmp_path / "three" / "step-2" / "model.bin", "-m", "rope", "--json").stdout)
    assert (rope["scaling"], rope["factor"], rope["ctx"]) == ("yarn", 4, 1024)


@pytest.mark.parametrize("flags,code,words", [
    (["--rope-scaling", "none", "--rope-factor", "2"], 2, "--rope-factor 2: --rope-scaling none takes no factor"),
    (["--rope-scaling", "linear", "--rope-factor", "0.5"], 2, "--rope-factor 0.5: expected a finite value >= 1"),
    (["--rope-scaling", "yarn", "--seq-len", "128"], 2, "--rope-factor 0.5"),
    (["--rope-scaling", "ntk", "--books", "moby_dick"], 2, "--books moby_dick: not a training book"),
    (["--rope-scaling", "dynamic"], 2, "argument --rope-scaling: invalid choice: 'dynamic'"),
    (["--rope-scaling", "ntk", "--passkey-mix", "2"], 2, "--passkey-mix 2.0: expected a fraction in [0, 1]"),
    (["--rope-scaling", "yarn", "--max-steps", "50", "--save-at", "50"], 2, "--save-at 50: expected a step in 1..49"),
])
def test_bad_flags(flags, code, words, tmp_path, capsys):
    need_books()
    argv = [str(BUNDLED), "--seq-len", "512", "--out-dir", str(tmp_path)] + flags
    with pytest.raises(SystemExit) as e:
        finetune.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == code and len(err) == 1 and words in err[0], err


def test_scaled_checkpoint_is_refused(tmp_path, capsys):
    """A checkpoint that already has a scaling (a fine-tune's own output) is not a base."""
    import export
    cfg, tensors = export.read_checkpoint(BUNDLED)
    scaled = tmp_path / "scaled.bin"
    export.write_checkpoint(scaled, dict(cfg, rope_scaling="linear", rope_factor=2.0), tensors)
    with pytest.raises(SystemExit) as e:
        finetune.main([str(scaled), "--seq-len", "512", "--rope-scaling", "yarn", "--out-dir", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 1 and len(err) == 1 and f"{scaled}: rope_scaling linear" in err[0], err
