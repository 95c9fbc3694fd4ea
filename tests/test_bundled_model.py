"""The bundled default model (models/): it loads, it generates, and it still is
the model the card describes.

- models/ holds model.bin, tokenizer.bin, tokenizer.model and README.md, at
  most 16 MiB in all.
- `run models/model.bin -t 0 -n 64 -i "It was"` exits 0 and prints the prompt
  and a continuation (the tokenizer is found beside the checkpoint).
- Held-out NLL: tools/prepare_data.py cuts a fixed excerpt (6,000 characters)
  of Pride and Prejudice, a book neither the model nor its tokenizer saw;
  `run -m ppl --ctx 256` must score it within NLL_BOUND of EXPECTED_NLL, the
  value measured when the model was trained (torch gives the same to 1e-6).
  Needs ../shared (or $SHARED_DIR); skipped with a message without it.
- The greedy continuation is mostly real words: at least 85% of its words
  occur in the training books (needs ../shared as well).
- The retrieval-trained model (models/retrieval/, its card beside it) shares
  the bundled tokenizer byte for byte and finds the passkey at its training
  length: at least 95% of 20 prompts of 247 tokens (4 keys at each of 5
  depths), with the fixed filler and with the held-out excerpt as filler (the
  latter needs ../shared). Measured: 200/200 with 40 keys per depth; the bar
  is the one the model was trained to meet.

Paths: ROOT = this file's parent's parent; SHARED = $SHARED_DIR or
ROOT/../shared; RUN = $RUN or ROOT/run.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("SHARED_DIR") or ROOT.parent / "shared")
RUN = Path(os.environ.get("RUN") or ROOT / "run")
MODELS = ROOT / "models"

sys.path.insert(0, str(ROOT / "tools"))
import prepare_data  # noqa: E402  (tools/prepare_data.py: the cleaning and the excerpt)

# Measured on the committed model (see models/README.md): mean NLL in nats per
# token of the excerpt (1,663 tokens), `run -m ppl --ctx 256`; torch's
# evaluation in tools/training/ (train.py) gives 3.8576594.
EXPECTED_NLL = 3.857659
# Why 0.02 nats: float32 summation order differs between compilers, -march,
# batching and OpenMP thread counts, which moves this mean by about 1e-6 (torch
# and run agree to 4e-7); a different checkpoint, a tokenizer out of step with
# it, or a broken forward pass moves it by far more (the same run 1,100 steps
# earlier scored 4.213 here, an untrained model ~8.3). 0.02 is loose for the
# first kind and tight for the second.
NLL_BOUND = 0.02
MAX_MODELS_BYTES = 16 * 2**20
RETRIEVAL = MODELS / "retrieval"
RETRIEVAL_MIN_ACCURACY = 0.95


def run(*args, timeout=60, threads=None):
    if not RUN.is_file() or not os.access(RUN, os.X_OK):
        pytest.fail(f"{RUN} is missing: build it with `make` (or set RUN=/path/to/run)", pytrace=False)
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "2")
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    p = subprocess.run([str(RUN)] + [str(a) for a in args], capture_output=True, timeout=timeout, env=env)
    assert p.returncode == 0, f"run {args} exited {p.returncode}: {p.stderr.decode(errors='replace')[-1500:]}"
    return p


def need_shared():
    books = SHARED / "data" / "books"
    if not (books / prepare_data.EXCERPT_BOOK).is_file():
        pytest.skip(f"{books / prepare_data.EXCERPT_BOOK} not found: the held-out checks need the "
                    "shared data (set SHARED_DIR to the shared folder)")


def test_models_folder_complete_and_small():
    for name in ("model.bin", "tokenizer.bin", "tokenizer.model", "README.md", "loss.png"):
        assert (MODELS / name).is_file(), f"models/{name} is missing"
    # what the repository ships: models/smollm2/ is `make smollm2`'s download, ignored by git
    total = sum(p.stat().st_size for p in MODELS.rglob("*")
                if p.is_file() and "smollm2" not in p.relative_to(MODELS).parts)
    assert total <= MAX_MODELS_BYTES, f"models/ holds {total} bytes, over 16 MiB"


def test_loads_and_generates():
    prompt = "It was"
    out = run(MODELS / "model.bin", "-t", "0", "-n", "64", "-i", prompt).stdout.decode("utf-8")
    assert out.startswith(prompt), out
    assert len(out.strip()) > len(prompt) + 100, f"too little text: {out!r}"


def test_greedy_text_is_mostly_words():
    need_shared()
    out = run(MODELS / "model.bin", "-t", "0", "-n", "200", "-i", "It was").stdout.decode("utf-8")
    train, _ = prepare_data.book_paths(SHARED)
    vocab = set()
    for p in train:
        vocab.update(w.lower() for w in re.findall(r"[A-Za-z]+", prepare_data.clean_book(p)))
    words = [w.lower() for w in re.findall(r"[A-Za-z]+", out)]
    assert len(words) >= 30, out
    frac = sum(w in vocab for w in words) / len(words)
    assert frac >= 0.85, f"{frac:.0%} dictionary words in {out!r}"


def test_heldout_excerpt_nll(tmp_path):
    need_shared()
    assert EXPECTED_NLL is not None
    excerpt = tmp_path / "excerpt.txt"
    excerpt.write_text(prepare_data.excerpt_text(SHARED), encoding="utf-8")
    p = run(MODELS / "model.bin", "-m", "ppl", "-f", excerpt, "--ctx", "256", "--json")
    res = json.loads(p.stdout)
    assert res["tokens"] > 1000, res
    assert abs(res["nll"] - EXPECTED_NLL) <= NLL_BOUND, \
        f"held-out NLL {res['nll']:.5f}, expected {EXPECTED_NLL:.5f} +- {NLL_BOUND}"


def passkey_accuracy(*filler):
    """run -m passkey on the retrieval model, 4 keys at each default depth: (correct, trials).
    One thread: a 247-token prompt of this model is a few milliseconds, less than
    a second thread costs to wake, and far less on a loaded machine."""
    p = run(RETRIEVAL / "model.bin", "-m", "passkey", "--trials", "4", "--json", *filler, threads=1)
    cells = json.loads(p.stdout)["cells"]
    assert [c["depth"] for c in cells] == [0, 0.25, 0.5, 0.75, 1], cells
    return sum(c["correct"] for c in cells), sum(len(c["trials"]) for c in cells)


def test_retrieval_model_files_and_tokenizer():
    for name in ("model.bin", "tokenizer.bin", "README.md"):
        assert (RETRIEVAL / name).is_file(), f"models/retrieval/{name} is missing"
    assert (RETRIEVAL / "model.bin").stat().st_size <= 8 * 2**20
    assert (RETRIEVAL / "tokenizer.bin").read_bytes() == (MODELS / "tokenizer.bin").read_bytes(), \
        "models/retrieval/tokenizer.bin differs from models/tokenizer.bin"


def test_retrieval_model_finds_the_key_with_fixed_filler():
    correct, n = passkey_accuracy()
    assert n == 20 and correct >= RETRIEVAL_MIN_ACCURACY * n, f"{correct}/{n} keys found"


def test_retrieval_model_finds_the_key_in_heldout_text(tmp_path):
    need_shared()
    excerpt = tmp_path / "excerpt.txt"
    excerpt.write_text(prepare_data.excerpt_text(SHARED), encoding="utf-8")
    correct, n = passkey_accuracy("-f", excerpt)
    assert n == 20 and correct >= RETRIEVAL_MIN_ACCURACY * n, f"{correct}/{n} keys found in held-out filler"
