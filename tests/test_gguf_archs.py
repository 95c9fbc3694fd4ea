"""GGUF files of the qwen2 and phi3 architectures: export.py --gguf
(convert/gguf.py) and ./run FILE.gguf (gguf_model.c).

The files are written here the way llama.cpp's converter from Hugging Face
models writes a Qwen2 or Phi-3, from a small random Hugging Face model
(test_convert.make_hf):

  qwen2  the Llama tensor names plus blk.N.attn_q/attn_k/attn_v.bias (F32);
         q/k rows as Hugging Face stores them (no permutation); no
         rope.dimension_count; output.weight absent when tied
  phi3   blk.N.attn_qkv = qkv_proj (q | k | v rows) and blk.N.ffn_up =
         gate_up_proj (gate | up rows) as they are; rope.dimension_count =
         int(partial_rotary_factor * hidden_size) // heads;
         rope.scaling.original_context_length always;
         attention.sliding_window (0 when the config has none); with LongRoPE
         the F32 tensors rope_factors_long / rope_factors_short and
         rope.scaling.attn_factor = sqrt(1 + ln s / ln L), s =
         max_position_embeddings / L (1 when s <= 1); newer converters also
         write rope.scaling.type "longrope"
  both   matrices in the chosen type, 1-D tensors (norms, biases) F32; a
         YaRN rope_scaling as rope.scaling.type, factor and
         original_context_length

Checked:
  - export.py's conversion of the GGUF is, byte for byte, its --hf
    conversion of the same (dequantized) weights (the independent check of
    convert/gguf.py: --hf is checked against transformers elsewhere), and the
    other q/k layout gives the same NLL; a LongRoPE file whose magnitude is
    derived (no attn_factor) gives the --hf NLL to LAYOUT_TOL;
  - ./run X.gguf: the logits bit-identical to ./run on export.py's conversion,
    the same greedy text and -m info (F32, F16, BF16, Q8_0; tied and untied;
    partial rotary; a window; Qwen2 with YaRN; LongRoPE with both factor
    sets, at a context past the original one, and the long factors shown to
    matter);
  - refusals, one line naming the file and the tensor or key, exit 1, from
    both readers: a missing bias, a fused tensor of the wrong shape, rope
    factors of the wrong length or not positive, one factor set only, a
    longrope type without factors, Qwen2's sliding window, separate q/k/v in
    a phi3 file, an architecture not read.
"""
import json
import math

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

import export
from conftest import run_ok, run_ppl  # noqa: F401
from test_convert import LAYOUT_TOL, export_ok, export_run, make_hf, text_file, write_hf_dir  # noqa: F401
from test_gguf import CTX, encode, llama_metadata, write_gguf
from test_gguf_load import _exported, _info, assert_same_model, refused

FILE_TYPES = {Q.F32: 0, Q.F16: 1, Q.Q4_1: 3, Q.Q8_0: 7, Q.BF16: 32}  # general.file_type, llama.cpp's numbers


def hf_model(directory, arch, tied=False, seed=0, **overrides):
    """A random Hugging Face Qwen2 or Phi-3 model (config, HF-named tensors)."""
    family = {"qwen2": "Qwen2ForCausalLM", "phi3": "Phi3ForCausalLM"}[arch]
    _, config, tensors = make_hf(directory, seed=seed, lm_head=not tied, architectures=[family],
                                 model_type=arch, num_key_value_heads=2, tie_word_embeddings=tied,
                                 **overrides)
    return config, tensors


def _tokenizer_metadata(config):
    """The synthetic sentencepiece vocabulary's tokenizer.* keys."""
    cfg = dict(seq_len=1, dim=1, n_layers=1, hidden_dim=1, n_heads=1, n_kv_heads=1, norm_eps=1e-5,
               rope_theta=1e4, vocab_size=config["vocab_size"])
    return [e for e in llama_metadata(cfg) if e[0].startswith("tokenizer.")]


def _phi3_metadata(config, tensors):
    """phi3's own keys and, with LongRoPE, its factor tensors (as the converter writes them)."""
    a, d, heads = "phi3", config["hidden_size"], config["num_attention_heads"]
    ctx = config["max_position_embeddings"]
    orig = config.get("original_max_position_embeddings", 4096)  # Phi3Config's default
    md = [(f"{a}.rope.dimension_count", "u32", int(config.get("partial_rotary_factor", 1.0) * d) // heads),
          (f"{a}.rope.scaling.original_context_length", "u32", orig),
          (f"{a}.attention.sliding_window", "u32", config.get("sliding_window") or 0)]
    rs = config.get("rope_scaling") or {}
    if not rs.get("long_factor"):
        return md, []
    s = ctx / orig
    md.append((f"{a}.rope.scaling.attn_factor", "f32", math.sqrt(1 + math.log(s) / math.log(orig)) if s > 1 else 1.0))
    factors = [("rope_factors_long.weight", np.float32(rs["long_factor"]), None),
               ("rope_factors_short.weight", np.float32(rs["short_factor"]), None)]
    return md, factors


def gguf_of_hf(path, config, tensors, qtype=Q.F32, seed=0, metadata=None, drop=(), extra=()):
    """Write the GGUF llama.cpp's converter makes of this Hugging Face model,
    its matrices stored as qtype. Returns (path, the HF-named tensors as the
    file stores them: what its tensors dequantize to). metadata(md) may edit
    the [(key, kind, value)] list; drop: GGUF tensor names left out; extra:
    more (name, array, raw_dtype) tensors."""
    arch, rng = config["model_type"], np.random.default_rng(seed)
    a, n = arch, config["num_hidden_layers"]
    md = [(f"{a}.context_length", "u32", config["max_position_embeddings"]),
          (f"{a}.embedding_length", "u32", config["hidden_size"]),
          (f"{a}.feed_forward_length", "u32", config["intermediate_size"]),
          (f"{a}.block_count", "u32", n),
          (f"{a}.attention.head_count", "u32", config["num_attention_heads"]),
          (f"{a}.attention.head_count_kv", "u32", config["num_key_value_heads"]),
          (f"{a}.rope.freq_base", "f32", config["rope_theta"]),
          (f"{a}.attention.layer_norm_rms_epsilon", "f32", config["rms_norm_eps"]),
          ("general.file_type", "u32", FILE_TYPES[qtype])]
    factors = []
    if arch == "phi3":
        more, factors = _phi3_metadata(config, tensors)
        md += more
    rs = config.get("rope_scaling") or {}
    if rs.get("type") == "yarn":  # the converter's keys for a YaRN rope_scaling with a factor
        md += [(f"{a}.rope.scaling.type", "str", "yarn"), (f"{a}.rope.scaling.factor", "f32", rs["factor"]),
               (f"{a}.rope.scaling.original_context_length", "u32", rs["original_max_position_embeddings"])]
    md += _tokenizer_metadata(config)
    names = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight"}
    if "lm_head.weight" in tensors and not config["tie_word_embeddings"]:
        names["output.weight"] = "lm_head.weight"
    layer = {"attn_norm.weight": "input_layernorm.weight", "attn_output.weight": "self_attn.o_proj.weight",
             "ffn_norm.weight": "post_attention_layernorm.weight", "ffn_down.weight": "mlp.down_proj.weight"}
    if arch == "qwen2":
        layer.update({f"attn_{x}.{kind}": f"self_attn.{x}_proj.{kind}" for x in "qkv" for kind in ("weight", "bias")})
        layer.update({"ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight"})
    else:  # fused as Hugging Face stores them: the converter renames them only
        layer.update({"attn_qkv.weight": "self_attn.qkv_proj.weight", "ffn_up.weight": "mlp.gate_up_proj.weight"})
    for i in range(n):
        names.update({f"blk.{i}.{g}": f"model.layers.{i}.{h}" for g, h in layer.items()})
    out, stored = [], {}
    for g, h in names.items():
        if g in drop:
            continue
        v = tensors[h]
        raw, raw_dtype, values = encode(v, qtype, rng) if v.ndim == 2 else (v, None, v)
        out.append((g, raw, raw_dtype))
        stored[h] = values
    md = metadata(md) if metadata else md
    return write_gguf(path, md, out + [f for f in factors if f[0] not in drop] + list(extra), arch), stored


def longrope(config_rot_pairs, orig=16, ctx=64, **extra):
    """Phi-3 LongRoPE config keys: L = orig, max_position_embeddings ctx, factor
    lists of the given number of pairs (short near 1, long growing to 12)."""
    rng = np.random.default_rng(7)
    short = [round(float(x), 4) for x in rng.uniform(1.0, 1.5, config_rot_pairs)]
    long_ = [round(float(x), 4) for x in np.sort(rng.uniform(1.0, 12.0, config_rot_pairs))]
    return dict(original_max_position_embeddings=orig, max_position_embeddings=ctx,
                rope_scaling=dict({"type": "longrope", "short_factor": short, "long_factor": long_}, **extra))


def attn_factor32(s, L):
    """The converter's LongRoPE magnitude as the GGUF stores it (float32)."""
    return float(np.float32(math.sqrt(1 + math.log(s) / math.log(L))))


# Cases: (arch, matrix type, tied, HF config overrides)
CASES = {
    "qwen2-F32": ("qwen2", Q.F32, False, {}),
    "qwen2-F16-tied": ("qwen2", Q.F16, True, {}),
    "qwen2-BF16": ("qwen2", Q.BF16, False, {}),
    "qwen2-Q8_0-tied": ("qwen2", Q.Q8_0, True, {}),
    "qwen2-F16-yarn": ("qwen2", Q.F16, False, dict(rope_scaling={"type": "yarn", "factor": 4.0,
                                                                 "original_max_position_embeddings": 16})),
    "phi3-F32": ("phi3", Q.F32, False, {}),
    "phi3-F16-tied": ("phi3", Q.F16, True, {}),
    "phi3-Q8_0-partial-window": ("phi3", Q.Q8_0, False, dict(partial_rotary_factor=0.5, sliding_window=24)),
    "phi3-F32-longrope": ("phi3", Q.F32, False, longrope(8)),
    "phi3-F16-longrope-partial-tied": ("phi3", Q.F16, True, dict(longrope(4, orig=32), partial_rotary_factor=0.5)),
}


def _case(tmp_path, name, seed=0):
    arch, qtype, tied, over = CASES[name]
    config, tensors = hf_model(tmp_path / "hf-src", arch, tied, seed=seed, **over)
    path, stored = gguf_of_hf(tmp_path / "m.gguf", config, tensors, qtype, seed=seed)
    return path, config, stored


def _hf_side(tmp_path, config, stored):
    """The --hf form of what the GGUF stores; LongRoPE's attention factor made
    the float32 value the converter wrote, so that the headers can be equal."""
    config = json.loads(json.dumps(config))
    rs = config.get("rope_scaling")
    if rs and rs["type"] == "longrope":
        L = config["original_max_position_embeddings"]
        rs["attention_factor"] = attn_factor32(config["max_position_embeddings"] / L, L)
    return write_hf_dir(tmp_path / "hf", config, stored)


# --------------------------------------------------------------------------
# export.py --gguf: the --hf conversion of the same weights

@pytest.mark.parametrize("name", CASES)
def test_gguf_arch_conversion_matches_hf(name, tmp_path, syn_tokenizer, text_file):
    """--gguf (the file's own layout, neox) is byte for byte --hf of the
    dequantized weights; --rope-layout interleaved gives the same NLL."""
    path, config, stored = _case(tmp_path, name, seed=list(CASES).index(name))
    q8 = ["--dtype", "q8_0"] if CASES[name][1] == Q.Q8_0 else []
    export_ok(tmp_path / "hf.bin", "--hf", _hf_side(tmp_path, config, stored), *q8)
    export_ok(tmp_path / "g.bin", "--gguf", path, *q8)
    assert (tmp_path / "g.bin").read_bytes() == (tmp_path / "hf.bin").read_bytes()
    h = export.read_header(tmp_path / "g.bin")
    assert h["rope_layout"] == export.ROPE_LAYOUTS.index("neox")
    assert h["bias_flags"] == (1 if config["model_type"] == "qwen2" else 0)
    export_ok(tmp_path / "inter.bin", "--gguf", path, "--rope-layout", "interleaved",
              "--tokenizer-out", tmp_path / "t2.bin")
    a, b = (run_ppl(tmp_path / f, syn_tokenizer, text_file, CTX) for f in ("g.bin", "inter.bin"))
    assert a["tokens"] == b["tokens"] > 150 and abs(a["nll"] - b["nll"]) < LAYOUT_TOL, (a, b)


def test_gguf_longrope_derived_magnitude_matches_hf(tmp_path, syn_tokenizer, text_file):
    """A LongRoPE file without rope.scaling.attn_factor (older converters) and
    with rope.scaling.type "longrope" (newer ones): the magnitude is derived as
    transformers derives it; the NLL is --hf's (which derives it too) to
    LAYOUT_TOL, past the original context."""
    config, tensors = hf_model(tmp_path / "src", "phi3", **longrope(8))
    path, stored = gguf_of_hf(tmp_path / "m.gguf", config, tensors, metadata=lambda md: [
        e for e in md if e[0] != "phi3.rope.scaling.attn_factor"] + [("phi3.rope.scaling.type", "str", "longrope")])
    export_ok(tmp_path / "hf.bin", "--hf", write_hf_dir(tmp_path / "hf", config, stored))
    err = export_ok(tmp_path / "g.bin", "--gguf", path)
    assert "no phi3.rope.scaling.attn_factor" in err, err
    h = export.read_header(tmp_path / "g.bin")
    assert (h["rope_scaling"], h["rope_orig_ctx"], h["rope_factor"], h["rope_attn_factor"]) == (
        export.ROPE_SCALINGS.index("longrope"), 16, 4.0, 0.0)
    assert (tmp_path / "g.bin").read_bytes() == (tmp_path / "hf.bin").read_bytes()
    a, b = (run_ppl(tmp_path / f, syn_tokenizer, text_file, CTX) for f in ("g.bin", "hf.bin"))
    assert abs(a["nll"] - b["nll"]) < LAYOUT_TOL


# --------------------------------------------------------------------------
# ./run X.gguf: the same model as export.py's conversion, bit for bit

@pytest.mark.parametrize("name", CASES)
def test_gguf_arch_run_bit_identical(name, tmp_path, text_file):
    """Logits of every scored token, greedy text and -m info: ./run on the
    GGUF equals ./run on export.py's conversion (--dtype q8_0 for a Q8_0
    file); ppl at CTX = 64 tokens, past a LongRoPE file's original context."""
    path, config, _ = _case(tmp_path, name, seed=20 + list(CASES).index(name))
    tok = assert_same_model(tmp_path, path, text_file, q8=CASES[name][1] == Q.Q8_0)
    info = _info(path, tok)
    rope = info["rope"]
    assert rope["layout"] == "neox", info
    if "longrope" in name:
        assert rope["scaling"] == "longrope" and rope["orig_ctx"] < CTX, info


def test_gguf_long_factors_switch_in(tmp_path, text_file):
    """The long factors matter past the original context and not before it:
    a copy of the file with long = short gives other logits at CTX (> L) and
    the same ones at L."""
    config, tensors = hf_model(tmp_path / "src", "phi3", **longrope(8))
    path, _ = gguf_of_hf(tmp_path / "m.gguf", config, tensors)
    same = json.loads(json.dumps(config))
    same["rope_scaling"]["long_factor"] = same["rope_scaling"]["short_factor"]
    other, _ = gguf_of_hf(tmp_path / "short.gguf", same, tensors)
    tok = tmp_path / "tok.bin"
    export_ok(tmp_path / "ref.bin", "--gguf", path, "--tokenizer-out", tok)
    for ctx, equal in ((16, True), (CTX, False)):
        logits = []
        for p in (path, other):
            out = tmp_path / f"{p.stem}-{ctx}.logits"
            run_ok(p, "-z", tok, "-m", "ppl", "-f", text_file, "--ctx", ctx, "--save-logits", out)
            logits.append(out.read_bytes())
        assert (logits[0] == logits[1]) == equal, ctx


# --------------------------------------------------------------------------
# Refusals: one line naming the file and the tensor or key, exit 1, from both readers

def _qwen2(tmp_path, **kw):
    config, tensors = hf_model(tmp_path / "src", "qwen2")
    return gguf_of_hf(tmp_path / "bad.gguf", config, tensors, **kw)[0]


def _phi3(tmp_path, over=None, **kw):
    config, tensors = hf_model(tmp_path / "src", "phi3", **(over if over is not None else longrope(8)))
    return gguf_of_hf(tmp_path / "bad.gguf", config, tensors, **kw)[0]


def _with_md(*entries):
    keys = {e[0] for e in entries}
    return lambda md: [e for e in md if e[0] not in keys] + list(entries)


def _bad(kind, tmp_path):
    """(a bad file, words both messages have)."""
    if kind == "qwen2-missing-bias":
        return _qwen2(tmp_path, drop=("blk.1.attn_k.bias",)), ["blk.1.attn_k.bias", "missing"]
    if kind == "qwen2-bias-wrong-length":
        return _qwen2(tmp_path, drop=("blk.0.attn_v.bias",), extra=[
            ("blk.0.attn_v.bias", np.zeros(16, np.float32), None)]), ["blk.0.attn_v.bias", "shape"]
    if kind == "qwen2-sliding-window":
        return _qwen2(tmp_path, metadata=_with_md(("qwen2.attention.sliding_window", "u32", 4096))), \
            ["qwen2.attention.sliding_window", "not supported"]
    if kind == "qwen2-rope-factors":
        return _qwen2(tmp_path, extra=[("rope_factors_long.weight", np.ones(8, np.float32), None)]), \
            ["rope_factors_long.weight", "unexpected"]
    if kind == "phi3-qkv-wrong-rows":
        return _phi3(tmp_path, drop=("blk.0.attn_qkv.weight",), extra=[
            ("blk.0.attn_qkv.weight", np.zeros((160, 64), np.float32), None)]), ["blk.0.attn_qkv.weight", "shape"]
    if kind == "phi3-ffn-up-not-fused":
        return _phi3(tmp_path, drop=("blk.1.ffn_up.weight",), extra=[
            ("blk.1.ffn_up.weight", np.zeros((96, 64), np.float32), None)]), ["blk.1.ffn_up.weight", "shape"]
    if kind == "phi3-separate-qkv":
        return _phi3(tmp_path, drop=("blk.0.attn_qkv.weight",), extra=[
            (f"blk.0.attn_{x}.weight", np.zeros((64 if x == "q" else 32, 64), np.float32), None)
            for x in "qkv"]), ["blk.0.attn_qkv.weight", "missing"]
    if kind == "phi3-factors-wrong-length":
        return _phi3(tmp_path, drop=("rope_factors_short.weight",), extra=[
            ("rope_factors_short.weight", np.ones(7, np.float32), None)]), ["rope_factors_short.weight", "shape"]
    if kind == "phi3-factor-not-positive":
        f = np.ones(8, np.float32)
        f[3] = 0.0
        return _phi3(tmp_path, drop=("rope_factors_long.weight",), extra=[
            ("rope_factors_long.weight", f, None)]), ["rope_factors_long.weight", "> 0"]
    if kind == "phi3-one-factor-set":
        return _phi3(tmp_path, drop=("rope_factors_long.weight",)), ["rope_factors_long.weight", "missing"]
    if kind == "phi3-longrope-type-without-factors":
        return _phi3(tmp_path, over={}, metadata=_with_md(("phi3.rope.scaling.type", "str", "longrope"))), \
            ["phi3.rope.scaling.type", "longrope", "rope_factors"]
    if kind == "phi3-longrope-without-original-context":
        return _phi3(tmp_path, metadata=lambda md: [e for e in md if "original_context" not in e[0]]), \
            ["phi3.rope.scaling.original_context_length"]
    if kind == "phi3-factors-with-yarn":
        return _phi3(tmp_path, metadata=_with_md(("phi3.rope.scaling.type", "str", "yarn"),
                                                 ("phi3.rope.scaling.factor", "f32", 4.0))), \
            ["yarn", "rope_factors"]
    if kind == "phi3-bias":
        return _phi3(tmp_path, extra=[("blk.0.attn_output.bias", np.zeros(64, np.float32), None)]), \
            ["blk.0.attn_output.bias", "unexpected"]
    if kind == "other-architecture":
        path = _qwen2(tmp_path)
        raw = bytearray(path.read_bytes())
        at = raw.index(b"general.architecture") + len(b"general.architecture") + 4 + 8
        raw[at:at + 5] = b"gemma"  # "qwen2" -> "gemma": the same length
        path.write_bytes(bytes(raw))
        return path, ["general.architecture", "gemma"]
    raise KeyError(kind)


BAD = ["qwen2-missing-bias", "qwen2-bias-wrong-length", "qwen2-sliding-window", "qwen2-rope-factors",
       "phi3-qkv-wrong-rows", "phi3-ffn-up-not-fused", "phi3-separate-qkv", "phi3-factors-wrong-length",
       "phi3-factor-not-positive", "phi3-one-factor-set", "phi3-longrope-type-without-factors",
       "phi3-longrope-without-original-context", "phi3-factors-with-yarn", "phi3-bias", "other-architecture"]


def test_gguf_phi3_one_row_ffn_up_stored_flat_refused(tmp_path):
    """With feed_forward_length 1, phi3's fused ffn_up holds 2 rows (gate,
    up): a flat tensor of one row's values is refused, not read past (the
    loader once took any one-row slot's tensor as a vector and read the up
    row from the bytes after it)."""
    config, tensors = hf_model(tmp_path / "src", "phi3", intermediate_size=1, **longrope(8))
    path = gguf_of_hf(tmp_path / "flat.gguf", config, tensors, drop=("blk.1.ffn_up.weight",), extra=[
        ("blk.1.ffn_up.weight", np.zeros(64, np.float32), None)])[0]
    refused(path, "blk.1.ffn_up.weight", "shape [64]", "expected [2, 64]")
    whole = gguf_of_hf(tmp_path / "whole.gguf", config, tensors)[0]  # the same model, stored right, runs
    run_ok(whole, "-z", whole, "-n", "2", "-i", "a")


@pytest.mark.parametrize("kind", BAD)
def test_gguf_arch_refused(kind, tmp_path):
    path, words = _bad(kind, tmp_path)
    refused(path, *words)
    code, err = export_run(tmp_path / "out.bin", "--gguf", path)
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert str(path) in err and all(w in err for w in words), (words, err)
    assert not (tmp_path / "out.bin").exists()


def test_gguf_phi3_q4_1_kept(tmp_path, text_file):
    """phi3 with Q4_1 matrices, kept as stored: the fused attn_qkv (q, k, v)
    and gate|up ffn_up split by rows out of the stored blocks ("kept" in the
    notice), near the --gguf-convert f32 model (test_gguf_quants.py's
    assert_near_f32: blocks of tokens bit for bit, one token within 6%)."""
    from test_gguf_quants import _note, assert_near_f32
    config, tensors = hf_model(tmp_path / "hf-src", "phi3", seed=7)
    path, _ = gguf_of_hf(tmp_path / "m.gguf", config, tensors, Q.Q4_1, seed=7)
    _, tok = _exported(tmp_path, path)
    assert "Q4_1 kept" in _note(path, tok) and "Q4_1 ->" not in _note(path, tok)
    assert_near_f32(path, tok, text_file, tmp_path)
