"""Shared helpers for the Python end-to-end tests.

Paths (override with environment variables):
    ROOT    the repository (this file's parent's parent)
    SHARED  $SHARED_DIR, else ROOT/../shared (models and data; tests that need
            it are skipped with a message when it is absent)
    RUN     $RUN, else ROOT/run (point it at another build, e.g. a sanitizer one)

The binary runs with OMP_NUM_THREADS=2 unless the environment sets it.

Tests write only under pytest's tmp_path / tmp_path_factory.
"""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHARED = pathlib.Path(os.environ.get("SHARED_DIR") or ROOT.parent / "shared")
RUN = pathlib.Path(os.environ.get("RUN") or ROOT / "run")
MODELS = SHARED / "models"

sys.path.insert(0, str(ROOT))
import export  # noqa: E402  (ROOT must be on sys.path first)

# A guard against a hung process only; no test depends on how long anything takes.
HANG_GUARD_S = 300


def need_shared(*names):
    """Skip the calling test unless SHARED/models holds every file in names."""
    for name in names:
        if not (MODELS / name).is_file():
            pytest.skip(f"{MODELS / name} not found (set SHARED_DIR to the shared folder)")
    return [MODELS / n for n in names]


def run_bin():
    if not RUN.is_file() or not os.access(RUN, os.X_OK):
        pytest.fail(f"{RUN} is missing or not executable: build it with `make` "
                    "(or set RUN=/path/to/binary)", pytrace=False)
    return RUN


def run(*args, input=None):
    """Run the binary with args (str, bytes or paths). Returns CompletedProcess
    with bytes stdout/stderr. Fails the test on a hang or a signal."""
    cmd = [str(run_bin())] + [a if isinstance(a, bytes) else str(a) for a in args]
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "2")
    try:
        p = subprocess.run(cmd, capture_output=True, input=input, timeout=HANG_GUARD_S, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"hung for {HANG_GUARD_S} s: {cmd}")
    assert p.returncode >= 0, (f"killed by signal {-p.returncode}: {cmd}\n"
                               f"stderr: {p.stderr.decode(errors='replace')[-2000:]}")
    return p


def run_ok(*args):
    p = run(*args)
    assert p.returncode == 0, (f"exit {p.returncode}: {[str(a) for a in args]}\n"
                               f"stderr: {p.stderr.decode(errors='replace')[-2000:]}")
    return p


def tokenize(ckpt, tok, text):
    """Ids of text (BOS included) as `run -m tokenize` prints them."""
    p = run_ok(ckpt, "-z", tok, "-m", "tokenize", "-i", text)
    lines = p.stdout.decode().strip().splitlines()
    assert len(lines) == 1, f"tokenize printed {len(lines)} lines: {p.stdout[:300]!r}"
    return [int(t) for t in lines[0].split()]


def run_ppl(ckpt, tok, text_file, ctx, stride=None, extra=()):
    args = [ckpt, "-z", tok, "-m", "ppl", "-f", text_file, "--ctx", str(ctx), "--json"]
    if stride is not None:
        args += ["--stride", str(stride)]
    p = run_ok(*args, *extra)
    try:
        return json.loads(p.stdout.decode())
    except ValueError:
        pytest.fail(f"ppl --json printed no JSON object: {p.stdout[:500]!r}")


# ---------------------------------------------------------------------------
# A synthetic tokenizer: <unk>, BOS, EOS, the 256 byte tokens, then single
# characters and a few multi-character pieces with decreasing negative scores
# (higher merges first), in the same shape as the Llama 2 vocabulary.

SINGLE_CHARS = " etaonihsrdlucmwfgypbvk.,'\"!?Tx"
MERGES = ["th", "he", "in", "er", "an", " t", " a", "re", "on", "nd", " s", "ou", "ha",
          "at", " the", " and", "en", "ed", " w", "it"]


def synthetic_vocab():
    pieces = [b"<unk>", b"\n<s>\n", b"\n</s>\n"] + [b"<0x%02X>" % i for i in range(256)]
    scores = [0.0] * len(pieces)
    for i, s in enumerate(list(SINGLE_CHARS) + MERGES):
        pieces.append(s.encode())
        scores.append(-1.0 - i)
    assert len(set(pieces)) == len(pieces)
    return pieces, scores


SYN_PIECES, SYN_SCORES = synthetic_vocab()
SYN_VOCAB = len(SYN_PIECES)  # 310

# Text for perplexity: mostly vocabulary characters, with some byte-fallback
# ones (capitals, digits, newlines, a UTF-8 character).
TEXT = (
    "the cat sat on the mat and then the dog ran to the tree. she said, \"hi there!\" "
    "Then it went in and out, and the rain fell on the town.\n"
    "he had a red hat; she had 2 green ones. what is that? it is the end, or is it? "
    "\u00e9t\u00e9 was a word she knew. they walked to the sea and sat down in the sand.\n"
    "a bird sang in the wood while the wind blew over the hill and the sun went down."
)


@pytest.fixture(scope="session")
def syn_tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tokenizer.bin"
    export.write_tokenizer(path, SYN_PIECES, SYN_SCORES)
    return path


def model_config(**overrides):
    cfg = dict(dim=64, hidden_dim=96, n_layers=2, n_heads=4, n_kv_heads=4,
               vocab_size=SYN_VOCAB, seq_len=32)
    cfg.update(overrides)
    return export.normalize_config(cfg)


def make_model(directory, name="model.bin", seed=0, tensors=None, **overrides):
    """Write a random-weight checkpoint; returns (path, cfg, tensors)."""
    cfg = model_config(**overrides)
    if tensors is None:
        tensors = export.random_tensors(cfg, seed)
    path = pathlib.Path(directory) / name
    export.write_checkpoint(path, cfg, tensors)
    return path, cfg, tensors


def hf_permute(w, n_heads):
    """Hugging Face's q/k row permutation (docs/rope.md §4.2): per head, row
    2i+c moves to c*(hd/2)+i. w: (n_heads*hd, dim)."""
    rows, dim = w.shape
    hd = rows // n_heads
    return w.reshape(n_heads, hd // 2, 2, dim).swapaxes(1, 2).reshape(rows, dim)


def check_error(p, code, needles):
    """Assert a clean failure: exit code `code`, nothing on stdout, no crash
    report, and a message naming one of needles (a path or a flag).

    Exit 1 (bad input): stderr must be exactly one line.
    Exit 2 (bad usage): the first line must be the message; a usage text may
    follow it."""
    err = p.stderr.decode(errors="replace")
    lines = [l for l in err.splitlines() if l.strip()]
    info = f"exit {p.returncode}, stderr:\n{err[-3000:]}"
    assert p.returncode >= 0, f"killed by signal {-p.returncode}; {info}"
    for bad in ("Traceback", "Sanitizer", "runtime error", "Assertion", "core dumped"):
        assert bad not in err, info
    assert p.returncode == code, f"expected exit {code}; {info}"
    assert lines, f"no message on stderr; {info}"
    if code == 1:
        assert len(lines) == 1, f"expected a one-line message; {info}"
    msg = lines[0].lower()
    needles = [str(n).lower() for n in needles]
    assert any(n in msg for n in needles), f"message does not name any of {needles}; {info}"
    assert p.stdout.strip() == b"", f"unexpected stdout {p.stdout[:200]!r}"


def write_legacy(path, cfg, tensors):
    """Write a llama2.c (version 0) checkpoint, as llama2.c's legacy_export
    does: 7 int32 (vocab_size negative when the classifier is not shared),
    then float32 tensors with no padding, with the unused freq_cis tables
    before wcls. A test-only writer: it makes legacy inputs for export.py and
    the loader."""
    c = export.normalize_config(cfg)
    hs = c["dim"] // c["n_heads"]
    vocab = c["vocab_size"] if c["shared_classifier"] else -c["vocab_size"]
    with open(path, "wb") as f:
        f.write(np.array([c["dim"], c["hidden_dim"], c["n_layers"], c["n_heads"],
                          c["n_kv_heads"], vocab, c["seq_len"]], dtype="<i4").tobytes())
        for name in export.tensor_names(c):
            f.write(np.ascontiguousarray(tensors[name], dtype="<f4").tobytes())
            if name == "rms_final_weight":
                inv = 10000.0 ** (-np.arange(0, hs, 2) / hs)
                ang = np.outer(np.arange(c["seq_len"]), inv)
                f.write(np.cos(ang).astype("<f4").tobytes())
                f.write(np.sin(ang).astype("<f4").tobytes())
    return pathlib.Path(path)
