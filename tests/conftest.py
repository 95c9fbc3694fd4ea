"""Shared helpers for the Python end-to-end tests.

Paths (override with environment variables):
    ROOT    the repository (this file's parent's parent)
    SHARED  $SHARED_DIR, else ROOT/../shared (models and data; tests that need
            it are skipped with a message when it is absent)
    RUN     $RUN, else ROOT/run (point it at another build, e.g. a sanitizer one)

The binary runs with OMP_NUM_THREADS=2 unless the environment sets it.

Tests write only under pytest's tmp_path / tmp_path_factory.
"""

import functools
import json
import os
import pathlib
import shutil
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


def run(*args, input=None, binary=None):
    """Run the binary (./run, or `binary`) with args (str, bytes or paths).
    Returns CompletedProcess with bytes stdout/stderr. Fails the test on a
    hang or a signal."""
    cmd = [str(binary or run_bin())] + [a if isinstance(a, bytes) else str(a) for a in args]
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "2")
    try:
        p = subprocess.run(cmd, capture_output=True, input=input, timeout=HANG_GUARD_S, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"hung for {HANG_GUARD_S} s: {cmd}")
    assert p.returncode >= 0, (f"killed by signal {-p.returncode}: {cmd}\n"
                               f"stderr: {p.stderr.decode(errors='replace')[-2000:]}")
    return p


def limited_address_space(limit):
    """A preexec_fn for subprocess that caps the child's address space at
    `limit` bytes, so that an allocation of more fails at once (a test that
    something is never allocated); None for a sanitizer build ($RUN named
    *-san), whose shadow memory needs far more address space."""
    if RUN.name.endswith("-san"):
        return None
    import resource
    return lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def run_ok(*args, binary=None):
    p = run(*args, binary=binary)
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


# ---------------------------------------------------------------------------
# Tokenizer files "LTOK" (model.h's "Tokenizer files", versions 2 and 3): a
# reader written from that description, not from export.py, and a byte-level
# BPE encoder that runs on what it reads (for tests of the exported data).

TOK2_TYPES = ("sentencepiece", "byte_bpe")
TOK2_PRES = ("none", "gpt2", "llama3", "qwen2", "smollm")
TOK_CHATS = ("unstated", "plain", "llama2", "chatml", "llama3")
TOK_MAX_STOP = 256
TOK_MAX_SYSTEM = 65536


def read_tok_ltok(path):
    """Parse an "LTOK" tokenizer file, version 2 or 3. Asserts the layout
    model.h gives: magic "LTOK", reserved header bytes zero (version 2: bytes
    44..63; version 3: 60..63), each piece record inside the file, then the
    merges; version 3 then n_stop stop ids (each once, inside the vocabulary,
    at most 256) and the two system texts (at most 65536 bytes each, UTF-8
    without NUL); the file ending right after the last of these. Returns a
    dict: version, type and pre (names), vocab_size, bos_id, eos_id, eot_id,
    pad_id, add_bos (int), pieces (bytes), kinds, scores (float32 values as
    floats), merges ((left, right) tuples), chat (name; version 2:
    "unstated"), stop_ids (list; version 2: []), system_default and
    system_prefix (str; version 2: "")."""
    import struct as _struct
    data = pathlib.Path(path).read_bytes()
    assert len(data) >= 64, f"{path}: {len(data)} bytes, shorter than the header"
    assert data[:4] == b"LTOK", data[:4]
    (magic, version, typ, pre, n, n_merges, bos, eos, eot, pad, add_bos) = \
        _struct.unpack_from("<Iiiiiiiiiii", data, 0)
    assert version in (2, 3), version
    if version == 2:
        assert data[44:64] == bytes(20), "reserved header bytes are not zero"
        chat, n_stop, default_len, prefix_len = 0, 0, 0, 0
    else:
        chat, n_stop, default_len, prefix_len = _struct.unpack_from("<4i", data, 44)
        assert data[60:64] == bytes(4), "reserved header bytes are not zero"
        assert 0 <= chat < len(TOK_CHATS), f"chat_template {chat}"
        assert 0 <= n_stop <= TOK_MAX_STOP, f"n_stop {n_stop}"
        assert 0 <= default_len <= TOK_MAX_SYSTEM and 0 <= prefix_len <= TOK_MAX_SYSTEM, \
            (default_len, prefix_len)
    pieces, kinds, scores, off = [], [], [], 64
    for i in range(n):
        assert off + 12 <= len(data), f"piece {i}: record header past the end"
        score, kind, length = _struct.unpack_from("<fii", data, off)
        off += 12
        assert 0 <= length <= 65536 and off + length <= len(data), f"piece {i}: length {length}"
        pieces.append(data[off:off + length])
        kinds.append(kind)
        scores.append(score)
        off += length
    tail = 8 * n_merges + 4 * n_stop + default_len + prefix_len
    assert len(data) == off + tail, \
        (f"{len(data) - off} bytes after the pieces, expected {tail} for {n_merges} merges, "
         f"{n_stop} stop ids and system texts of {default_len} and {prefix_len} bytes")
    flat = _struct.unpack_from(f"<{2 * n_merges}i", data, off) if n_merges else ()
    merges = list(zip(flat[0::2], flat[1::2]))
    off += 8 * n_merges
    stop_ids = list(_struct.unpack_from(f"<{n_stop}i", data, off)) if n_stop else []
    off += 4 * n_stop
    assert all(0 <= v < n for v in stop_ids), f"stop ids {stop_ids} outside 0..{n - 1}"
    assert len(set(stop_ids)) == len(stop_ids), f"stop ids {stop_ids} repeat"
    texts = []
    for length in (default_len, prefix_len):
        raw = data[off:off + length]
        assert b"\0" not in raw, f"NUL in a system text {raw[:40]!r}"
        texts.append(raw.decode("utf-8"))  # raises on invalid UTF-8
        off += length
    return dict(version=version, type=TOK2_TYPES[typ], pre=TOK2_PRES[pre], vocab_size=n,
                bos_id=bos, eos_id=eos, eot_id=eot, pad_id=pad, add_bos=add_bos, pieces=pieces,
                kinds=kinds, scores=scores, merges=merges, chat=TOK_CHATS[chat],
                stop_ids=stop_ids, system_default=texts[0], system_prefix=texts[1])


# The pre-tokenizer regexes (as Hugging Face's tokenizers apply them; the
# `regex` module has the \p{...} classes)
GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = LLAMA3_REGEX.replace(r"\p{N}{1,3}", r"\p{N}")


def pre_split(pre, text):
    """Text cut into the chunks BPE runs on, for a pre-tokenizer name."""
    import regex
    if pre == "gpt2":
        return regex.findall(GPT2_REGEX, text)
    if pre == "smollm":  # every digit its own chunk, then GPT-2's regex between them
        out = []
        for part in regex.split(r"(\p{N})", text):
            if part:
                digit = regex.fullmatch(r"\p{N}", part)
                out += [part] if digit else regex.findall(GPT2_REGEX, part)
        return out
    if pre == "llama3":
        return regex.findall(LLAMA3_REGEX, text)
    if pre == "qwen2":
        return regex.findall(QWEN2_REGEX, text)
    raise ValueError(pre)


def bpe_encode_ltok(tok, text):
    """Ids of text under a byte-level BPE tokenizer as read_tok_ltok returns it:
    exact special-piece texts first (longest first), then per pre-tokenized
    chunk: single bytes joined pair by pair, always the adjacent pair of
    lowest merge rank (leftmost on ties). A byte with no single-byte piece is
    dropped, as Hugging Face's BPE without an unknown token does."""
    import re
    assert tok["type"] == "byte_bpe"
    rank = {pair: r for r, pair in enumerate(tok["merges"])}
    joined = {}  # merge pair -> id of its result, filled as merges are used
    normal = {p: i for i, (p, k) in enumerate(zip(tok["pieces"], tok["kinds"])) if k == 0}
    specials = sorted({p for p, k in zip(tok["pieces"], tok["kinds"]) if k == 1 and p},
                      key=len, reverse=True)
    special_id = {}
    for i, (p, k) in enumerate(zip(tok["pieces"], tok["kinds"])):
        if k == 1:
            special_id.setdefault(p, i)
    parts = [text.encode()]
    if specials:
        pattern = re.compile(b"(" + b"|".join(re.escape(s) for s in specials) + b")")
        parts = pattern.split(text.encode())
    ids = []
    for j, part in enumerate(parts):
        if j % 2 == 1:
            ids.append(special_id[part])
            continue
        for chunk in pre_split(tok["pre"], part.decode()):
            seq = [normal[bytes([b])] for b in chunk.encode() if bytes([b]) in normal]
            while len(seq) > 1:
                best, at = None, -1
                for i in range(len(seq) - 1):
                    r = rank.get((seq[i], seq[i + 1]))
                    if r is not None and (best is None or r < best):
                        best, at = r, i
                if best is None:
                    break
                pair = (seq[at], seq[at + 1])
                if pair not in joined:
                    joined[pair] = normal[tok["pieces"][pair[0]] + tok["pieces"][pair[1]]]
                seq[at:at + 2] = [joined[pair]]
            ids += seq
    return ids


def train_byte_bpe(chunks, n_merges):
    """A small byte-level BPE trained the textbook way, for test vocabularies:
    chunks (bytes, e.g. pre-tokenized words) start as single bytes; each step
    joins the most frequent adjacent pair everywhere (ties: the greatest pair,
    for determinism). Returns the merges as (left bytes, right bytes), in
    training order."""
    from collections import Counter
    words = Counter(chunks)
    seqs = {w: [bytes([b]) for b in w] for w in words}
    merges = []
    for _ in range(n_merges):
        counts = Counter()
        for w, c in words.items():
            s = seqs[w]
            for pair in zip(s, s[1:]):
                counts[pair] += c
        if not counts:
            break
        best = max(counts, key=lambda p: (counts[p], p))
        merges.append(best)
        for w in words:
            s, out, i = seqs[w], [], 0
            while i < len(s):
                if i + 1 < len(s) and (s[i], s[i + 1]) == best:
                    out.append(s[i] + s[i + 1])
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            seqs[w] = out
    return merges


@functools.lru_cache(maxsize=None)
def trained_byte_vocab():
    """A byte-level BPE vocabulary trained on TEXT (120 merges): ({gpt2
    string: id}, [(gpt2 a, gpt2 b)]); ids: 256 bytes in byte order, then the
    merges' results."""
    chunks = [c.encode() for c in pre_split("gpt2", TEXT * 3)]
    merges = train_byte_bpe(chunks, 120)
    vocab = {export.bytes_to_gpt2(bytes([b])): b for b in range(256)}
    for a, b in merges:
        vocab.setdefault(export.bytes_to_gpt2(a + b), len(vocab))
    return vocab, [(export.bytes_to_gpt2(a), export.bytes_to_gpt2(b)) for a, b in merges]


def c_driver(tmp_path_factory, env, name, args, quiet=False):
    """Path of a test driver binary: $env when set (make test-py builds them
    with ./run's flags), else built here as `cc ARGS -o NAME -lm` in the
    checkout (quiet: and with no compiler warning). Skips without a C compiler."""
    if os.environ.get(env):
        return os.environ[env]
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip(f"no C compiler found (set CC or {env})")
    exe = tmp_path_factory.mktemp(name) / name
    cmd = [cc, *args, "-o", str(exe), "-lm"]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0 and not (quiet and res.stderr), f"building {name} failed: {' '.join(cmd)}\n{res.stderr}"
    return str(exe)


@pytest.fixture(scope="session")
def driver(tmp_path_factory):
    """Path of a tok_driver binary: $TOK_DRIVER, or built from tests/tok_driver.c."""
    return c_driver(tmp_path_factory, "TOK_DRIVER", "tok_driver", ["-O2", "-I.", "tests/tok_driver.c"])


def mix_strings(pools, extras, count, seed, extra_rate, pool_rate):
    """count random strings of 0..40 parts: with probability extra_rate a
    string from extras, else a character from a random pool (with
    probability pool_rate; otherwise ASCII with spaces, pools[0] + "  ")."""
    import random
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randint(0, 40)):
            if rng.random() < extra_rate:
                parts.append(rng.choice(extras))
            else:
                pool = pools[rng.randrange(len(pools))] if rng.random() < pool_rate else pools[0] + "  "
                parts.append(rng.choice(pool))
        out.append("".join(parts))
    return out


def length_prefixed(data, count):
    """Split tok_driver -d's output: count records, each a u32 length then bytes."""
    import struct
    out, pos = [], 0
    while pos < len(data):
        (n,) = struct.unpack_from("<I", data, pos)
        out.append(data[pos + 4:pos + 4 + n])
        pos += 4 + n
    assert len(out) == count, f"{len(out)} records, expected {count}"
    return out
