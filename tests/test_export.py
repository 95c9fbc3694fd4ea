"""export.py: the version-1 writer, the llama2.c converter, the tokenizer
converter, atomic writes, and its error messages.

Tests that need ../shared (stories260K, the Llama 2 tokenizer) or sentencepiece
skip with a message when those are absent; tests that run the binary need
./run (or $RUN).
"""

import struct
import subprocess
import sys

import numpy as np
import pytest

import export
from conftest import (ROOT, SHARED, SYN_PIECES, SYN_SCORES, TEXT, make_model, model_config,
                      need_shared, run_ok, run_ppl, write_legacy)
from reference.forward import Reference, ppl_reference

EXPORT = [sys.executable, str(ROOT / "export.py")]


def export_cli(*args):
    return subprocess.run(EXPORT + [str(a) for a in args], capture_output=True, timeout=300)


def f32(cfg):
    """cfg with its float fields rounded to float32, as the header stores them."""
    return {k: float(np.float32(v)) if isinstance(v, float) else v for k, v in cfg.items()}


def listing(d):
    return sorted(p.name for p in d.iterdir())


def expected_size(c):
    """The file size by model.h's rule, computed here independently of export.py:
    a 256-byte header, then each tensor at the next multiple of 64."""
    hs = c["dim"] // c["n_heads"]
    kv = c["n_kv_heads"] * hs
    L, d, h, v = c["n_layers"], c["dim"], c["hidden_dim"], c["vocab_size"]
    sizes = [v * d, L * d, L * d * d, L * kv * d, L * kv * d, L * d * d, L * d,
             L * h * d, L * d * h, L * h * d, d] + ([] if c["shared_classifier"] else [v * d])
    offsets, off = [], 256
    for n in sizes:
        off = (off + 63) // 64 * 64
        offsets.append(off)
        off += 4 * n
    return off, offsets


# --------------------------------------------------------------------------
# Version-1 writer

def test_random_cli_round_trip(tmp_path):
    """--random writes every header field as given, zero reserved bytes, and
    the tensors at 64-aligned offsets, ending exactly at the file end; it
    prints one line on stdout (the file, its size, the parameter count, the
    weight type, the shape) and nothing on stderr."""
    out = tmp_path / "r.bin"
    p = export_cli(out, "--random", "48,80,3,6,2,77,24", "--seed", "5", "--unshared",
                   "--rope-layout", "neox", "--rot-dim", "4", "--rope-theta", "500000",
                   "--norm-eps", "1e-6")
    assert p.returncode == 0, p.stderr
    assert p.stderr == b"" and p.stdout.count(b"\n") == 1, p
    raw = out.read_bytes()
    h = struct.unpack_from("<I13i2f3ifi5f", raw)
    assert h[:14] == (0x4550524C, 1, 48, 80, 3, 6, 2, 77, 24, 0, 1, 2, 0, 0)
    assert raw[:4] == b"LRPE"
    assert h[14] == np.float32(1e-6) and h[15] == 500000.0
    assert h[16:19] == (1, 4, 0)              # neox, rot_dim 4, no scaling
    assert h[19:] == (1.0, 0, 32.0, 1.0, 0.0, 1.0, 4.0)
    assert raw[104:256] == bytes(152)
    cfg = dict(dim=48, hidden_dim=80, n_layers=3, n_heads=6, n_kv_heads=2, vocab_size=77,
               seq_len=24, shared_classifier=False, rope_layout="neox", rot_dim=4)
    size, offsets = expected_size(cfg)
    assert len(raw) == size
    want = export.random_tensors(cfg, 5)
    for (name, arr), off in zip(want.items(), offsets):
        assert off % 64 == 0
        got = np.frombuffer(raw, dtype="<f4", count=arr.size, offset=off).reshape(arr.shape)
        assert np.array_equal(got, arr), name
    # the padding is zero
    ends = [off + 4 * a.size for off, a in zip(offsets, want.values())]
    for end, nxt in zip(ends, offsets[1:]):
        assert raw[end:nxt] == bytes(nxt - end)
    n = sum(a.size for a in want.values())
    assert p.stdout.decode() == (
        f"export.py: wrote {out} ({len(raw) / 1024:.1f} KiB): {n / 1000:.1f}K parameters, weights f32, "
        "dim 48, hidden 80, 3 layers, 6 heads (2 kv), vocab 77, seq_len 24, untied classifier, rope neox "
        "theta 500000 rot_dim 4 scaling none, eps 1e-06, bos 1 eos 2\n")


def test_success_line_q8_0_and_tokenizer(tmp_path):
    """A re-export as q8_0 and a tokenizer conversion each print one line on
    stdout naming the file, its size and what it holds; nothing on stderr."""
    src, out = tmp_path / "r.bin", tmp_path / "q.bin"
    assert export_cli(src, "--random", "64,96,2,4,2,50,32").returncode == 0
    p = export_cli(out, "--checkpoint", src, "--dtype", "q8_0")
    assert p.returncode == 0 and p.stderr == b"", p
    line = p.stdout.decode()
    assert line.count("\n") == 1 and line.startswith(f"export.py: wrote {out} ("), line
    assert f"({out.stat().st_size / 1024:.1f} KiB): " in line, line
    assert ", weights q8_0 (group size 32), dim 64, " in line, line
    (model,) = need_shared("llama2-tokenizer.model")
    pytest.importorskip("sentencepiece")
    tok = tmp_path / "t.bin"
    p = export_cli(tok, "--tokenizer", model)
    assert p.returncode == 0 and p.stderr == b"", p
    assert p.stdout.decode() == (f"export.py: wrote {tok} ({tok.stat().st_size / 1024:.1f} KiB): "
                                 "sentencepiece, 32000 pieces (llama2.c's format)\n")


def test_write_checkpoint_all_rope_fields(tmp_path):
    """Every RoPE and config field lands at its model.h offset; float64 input
    tensors are written as float32."""
    cfg = model_config(bos_id=5, eos_id=7, norm_eps=1e-6, rope_theta=123.5, rope_layout="neox",
                       rot_dim=8, rope_scaling="yarn", rope_factor=4.0, rope_orig_ctx=256,
                       yarn_beta_fast=16.0, yarn_beta_slow=2.0, rope_attn_factor=1.25,
                       llama3_low_freq=1.5, llama3_high_freq=3.5, shared_classifier=True)
    tensors = {k: v.astype(np.float64) for k, v in export.random_tensors(cfg, 1).items()}
    path = tmp_path / "m.bin"
    export.write_checkpoint(path, cfg, tensors)
    h = export.read_header(path)
    assert h["magic"] == 0x4550524C and h["version"] == 1 and h["reserved_zero"]
    for key, value in [("dim", 64), ("hidden_dim", 96), ("n_layers", 2), ("n_heads", 4),
                       ("n_kv_heads", 4), ("vocab_size", len(SYN_PIECES)), ("seq_len", 32),
                       ("shared_classifier", 1), ("bos_id", 5), ("eos_id", 7),
                       ("weight_type", 0), ("group_size", 0), ("rope_layout", 1),
                       ("rot_dim", 8), ("rope_scaling", 4), ("rope_orig_ctx", 256)]:
        assert h[key] == value, key
    for key, value in [("norm_eps", 1e-6), ("rope_theta", 123.5), ("rope_factor", 4.0),
                       ("yarn_beta_fast", 16.0), ("yarn_beta_slow", 2.0),
                       ("rope_attn_factor", 1.25), ("llama3_low_freq", 1.5),
                       ("llama3_high_freq", 3.5)]:
        assert h[key] == np.float32(value), key
    assert path.stat().st_size == expected_size(cfg)[0]
    back_cfg, back = export.read_checkpoint(path)
    assert back_cfg == f32(cfg)
    for name, arr in tensors.items():
        assert np.array_equal(back[name], arr.astype(np.float32)), name


BAD_CONFIGS = [
    ("kv-not-dividing", dict(n_heads=4, n_kv_heads=3), "n_kv_heads"),
    ("dim-not-divisible", dict(dim=64, n_heads=5, n_kv_heads=5), "n_heads"),
    ("odd-rot-dim", dict(rot_dim=7), "rot_dim"),
    ("rot-dim-too-big", dict(rot_dim=18), "rot_dim"),
    ("odd-head-size", dict(dim=36, n_heads=4, n_kv_heads=4), "rot_dim"),
    ("zero-layers", dict(n_layers=0), "n_layers"),
    ("negative-vocab", dict(vocab_size=-5), "vocab_size"),
    ("bos-outside", dict(bos_id=1000), "bos_id"),
    ("bad-layout", dict(rope_layout="halves"), "rope_layout"),
    ("bad-scaling", dict(rope_scaling="su"), "rope_scaling"),
    ("negative-window", dict(sliding_window=-1), "sliding_window"),
    ("window-layer-past-the-last", dict(window_first_layer=99), "window_first_layer"),
    ("bias-not-bool", dict(qkv_bias=1), "qkv_bias"),
    ("zero-theta", dict(rope_theta=0.0), "rope_theta"),
    ("nan-eps", dict(norm_eps=float("nan")), "norm_eps"),
    ("zero-eps", dict(norm_eps=0.0), "norm_eps"),
    ("factor-below-one", dict(rope_factor=0.5), "rope_factor"),
    ("yarn-betas", dict(rope_scaling="yarn", yarn_beta_fast=1.0, yarn_beta_slow=32.0), "beta"),
    ("llama3-freqs", dict(rope_scaling="llama3", llama3_low_freq=4.0, llama3_high_freq=1.0),
     "llama3"),
    ("unknown-key", dict(n_experts=8), "n_experts"),
]


@pytest.mark.parametrize("overrides,needle", [c[1:] for c in BAD_CONFIGS],
                         ids=[c[0] for c in BAD_CONFIGS])
def test_write_checkpoint_rejects_bad_config(tmp_path, overrides, needle):
    cfg = dict(dim=64, hidden_dim=96, n_layers=2, n_heads=4, n_kv_heads=4, vocab_size=300,
               seq_len=32)
    cfg.update(overrides)
    with pytest.raises(export.ExportError, match=needle):
        export.write_checkpoint(tmp_path / "m.bin", cfg, {})
    assert listing(tmp_path) == []


@pytest.mark.parametrize("change", ["wrong-shape", "missing-wcls", "extra-wcls", "missing-wq",
                                    "nan-last-tensor"])
def test_write_checkpoint_bad_tensors_leave_nothing(tmp_path, change):
    """A bad tensor raises ExportError, and neither an output nor a temporary
    file is left; an existing output is left untouched (atomic replace).
    'nan-last-tensor' fails in the middle of streaming, after most of the
    file has been written."""
    cfg = model_config(shared_classifier=(change != "missing-wcls"))
    tensors = export.random_tensors(cfg, 0)
    if change == "wrong-shape":
        tensors["wk"] = tensors["wk"][:, :-1]
    elif change == "missing-wcls":
        tensors.pop("wcls", None)
    elif change == "extra-wcls":
        tensors["wcls"] = tensors["token_embedding"].copy()
    elif change == "missing-wq":
        del tensors["wq"]
    else:
        tensors["rms_final_weight"][3] = np.nan
    out = tmp_path / "model.bin"
    out.write_bytes(b"previous contents")
    with pytest.raises(export.ExportError):
        export.write_checkpoint(out, cfg, tensors)
    assert listing(tmp_path) == ["model.bin"]
    assert out.read_bytes() == b"previous contents"


# --------------------------------------------------------------------------
# llama2.c conversion

def test_llama2c_stories260k_tensors(tmp_path):
    """Converting stories260K keeps every tensor bit for bit and writes
    llama2.c's fixed conventions into the header."""
    (src,) = need_shared("stories260K.bin")
    out = tmp_path / "s.bin"
    p = export_cli(out, "--llama2c", src)
    assert p.returncode == 0, p.stderr
    assert p.stderr == b"", p.stderr
    assert p.stdout.decode().startswith(f"export.py: wrote {out} (1016.0 KiB): 260.0K parameters, "
                                        "weights f32, dim 64, hidden 172, 5 layers, 8 heads (4 kv)"), p.stdout
    h = export.read_header(out)
    assert (h["dim"], h["hidden_dim"], h["n_layers"], h["n_heads"], h["n_kv_heads"],
            h["vocab_size"], h["seq_len"]) == (64, 172, 5, 8, 4, 512, 512)
    assert (h["shared_classifier"], h["bos_id"], h["eos_id"], h["rope_layout"], h["rot_dim"],
            h["rope_scaling"], h["rope_orig_ctx"]) == (1, 1, 2, 0, 8, 0, 0)
    assert h["norm_eps"] == np.float32(1e-5) and h["rope_theta"] == 10000.0
    assert h["rope_factor"] == 1.0 and h["reserved_zero"]
    cfg, legacy, _, _ = export.read_llama2c(src)
    _, ours = export.read_checkpoint(out)
    assert out.stat().st_size == expected_size(cfg)[0]
    assert list(ours) == list(legacy)
    for name in legacy:
        assert np.array_equal(ours[name], legacy[name]), name


def test_llama2c_stories260k_same_output(tmp_path):
    """run reads the converted file and gives the same greedy text and the
    same perplexity as from the legacy file. Same float32 weights, same code
    after loading: the results must be identical, not just close."""
    src, tok = need_shared("stories260K.bin", "tok512.bin")
    out = tmp_path / "s.bin"
    assert export_cli(out, "--llama2c", src).returncode == 0
    for prompt in ([], ["-i", "Once upon a time"]):
        a = run_ok(src, "-z", tok, "-t", "0", "-n", "300", *prompt)
        b = run_ok(out, "-z", tok, "-t", "0", "-n", "300", *prompt)
        assert a.stdout == b.stdout and len(a.stdout) > 100
    valid = SHARED / "data" / "tinystories" / "tinystories_valid_head.txt"
    text = valid.read_bytes()[:2000] if valid.is_file() else TEXT.encode()
    text = text.decode("utf-8", errors="ignore").encode()
    (tmp_path / "t.txt").write_bytes(text)
    for ctx, stride in ((128, None), (600, None), (128, 48)):
        a = run_ppl(src, tok, tmp_path / "t.txt", ctx, stride)
        b = run_ppl(out, tok, tmp_path / "t.txt", ctx, stride)
        assert a["tokens"] == b["tokens"] > 100
        assert a["nll"] == b["nll"] and a["buckets"] == b["buckets"]
        assert 0.5 < a["nll"] < 4, a["nll"]  # a trained model, not noise


def test_llama2c_unshared_gqa_round_trip(tmp_path, syn_tokenizer):
    """A llama2.c file with an unshared classifier (negative vocab_size) and
    GQA converts losslessly; run gives identical NLL from both files, equal to
    the reference."""
    cfg = model_config(n_heads=8, n_kv_heads=2, shared_classifier=False)
    tensors = export.random_tensors(cfg, 21)
    legacy = write_legacy(tmp_path / "legacy.bin", cfg, tensors)
    out = tmp_path / "ours.bin"
    p = export_cli(out, "--llama2c", legacy)
    assert p.returncode == 0, p.stderr
    back_cfg, back = export.read_checkpoint(out)
    assert back_cfg == f32(cfg)
    for name in tensors:
        assert np.array_equal(back[name], tensors[name]), name
    (tmp_path / "t.txt").write_bytes(TEXT.encode())
    a = run_ppl(legacy, syn_tokenizer, tmp_path / "t.txt", 64)
    b = run_ppl(out, syn_tokenizer, tmp_path / "t.txt", 64)
    assert a["nll"] == b["nll"] and a["buckets"] == b["buckets"]
    ids = run_ok(out, "-z", syn_tokenizer, "-m", "tokenize", "-i", TEXT).stdout.split()
    ids = [int(i) for i in ids]
    ref = ppl_reference(Reference(cfg, tensors), ids[1:], 64, 1, cfg["seq_len"])
    assert abs(ref["nll"] - b["nll"]) < 1e-4  # tolerance: see test_forward.py


def _legacy_source(tmp_path, kind):
    """A bad --llama2c input and the words the message must contain."""
    cfg = model_config()
    good = write_legacy(tmp_path / "good.bin", cfg, export.random_tensors(cfg, 0))
    data = good.read_bytes()
    path = tmp_path / f"{kind}.bin"
    if kind == "truncated":
        path.write_bytes(data[:len(data) // 2])
        return path, ["truncated", str(len(data)), str(len(data) // 2)]
    if kind == "trailing-byte":
        path.write_bytes(data + b"\0")
        return path, [str(len(data)), str(len(data) + 1)]
    if kind == "header-only":
        path.write_bytes(data[:28])
        return path, [str(len(data)), "28"]
    if kind == "short-header":
        path.write_bytes(data[:10])
        return path, ["10"]
    if kind == "empty":
        path.write_bytes(b"")
        return path, ["0"]
    if kind == "15M-header-4KB":
        path.write_bytes(struct.pack("<7i", 288, 768, 6, 6, 6, 32000, 256) + bytes(4096))
        return path, ["truncated", "4124"]
    if kind == "zero-heads":
        path.write_bytes(struct.pack("<7i", 64, 172, 5, 0, 4, 512, 512) + data[28:])
        return path, ["n_heads"]
    if kind == "missing":
        return tmp_path / "nothere.bin", []
    if kind == "directory":
        (tmp_path / "adir").mkdir()
        return tmp_path / "adir", ["directory"]
    if kind == "version-1-file":
        make_model(tmp_path, "v1.bin")
        return tmp_path / "v1.bin", ["version-1"]
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["truncated", "trailing-byte", "header-only", "short-header",
                                  "empty", "15M-header-4KB", "zero-heads", "missing",
                                  "directory", "version-1-file"])
def test_llama2c_bad_source(tmp_path, kind):
    """One line on stderr naming the input and the problem (expected and actual
    byte counts for a size mismatch), exit 1, no traceback, no output file,
    no temporary file."""
    src, words = _legacy_source(tmp_path, kind)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    p = export_cli(out_dir / "o.bin", "--llama2c", src)
    err = p.stderr.decode()
    assert p.returncode == 1, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert str(src) in err
    for w in words:
        assert w in err, (w, err)
    assert listing(out_dir) == []


def test_failed_cli_keeps_existing_output(tmp_path):
    src, _ = _legacy_source(tmp_path, "truncated")
    out = tmp_path / "o.bin"
    out.write_bytes(b"keep me")
    p = export_cli(out, "--llama2c", src)
    assert p.returncode == 1
    assert out.read_bytes() == b"keep me"
    assert not [n for n in listing(tmp_path) if n.endswith(".tmp")]


@pytest.mark.parametrize("args,code", [
    (["o.bin"], 2),                                     # no source
    (["o.bin", "--random", "1,2,3"], 1),                # wrong field count
    (["o.bin", "--random", "64,96,2,4,3,300,32"], 1),   # n_kv_heads 3 does not divide 4
    (["o.bin", "--random", "64,96,2,4,4,300,32", "--rot-dim", "5"], 1),
    (["o.bin", "--llama2c", "a.bin", "--tokenizer", "b.model"], 2),
], ids=["no-source", "random-spec", "random-kv", "random-rot", "two-sources"])
def test_cli_usage_errors(tmp_path, args, code):
    p = subprocess.run(EXPORT + args, capture_output=True, cwd=tmp_path, timeout=60)
    err = p.stderr.decode()
    assert p.returncode == code, err
    assert "Traceback" not in err
    if code == 1:
        assert len(err.strip().splitlines()) == 1 and "o.bin" in err, err
    assert listing(tmp_path) == []


# --------------------------------------------------------------------------
# Tokenizers

def test_write_tokenizer_round_trip(tmp_path):
    path = tmp_path / "tok.bin"
    export.write_tokenizer(path, SYN_PIECES, SYN_SCORES)
    max_len, pieces, scores = export.read_tokenizer(path)
    assert max_len == max(len(p) for p in SYN_PIECES) == 6
    assert pieces == SYN_PIECES
    assert scores == [float(np.float32(s)) for s in SYN_SCORES]
    raw = path.read_bytes()
    assert raw[:4] == struct.pack("<i", 6)
    assert raw[4:4 + 8 + 5] == struct.pack("<fi", 0.0, 5) + b"<unk>"


def test_write_tokenizer_reproduces_tok512(tmp_path):
    (src,) = need_shared("tok512.bin")
    max_len, pieces, scores = export.read_tokenizer(src)
    out = tmp_path / "tok.bin"
    export.write_tokenizer(out, pieces, scores)
    assert out.read_bytes() == src.read_bytes()


def test_tokenizer_from_sentencepiece_equals_llama2_bin(tmp_path):
    """--tokenizer on the Llama 2 sentencepiece model reproduces llama2.c's
    tokenizer.bin byte for byte (checked: it does)."""
    model, ref = need_shared("llama2-tokenizer.model", "llama2-tokenizer.bin")
    pytest.importorskip("sentencepiece", reason="python3-sentencepiece is not installed")
    out = tmp_path / "tok.bin"
    p = export_cli(out, "--tokenizer", model)
    assert p.returncode == 0, p.stderr
    assert out.read_bytes() == ref.read_bytes()


@pytest.mark.parametrize("kind", ["missing", "directory", "not-a-model"])
def test_tokenizer_bad_source(tmp_path, kind):
    pytest.importorskip("sentencepiece", reason="python3-sentencepiece is not installed")
    src = tmp_path / "in.model"
    if kind == "directory":
        src.mkdir()
    elif kind == "not-a-model":
        src.write_bytes(b"this is not a protobuf\n" * 10)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    p = export_cli(out_dir / "tok.bin", "--tokenizer", src)
    err = p.stderr.decode()
    assert p.returncode == 1, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert str(src) in err
    assert listing(out_dir) == []
