"""./run FILE.gguf: GGUF files read directly (gguf.c, gguf_model.c).

The reference is export.py's conversion of the same file (`export.py OUT.bin
--gguf FILE.gguf`, f32, or `--dtype q8_0` for a Q8_0 file): for the float
tensor types and Q8_0 (the 4- to 6-bit types: tests/test_gguf_quants.py),
tied and untied classifier, GQA and partial rotary, and each RoPE scaling
the GGUF keys give (none, linear, the older rope.scale_linear, YaRN with
its original context, betas and attention factors), `run X.gguf -m ppl
--save-logits` writes the same bytes as `run X.bin` (every logit of every
scored token bit for bit), greedy generation prints the same text, and `-m
info --json` reports the same config.
Both runs use the tokenizer export.py writes from the GGUF (-z).

Refusals, each one line on stderr naming the file, exit 1: the file
truncated at every field boundary of its header, metadata and tensor table and
inside its data; absurd counts, lengths, dimensions and offsets; misaligned
data; unknown value and tensor types; an architecture not read (qwen2 and
phi3 are tests/test_gguf_archs.py's); a
tensor type not read yet (Q2_K: the message names the export.py command that
converts the file, which then works). Without -z, the GGUF's own tokenizer
gives the text of export.py's (tests/test_gguf_tokenizer.py compares them).

The small files come from tests/test_gguf.py's make_gguf (gguf.GGUFWriter).
"""
import json
import pathlib
import struct

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from conftest import SYN_VOCAB, run, run_ok  # noqa: F401
from test_convert import advised_command, export_ok, text_file  # noqa: F401
from test_gguf import CTX, _field_offset, _tensor_info, llama_metadata, llamacpp_rope_freqs, make_gguf

FLOAT_TYPES = [Q.F32, Q.F16, Q.BF16]


def _exported(tmp_path, path, q8=False):
    """export.py's conversion of path (q8: --dtype q8_0) and its tokenizer."""
    out = tmp_path / ("ref-q8.bin" if q8 else "ref.bin")
    tok = tmp_path / "ref-tok.bin"
    export_ok(out, "--gguf", path, "--tokenizer-out", tok, *(["--dtype", "q8_0"] if q8 else []))
    return out, tok


def _logits(ckpt, tok, text_file, out, extra=()):
    run_ok(ckpt, "-z", tok, "-m", "ppl", "-f", text_file, "--ctx", str(CTX), "--save-logits", out, *extra)
    return pathlib.Path(out).read_bytes()


def _info(ckpt, tok, extra=()):
    info = json.loads(run_ok(ckpt, "-z", tok, "-m", "info", "--json", *extra).stdout)
    for key in ("file", "file_size", "format_version", "gguf_version", "converted_bytes", "gguf_keys_mapped",
                "gguf_keys_ignored"):
        info.pop(key, None)
    return info


def assert_same_model(tmp_path, path, text_file, q8=False, extra=()):
    """run on the GGUF and on export.py's conversion: the same logits, text and config."""
    ref, tok = _exported(tmp_path, path, q8)
    a = _logits(path, tok, text_file, tmp_path / "gguf.logits", extra)
    b = _logits(ref, tok, text_file, tmp_path / "ref.logits", extra)
    assert len(a) > 10000 and a == b
    gen = ["-z", tok, "-t", "0", "-n", "24", "-i", "the cat", *extra]
    assert run_ok(path, *gen).stdout == run_ok(ref, *gen).stdout
    extra = list(extra)  # -m info takes --gguf-convert, not every flag ppl and generation take
    convert = extra[extra.index("--gguf-convert"):][:2] if "--gguf-convert" in extra else []
    assert _info(path, tok, convert) == _info(ref, tok)
    return tok


# --------------------------------------------------------------------------
# The same model as export.py's conversion

@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("qtype", FLOAT_TYPES + [Q.Q8_0], ids=lambda q: q.name)
def test_gguf_types_bit_identical(qtype, tied, tmp_path, text_file):
    """Each tensor type run reads, against export.py's f32 conversion (Q8_0:
    its --dtype q8_0 conversion, whose quantizer run's loader repeats)."""
    path, _, _ = make_gguf(tmp_path / "m.gguf", qtype, tied=tied, seed=11 + FLOAT_TYPES.count(qtype) + tied)
    tok = assert_same_model(tmp_path, path, text_file, q8=qtype == Q.Q8_0)
    err = run_ok(path, "-z", tok, "-m", "info").stderr.decode()
    note = [line for line in err.splitlines() if "converted at load" in line]
    assert len(note) == 1 and str(path) in note[0] and "MiB" in note[0], err
    if qtype == Q.Q8_0:
        assert "Q8_0 -> q8_0" in note[0] and b"q8_0" in run_ok(path, "-z", tok, "-m", "info").stdout


def test_gguf_q8_0_matches_f32_conversion_kernels(tmp_path, text_file):
    """A Q8_0 file read as our q8_0 also equals export.py's --dtype q8_0
    conversion with the int8 kernels for blocks (--q8-activations int8)."""
    path, _, _ = make_gguf(tmp_path / "m.gguf", Q.Q8_0, seed=5)
    assert_same_model(tmp_path, path, text_file, q8=True, extra=["--q8-activations", "int8"])


def test_gguf_gqa_partial_rotary(tmp_path, text_file):
    """GQA (n_kv_heads 1) and rot_dim 32 of head size 64, base 500000."""
    path, _, _ = make_gguf(tmp_path / "m.gguf", Q.F16, seed=3, n_kv_heads=1, rot_dim=32, rope_theta=500000.0)
    assert_same_model(tmp_path, path, text_file)


SCALINGS = {
    "linear": [("llama.rope.scaling.type", "str", "linear"), ("llama.rope.scaling.factor", "f32", 2.5)],
    "scale_linear": [("llama.rope.scale_linear", "f32", 4.0)],
    "yarn": [("llama.rope.scaling.type", "str", "yarn"), ("llama.rope.scaling.factor", "f32", 4.0),
             ("llama.rope.scaling.original_context_length", "u32", 16)],
    "yarn-params": [("llama.rope.scaling.type", "str", "yarn"), ("llama.rope.scaling.factor", "f32", 8.0),
                    ("llama.rope.scaling.yarn_beta_fast", "f32", 16.0),
                    ("llama.rope.scaling.yarn_beta_slow", "f32", 2.0),
                    ("llama.rope.scaling.attn_factor", "f32", 0.8),
                    ("llama.rope.scaling.yarn_attn_factor", "f32", 1.1)],
    "none-with-factor": [("llama.rope.scaling.type", "str", "none"), ("llama.rope.scaling.factor", "f32", 3.0)],
    "rope_freqs-ones": [],
}


@pytest.mark.parametrize("name", SCALINGS)
def test_gguf_rope_scaling_bit_identical(name, tmp_path, text_file):
    """Each scaling the GGUF keys give, mapped as export.py maps it; ppl at a
    context past the training length too."""
    extra = [("rope_freqs.weight", np.ones(32, np.float32), None)] if name == "rope_freqs-ones" else ()
    path, _, _ = make_gguf(tmp_path / "m.gguf", Q.F32, seed=9, extra_tensors=extra,
                           metadata=lambda cfg: llama_metadata(cfg) + SCALINGS[name])
    tok = assert_same_model(tmp_path, path, text_file)
    ref, _ = _exported(tmp_path, path)
    long = ["--ctx", str(4 * CTX)]
    a = run_ok(path, "-z", tok, "-m", "ppl", "-f", text_file, *long, "--json").stdout
    assert a == run_ok(ref, "-z", tok, "-m", "ppl", "-f", text_file, *long, "--json").stdout


LLAMA3 = {  # base, factor, low, high, original context, whether the file gives the context
    "llama3.1": (500000.0, 8.0, 1.0, 4.0, 8192, False),
    "llama3.2-1b": (500000.0, 32.0, 1.0, 4.0, 8192, False),
    "orig-16384": (500000.0, 8.0, 1.0, 4.0, 16384, False),
    "orig-from-key": (10000.0, 16.0, 2.0, 8.0, 4096, True),
    "low-2-seen-as-low-1": (10000.0, 16.0, 2.0, 8.0, 4096, False),
    "small-factor": (10000.0, 4.0, 1.0, 4.0, 8192, False),
}


@pytest.mark.parametrize("name", LLAMA3)
def test_gguf_llama3_rope_freqs_bit_identical(name, tmp_path, text_file):
    """llama.cpp's rope_freqs for Llama 3's scaling: the parameters recovered
    as export.py's fit recovers them (-m info says the same), the same logits."""
    base, factor, low, high, orig, key = LLAMA3[name]
    freqs = llamacpp_rope_freqs(base, 64, factor, low, high, orig)
    extra_md = [("llama.rope.scaling.original_context_length", "u32", orig)] if key else []
    path, _, _ = make_gguf(tmp_path / "m.gguf", Q.F16, seed=4, rope_theta=base,
                           extra_tensors=[("rope_freqs.weight", freqs, None)],
                           metadata=lambda cfg: llama_metadata(cfg) + extra_md)
    tok = assert_same_model(tmp_path, path, text_file)
    info = _info(path, tok)
    assert info["rope"]["scaling"] == "llama3", info


def test_gguf_rope_freqs_off_the_rule_refused(tmp_path):
    freqs = llamacpp_rope_freqs(10000.0, 64, 8.0, 1.0, 4.0, 8192) * np.float32(1.001)
    path, _, _ = make_gguf(tmp_path / "m.gguf", Q.F32, extra_tensors=[("rope_freqs.weight", freqs, None)])
    refused(path, "rope_freqs", "Llama 3")


def _rewritten(src, dst, as_type):
    """A copy of GGUF src with the tensors of as_type ({name: "f32" | "f16"})
    dequantized and stored as that float type, the others as they are."""
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(str(dst), "llama")
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if f.types[0] == gguf.GGUFValueType.ARRAY and f.types[1] == gguf.GGUFValueType.STRING:
            w.add_array(name, [bytes(f.parts[i]).decode() for i in f.data])
        elif f.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_array(name, [f.parts[i][0].item() for i in f.data])
        elif f.types[0] == gguf.GGUFValueType.STRING:
            w.add_string(name, bytes(f.parts[-1]).decode())
        else:
            w.add_key_value(name, f.parts[-1][0].item(), f.types[0])
    for t in r.tensors:
        shape = tuple(reversed([int(d) for d in t.shape]))
        if t.name in as_type:
            v = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
            w.add_tensor(t.name, v.astype(np.float16) if as_type[t.name] == "f16" else v)
        elif t.tensor_type == Q.Q8_0:
            w.add_tensor(t.name, np.array(t.data), raw_dtype=Q.Q8_0)
        else:
            w.add_tensor(t.name, np.array(t.data).reshape(shape))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def test_gguf_mixed_types(tmp_path, text_file):
    """Q8_0 matrices with an F32 embedding and one layer's q in F16 (as some
    files mix types): the embedding stays float32, the q matrix of both layers
    becomes float32 (one matrix has one type), the rest q8_0; the notice says
    so, and the NLL is export.py's f32 conversion's to float rounding."""
    src, _, _ = make_gguf(tmp_path / "m.gguf", Q.Q8_0, seed=8)
    path = _rewritten(src, tmp_path / "mixed.gguf", {"token_embd.weight": "f32", "blk.1.attn_q.weight": "f16"})
    ref, tok = _exported(tmp_path, src)
    err = run_ok(path, "-z", tok, "-m", "info").stderr.decode()
    assert "(4 F32 copied, 1 F16 -> f32, 1 Q8_0 -> f32, 13 Q8_0 -> q8_0; layers stacked)" in err, err
    nll = [json.loads(run_ok(p, "-z", tok, "-m", "ppl", "-f", text_file, "--ctx", str(CTX), "--json").stdout)["nll"]
           for p in (path, ref)]
    assert abs(nll[0] - nll[1]) < 1e-3, nll


# --------------------------------------------------------------------------
# The tokenizer

def test_gguf_without_z_reads_its_own_tokenizer(tmp_path):
    """No -z: the GGUF's own vocabulary (tokenizer.ggml.*; the comparisons
    with export.py's tokenizer are tests/test_gguf_tokenizer.py's), giving
    the text export.py's tokenizer.bin gives."""
    path, _, _ = make_gguf(tmp_path / "m.gguf", Q.F16)
    _, tok = _exported(tmp_path, path)
    gen = ["-t", "0", "-n", "4", "-i", "the cat"]
    assert run_ok(path, *gen).stdout == run_ok(path, "-z", tok, *gen).stdout


# --------------------------------------------------------------------------
# Refusals

def refused(path, *words):
    """run on path: exit 1, one line on stderr that names path and has words."""
    p = run(path, "-m", "info", "-z", "/nonexistent/tokenizer.bin")
    err = p.stderr.decode(errors="replace")
    assert p.returncode == 1, (p.returncode, err)
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith(str(path)), err
    for w in words:
        assert w in err, (w, err)
    return err


def test_gguf_info_keys_mapped_and_ignored(tmp_path):
    """-m info names the metadata keys the load reads and those it passes by,
    in the file's order: the model's, the RoPE's and the tokenizer's keys are
    mapped; general.name, a key of no reader and unknown_token_id (a
    sentencepiece file's <unk> is found by its token type) are ignored."""
    def metadata(cfg):
        return llama_metadata(cfg) + [("general.name", "str", "tiny"), ("x.custom", "u32", 7)]
    path, cfg, _ = make_gguf(tmp_path / "m.gguf", Q.F32, metadata=metadata)
    info = json.loads(run_ok(path, "-m", "info", "--json").stdout)
    mapped, ignored = info["gguf_keys_mapped"], info["gguf_keys_ignored"]
    assert set(mapped) | set(ignored) == {k for k, _, _ in metadata(cfg)} | {"general.architecture"}
    assert not set(mapped) & set(ignored)
    for key in ("general.architecture", "llama.context_length", "llama.rope.freq_base", "tokenizer.ggml.tokens",
                "tokenizer.ggml.scores", "tokenizer.ggml.eos_token_id"):
        assert key in mapped
    for key in ("general.name", "x.custom", "general.file_type"):
        assert key in ignored
    text = run_ok(path, "-m", "info").stdout.decode()
    line = next(x for x in text.splitlines() if x.startswith("gguf_keys_ignored"))
    assert line.split(None, 1)[1] == f"{len(ignored)}: " + ", ".join(ignored)
    # with another tokenizer (-z) the file's tokenizer keys are not read (tokens, the vocabulary size, still
    # is, by the model); an export.py checkpoint has no GGUF keys
    ref, tok = _exported(tmp_path, path)
    other = json.loads(run_ok(path, "-z", tok, "-m", "info", "--json").stdout)
    assert "tokenizer.ggml.scores" in other["gguf_keys_ignored"] and "tokenizer.ggml.tokens" in other["gguf_keys_mapped"]
    assert "gguf_keys_mapped" not in json.loads(run_ok(ref, "-z", tok, "-m", "info", "--json").stdout)


def test_gguf_unsupported_tensor_type(tmp_path):
    path, _, _ = make_gguf(tmp_path / "m.gguf", Q.Q2_K)
    err = refused(path, "Q2_K", "token_embd.weight", "export.py")
    import subprocess
    out = tmp_path / "out"
    out.mkdir()
    conv = subprocess.run(advised_command(err, "convert it with: ", " (also"), cwd=out, capture_output=True)
    assert conv.returncode == 0, conv.stderr


def test_gguf_other_architecture(tmp_path):
    """An architecture run does not read (qwen2 and phi3: tests/test_gguf_archs.py)."""
    md = lambda cfg: [(k.replace("llama.", "gemma."), kind, v) for k, kind, v in llama_metadata(cfg)]
    path, _, _ = make_gguf(tmp_path / "m.gguf", Q.F32, metadata=md)
    raw = bytearray(path.read_bytes())
    at = raw.index(b"general.architecture") + len(b"general.architecture") + 4 + 8
    raw[at:at + 5] = b"gemma"  # "llama" -> "gemma": the same length
    path.write_bytes(bytes(raw))
    refused(path, "general.architecture", "gemma", "llama", "qwen2", "phi3")


def _patch(path, offset, fmt, value):
    raw = bytearray(path.read_bytes())
    struct.pack_into(fmt, raw, offset, value)
    path.write_bytes(bytes(raw))


def _tensor_field(path, name, field):
    """Byte offset of a tensor table entry's field (n_dims, dims, type, offset)."""
    off, name_len, n_dims = _tensor_info(path, name)
    at = off + 8 + name_len
    return {"n_dims": at, "dims": at + 4, "type": at + 4 + 8 * n_dims, "offset": at + 4 + 8 * n_dims + 4}[field]


def _bad(kind, path):
    """Make one kind of bad file out of a good one; returns words its message must have."""
    key = "tokenizer.ggml.tokens"
    if kind == "n_tensors":
        _patch(path, 8, "<Q", 1 << 62)
        return ["tensors"]
    if kind == "n_kv":
        _patch(path, 16, "<Q", (1 << 64) - 1)
        return ["metadata entries"]
    if kind == "version":
        _patch(path, 4, "<I", 1)
        return ["version 1"]
    if kind == "big-endian":
        _patch(path, 4, "<I", 3 << 24)
        return ["big-endian"]
    if kind == "magic":
        _patch(path, 0, "4s", b"GGUG")
        return ["not a checkpoint"]
    if kind == "key-length":
        _patch(path, _field_offset(path, key), "<Q", 1 << 60)
        return ["truncated", "metadata entry"]
    if kind == "value-type":
        _patch(path, _field_offset(path, key) + 8 + len(key), "<I", 13)
        return [key, "value type 13"]
    if kind == "array-length":
        _patch(path, _field_offset(path, key) + 8 + len(key) + 4 + 4, "<Q", 1 << 61)
        return [key, "truncated"]
    if kind == "array-type":
        _patch(path, _field_offset(path, key) + 8 + len(key) + 4, "<I", 77)
        return [key, "value type 77"]
    if kind == "string-length":  # the first token's length
        _patch(path, _field_offset(path, key) + 8 + len(key) + 4 + 4 + 8, "<Q", 1 << 40)
        return [key, "truncated"]
    name = "blk.0.attn_q.weight"
    if kind == "n_dims":
        _patch(path, _tensor_field(path, name, "n_dims"), "<I", 5)
        return [name, "5 dimensions"]
    if kind == "dims-zero":
        _patch(path, _tensor_field(path, name, "dims"), "<Q", 0)
        return [name, "dimensions"]
    if kind == "dims-huge":
        _patch(path, _tensor_field(path, name, "dims"), "<Q", 1 << 40)
        return [name, "dimensions"]
    if kind == "dims-shape":
        _patch(path, _tensor_field(path, name, "dims"), "<Q", 32)
        return [name, "shape"]
    if kind == "tensor-type":
        _patch(path, _tensor_field(path, name, "type"), "<I", 99)
        return [name, "unknown type 99"]
    if kind == "offset-past-end":
        _patch(path, _tensor_field(path, name, "offset"), "<Q", 1 << 40)
        return [name, "past the end"]
    if kind == "offset-misaligned":
        (offset,) = struct.unpack_from("<Q", path.read_bytes(), _tensor_field(path, name, "offset"))
        _patch(path, _tensor_field(path, name, "offset"), "<Q", offset + 4)
        return [name, "not a multiple of the alignment"]
    if kind == "overlap":
        (k_data,) = struct.unpack_from("<Q", path.read_bytes(),
                                       _tensor_field(path, "blk.0.attn_k.weight", "offset"))
        _patch(path, _tensor_field(path, name, "offset"), "<Q", k_data + 32)
        return ["overlap"]
    if kind == "duplicate-tensor":  # blk.0.attn_q -> blk.0.attn_k: the same length
        raw = path.read_bytes()
        path.write_bytes(raw.replace(b"blk.0.attn_q.weight", b"blk.0.attn_k.weight", 1))
        return ["blk.0.attn_k.weight", "twice"]
    if kind == "duplicate-key":
        raw = path.read_bytes()
        path.write_bytes(raw.replace(b"llama.vocab_size", b"llama.block_count"[:16], 1))
        return ["appears twice"]
    raise KeyError(kind)


BAD = ["n_tensors", "n_kv", "version", "big-endian", "magic", "key-length", "value-type", "array-length",
       "array-type", "string-length", "n_dims", "dims-zero", "dims-huge", "dims-shape", "tensor-type",
       "offset-past-end", "offset-misaligned", "overlap", "duplicate-tensor"]


@pytest.fixture(scope="module")
def good_gguf(tmp_path_factory):
    path, _, _ = make_gguf(tmp_path_factory.mktemp("good") / "m.gguf", Q.F16, seed=2)
    return path.read_bytes()


@pytest.mark.parametrize("kind", BAD)
def test_gguf_bad_file(kind, tmp_path, good_gguf):
    path = tmp_path / "bad.gguf"
    path.write_bytes(good_gguf)
    words = _bad(kind, path)
    if kind == "magic":  # no longer a GGUF: the checkpoint loader's refusal
        p = run(path, "-m", "info")
        assert p.returncode == 1 and len(p.stderr.decode().strip().splitlines()) == 1
        return
    refused(path, *words)


def test_gguf_bad_alignment(tmp_path):
    """general.alignment not a power of two, and of the wrong type."""
    path, _, _ = make_gguf(tmp_path / "m.gguf", Q.F32,
                           metadata=lambda cfg: llama_metadata(cfg) + [("general.alignment", "u32", 32)])
    _patch(path, _field_offset(path, "general.alignment") + 8 + len("general.alignment") + 4, "<I", 48)
    refused(path, "general.alignment", "power of two")
    path, _, _ = make_gguf(tmp_path / "n.gguf", Q.F32,
                           metadata=lambda cfg: llama_metadata(cfg) + [("general.alignment", "u64", 32)])
    refused(path, "general.alignment", "u32")


def _boundaries(path):
    """Byte offsets where a field of the header, the metadata or the tensor
    table starts or ends (every part of every field GGUFReader reports; the
    parts of the long token arrays sampled), and a few inside the data."""
    reader = gguf.GGUFReader(path)
    cuts = {4, 8, 16, 24}
    for field in list(reader.fields.values()) + [t.field for t in reader.tensors]:
        at = field.offset
        step = max(1, len(field.parts) // 40)
        for i, part in enumerate(field.parts):
            if i % step == 0 or i == len(field.parts) - 1:
                cuts.update((at, at + 1))
            at += part.nbytes
        cuts.add(at)
    ends = sorted(t.data_offset + t.n_bytes for t in reader.tensors)
    cuts.update(e - 1 for e in ends[::4])
    size = path.stat().st_size
    return sorted(c for c in cuts if 0 < c < size)


def test_gguf_truncated_everywhere(tmp_path, good_gguf):
    """Cut at every field boundary (and inside the data): one line, exit 1."""
    src = tmp_path / "m.gguf"
    src.write_bytes(good_gguf)
    cuts = _boundaries(src)
    assert len(cuts) > 150
    for n in cuts:
        path = tmp_path / "cut.gguf"
        path.write_bytes(good_gguf[:n])
        p = run(path, "-m", "info", "-z", "/nonexistent")
        err = p.stderr.decode(errors="replace")
        assert p.returncode == 1 and len(err.strip().splitlines()) == 1, (n, err)
        assert str(path) in err and ("truncated" in err or "past the end" in err or "header" in err), (n, err)
