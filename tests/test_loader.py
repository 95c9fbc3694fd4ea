"""Bad inputs and bad usage: run must answer each with a message, never a crash.

Every case is its own test id. The contract (docs/command-line.md, exit status):
  exit 1  bad input (a file that is missing, truncated, inconsistent, a prompt
          too long for the context): exactly one line on stderr, naming the
          file (or the flag/setting at fault), and nothing on stdout;
  exit 2  bad usage (an unknown flag or mode, a value that does not parse or
          is out of range): the first line of stderr names the flag; a usage
          text may follow;
  never   a signal (a negative return code), a sanitizer report or a hang.
"""

import os
import struct

import pytest

import export
from conftest import (MODELS, SYN_PIECES, SYN_SCORES, check_error, make_model, run,
                      write_legacy)

OFFSET = {}  # header field -> (byte offset, struct code), from model.h's table
_off = 0
for _name, _code in export.HEADER_FIELDS:
    OFFSET[_name] = (_off, _code)
    _off += 4


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A valid model (shared classifier, GQA) and its tokenizer."""
    d = tmp_path_factory.mktemp("base")
    tok = d / "tokenizer.bin"
    export.write_tokenizer(tok, SYN_PIECES, SYN_SCORES)
    ckpt, cfg, tensors = make_model(d, n_heads=4, n_kv_heads=2)
    unshared, _, _ = make_model(d, "unshared.bin", n_heads=4, n_kv_heads=2, shared_classifier=False)
    return dict(dir=d, tok=tok, ckpt=ckpt, cfg=cfg, tensors=tensors, unshared=unshared)


def generate(ckpt, tok, *extra):
    return run(ckpt, "-z", tok, "-t", "0", "-n", "2", "-i", "the cat", *extra)


def test_valid_base_model_works(base):
    """The cases below differ from this one in one thing each."""
    p = generate(base["ckpt"], base["tok"])
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(b"the cat")


# ---------------------------------------------------------------------------
# Checkpoints

def patched(data, **fields):
    data = bytearray(data)
    for name, value in fields.items():
        off, code = OFFSET[name]
        struct.pack_into("<" + code, data, off, value)
    return bytes(data)


def bad_checkpoint(base, kind, path):
    """Write the bad checkpoint `kind` to path (or return another path)."""
    data = base["ckpt"].read_bytes()
    layout, size = export.tensor_layout(base["cfg"])
    assert size == len(data)
    cfg = base["cfg"]
    if kind == "missing":
        return path.parent / "does-not-exist.bin"
    if kind == "directory":
        path.mkdir()
        return path
    simple = {
        "empty": b"",
        "three-bytes": data[:3],
        "short-header": data[:100],
        "header-only": data[:256],
        "half-the-tensors": data[:layout[len(layout) // 2][2]],
        "last-byte-missing": data[:-1],
        "trailing-byte": data + b"\0",
        "trailing-tensor": data + data[256:256 + 4 * cfg["vocab_size"] * cfg["dim"]],
        "bad-magic": b"GGUF" + data[4:],
        "reserved-nonzero": data[:200] + b"\x01" + data[201:],
        "version-0-with-magic": patched(data, version=0),
        "version-3": patched(data, version=3),
        "version-negative": patched(data, version=-1),
        "dim-zero": patched(data, dim=0),
        "dim-negative": patched(data, dim=-64),
        "dim-huge": patched(data, dim=2**30),
        "hidden-zero": patched(data, hidden_dim=0),
        "layers-zero": patched(data, n_layers=0),
        "layers-huge": patched(data, n_layers=2**31 - 1),
        "heads-zero": patched(data, n_heads=0),
        "kv-heads-zero": patched(data, n_kv_heads=0),
        "kv-heads-not-dividing": patched(data, n_heads=4, n_kv_heads=3),
        "kv-heads-above-heads": patched(data, n_kv_heads=8),
        "dim-not-divisible-by-heads": patched(data, n_heads=5, n_kv_heads=5),
        "odd-head-size": patched(data, n_heads=64, n_kv_heads=32, rot_dim=1),
        "vocab-zero": patched(data, vocab_size=0),
        "vocab-huge": patched(data, vocab_size=2**31 - 1),
        "seq-len-zero": patched(data, seq_len=0),
        "seq-len-huge": patched(data, seq_len=2**31 - 1),
        "rot-dim-odd": patched(data, rot_dim=7),
        "rot-dim-zero": patched(data, rot_dim=0),
        "rot-dim-above-head-size": patched(data, rot_dim=18),
        "weight-type-unknown": patched(data, weight_type=1),
        "group-size-nonzero": patched(data, group_size=32),
        "layout-unknown": patched(data, rope_layout=2),
        "scaling-unknown": patched(data, rope_scaling=6),
        "rope-theta-zero": patched(data, rope_theta=0.0),
        "rope-theta-nan": patched(data, rope_theta=float("nan")),
        "norm-eps-negative": patched(data, norm_eps=-1.0),
        "bos-outside-vocab": patched(data, bos_id=cfg["vocab_size"]),
        "eos-negative": patched(data, eos_id=-1),
        "shared-flag-cleared": patched(data, shared_classifier=0),  # wcls then missing
    }
    legacy_good = None
    if kind.startswith("legacy"):
        legacy_good = write_legacy(path.parent / "legacy-good.bin", cfg, base["tensors"]).read_bytes()
        simple.update({
            "legacy-truncated": legacy_good[:-100],
            "legacy-trailing-byte": legacy_good + b"\0",
            "legacy-15M-header-4KB": struct.pack("<7i", 288, 768, 6, 6, 6, 32000, 256)
            + bytes(4096),
            "legacy-heads-zero": struct.pack("<7i", 64, 96, 2, 0, 2, cfg["vocab_size"], 32)
            + legacy_good[28:],
            "legacy-kv-heads-zero": struct.pack("<7i", 64, 96, 2, 4, 0, cfg["vocab_size"], 32)
            + legacy_good[28:],
            "legacy-negative-dim": struct.pack("<7i", -64, 96, 2, 4, 2, cfg["vocab_size"], 32)
            + legacy_good[28:],
            "legacy-vocab-int-min": struct.pack("<7i", 64, 96, 2, 4, 2, -2**31, 32)
            + legacy_good[28:],
        })
    path.write_bytes(simple[kind])
    return path


CHECKPOINT_CASES = [
    "missing", "directory", "empty", "three-bytes", "short-header", "header-only",
    "half-the-tensors", "last-byte-missing", "trailing-byte", "trailing-tensor", "bad-magic",
    "reserved-nonzero", "version-0-with-magic", "version-3", "version-negative", "dim-zero",
    "dim-negative", "dim-huge", "hidden-zero", "layers-zero", "layers-huge", "heads-zero",
    "kv-heads-zero", "kv-heads-not-dividing", "kv-heads-above-heads",
    "dim-not-divisible-by-heads", "odd-head-size", "vocab-zero", "vocab-huge", "seq-len-zero",
    "seq-len-huge", "rot-dim-odd", "rot-dim-zero", "rot-dim-above-head-size",
    "weight-type-unknown", "group-size-nonzero", "layout-unknown", "scaling-unknown",
    "rope-theta-zero", "rope-theta-nan", "norm-eps-negative", "bos-outside-vocab",
    "eos-negative", "shared-flag-cleared",
    "legacy-truncated", "legacy-trailing-byte", "legacy-15M-header-4KB", "legacy-heads-zero",
    "legacy-kv-heads-zero", "legacy-negative-dim", "legacy-vocab-int-min",
]


@pytest.mark.parametrize("kind", CHECKPOINT_CASES)
@pytest.mark.parametrize("mode", ["generate", "ppl"])
def test_bad_checkpoint(base, tmp_path, kind, mode):
    path = bad_checkpoint(base, kind, tmp_path / "bad.bin")
    if mode == "generate":
        p = generate(path, base["tok"])
    else:
        text = tmp_path / "t.txt"
        text.write_bytes(b"the cat sat on the mat")
        p = run(path, "-z", base["tok"], "-m", "ppl", "-f", text, "--json")
    check_error(p, 1, [path])


# ---------------------------------------------------------------------------
# Tokenizers

def bad_tokenizer(base, kind, path):
    data = base["tok"].read_bytes()
    if kind == "missing":
        return path.parent / "no-tokenizer.bin"
    if kind == "directory":
        path.mkdir()
        return path
    if kind == "empty":
        data = b""
    elif kind == "truncated-half":
        data = data[:len(data) // 2]
    elif kind == "truncated-last-byte":
        data = data[:-1]
    elif kind == "trailing-byte":
        data = data + b"x"
    elif kind in ("too-few-tokens", "too-many-tokens"):
        n = len(SYN_PIECES) + (-10 if kind == "too-few-tokens" else 10)
        pieces = (SYN_PIECES + [b"zz%d" % i for i in range(10)])[:n]
        export.write_tokenizer(path, pieces, [0.0] * n)
        return path
    elif kind == "llama2-32000":
        src = MODELS / "llama2-tokenizer.bin"
        if src.is_file():
            return src
        pieces = SYN_PIECES + [b"p%d" % i for i in range(32000 - len(SYN_PIECES))]
        export.write_tokenizer(path, pieces, [0.0] * len(pieces))
        return path
    elif kind == "negative-length":
        # the first entry (<unk>): f32 score at 4, i32 length at 8
        data = bytearray(data)
        struct.pack_into("<i", data, 8, -5)
        data = bytes(data)
    elif kind == "huge-length":
        data = bytearray(data)
        struct.pack_into("<i", data, 8, 2**31 - 1)
        data = bytes(data)
    elif kind == "max-len-negative":
        data = struct.pack("<i", -1) + data[4:]
    else:
        raise ValueError(kind)
    path.write_bytes(data)
    return path


TOKENIZER_CASES = ["missing", "directory", "empty", "truncated-half", "truncated-last-byte",
                   "trailing-byte", "too-few-tokens", "too-many-tokens", "llama2-32000",
                   "negative-length", "huge-length"]


@pytest.mark.parametrize("kind", TOKENIZER_CASES)
@pytest.mark.parametrize("mode", ["generate", "tokenize"])
def test_bad_tokenizer(base, tmp_path, kind, mode):
    path = bad_tokenizer(base, kind, tmp_path / "tok.bin")
    if mode == "generate":
        p = generate(base["ckpt"], path)
    else:
        p = run(base["ckpt"], "-z", path, "-m", "tokenize", "-i", "hello")
    check_error(p, 1, [path])


def test_max_token_length_field_is_not_trusted(base, tmp_path):
    """A negative max_token_length must not crash (exit 1 with a message, or
    0 if the reader derives the length from the pieces)."""
    path = bad_tokenizer(base, "max-len-negative", tmp_path / "tok.bin")
    p = generate(base["ckpt"], path)
    if p.returncode != 0:
        check_error(p, 1, [path])


# ---------------------------------------------------------------------------
# Command line

USAGE_CASES = [
    # (id, arguments after the checkpoint, words of which the message names one)
    ("unknown-flag", ["--bogus"], ["--bogus"]),
    ("unknown-flag-with-value", ["--bogus", "1"], ["--bogus"]),
    ("unknown-short-flag", ["-q", "1"], ["-q"]),
    ("unknown-mode", ["-m", "bogus"], ["bogus"]),
    ("temperature-not-a-number", ["-t", "abc"], ["-t"]),
    ("temperature-trailing-junk", ["-t", "0.5x"], ["-t"]),
    ("temperature-negative", ["-t", "-1"], ["-t"]),
    ("temperature-missing-value", ["-t"], ["-t"]),
    ("top-p-above-one", ["-p", "1.5"], ["-p"]),
    ("top-p-negative", ["-p", "-0.1"], ["-p"]),
    ("steps-negative", ["-n", "-1"], ["-n"]),
    ("steps-not-a-number", ["-n", "ten"], ["-n"]),
    ("steps-overflow", ["-n", "99999999999999999999"], ["-n"]),
    ("ctx-zero", ["--ctx", "0"], ["--ctx", "-c"]),
    ("ctx-negative", ["-c", "-5"], ["--ctx", "-c"]),
    ("ctx-not-a-number", ["--ctx", "lots"], ["--ctx", "-c"]),
    ("top-k-negative", ["-k", "-1"], ["-k", "--top-k"]),
    ("seed-not-a-number", ["-s", "abc"], ["-s"]),
    ("stride-zero", ["-m", "ppl", "--stride", "0"], ["--stride"]),
    ("rope-scaling-unknown", ["--rope-scaling", "bogus"], ["--rope-scaling", "bogus"]),
]


@pytest.mark.parametrize("args,words", [c[1:] for c in USAGE_CASES],
                         ids=[c[0] for c in USAGE_CASES])
def test_bad_usage(base, args, words):
    p = run(base["ckpt"], "-z", base["tok"], "-i", "the cat", *args)
    check_error(p, 2, words)
    if args[0] in ("--bogus", "-q"):
        # an unknown flag is reported as unknown, not as, say, a missing value
        first = p.stderr.decode(errors="replace").strip().splitlines()[0].lower()
        assert "unknown" in first or "unrecognized" in first, first


def test_no_arguments_is_usage_error():
    p = run()
    check_error(p, 2, ["usage", "checkpoint"])


def test_tokenizer_and_text_from_a_pipe(base):
    """-z and -f read pipes to their end (bash's <(...), /dev/stdin): the same
    output as from the files themselves."""
    want = generate(base["ckpt"], base["tok"])
    assert want.returncode == 0, want.stderr
    piped = run(base["ckpt"], "-z", "/dev/stdin", "-t", "0", "-n", "2", "-i", "the cat",
                input=base["tok"].read_bytes())
    assert piped.returncode == 0 and piped.stdout == want.stdout, piped.stderr
    text = run(base["ckpt"], "-z", base["tok"], "-t", "0", "-n", "2", "-f", "/dev/stdin", input=b"the cat")
    assert text.returncode == 0 and text.stdout == want.stdout, text.stderr


@pytest.mark.parametrize("flag", ["-z", "-f"])
def test_named_pipe_without_a_writer_is_bad_input(base, tmp_path, flag):
    """A FIFO nobody writes to: exit 1 at once, naming it (it used to block
    forever in open)."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    args = ["-z", fifo, "-i", "x"] if flag == "-z" else ["-z", base["tok"], "-f", fifo]
    check_error(run(base["ckpt"], *args), 1, [str(fifo)])


@pytest.mark.parametrize("where,value", [("wq", float("nan")), ("w2", float("inf")),
                                         ("rms_att_weight", float("nan"))])
@pytest.mark.parametrize("dtype", ["f32", "q8_0"])
def test_non_finite_weight_is_bad_input(base, tmp_path, where, value, dtype):
    """A NaN or infinite weight (export.py refuses them; a damaged file can
    still hold one): generation and ppl stop with one line instead of printing
    nan or sampling from it; q8_0 checkpoints quantize the non-finite
    activations without an undefined float-to-int conversion (the clang
    sanitizer build checks that). q8_0 keeps norm weights in float32, so the
    value is patched into the file after export."""
    ckpt = tmp_path / f"{dtype}.bin"
    export.write_checkpoint(ckpt, dict(base["cfg"], weight_type=dtype), base["tensors"])
    layout, _ = export.tensor_layout(dict(base["cfg"], weight_type=dtype))
    name, shape, offset, scales = next(entry for entry in layout if entry[0] == where)
    data = bytearray(ckpt.read_bytes())
    struct.pack_into("<f", data, scales if scales is not None else offset, value)  # row 0, group 0
    ckpt.write_bytes(bytes(data))
    text = tmp_path / "t.txt"
    text.write_text("the cat sat on the mat. " * 8)
    for p in (generate(ckpt, base["tok"]),
              run(ckpt, "-z", base["tok"], "-m", "ppl", "-f", text, "--json")):
        # found while running, so after the load line: the message is the last line
        err = p.stderr.decode()
        assert p.returncode == 1 and p.stdout.strip() in (b"", b"the cat"), err
        assert "NaN or infinite" in err.strip().splitlines()[-1], err
        assert not any(w in err for w in ("Sanitizer", "runtime error", "Traceback")), err


@pytest.mark.parametrize("flag", ["-z", "-f"])
def test_device_or_directory_is_bad_input(base, tmp_path, flag):
    """A device (/dev/zero would never end) or a directory: exit 1 naming it."""
    for path in ("/dev/zero", tmp_path):
        args = ["-z", base["tok"], "-i", "x"] if flag == "-z" else ["-z", base["tok"]]
        if flag == "-z":
            args[1] = path
        else:
            args += ["-f", path]
        check_error(run(base["ckpt"], *args), 1, [str(path)])


def test_prompt_file_missing(base, tmp_path):
    missing = tmp_path / "no-such-prompt.txt"
    p = run(base["ckpt"], "-z", base["tok"], "-f", missing)
    check_error(p, 1, [missing])


def test_ppl_text_file_missing(base, tmp_path):
    missing = tmp_path / "no-such-text.txt"
    p = run(base["ckpt"], "-z", base["tok"], "-m", "ppl", "-f", missing, "--json")
    check_error(p, 1, [missing])


def test_ppl_text_file_is_directory(base, tmp_path):
    p = run(base["ckpt"], "-z", base["tok"], "-m", "ppl", "-f", tmp_path, "--json")
    check_error(p, 1, [tmp_path])


def test_prompt_longer_than_context(base):
    """Generating from a prompt that does not fit in --ctx is bad input."""
    p = run(base["ckpt"], "-z", base["tok"], "--ctx", "8", "-t", "0", "-n", "4",
            "-i", "the cat sat on the mat and then the dog ran to the tree")
    check_error(p, 1, ["ctx", "context", "prompt"])


def test_empty_text_in_ppl_mode_does_not_crash(base, tmp_path):
    text = tmp_path / "empty.txt"
    text.write_bytes(b"")
    p = run(base["ckpt"], "-z", base["tok"], "-m", "ppl", "-f", text, "--json")
    if p.returncode != 0:
        check_error(p, 1, [text])


@pytest.mark.parametrize("prompt", [b"\xff\xfe bad \xc3", b"\xc3", b"caf\xc3\xa9 \xe2\x82"],
                         ids=["ff-fe", "lone-lead-byte", "cut-sequence"])
def test_invalid_utf8_prompt(base, prompt):
    """Invalid UTF-8 in the prompt is handled by byte fallback (exit 0) or
    refused with a message (exit 1), never a crash."""
    p = run(base["ckpt"], "-z", base["tok"], "-t", "0", "-n", "3", "-i", prompt)
    if p.returncode != 0:
        check_error(p, 1, ["-i", "prompt", "utf-8", "utf8"])
    p = run(base["ckpt"], "-z", base["tok"], "-m", "tokenize", "-i", prompt)
    assert p.returncode in (0, 1), p.stderr
    if p.returncode == 0:
        ids = [int(t) for t in p.stdout.split()]
        assert ids[0] == 1 and all(0 <= t < len(SYN_PIECES) for t in ids)


def test_unshared_model_loads(base):
    p = generate(base["unshared"], base["tok"])
    assert p.returncode == 0, p.stderr
