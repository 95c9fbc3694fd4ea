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
import re
import shlex
import struct
import subprocess

import pytest

import export
from conftest import (HANG_GUARD_S, MODELS, ROOT, RUN, SYN_PIECES, SYN_SCORES, check_error, limited_address_space,
                      make_model, run, write_legacy)

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


@pytest.mark.parametrize("flag", ["-z", "-f", "checkpoint"])
def test_named_pipe_without_a_writer_is_bad_input(base, tmp_path, flag):
    """A FIFO nobody writes to: exit 1 at once, naming it (it used to block
    forever in open; as the checkpoint, until a writer came). A checkpoint is
    mapped, so a FIFO is refused there even with a writer."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    args = {"-z": [base["ckpt"], "-z", fifo, "-i", "x"], "-f": [base["ckpt"], "-z", base["tok"], "-f", fifo],
            "checkpoint": [fifo, "-z", base["tok"], "-i", "x"]}[flag]
    p = run(*args)
    check_error(p, 1, [str(fifo)])
    if flag == "checkpoint":
        assert "FIFO" in p.stderr.decode(), p.stderr


def machine_memory():
    """The machine's physical memory in bytes, as run reads it."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.parametrize("mode,kv", [("generate", "f32"), ("passkey", "f32"), ("generate", "q8_0")])
def test_context_past_the_machines_memory_is_refused_before_allocating(tmp_path, mode, kv):
    """A context whose KV cache exceeds the machine's physical memory is
    refused with one line naming what set it (--ctx, or passkey's --lengths)
    and the two sizes, before anything is allocated: the run is capped at 1
    GiB of address space, so an allocation first would fail with another
    message. (It used to be accepted: calloc only reserves pages, and the run
    failed or swapped later as the cache filled.) The model has enough layers
    that 8,000,000 positions need 1.25x the machine's memory; with --kv q8_0
    the sizes are the q8_0 cache's (36 bytes per 32 values)."""
    ctx, per_layer_position = 8_000_000, 2 * 64 * (4 if kv == "f32" else 36 / 32)  # keys and values of dim 64
    n_layers = -(-int(1.25 * machine_memory()) // int(per_layer_position * ctx))
    tok = tmp_path / "tokenizer.bin"
    export.write_tokenizer(tok, SYN_PIECES, SYN_SCORES)
    ckpt, _, _ = make_model(tmp_path, n_layers=n_layers, dim=64, n_heads=4, n_kv_heads=4)
    args = ["-i", "the cat", "--ctx", str(ctx)] if mode == "generate" else \
        ["-m", "passkey", "--lengths", str(ctx - 9)]  # its 5-digit key's answer takes 9 more
    cmd = [str(RUN), str(ckpt), "-z", str(tok), *args, "--kv", kv]
    p = subprocess.run(cmd, capture_output=True, timeout=HANG_GUARD_S, preexec_fn=limited_address_space(1 << 30))
    check_error(p, 2, ["--ctx 8000000" if mode == "generate" else "--lengths (a context of 8000000 positions)"])
    err = p.stderr.decode()
    assert len(err.splitlines()) == 1, err
    sizes = re.search(r"KV cache \(([0-9.]+) GiB\) and buffers for this context need ([0-9.]+) GiB, more than this "
                      r"machine's ([0-9.]+) GiB of memory", err)
    assert sizes, err
    cache, total, memory = (float(g) for g in sizes.groups())
    assert abs(cache - n_layers * per_layer_position * ctx / 2**30) <= 0.05, err
    assert abs(memory - machine_memory() / 2**30) <= 0.05 and total >= cache > memory, err


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


# ---------------------------------------------------------------------------
# Files given in the wrong place: safetensors, a PyTorch file or a tokenizer
# as the checkpoint, a checkpoint or an unconverted tokenizer to -z. (A GGUF
# is read in either place: tests/test_gguf_load.py and
# tests/test_gguf_tokenizer.py; the latter has a GGUF without a vocabulary
# given to -z.)
# Each is made by the library that writes that format where one is at hand
# (safetensors, torch, tokenizers), and the message must say what the
# file is and give the export.py command that converts it (docs/convert.md;
# test_gguf.py and test_convert.py run the commands).

def foreign_file(kind, d, base):
    """A file of `kind` in folder d (or base's files); returns its path."""
    d.mkdir(parents=True, exist_ok=True)
    if kind == "safetensors":
        st = pytest.importorskip("safetensors.numpy")
        import numpy as np
        st.save_file({"model.norm.weight": np.ones(4, np.float32)}, str(d / "model.safetensors"))
        return d / "model.safetensors"
    if kind == "pytorch":
        torch = pytest.importorskip("torch")
        torch.save({"norm.weight": torch.ones(4)}, d / "consolidated.00.pth")
        return d / "consolidated.00.pth"
    if kind == "config-json":
        (d / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "model_type": "llama"}')
        return d / "config.json"
    if kind == "tokenizer-json":
        tokenizers = pytest.importorskip("tokenizers")
        vocab = {p.decode(): i for i, p in enumerate(SYN_PIECES) if p.isalpha()}
        tok = tokenizers.Tokenizer(tokenizers.models.BPE(vocab=vocab, merges=[]))
        tok.save(str(d / "tokenizer.json"))
        return d / "tokenizer.json"
    if kind == "sentencepiece":
        return ROOT / "models" / "tokenizer.model"  # the bundled model's, made by sentencepiece
    if kind == "tiktoken":  # Llama 3's tokenizer.model: base64 of each piece, its rank
        import base64
        lines = [base64.b64encode(bytes([b])).decode() + f" {b}" for b in range(256)]
        (d / "tokenizer.model").write_text("\n".join(lines) + "\n")
        return d / "tokenizer.model"
    if kind == "tokenizer-bin":
        return base["tok"]
    if kind == "checkpoint":
        return base["ckpt"]
    if kind == "llama2c-checkpoint":
        return write_legacy(d / "stories.bin", base["cfg"], base["tensors"])
    raise ValueError(kind)


# (a GGUF is a checkpoint run reads directly: tests/test_gguf_load.py has its refusals)
AS_CHECKPOINT = {  # kind -> what the message must hold ({p}: the file, {d}: its folder)
    "safetensors": ["safetensors", "python3 export.py model.bin --hf {d}"],
    "pytorch": ["zip archive", "python3 export.py model.bin --meta-llama {d}"],
    "config-json": ["config.json", "python3 export.py model.bin --hf {d}"],
    "tokenizer-json": ["tokenizer.json", "python3 export.py tokenizer.bin --tokenizer {p}", "-z"],
    "sentencepiece": ["sentencepiece", "python3 export.py tokenizer.bin --tokenizer {p}", "-z"],
    "tiktoken": ["tiktoken", "python3 export.py tokenizer.bin --tokenizer {p}", "-z"],
    "tokenizer-bin": [f"a tokenizer file of {len(SYN_PIECES)} tokens", "run <checkpoint> -z {p}"],
}


def message_holds(p, path, words):
    err = p.stderr.decode()
    for w in words:
        w = w.format(p=path, d=path.parent)
        assert w in err, f"{w!r} not in {err!r}"


@pytest.mark.parametrize("kind", list(AS_CHECKPOINT))
def test_foreign_file_as_checkpoint_names_the_conversion(base, tmp_path, kind):
    path = foreign_file(kind, tmp_path / "src", base)
    p = run(path, "-z", base["tok"], "-i", "the cat")
    check_error(p, 1, [path])
    assert p.stderr.decode().startswith(f"{path}: not a checkpoint: "), p.stderr
    message_holds(p, path, AS_CHECKPOINT[kind])


AS_TOKENIZER = {
    "checkpoint": ["a checkpoint", "first argument"],
    "llama2c-checkpoint": ["a checkpoint", "first argument"],
    "safetensors": ["safetensors", "python3 export.py tokenizer.bin --tokenizer {d}/tokenizer.json"],
    "pytorch": ["zip archive", "python3 export.py tokenizer.bin --tokenizer {d}/tokenizer.model"],
    "config-json": ["config.json", "python3 export.py tokenizer.bin --tokenizer {d}/tokenizer.json"],
    "tokenizer-json": ["tokenizer.json", "python3 export.py tokenizer.bin --tokenizer {p}"],
    "sentencepiece": ["sentencepiece", "python3 export.py tokenizer.bin --tokenizer {p}"],
    "tiktoken": ["tiktoken", "python3 export.py tokenizer.bin --tokenizer {p}"],
}


@pytest.mark.parametrize("kind", list(AS_TOKENIZER))
def test_foreign_file_given_to_z_names_the_conversion(base, tmp_path, kind):
    path = foreign_file(kind, tmp_path / "src", base)
    p = run(base["ckpt"], "-z", path, "-i", "the cat")
    check_error(p, 1, [path])
    assert p.stderr.decode().startswith(f"tokenizer {path} (given with -z): not a tokenizer file: "), p.stderr
    message_holds(p, path, AS_TOKENIZER[kind])
    assert "give the tokenizer with -z" not in p.stderr.decode()


def test_unrecognised_file_keeps_the_loaders_message(base, tmp_path):
    """A file of no known format still gets the loader's own reason."""
    junk = tmp_path / "junk.bin"
    junk.write_bytes(bytes(range(256)) * 4)
    p = run(junk, "-z", base["tok"], "-i", "the cat")
    check_error(p, 1, [junk])
    assert "not a checkpoint" not in p.stderr.decode() and "out of range" in p.stderr.decode(), p.stderr
    p = run(base["ckpt"], "-z", junk, "-i", "the cat")
    check_error(p, 1, [junk])
    assert "not a tokenizer file" not in p.stderr.decode(), p.stderr


# ---------------------------------------------------------------------------
# Which tokenizer was tried: -z, tokenizer.bin beside the checkpoint, or
# ./tokenizer.bin when there is none beside it. The message names the path
# and how it was chosen, and suggests -z only when -z was not given.

def run_in(cwd, *args):
    """run() from the folder cwd (the default tokenizer path depends on it)."""
    cmd = [str(RUN.resolve())] + [str(a) for a in args]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, timeout=HANG_GUARD_S, env=env)
    assert p.returncode >= 0, p
    return p


@pytest.fixture
def other_vocab(tmp_path):
    """A tokenizer.bin of another vocabulary than base's model (as SmolLM2's
    checkpoint given the bundled tokenizer)."""
    path = tmp_path / "other" / "tokenizer.bin"
    path.parent.mkdir()
    export.write_tokenizer(path, SYN_PIECES[:-10], SYN_SCORES[:-10])
    return path


def test_tokenizer_given_with_z_does_not_suggest_z(base, other_vocab):
    p = run(base["ckpt"], "-z", other_vocab, "-i", "the cat")
    check_error(p, 1, [other_vocab])
    err = p.stderr.decode().strip()
    assert err == (f"tokenizer {other_vocab} (given with -z): holds {len(SYN_PIECES) - 10} tokens but the "
                   f"model has vocab_size {len(SYN_PIECES)}"), err
    missing = other_vocab.parent / "missing.bin"
    p = run(base["ckpt"], "-z", missing, "-i", "the cat")
    check_error(p, 1, [missing])
    assert p.stderr.decode().strip() == f"tokenizer {missing} (given with -z): No such file or directory"


def test_default_tokenizer_beside_the_checkpoint_is_named(base, other_vocab, tmp_path):
    ckpt = other_vocab.parent / "model.bin"
    ckpt.write_bytes(base["ckpt"].read_bytes())
    p = run_in(tmp_path, ckpt, "-i", "the cat")
    check_error(p, 1, [other_vocab])
    err = p.stderr.decode().strip()
    assert err.startswith(f"tokenizer {other_vocab} (the default, beside the checkpoint): holds "), err
    assert err.endswith("; give the tokenizer with -z"), err


def test_default_tokenizer_in_the_current_folder_is_named(base, other_vocab, tmp_path):
    """No tokenizer.bin beside the checkpoint: ./tokenizer.bin is tried, and
    the message says both."""
    sub = other_vocab.parent / "sub"
    sub.mkdir()
    (sub / "model.bin").write_bytes(base["ckpt"].read_bytes())
    p = run_in(other_vocab.parent, "sub/model.bin", "-i", "the cat")
    check_error(p, 1, ["tokenizer.bin"])
    err = p.stderr.decode().strip()
    assert err.startswith("tokenizer tokenizer.bin (the default in the current directory, as there is no "
                          "sub/tokenizer.bin beside the checkpoint): holds "), err
    assert err.endswith("; give the tokenizer with -z"), err
    (other_vocab.parent / "tokenizer.bin").write_bytes(base["tok"].read_bytes())  # the right one: it runs
    assert run_in(other_vocab.parent, "sub/model.bin", "-n", "1", "-i", "the cat").returncode == 0


def test_no_default_tokenizer_names_both_paths(base, tmp_path):
    (tmp_path / "m").mkdir()
    ckpt = tmp_path / "m" / "model.bin"
    ckpt.write_bytes(base["ckpt"].read_bytes())
    p = run_in(tmp_path, ckpt, "-i", "the cat")
    check_error(p, 1, [tmp_path / "m" / "tokenizer.bin"])
    assert p.stderr.decode().strip() == (
        f"tokenizer: no -z given, and neither {tmp_path}/m/tokenizer.bin (beside the checkpoint) nor "
        "./tokenizer.bin exists; give the tokenizer with -z")
    p = run_in(tmp_path / "m", "model.bin", "-i", "the cat")  # the checkpoint's folder is the current one
    check_error(p, 1, ["tokenizer.bin"])
    assert p.stderr.decode().strip() == (
        "tokenizer: no -z given, and no ./tokenizer.bin beside the checkpoint model.bin; give the tokenizer "
        "with -z")
    assert run_in(tmp_path, ckpt, "-m", "rope").returncode == 0  # -m rope reads no tokenizer


# ---------------------------------------------------------------------------
# The checkpoint forgotten, and --help's examples

def test_missing_checkpoint_is_one_line():
    """`run -i hi`: one line saying the checkpoint is missing, not the usage."""
    for args in (["-i", "hi"], ["-m", "ppl", "-f", "book.txt"], ["-t", "0", "-n", "5"]):
        p = run(*args)
        check_error(p, 2, ["checkpoint"])
        lines = p.stderr.decode().strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("missing <checkpoint>"), lines


def test_help_ends_with_examples_that_parse():
    """--help's last block is a few example commands, and each one's flags
    and values are accepted by the parser (--help after them exits 0 once
    they have all been read)."""
    p = run("--help")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.decode().rstrip("\n").splitlines()
    start = lines.index("Examples:")
    examples = lines[start + 1:]
    assert len(examples) >= 2 and all(e.startswith("  run ") for e in examples), lines[start:]
    for example in examples:
        args = shlex.split(example)[1:]
        q = run(*args, "--help")
        assert q.returncode == 0, (example, q.stderr)
