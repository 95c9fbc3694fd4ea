"""export.py --hf, --meta-llama and --tokenizer: conversions of real-world model
formats, checked end to end against independent forward passes.

Hugging Face: small model directories are built here (random weights with
Hugging Face's q/k row permutation applied, config.json, safetensors written by
write_safetensors below: F32, F16, BF16, one file or shards with an index).
Each is exported in both q/k layouts (neox: rows kept; interleaved: rows
un-permuted) and `run -m ppl` must give the NLL of tests/reference/hf.py, a
float64 forward pass in Hugging Face's semantics (rotate_half on the HF
weights, transformers' inv_freq for each rope_scaling type).

Dynamic NTK is checked within L (where every semantics is plain RoPE) and
past it against the token-by-token references (run's default "hf" mode and
--rope-dynamic exact), since a full-sequence forward equals neither there.

Meta: a tiny consolidated.NN.pth checkpoint (model-parallel shards split the
way Meta splits them), when torch is installed, against
tests/reference/forward.py and against the export of the same model's Hugging
Face form.

Also: header fields from config.json, bad sources (one line naming the file,
exit 1, no output or temporary file), streaming in blocks, and the
sentencepiece tokenizer export (run's ids equal sentencepiece's).

Most exports run export.main() in this process (export_run) to keep the suite
fast; a few go through the real command line.

Tolerances: as in test_forward.py (NLL_TOL 1e-4 on the mean NLL; the same
float32-vs-float64 argument holds: bf16/f16 weights are exact in float32, so
run and the reference see the same weights). Each parity case also checks that
getting the case's point wrong (q/k layout, scaling ignored, base, classifier,
GQA un-permuted with the query head count) moves the reference NLL by more
than 10x the tolerance, so the test can fail.
"""

import contextlib
import importlib.util
import io
import json
import math
import pathlib
import shlex
import struct
import subprocess
import sys

import numpy as np
import pytest

import convert.checkpoint
import convert.safetensors
import export
from conftest import (ROOT, SYN_VOCAB, TEXT, check_error, hf_permute, make_model, need_shared,
                      run, run_ok, run_ppl, tokenize)
from reference.forward import Reference, ppl_reference
from reference.hf import HFReference, inv_freq_and_attention

EXPORT = [sys.executable, str(ROOT / "export.py")]
NLL_TOL = 1e-4
BUCKET_TOL = 2e-4
LAYOUT_TOL = 1e-5


def export_cli(*args):
    return subprocess.run(EXPORT + [str(a) for a in args], capture_output=True, timeout=300)


def export_run(*args):
    """(exit code, stderr) of export.py's main() run in this process: the code
    path of the command line without starting Python, numpy and torch again.
    Usage errors (argparse's SystemExit) included; an uncaught exception fails
    the test, as a traceback would."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            code = export.main([str(a) for a in args])
        except SystemExit as e:
            code = e.code
    return code, err.getvalue()


def export_ok(*args):
    code, err = export_run(*args)
    assert code == 0, err
    return err


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "text.txt"
    path.write_bytes(TEXT.encode())
    return path


@pytest.fixture(scope="module")
def text_ids(tmp_path_factory, syn_tokenizer):
    ckpt, _, _ = make_model(tmp_path_factory.mktemp("tokmodel"))
    ids = tokenize(ckpt, syn_tokenizer, TEXT)
    assert ids[0] == 1 and len(ids) > 150
    return ids[1:]


# --------------------------------------------------------------------------
# Building Hugging Face model directories

def bf16_bits(a):
    """float32 -> bfloat16 bit patterns (uint16), rounding to nearest even."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def round_to(a, dtype):
    """The float32 values a tensor has after storing it as dtype."""
    a = np.asarray(a, dtype=np.float32)
    if dtype == "F16":
        return a.astype(np.float16).astype(np.float32)
    if dtype == "BF16":
        return (bf16_bits(a).astype(np.uint32) << 16).view(np.float32)
    return a


def write_safetensors(path, tensors, dtype="F32"):
    """A safetensors file as the safetensors library writes it: u64 header
    length, the JSON header (padded with spaces to a multiple of 8), the data.
    tensors: name -> float array, stored as dtype (F32, F16, BF16)."""
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, a in tensors.items():
        if dtype == "F32":
            raw = np.ascontiguousarray(a, dtype="<f4").tobytes()
        elif dtype == "F16":
            raw = np.ascontiguousarray(a, dtype="<f2").tobytes()
        else:
            raw = bf16_bits(a).astype("<u2").tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)


BASE_CONFIG = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu",
                   hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=4, vocab_size=SYN_VOCAB,
                   max_position_embeddings=32, rms_norm_eps=1e-5, rope_theta=10000.0,
                   bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
                   attention_bias=False, mlp_bias=False, torch_dtype="float32")


def hf_config(**overrides):
    c = json.loads(json.dumps(BASE_CONFIG))
    for k, v in overrides.items():
        if v is None and k not in ("bos_token_id", "sliding_window", "rope_scaling"):
            c.pop(k, None)
        else:
            c[k] = v
    return c


def hf_biases(config):
    """The projections with a bias in this config's family: (q, k, v, o, mlp)."""
    mt = config.get("model_type")
    if mt == "qwen2":
        return {"q", "k", "v"}
    if mt in ("llama", None):
        return ({"q", "k", "v", "o"} if config.get("attention_bias") else set()) | \
            ({"gate", "up", "down"} if config.get("mlp_bias") else set())
    return set()


def random_hf_tensors(config, seed=0, dtype="F32", lm_head=True):
    """HF-named random weights for config, rounded to dtype. q/k are made in
    Meta's interleaved layout and then permuted the way Hugging Face's
    conversion script does (conftest.hf_permute: k with the kv head count), and
    so are their biases. The family's biases (hf_biases) are N(0, 0.5^2); Phi-3
    gets its fused qkv_proj (q | k | v rows) and gate_up_proj (gate | up)."""
    rng = np.random.default_rng(seed)
    d, h, n = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    nh = config["num_attention_heads"]
    nkv = config.get("num_key_value_heads") or nh
    hd, V = d // nh, config["vocab_size"]

    def mat(rows, cols):
        return rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(cols ** -0.5)

    def norm():
        return rng.uniform(0.5, 1.5, size=d).astype(np.float32)

    def bias(rows, heads=None):
        b = rng.standard_normal(rows, dtype=np.float32) * np.float32(0.5)
        return b if heads is None else hf_permute(b[:, None], heads)[:, 0]

    biased = hf_biases(config)
    t = {"model.embed_tokens.weight": rng.standard_normal((V, d), dtype=np.float32) * 0.5}
    for i in range(n):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = norm()
        t[p + "self_attn.q_proj.weight"] = hf_permute(mat(nh * hd, d), nh)
        t[p + "self_attn.k_proj.weight"] = hf_permute(mat(nkv * hd, d), nkv)
        t[p + "self_attn.v_proj.weight"] = mat(nkv * hd, d)
        t[p + "self_attn.o_proj.weight"] = mat(d, nh * hd)
        t[p + "post_attention_layernorm.weight"] = norm()
        t[p + "mlp.gate_proj.weight"] = mat(h, d)
        t[p + "mlp.up_proj.weight"] = mat(h, d)
        t[p + "mlp.down_proj.weight"] = mat(d, h)
        for name, rows, heads in (("q", nh * hd, nh), ("k", nkv * hd, nkv), ("v", nkv * hd, None),
                                  ("o", d, None)):
            if name in biased:
                t[p + f"self_attn.{name}_proj.bias"] = bias(rows, heads)
        for name, rows in (("gate", h), ("up", h), ("down", d)):
            if name in biased:
                t[p + f"mlp.{name}_proj.bias"] = bias(rows)
        if config.get("model_type") == "phi3":
            t[p + "self_attn.qkv_proj.weight"] = np.concatenate(
                [t.pop(p + f"self_attn.{x}_proj.weight") for x in "qkv"])
            t[p + "mlp.gate_up_proj.weight"] = np.concatenate(
                [t.pop(p + "mlp.gate_proj.weight"), t.pop(p + "mlp.up_proj.weight")])
    t["model.norm.weight"] = norm()
    if lm_head:
        t["lm_head.weight"] = rng.standard_normal((V, d), dtype=np.float32) * 0.5
    return {k: round_to(v, dtype) for k, v in t.items()}


def write_hf_dir(directory, config, tensors, dtype="F32", shards=1):
    """config.json plus model.safetensors, or `shards` files
    model-0000k-of-0000n.safetensors with model.safetensors.index.json."""
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    if shards == 1:
        write_safetensors(directory / "model.safetensors", tensors, dtype)
        return directory
    names = list(tensors)
    weight_map, per = {}, -(-len(names) // shards)
    for k in range(shards):
        fname = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[k * per:(k + 1) * per]}
        write_safetensors(directory / fname, part, dtype)
        weight_map.update({n: fname for n in part})
    size = sum(a.size for a in tensors.values()) * (4 if dtype == "F32" else 2)
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": size}, "weight_map": weight_map}, indent=2))
    return directory


def make_hf(directory, seed=0, dtype="F32", shards=1, lm_head=True, **overrides):
    config = hf_config(**overrides)
    tensors = random_hf_tensors(config, seed, dtype, lm_head)
    return write_hf_dir(directory, config, tensors, dtype, shards), config, tensors


def bucket_len(config):
    """The L of run's ppl buckets: rope_orig_ctx, else seq_len."""
    rs = config.get("rope_scaling") or config.get("rope_parameters") or {}
    kind = rs.get("rope_type", rs.get("type"))
    top = config.get("original_max_position_embeddings")
    if kind in ("yarn", "llama3", "longrope", "su") and (top or rs.get("original_max_position_embeddings")):
        return top or rs["original_max_position_embeddings"]
    return config["max_position_embeddings"]


def check_nll(got, ref, buckets=True):
    assert got["tokens"] == ref["tokens"]
    assert abs(got["nll"] - ref["nll"]) < NLL_TOL, (got["nll"], ref["nll"])
    if buckets:
        assert [(b["start"], b["end"]) for b in got["buckets"]] == \
            [(b["start"], b["end"]) for b in ref["buckets"]]
        for g, r in zip(got["buckets"], ref["buckets"]):
            assert g["tokens"] == r["tokens"]
            if r["tokens"]:
                assert abs(g["nll"] - r["nll"]) < BUCKET_TOL, (g, r)


# --------------------------------------------------------------------------
# Ways to get a conversion wrong, applied to the reference: each must move the
# NLL far more than the tolerance, or the parity test could not see the bug.

def _adjacent_pairs(config, tensors, kv_heads_for_k=True):
    """What run computes from HF weights exported in the interleaved layout
    when the un-permutation is wrong: q/k rows un-permuted (k with n_heads
    instead of n_kv_heads when kv_heads_for_k is False, llama2.c's GQA bug),
    then rotated as adjacent pairs. Returned as HF-layout weights that give the
    same scores under rotate_half: re-permuting with the right counts."""
    nh = config["num_attention_heads"]
    nkv = config.get("num_key_value_heads") or nh
    t = dict(tensors)
    for name, w in tensors.items():
        if name.endswith("k_proj.weight") and not kv_heads_for_k:
            rows, cols = w.shape
            wrong = w.reshape(nh, 2, rows // nh // 2, cols).swapaxes(1, 2).reshape(rows, cols)
            t[name] = hf_permute(wrong, nkv)
    return t


def perturbed_nll(config, tensors, change, text_ids, ctx, dynamic="full"):
    config, tensors = json.loads(json.dumps(config)), dict(tensors)
    if change == "layout":  # HF weights rotated as adjacent pairs: q/k never un-permuted
        nh = config["num_attention_heads"]
        nkv = config.get("num_key_value_heads") or nh
        hd = config["hidden_size"] // nh
        for name, w in tensors.items():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                tensors[name] = hf_permute(w, nh if "q_proj" in name else nkv)
            elif name.endswith("qkv_proj.weight"):  # Phi-3: the q and k rows of the fused matrix
                q, k, v = np.split(w, [nh * hd, (nh + nkv) * hd])
                tensors[name] = np.concatenate([hf_permute(q, nh), hf_permute(k, nkv), v])
    elif change == "gqa_permute_bug":
        tensors = _adjacent_pairs(config, tensors, kv_heads_for_k=False)
    elif change == "scaling":
        config.pop("rope_scaling", None)
        rp = config.get("rope_parameters")
        if rp:
            config["rope_parameters"] = {"rope_type": "default", "rope_theta": rp.get("rope_theta")}
    elif change == "theta":
        config["rope_theta"] = 10000.0 if config.get("rope_theta") != 10000.0 else 500000.0
    elif change == "tied":
        config["tie_word_embeddings"] = not config.get("tie_word_embeddings")
        if "lm_head.weight" not in tensors:
            tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"][::-1].copy()
    elif change == "rot":
        config["partial_rotary_factor"] = 1.0
    elif change == "rot-applied":  # partial_rotary_factor applied to a Llama (as Phi-3 reads it)
        config["model_type"] = "phi3"
    elif change == "biases":  # a converter that drops the biases
        tensors = {k: v for k, v in tensors.items() if not k.endswith(".bias")}
    elif change == "window":  # a converter that ignores the sliding window
        config.update(sliding_window=None, use_sliding_window=False)
        config.pop("layer_types", None)
    elif change == "window-layers":  # the window on every layer instead of the config's ones
        config.update(model_type="mistral")
    elif change == "fused-order":  # Phi-3's fused rows split in the wrong order (up | gate)
        for k in [k for k in tensors if k.endswith("gate_up_proj.weight")]:
            tensors[k] = np.concatenate(np.split(tensors[k], 2)[::-1])
    elif change == "inner-original":  # the original context inside rope_scaling, not the top one
        config.pop("original_max_position_embeddings")
    else:
        raise ValueError(change)
    return ppl_reference(HFReference(config, tensors, dynamic), text_ids, ctx, 1,
                         bucket_len(config))["nll"]


# (id, config overrides, writer options, changes the test must be able to see)
HF_CASES = [
    ("mha-f32-untied", dict(), dict(), ["layout", "tied"]),
    ("gqa-bf16-theta", dict(num_attention_heads=8, num_key_value_heads=2, rope_theta=1000.0),
     dict(dtype="BF16"), ["layout", "gqa_permute_bug", "theta"]),
    ("mqa-f16-tied", dict(num_key_value_heads=1, tie_word_embeddings=True),
     dict(dtype="F16", lm_head=False), ["layout", "tied"]),
    ("tied-lm_head-stored-and-ignored", dict(num_key_value_heads=2, tie_word_embeddings=True),
     dict(lm_head=True), ["layout", "tied"]),
    ("no-lm_head-means-tied", dict(), dict(lm_head=False), ["layout"]),
    ("sharded-bf16-gqa", dict(num_attention_heads=8, num_key_value_heads=4, num_hidden_layers=3),
     dict(dtype="BF16", shards=3), ["layout", "gqa_permute_bug"]),
    ("linear-old-type-key", dict(rope_scaling={"type": "linear", "factor": 2.0}), dict(),
     ["layout", "scaling"]),
    ("linear-rope_type-gqa", dict(num_key_value_heads=2,
                                  rope_scaling={"rope_type": "linear", "factor": 4.0}),
     dict(), ["layout", "scaling", "gqa_permute_bug"]),
    ("yarn", dict(rope_scaling={"rope_type": "yarn", "factor": 2.0,
                                "original_max_position_embeddings": 16}),
     dict(), ["layout", "scaling"]),
    ("yarn-old-type-key-betas-attention-factor",
     dict(num_key_value_heads=2, rope_theta=20000.0,
          rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8,
                        "beta_fast": 16, "beta_slow": 2, "attention_factor": 1.3}),
     dict(dtype="BF16"), ["layout", "scaling", "theta"]),
    ("yarn-mscale-ratio-zero-betas",
     dict(rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8,
                        "mscale": 0.8, "mscale_all_dim": 0.5, "beta_fast": 0, "beta_slow": None}),
     dict(), ["scaling"]),
    ("yarn-no-original", dict(rope_scaling={"rope_type": "yarn", "factor": 3.0}), dict(),
     ["scaling"]),
    ("llama3", dict(num_key_value_heads=1, rope_theta=5000.0,
                    rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0,
                                  "original_max_position_embeddings": 16}),
     dict(), ["layout", "scaling"]),
    ("phi3-partial-rotary", dict(architectures=["Phi3ForCausalLM"], model_type="phi3",
                                 num_key_value_heads=2, partial_rotary_factor=0.5), dict(),
     ["layout", "rot", "fused-order"]),
    ("llama-partial-rotary-ignored", dict(num_key_value_heads=2, partial_rotary_factor=0.5),
     dict(), ["layout", "rot-applied"]),
    ("v5-rope_parameters", dict(rope_theta=None,
                                rope_parameters={"rope_type": "yarn", "rope_theta": 20000.0,
                                                 "factor": 2.0,
                                                 "original_max_position_embeddings": 16}),
     dict(), ["layout", "scaling"]),
    ("mistral-without-sliding-window", dict(architectures=["MistralForCausalLM"],
                                            model_type="mistral", sliding_window=None,
                                            head_dim=16, num_key_value_heads=2),
     dict(), ["layout"]),
    # More families (windows smaller than the test windows of 2 x 32 tokens)
    ("llama-attention-and-mlp-biases", dict(attention_bias=True, mlp_bias=True,
                                            num_key_value_heads=2), dict(), ["layout", "biases"]),
    ("qwen2-biases-tied-bf16", dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2",
                                    num_key_value_heads=2, tie_word_embeddings=True,
                                    rope_theta=1000000.0, use_sliding_window=False,
                                    sliding_window=4096, max_window_layers=2),
     dict(dtype="BF16", lm_head=False), ["layout", "biases", "tied"]),
    ("qwen2-sliding-window-from-max_window_layers",
     dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", num_key_value_heads=2,
          use_sliding_window=True, sliding_window=9, max_window_layers=1),
     dict(), ["layout", "biases", "window", "window-layers"]),
    ("qwen2-sliding-window-from-layer_types",
     dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", num_hidden_layers=3,
          use_sliding_window=True, sliding_window=5, max_window_layers=0,
          layer_types=["full_attention", "sliding_attention", "sliding_attention"]),
     dict(), ["layout", "window", "window-layers"]),
    ("mistral-sliding-window", dict(architectures=["MistralForCausalLM"], model_type="mistral",
                                    sliding_window=7, num_key_value_heads=1),
     dict(dtype="F16"), ["layout", "window"]),
    ("phi3-fused-sliding-window", dict(architectures=["Phi3ForCausalLM"], model_type="phi3",
                                       sliding_window=11, num_key_value_heads=2),
     dict(), ["layout", "window", "fused-order"]),
    ("llama31-top-level-original-wins",
     dict(original_max_position_embeddings=16, max_position_embeddings=32,
          rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                        "high_freq_factor": 4.0, "original_max_position_embeddings": 4}),
     dict(), ["layout", "scaling", "inner-original"]),
]


@pytest.mark.parametrize("case", range(len(HF_CASES)), ids=[c[0] for c in HF_CASES])
def test_hf_matches_hf_reference(case, tmp_path, syn_tokenizer, text_file, text_ids):
    """Both q/k layouts give run NLLs equal to the HF-semantics reference, and
    equal to each other."""
    name, overrides, writer, can_fail = HF_CASES[case]
    src, config, tensors = make_hf(tmp_path / "hf", seed=300 + case, **writer, **overrides)
    ctx = 2 * config["max_position_embeddings"]
    ref = ppl_reference(HFReference(config, tensors), text_ids, ctx, 1, bucket_len(config))
    results = {}
    for layout in ("neox", "interleaved"):
        out = tmp_path / f"{layout}.bin"
        args = [out, "--hf", src] + ([] if layout == "neox" else ["--rope-layout", layout])
        export_ok(*args)
        h = export.read_header(out)
        assert h["rope_layout"] == export.ROPE_LAYOUTS.index(layout)
        results[layout] = run_ppl(out, syn_tokenizer, text_file, ctx)
        check_nll(results[layout], ref)
    assert abs(results["neox"]["nll"] - results["interleaved"]["nll"]) < LAYOUT_TOL
    for change in can_fail:
        wrong = perturbed_nll(config, tensors, change, text_ids, ctx)
        assert abs(wrong - ref["nll"]) > 10 * NLL_TOL, f"{change} is not visible"


def test_hf_default_layout_keeps_weights_bit_exact(tmp_path):
    """The default (neox) writes q/k exactly as stored; interleaved writes the
    rows un-permuted per head, k with the kv head count (GQA), which gives back
    the interleaved weights the HF ones were made from."""
    src, config, tensors = make_hf(tmp_path / "hf", num_attention_heads=8,
                                   num_key_value_heads=2)
    export_ok(tmp_path / "n.bin", "--hf", src)
    export_ok(tmp_path / "i.bin", "--hf", src, "--rope-layout", "interleaved")
    _, neox = export.read_checkpoint(tmp_path / "n.bin")
    _, inter = export.read_checkpoint(tmp_path / "i.bin")
    for l in range(2):
        q = tensors[f"model.layers.{l}.self_attn.q_proj.weight"]
        k = tensors[f"model.layers.{l}.self_attn.k_proj.weight"]
        assert np.array_equal(neox["wq"][l], q) and np.array_equal(neox["wk"][l], k)
        assert np.array_equal(hf_permute(inter["wq"][l], 8), q)
        assert np.array_equal(hf_permute(inter["wk"][l], 2), k)
        assert np.array_equal(inter["wv"][l], tensors[f"model.layers.{l}.self_attn.v_proj.weight"])


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2"])
def test_hf_partial_rotary_ignored_with_a_note(family, tmp_path):
    """Llama, Mistral and Qwen2 rotate the whole head whatever
    partial_rotary_factor says (top level or in rope_parameters): rot_dim is
    the head size, and a note says the factor is ignored."""
    arch = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
            "qwen2": "Qwen2ForCausalLM"}[family]
    for i, where in enumerate(("top", "rope_parameters")):
        extra = (dict(partial_rotary_factor=0.5) if where == "top" else
                 dict(rope_theta=None, rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                                        "partial_rotary_factor": 0.5}))
        src, _, _ = make_hf(tmp_path / f"hf{i}", architectures=[arch], model_type=family,
                            **extra)
        err = export_ok(tmp_path / f"m{i}.bin", "--hf", src)
        assert f"ignoring partial_rotary_factor=0.5: {arch} rotates all 16 dims" in err, err
        assert export.read_header(tmp_path / f"m{i}.bin")["rot_dim"] == 16


def test_hf_header_fields(tmp_path, capsys):
    """What config.json says lands in the header: eps, theta, bos/eos (lists:
    the first), seq_len, and every yarn field; notes say what was chosen (on
    stderr; the line saying what was written goes to stdout)."""
    src, config, _ = make_hf(
        tmp_path / "hf", rms_norm_eps=1e-6, rope_theta=123456.0, bos_token_id=5,
        eos_token_id=[7, 9], max_position_embeddings=64,
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                      "beta_fast": 24, "beta_slow": 1.5, "attention_factor": 1.25})
    err = export_ok(tmp_path / "m.bin", "--hf", src)
    assert "eos_token_id is a list" in err and "wrote" not in err, err
    out = capsys.readouterr().out
    assert out.startswith(f"export.py: wrote {tmp_path / 'm.bin'} (") and "scaling yarn x4 (orig ctx 16)" in out, out
    h = export.read_header(tmp_path / "m.bin")
    assert (h["bos_id"], h["eos_id"], h["seq_len"], h["rope_layout"], h["rot_dim"]) == \
        (5, 7, 64, 1, 16)
    assert h["rope_scaling"] == export.ROPE_SCALINGS.index("yarn") and h["rope_orig_ctx"] == 16
    for key, value in [("norm_eps", 1e-6), ("rope_theta", 123456.0), ("rope_factor", 4.0),
                       ("yarn_beta_fast", 24.0), ("yarn_beta_slow", 1.5),
                       ("rope_attn_factor", 1.25)]:
        assert h[key] == np.float32(value), key


@pytest.mark.parametrize("scaling,fields", [
    ({"type": "dynamic", "factor": 2.0}, dict(rope_scaling=3, rope_factor=2.0, rope_orig_ctx=32)),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 2.0, "high_freq_factor": 8.0},
     dict(rope_scaling=5, rope_factor=8.0, rope_orig_ctx=32, llama3_low_freq=2.0,
          llama3_high_freq=8.0)),
    ({"rope_type": "linear", "factor": 3.0},
     dict(rope_scaling=1, rope_factor=3.0, rope_orig_ctx=0)),
    ({"rope_type": "yarn", "original_max_position_embeddings": 8},
     dict(rope_scaling=4, rope_factor=4.0, rope_orig_ctx=8, rope_attn_factor=0.0)),
    ({"rope_type": "default"}, dict(rope_scaling=0, rope_factor=1.0)),
    (None, dict(rope_scaling=0, rope_factor=1.0)),
], ids=["dynamic-L-is-max_pos", "llama3-orig-from-max_pos", "linear", "yarn-factor-derived",
        "default", "null"])
def test_hf_scaling_header(tmp_path, scaling, fields):
    src, _, _ = make_hf(tmp_path / "hf", rope_scaling=scaling)
    export_ok(tmp_path / "m.bin", "--hf", src)
    h = export.read_header(tmp_path / "m.bin")
    for k, v in fields.items():
        assert h[k] == (np.float32(v) if isinstance(v, float) else v), (k, h[k])


def test_hf_stored_scaling_is_run_default(tmp_path):
    """run applies the scaling the checkpoint stores (rope mode shows it)."""
    src, config, _ = make_hf(tmp_path / "hf", rope_scaling={
        "rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 16})
    export_ok(tmp_path / "m.bin", "--hf", src)
    p = run_ok(tmp_path / "m.bin", "-m", "rope", "--json")
    info = json.loads(p.stdout)
    assert info["scaling"] == "yarn" and info["orig_ctx"] == 16
    assert abs(info["attn_factor"] - (0.1 * math.log(2) + 1)) < 1e-6


# --------------------------------------------------------------------------
# Dynamic NTK: run evaluates ppl token by token

def test_hf_dynamic_within_training_context(tmp_path, syn_tokenizer, text_file, text_ids):
    """Windows that stay within L = max_position_embeddings: dynamic is plain
    RoPE in every semantics, and run matches a full-sequence HF forward."""
    src, config, tensors = make_hf(tmp_path / "hf", num_key_value_heads=2,
                                   rope_scaling={"rope_type": "dynamic", "factor": 4.0})
    ctx = config["max_position_embeddings"]
    export_ok(tmp_path / "m.bin", "--hf", src)
    got = run_ppl(tmp_path / "m.bin", syn_tokenizer, text_file, ctx)
    ref = ppl_reference(HFReference(config, tensors), text_ids, ctx, 1, ctx)
    check_nll(got, ref)
    plain = dict(config, rope_scaling=None)
    assert abs(ppl_reference(HFReference(plain, tensors), text_ids, ctx, 1, ctx)["nll"]
               - ref["nll"]) < 1e-9


@pytest.mark.parametrize("mode", ["hf", "exact"])
def test_hf_dynamic_beyond_training_context(mode, tmp_path, syn_tokenizer, text_file, text_ids):
    """Past L: run's default dynamic mode equals the token-by-token HF
    semantics (key t rotated once with the base for length t+1), and
    --rope-dynamic exact equals re-rotating every key with the current base."""
    src, config, tensors = make_hf(tmp_path / "hf", num_key_value_heads=2,
                                   rope_scaling={"rope_type": "dynamic", "factor": 4.0})
    L = config["max_position_embeddings"]
    ctx = 3 * L
    ref = ppl_reference(HFReference(config, tensors, mode), text_ids, ctx, 1, L)
    for layout in ("neox", "interleaved"):
        out = tmp_path / f"{layout}.bin"
        export_ok(out, "--hf", src, "--rope-layout", layout)
        extra = ["--rope-dynamic", "exact"] if mode == "exact" else []
        check_nll(run_ppl(out, syn_tokenizer, text_file, ctx, extra=extra), ref)
    plain = ppl_reference(HFReference(dict(config, rope_scaling=None), tensors), text_ids, ctx,
                          1, L)
    assert abs(plain["nll"] - ref["nll"]) > 10 * NLL_TOL, "dynamic scaling is not visible"
    other = ppl_reference(HFReference(config, tensors, "exact" if mode == "hf" else "hf"),
                          text_ids, ctx, 1, L)
    assert abs(other["nll"] - ref["nll"]) > 10 * NLL_TOL, "the two dynamic modes look alike"


# --------------------------------------------------------------------------
# Sliding windows from the command line, and with the token-by-token path

def test_window_flag_equals_a_windowed_model(tmp_path, syn_tokenizer, text_file, text_ids):
    """--window 7 on a Llama checkpoint is Mistral's sliding window of 7 on
    every layer; --window 0 on a Mistral checkpoint turns its window off."""
    src, config, tensors = make_hf(tmp_path / "hf")
    export_ok(tmp_path / "llama.bin", "--hf", src)
    windowed = dict(config, architectures=["MistralForCausalLM"], model_type="mistral",
                    sliding_window=7)
    ref = ppl_reference(HFReference(windowed, tensors), text_ids, 64, 1, 32)
    check_nll(run_ppl(tmp_path / "llama.bin", syn_tokenizer, text_file, 64,
                      extra=["--window", "7"]), ref)
    src2 = write_hf_dir(tmp_path / "mistral", windowed, tensors)
    export_ok(tmp_path / "mistral.bin", "--hf", src2)
    assert export.read_header(tmp_path / "mistral.bin")["sliding_window"] == 7
    full = ppl_reference(HFReference(config, tensors), text_ids, 64, 1, 32)
    check_nll(run_ppl(tmp_path / "mistral.bin", syn_tokenizer, text_file, 64,
                      extra=["--window", "0"]), full)
    assert abs(full["nll"] - ref["nll"]) > 10 * NLL_TOL, "the window is not visible"


def test_window_with_exact_dynamic_ntk(tmp_path, syn_tokenizer, text_file, text_ids):
    """Exact dynamic NTK past L rotates keys per query (a pre-RoPE cache, in
    blocks with per-query frames): the window holds there too (Qwen2 windowed
    layers, past L)."""
    src, config, tensors = make_hf(
        tmp_path / "hf", architectures=["Qwen2ForCausalLM"], model_type="qwen2",
        num_key_value_heads=2, use_sliding_window=True, sliding_window=6, max_window_layers=1,
        rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    export_ok(tmp_path / "m.bin", "--hf", src)
    ref = ppl_reference(HFReference(config, tensors, "exact"), text_ids, 48, 1, 32)
    check_nll(run_ppl(tmp_path / "m.bin", syn_tokenizer, text_file, 48,
                      extra=["--rope-dynamic", "exact"]), ref)


def test_q8_0_keeps_biases_in_float32(tmp_path, syn_tokenizer, text_file, text_ids):
    """A Qwen2 export in q8_0 quantizes the matrices only: its NLL stays within
    q8_0's usual distance of the float32 reference (0.02 nats on this model)
    while dropping the biases would move it far more."""
    src, config, tensors = make_hf(tmp_path / "hf", architectures=["Qwen2ForCausalLM"],
                                   model_type="qwen2", num_key_value_heads=2)
    export_ok(tmp_path / "q8.bin", "--hf", src, "--dtype", "q8_0")
    _, back = export.read_checkpoint(tmp_path / "q8.bin")
    got = run_ppl(tmp_path / "q8.bin", syn_tokenizer, text_file, 32)
    ref = ppl_reference(HFReference(config, tensors), text_ids, 32, 1, 32)
    assert abs(got["nll"] - ref["nll"]) < 0.02, (got["nll"], ref["nll"])
    assert np.array_equal(back["bq"][0], tensors["model.layers.0.self_attn.q_proj.bias"])
    assert abs(perturbed_nll(config, tensors, "biases", text_ids, 32) - ref["nll"]) > 0.1


@pytest.mark.parametrize("flags,needles", [
    (["--window", "-1"], ["--window"]),
    (["--window", "4", "--sinks", "2"], ["--sinks", "window"]),
    (["--window", "4", "--self-extend", "2", "8"], ["--self-extend", "window"]),
    (["--sinks", "2"], ["the checkpoint's"]),                       # Mistral's own window
    (["--rope-scaling", "longrope", "--window", "0"], ["longrope", "factor arrays"]),
])
def test_window_and_longrope_usage_errors(tmp_path, syn_tokenizer, flags, needles):
    src, _, _ = make_hf(tmp_path / "hf", architectures=["MistralForCausalLM"],
                        model_type="mistral", sliding_window=7)
    export_ok(tmp_path / "m.bin", "--hf", src)
    check_error(run(tmp_path / "m.bin", "-z", syn_tokenizer, "-n", "2", "-i", "the", *flags),
                2, needles)
    run_ok(tmp_path / "m.bin", "-z", syn_tokenizer, "-n", "2", "-i", "the", "--window", "0",
           "--sinks", "2")


def test_window_as_long_as_the_cache_is_no_window(tmp_path, syn_tokenizer, text_file):
    """Phi-3-128k-style configs ship a window longer than any usable context:
    it never leaves a key out, so sinks and Self-Extend combine with it (and the
    scores are unchanged); a window shorter than --ctx still refuses them."""
    src, _, _ = make_hf(tmp_path / "hf", architectures=["MistralForCausalLM"],
                        model_type="mistral", sliding_window=64)
    export_ok(tmp_path / "m.bin", "--hf", src)
    run_ok(tmp_path / "m.bin", "-z", syn_tokenizer, "-n", "2", "-i", "the", "--sinks", "2")  # --ctx 32
    run_ok(tmp_path / "m.bin", "-z", syn_tokenizer, "-n", "2", "-i", "the", "--ctx", "64", "--self-extend", "2", "8")
    check_error(run(tmp_path / "m.bin", "-z", syn_tokenizer, "-n", "2", "-i", "the", "--ctx", "65",
                    "--sinks", "2"), 2, ["--sinks", "window of 64"])
    a = run_ppl(tmp_path / "m.bin", syn_tokenizer, text_file, 32)
    b = run_ppl(tmp_path / "m.bin", syn_tokenizer, text_file, 32, extra=("--window", "0"))
    assert a["nll"] == b["nll"]


# --------------------------------------------------------------------------
# LongRoPE (Phi-3): short factors while a sequence fits in the original
# context L, long ones beyond; both layouts, both key-cache semantics

def longrope_config(**overrides):
    """A Phi-3 config with LongRoPE: L = 16 (top level), max_position_embeddings
    64 (factor 4, attention factor sqrt(1 + ln 4 / ln 16)), factor arrays of
    rot/2 = 8 pairs: short ones near 1, long ones growing to 12."""
    rng = np.random.default_rng(7)
    short = [round(float(x), 4) for x in rng.uniform(1.0, 1.5, 8)]
    long_ = [round(float(x), 4) for x in np.sort(rng.uniform(1.0, 12.0, 8))]
    base = dict(architectures=["Phi3ForCausalLM"], model_type="phi3", num_key_value_heads=2,
                original_max_position_embeddings=16, max_position_embeddings=64,
                rope_scaling={"type": "longrope", "short_factor": short, "long_factor": long_})
    base.update(overrides)
    return base


def test_hf_longrope_header_and_rope_mode(tmp_path):
    """The header stores longrope (format version 2), L from the top level,
    s = max_position_embeddings / L, attention factor 0 (derived); the factor
    arrays are tensors; `-m rope` shows the short factors up to L and the long
    ones past it, with HF's frequencies and attention factor."""
    src, config, _ = make_hf(tmp_path / "hf", **longrope_config())
    export_ok(tmp_path / "m.bin", "--hf", src)
    h = export.read_header(tmp_path / "m.bin")
    assert h["version"] == 2 and h["rope_scaling"] == export.ROPE_SCALINGS.index("longrope")
    assert (h["rope_orig_ctx"], h["rope_factor"], h["rope_attn_factor"]) == (16, 4.0, 0.0)
    _, tensors = export.read_checkpoint(tmp_path / "m.bin")
    assert np.array_equal(tensors["rope_long_factor"],
                          np.float32(config["rope_scaling"]["long_factor"]))
    for ctx, which, seq_len in ((16, "short", 16), (17, "long", 17)):
        info = json.loads(run_ok(tmp_path / "m.bin", "-m", "rope", "--json", "--ctx", ctx).stdout)
        inv, att = inv_freq_and_attention(config, seq_len)
        assert info["scaling"] == "longrope" and info["longrope_factors"] == which
        assert np.allclose(info["inv_freq"], inv, rtol=1e-12), which
        assert abs(info["attn_factor"] - math.sqrt(1 + math.log(4) / math.log(16))) < 1e-12
        assert abs(att - info["attn_factor"]) < 1e-12


def test_hf_longrope_within_original_context(tmp_path, syn_tokenizer, text_file, text_ids):
    """Windows of L tokens: the short factors throughout, in every semantics."""
    src, config, tensors = make_hf(tmp_path / "hf", **longrope_config())
    export_ok(tmp_path / "m.bin", "--hf", src)
    ref = ppl_reference(HFReference(config, tensors), text_ids, 16, 1, 16)
    check_nll(run_ppl(tmp_path / "m.bin", syn_tokenizer, text_file, 16), ref)
    short_only = json.loads(json.dumps(config))
    short_only["rope_scaling"]["long_factor"] = [99.0] * 8  # unused within L
    assert abs(ppl_reference(HFReference(short_only, tensors), text_ids, 16, 1, 16)["nll"]
               - ref["nll"]) < 1e-12


@pytest.mark.parametrize("mode", ["hf", "exact"])
def test_hf_longrope_beyond_original_context(mode, tmp_path, syn_tokenizer, text_file, text_ids):
    """Windows of 3 L: run's default equals HF decoding token by token (a key
    keeps the factors of the length when it arrived: short before L, long
    after), --rope-dynamic exact equals re-rotating every key for the current
    length; the long factors, the attention factor and the mode all show."""
    src, config, tensors = make_hf(tmp_path / "hf", **longrope_config())
    ctx = 48
    ref = ppl_reference(HFReference(config, tensors, mode), text_ids, ctx, 1, 16)
    for layout in ("neox", "interleaved"):
        out = tmp_path / f"{layout}.bin"
        export_ok(out, "--hf", src, "--rope-layout", layout)
        extra = ["--rope-dynamic", "exact"] if mode == "exact" else []
        check_nll(run_ppl(out, syn_tokenizer, text_file, ctx, extra=extra), ref)
    variants = {"no scaling": dict(config, rope_scaling=None),
                "short factors only": json.loads(json.dumps(config)),
                "attention factor 1": json.loads(json.dumps(config))}
    variants["short factors only"]["rope_scaling"]["long_factor"] = \
        config["rope_scaling"]["short_factor"]
    variants["attention factor 1"]["rope_scaling"]["attention_factor"] = 1.0
    for what, c in variants.items():
        other = ppl_reference(HFReference(c, tensors, mode), text_ids, ctx, 1, 16)
        assert abs(other["nll"] - ref["nll"]) > 10 * NLL_TOL, f"{what} looks the same"
    other = ppl_reference(HFReference(config, tensors, "exact" if mode == "hf" else "hf"),
                          text_ids, ctx, 1, 16)
    assert abs(other["nll"] - ref["nll"]) > 10 * NLL_TOL, "the two modes look alike"


@pytest.mark.parametrize("top,inner,expect,note", [
    (16, 8, 16, "using the top-level 16"),       # both: the top level wins, and says so
    (None, 8, 8, None),                          # Llama-style: only inside rope_scaling
    (None, None, 4096, "Phi3Config's default"),  # Phi-3 with neither: its config default
])
def test_hf_longrope_original_context_precedence(tmp_path, top, inner, expect, note):
    rs = dict(longrope_config()["rope_scaling"], attention_factor=1.25)
    if inner is not None:
        rs["original_max_position_embeddings"] = inner
    over = longrope_config(rope_scaling=rs, original_max_position_embeddings=top)
    if top is None and inner is not None:  # a Llama checkpoint with LongRoPE in rope_scaling
        over.update(architectures=["LlamaForCausalLM"], model_type="llama")
    src, _, _ = make_hf(tmp_path / "hf", **over)
    err = export_ok(tmp_path / "m.bin", "--hf", src)
    h = export.read_header(tmp_path / "m.bin")
    assert h["rope_orig_ctx"] == expect and h["rope_attn_factor"] == np.float32(1.25)
    if note:
        assert note in err, err


def test_hf_yarn_top_level_original_wins(tmp_path):
    """YaRN as Llama 3.1-era configs write it: max_position_embeddings 131072,
    a top-level original of 4096 and another inside rope_scaling: L = 4096."""
    src, _, _ = make_hf(tmp_path / "hf", max_position_embeddings=131072,
                        original_max_position_embeddings=4096,
                        rope_scaling={"rope_type": "yarn", "factor": 32.0,
                                      "original_max_position_embeddings": 8192})
    err = export_ok(tmp_path / "m.bin", "--hf", src)
    h = export.read_header(tmp_path / "m.bin")
    assert (h["seq_len"], h["rope_orig_ctx"], h["rope_factor"]) == (131072, 4096, 32.0)
    assert "using the top-level 4096" in err, err


# --------------------------------------------------------------------------
# Bad Hugging Face sources: one line naming the file and the problem, exit 1,
# no output and no temporary file left behind

def _config_change(**overrides):
    def change(d, config, tensors):
        config.update(overrides)
        for k, v in overrides.items():
            if v is None:
                config.pop(k)
        return "config.json"
    return change


def _drop_tensor(name):
    def change(d, config, tensors):
        del tensors[name]
        return "model.safetensors"
    return change


def _reshape_tensor(name, shape):
    def change(d, config, tensors):
        tensors[name] = np.zeros(shape, dtype=np.float32)
        return "model.safetensors"
    return change


def _add_tensor(name, shape):
    def change(d, config, tensors):
        tensors[name] = np.zeros(shape, dtype=np.float32)
        return "model.safetensors"
    return change


def _qwen2_biases(**bad):
    """The config made Qwen2's, with q/k/v biases for every layer; bad: name ->
    shape (None: left out) for layer 1."""
    def change(d, config, tensors):
        config.update(architectures=["Qwen2ForCausalLM"], model_type="qwen2")
        for i in range(config["num_hidden_layers"]):
            for n in "qkv":
                shape = bad.get(n, (64,)) if i == 1 else (64,)
                if shape is not None:
                    tensors[f"model.layers.{i}.self_attn.{n}_proj.bias"] = np.zeros(shape, np.float32)
        return "model.safetensors"
    return change


def _phi3_unfused(d, config, tensors):
    config.update(architectures=["Phi3ForCausalLM"], model_type="phi3")
    return "model.safetensors"


def _nan_in_lm_head(d, config, tensors):
    tensors["lm_head.weight"] = tensors["lm_head.weight"].copy()
    tensors["lm_head.weight"][-1, -1] = np.nan
    return "model.safetensors"


def _file_change(kind):
    """Changes made to the files after writing the directory."""
    def change(d):
        st = d / "model.safetensors"
        if kind == "truncated":
            data = st.read_bytes()
            st.write_bytes(data[:len(data) * 2 // 3])
            return "model.safetensors"
        if kind == "garbage":
            st.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!" + bytes(100))
            return "model.safetensors"
        if kind == "huge-header-length":
            st.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
            return "model.safetensors"
        if kind == "int8-dtype":
            data = st.read_bytes()
            n = struct.unpack_from("<Q", data)[0]
            header = data[8:8 + n].replace(b'"F32"', b'"I8" ', 1)
            st.write_bytes(data[:8] + header + data[8 + n:])
            return "model.safetensors"
        if kind == "overlapping-offsets":  # o_proj's data shifted to start inside q_proj's
            data = st.read_bytes()
            n = struct.unpack_from("<Q", data)[0]
            header = json.loads(data[8:8 + n])
            q = header["model.layers.0.self_attn.q_proj.weight"]["data_offsets"]
            o = header["model.layers.0.self_attn.o_proj.weight"]
            o["data_offsets"] = [q[0] + 64, q[0] + 64 + o["data_offsets"][1] - o["data_offsets"][0]]
            h = json.dumps(header).encode()
            h += b" " * (-len(h) % 8)
            st.write_bytes(struct.pack("<Q", len(h)) + h + data[8 + n:])
            return "model.safetensors"
        if kind == "no-weights":
            st.unlink()
            return ""
        if kind == "pytorch-bin-only":
            st.unlink()
            (d / "pytorch_model.bin").write_bytes(b"PK")
            return ""
        if kind == "no-config":
            (d / "config.json").unlink()
            return ""
        if kind == "config-not-json":
            (d / "config.json").write_text('{"hidden_size": 64,')
            return "config.json"
        if kind == "config-nested-deeply":  # Python's json recurses once per level
            (d / "config.json").write_text('{"a": ' + "[" * 100000 + "]" * 100000 + "}")
            return "config.json"
        if kind == "header-nested-deeply":
            h = ('{"x": ' + "[" * 100000 + "]" * 100000 + "}").encode()
            st.write_bytes(struct.pack("<Q", len(h)) + h)
            return "model.safetensors"
        raise ValueError(kind)
    return change


# (id, change to config/tensors before writing or to the files after, words)
HF_BAD = [
    ("gemma-architecture", _config_change(architectures=["GemmaForCausalLM"], model_type="gemma"),
     ["GemmaForCausalLM", "not supported"]),
    ("architecture-and-model_type-disagree", _config_change(architectures=["Qwen2ForCausalLM"]),
     ["Qwen2ForCausalLM", "not supported"]),
    ("attention-bias-not-bool", _config_change(attention_bias="yes"), ["attention_bias"]),
    ("gelu", _config_change(hidden_act="gelu"), ["hidden_act", "gelu"]),
    ("negative-sliding-window", _config_change(architectures=["MistralForCausalLM"],
                                               model_type="mistral", sliding_window=-1),
     ["sliding_window=-1"]),
    ("qwen2-layer_types-full-after-sliding",
     _config_change(architectures=["Qwen2ForCausalLM"], model_type="qwen2", use_sliding_window=True,
                    sliding_window=8, layer_types=["sliding_attention", "full_attention"]),
     ["layer_types"]),
    ("heads-not-dividing", _config_change(num_attention_heads=5, num_key_value_heads=5),
     ["num_attention_heads=5", "hidden_size=64"]),
    ("kv-heads-not-dividing", _config_change(num_key_value_heads=3), ["num_key_value_heads=3"]),
    ("head_dim-differs", _config_change(head_dim=32), ["head_dim=32"]),
    ("missing-hidden_size", _config_change(hidden_size=None), ["hidden_size"]),
    ("odd-partial-rotary", _config_change(architectures=["Phi3ForCausalLM"], model_type="phi3",
                                          partial_rotary_factor=0.5625), ["partial_rotary_factor"]),
    ("llama-partial-rotary-with-scaling",
     _config_change(partial_rotary_factor=0.5, rope_scaling={"rope_type": "linear", "factor": 2.0}),
     ["partial_rotary_factor=0.5 with linear", "whole head"]),
    ("unknown-rope-type", _config_change(rope_scaling={"rope_type": "mrope", "factor": 2.0}),
     ["mrope", "not supported"]),
    ("longrope-without-factor-arrays",
     _config_change(rope_scaling={"rope_type": "longrope", "factor": 2.0}), ["short_factor"]),
    ("longrope-factors-of-the-wrong-length",
     _config_change(rope_scaling={"rope_type": "longrope", "short_factor": [1.0] * 8,
                                  "long_factor": [2.0] * 7}), ["long_factor", "8 numbers", "7"]),
    ("longrope-negative-factor",
     _config_change(rope_scaling={"rope_type": "longrope", "short_factor": [1.0] * 8,
                                  "long_factor": [2.0] * 7 + [-1.0]}), ["long_factor[7]"]),
    ("longrope-factor-float32-underflows",
     _config_change(rope_scaling={"rope_type": "longrope", "short_factor": [1.0] * 7 + [1e-50],
                                  "long_factor": [2.0] * 8}), ["short_factor[7]", "float32"]),
    ("longrope-factor-float32-overflows",
     _config_change(rope_scaling={"rope_type": "longrope", "short_factor": [1.0] * 8,
                                  "long_factor": [1e300] + [2.0] * 7}), ["long_factor[0]", "float32"]),
    ("attention-factor-beyond-run", _config_change(rope_scaling={"rope_type": "yarn", "factor": 2.0,
                                                                 "attention_factor": 5000.0}),
     ["rope_attn_factor=5000", "1000"]),
    ("yarn-beta-beyond-run", _config_change(rope_scaling={"rope_type": "yarn", "factor": 2.0,
                                                          "beta_fast": 1e7}),
     ["yarn_beta_fast=1e+07"]),
    ("unknown-rope-type-old-key", _config_change(rope_scaling={"type": "ntk-by-parts",
                                                               "factor": 2.0}),
     ["ntk-by-parts"]),
    ("rope-scaling-without-type", _config_change(rope_scaling={"factor": 2.0}),
     ["rope_scaling", "type"]),
    ("yarn-truncate-false", _config_change(rope_scaling={"rope_type": "yarn", "factor": 2.0,
                                                         "truncate": False}), ["truncate"]),
    ("linear-without-factor", _config_change(rope_scaling={"rope_type": "linear"}), ["factor"]),
    ("factor-below-one", _config_change(rope_scaling={"rope_type": "linear", "factor": 0.5}),
     ["factor"]),
    ("eos-outside-vocab", _config_change(eos_token_id=5000), ["eos_token_id"]),
    ("eos-list-entry-not-an-id", _config_change(eos_token_id=[2, "x"]),
     ["eos_token_id[1]=\"x\"", "expected a token id"]),
    ("sliding-window-negative-llama", _config_change(sliding_window=-1),
     ["sliding_window=-1", "expected an integer >= 0 or null"]),
    ("sliding-window-negative-qwen2-unused",
     _config_change(architectures=["Qwen2ForCausalLM"], model_type="qwen2",
                    use_sliding_window=False, sliding_window=-5), ["sliding_window=-5", ">= 0"]),
    ("torch-dtype-int4", _config_change(torch_dtype="int4"),
     ["torch_dtype=\"int4\"", "float32, float16, bfloat16"]),
    ("missing-tensor", _drop_tensor("model.layers.1.mlp.down_proj.weight"),
     ["missing", "model.layers.1.mlp.down_proj.weight"]),
    ("missing-norm", _drop_tensor("model.norm.weight"), ["model.norm.weight"]),
    ("k-shape-mismatch", _reshape_tensor("model.layers.0.self_attn.k_proj.weight", (32, 64)),
     ["k_proj", "shape", "[32, 64]", "[64, 64]"]),
    ("vocab-mismatch", _reshape_tensor("model.embed_tokens.weight", (311, 64)),
     ["embed_tokens", "[311, 64]"]),
    ("bias-tensor", _add_tensor("model.layers.0.self_attn.q_proj.bias", (64,)),
     ["q_proj.bias", "bias"]),
    ("qk-norm-tensor", _add_tensor("model.layers.0.self_attn.q_norm.weight", (16,)), ["q_norm"]),
    ("qwen2-k-bias-wrong-shape", _qwen2_biases(k=(32,)), ["layers.1.self_attn.k_proj.bias", "[32]"]),
    ("qwen2-k-bias-two-dimensional", _qwen2_biases(k=(64, 1)), ["k_proj.bias"]),
    ("qwen2-v-bias-missing", _qwen2_biases(v=None), ["layers.1.self_attn.v_proj.bias"]),
    ("phi3-without-fused-projections", _phi3_unfused, ["qkv_proj"]),
    ("mistral-with-a-bias", lambda d, config, tensors: (
        config.update(architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=None),
        tensors.update({"model.layers.0.self_attn.q_proj.bias": np.zeros(64, np.float32)}),
        "model.safetensors")[-1], ["q_proj.bias", "MistralForCausalLM"]),
    ("extra-layer", _add_tensor("model.layers.2.input_layernorm.weight", (64,)),
     ["model.layers.2.input_layernorm.weight"]),
    ("nan-in-last-tensor", _nan_in_lm_head, ["lm_head.weight", "NaN"]),
    ("truncated-file", _file_change("truncated"), ["truncated"]),
    ("garbage-file", _file_change("garbage"), ["safetensors"]),
    ("huge-header-length", _file_change("huge-header-length"), ["header length"]),
    ("int8-dtype", _file_change("int8-dtype"), ["I8", "embed_tokens"]),
    ("overlapping-data-offsets", _file_change("overlapping-offsets"),
     ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.o_proj.weight",
      "overlap"]),
    ("no-weights", _file_change("no-weights"), ["model.safetensors"]),
    ("pytorch-bin-only", _file_change("pytorch-bin-only"), ["pytorch_model.bin", "safetensors"]),
    ("no-config", _file_change("no-config"), ["config.json"]),
    ("config-not-json", _file_change("config-not-json"), ["JSON"]),
    ("config-nested-deeply", _file_change("config-nested-deeply"), ["nested too deeply"]),
    ("safetensors-header-nested-deeply", _file_change("header-nested-deeply"),
     ["nested too deeply"]),
]


@pytest.mark.parametrize("family, absent, key, expect", [
    ("phi3", "rms_norm_eps", "norm_eps", 1e-5),
    ("llama", "rms_norm_eps", "norm_eps", 1e-6),
    ("qwen2", "max_position_embeddings", "seq_len", 32768),
    ("mistral", "max_position_embeddings", "seq_len", 131072),
    ("mistral", "num_key_value_heads", "n_kv_heads", 8),
    ("llama", "num_key_value_heads", "n_kv_heads", 8),
])
def test_hf_absent_keys_take_the_family_default(family, absent, key, expect):
    """A key config.json leaves out gets what that family's transformers config
    class gives it (LlamaConfig's defaults are not every family's), with a note."""
    arch = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
            "phi3": "Phi3ForCausalLM"}[family]
    config = hf_config(architectures=[arch], model_type=family, num_attention_heads=8, **{absent: None})
    cfg, _, notes = export.hf_config(config)
    assert cfg[key] == pytest.approx(expect, rel=1e-6), (cfg[key], expect)
    if not (family == "llama" and absent == "num_key_value_heads"):  # LlamaConfig: absent = every head, no note
        assert any(absent in n and "default" in n for n in notes), notes


def test_hf_null_attention_bias_means_none():
    cfg, _, _ = export.hf_config(hf_config() | {"attention_bias": None, "mlp_bias": None})
    assert not cfg["qkv_bias"] and not cfg["o_bias"] and not cfg["mlp_bias"]


def _bad_hf_dir(tmp_path, change):
    config = hf_config()
    tensors = random_hf_tensors(config, 1)
    d = tmp_path / "hf"
    named = None
    if change.__code__.co_argcount == 3:
        named = change(d, config, tensors)
        write_hf_dir(d, config, tensors)
    else:
        write_hf_dir(d, config, tensors)
        named = change(d)
    return d, str(d / named) if named else str(d)


@pytest.mark.parametrize("case", range(len(HF_BAD)), ids=[c[0] for c in HF_BAD])
def test_hf_bad_source(case, tmp_path):
    name, change, words = HF_BAD[case]
    src, named = _bad_hf_dir(tmp_path, change)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    code, err = export_run(out_dir / "m.bin", "--hf", src)
    assert code == 1, err
    assert len(err.strip().splitlines()) == 1, err
    assert named in err, (named, err)
    for w in words:
        assert w in err, (w, err)
    assert sorted(p.name for p in out_dir.iterdir()) == []


@pytest.mark.parametrize("kind", ["truncated-file", "k-shape-mismatch", "no-config"])
def test_hf_bad_source_command_line(kind, tmp_path):
    """The same through the real command line: exit 1, one line, no traceback,
    and an existing output file is left as it was."""
    change = dict((c[0], c[1]) for c in HF_BAD)[kind]
    src, named = _bad_hf_dir(tmp_path, change)
    out = tmp_path / "m.bin"
    out.write_bytes(b"previous")
    p = export_cli(out, "--hf", src)
    err = p.stderr.decode()
    assert p.returncode == 1 and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1 and named in err, err
    assert out.read_bytes() == b"previous"
    assert sorted(q.name for q in tmp_path.iterdir()) == ["hf", "m.bin"]


def test_hf_sharded_bad_index(tmp_path):
    config = hf_config()
    tensors = random_hf_tensors(config, 2)
    d = write_hf_dir(tmp_path / "hf", config, tensors, shards=2)
    index = json.loads((d / "model.safetensors.index.json").read_text())
    # a name mapped to the shard that does not hold it
    index["weight_map"]["model.norm.weight"] = "model-00001-of-00002.safetensors"
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    code, err = export_run(tmp_path / "a.bin", "--hf", d)
    assert code == 1 and "model.norm.weight" in err and "model-00001-of-00002" in err, err
    # a shard missing
    (d / "model-00002-of-00002.safetensors").unlink()
    code, err = export_run(tmp_path / "b.bin", "--hf", d)
    assert code == 1 and "model-00002-of-00002.safetensors" in err and "missing" in err, err
    assert not list(tmp_path.glob("*.bin")) and not list(tmp_path.glob(".*tmp"))


def test_hf_usage_errors(tmp_path):
    src, _, _ = make_hf(tmp_path / "hf")
    for args in (["--hf", src, "--llama2c", "x.bin"],            # two sources
                 ["--llama2c", "x.bin", "--rope-layout", "neox"],  # layout without --hf
                 ["--hf", src, "--rope-layout", "halves"],
                 ["--hf", src, "--seq-len", "0"]):
        code, err = export_run(tmp_path / "o.bin", *args)
        assert code == 2 and err.splitlines()[-1].startswith("export.py: error:"), err
    assert not (tmp_path / "o.bin").exists()


def test_hf_export_streams_in_blocks(tmp_path, monkeypatch):
    """Nothing is read whole: with a 2 KB block size every read of the source
    asks for at most one block (plus the rest of a head, when q/k rows are
    permuted), and the output is the same bytes as with the default size."""
    src, config, _ = make_hf(tmp_path / "hf", dtype="BF16", num_key_value_heads=2)
    export_ok(tmp_path / "big-blocks.bin", "--hf", src, "--rope-layout", "interleaved")
    reads, real_rows = [], convert.safetensors._SafetensorsTensor.rows

    def rows(self, a, b):
        reads.append((b - a) * self.shape[-1] * 4)
        return real_rows(self, a, b)
    monkeypatch.setattr(convert.safetensors._SafetensorsTensor, "rows", rows)
    monkeypatch.setattr(convert.checkpoint, "_CHUNK_BYTES", 2048)
    export_ok(tmp_path / "small-blocks.bin", "--hf", src, "--rope-layout", "interleaved")
    head_bytes = 16 * config["hidden_size"] * 4
    assert len(reads) > 100 and max(reads) <= 2048 + head_bytes, (len(reads), max(reads))
    assert (tmp_path / "small-blocks.bin").read_bytes() == \
        (tmp_path / "big-blocks.bin").read_bytes()


def test_hf_seq_len_override(tmp_path):
    src, _, _ = make_hf(tmp_path / "hf")
    export_ok(tmp_path / "m.bin", "--hf", src, "--seq-len", "48")
    assert export.read_header(tmp_path / "m.bin")["seq_len"] == 48


# --------------------------------------------------------------------------
# Meta checkpoints (consolidated.NN.pth + params.json); need torch

# Meta's tensor names and model-parallel split axes, written out here rather
# than taken from export.py: column-parallel on 0, row-parallel on 1, norms
# replicated (None)
META_LAYER = {"rms_att_weight": ("attention_norm", None), "wq": ("attention.wq", 0),
              "wk": ("attention.wk", 0), "wv": ("attention.wv", 0), "wo": ("attention.wo", 1),
              "rms_ffn_weight": ("ffn_norm", None), "w1": ("feed_forward.w1", 0),
              "w2": ("feed_forward.w2", 1), "w3": ("feed_forward.w3", 0)}


def write_meta_dir(directory, cfg, tensors, shards=1, emb_axis=1, **params):
    """A Meta checkpoint of our-named, interleaved tensors: params.json and
    consolidated.NN.pth, each shard holding its slice (bf16, as Meta ships)."""
    torch = pytest.importorskip("torch", reason="python3-torch is not installed")
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    p = dict(dim=cfg["dim"], n_layers=cfg["n_layers"], n_heads=cfg["n_heads"],
             n_kv_heads=cfg["n_kv_heads"], vocab_size=-1, multiple_of=32,
             norm_eps=cfg["norm_eps"], rope_theta=cfg["rope_theta"], max_seq_len=cfg["seq_len"])
    p.update(params)
    p = {k: v for k, v in p.items() if v is not None}
    (directory / "params.json").write_text(json.dumps(p))

    def piece(a, axis, k):
        a = np.ascontiguousarray(np.array_split(a, shards, axis=axis)[k] if axis is not None else a)
        return torch.from_numpy(a.astype(np.float32)).to(torch.bfloat16)
    for k in range(shards):
        sd = {"tok_embeddings.weight": piece(tensors["token_embedding"], emb_axis, k),
              "norm.weight": piece(tensors["rms_final_weight"], None, k),
              "output.weight": piece(tensors["wcls"], 0, k)}
        for l in range(cfg["n_layers"]):
            for ours, (theirs, axis) in META_LAYER.items():
                sd[f"layers.{l}.{theirs}.weight"] = piece(tensors[ours][l], axis, k)
        torch.save(sd, directory / f"consolidated.{k:02d}.pth")
    return directory


def meta_model(directory, shards=1, emb_axis=1, seed=0, **params):
    from conftest import model_config
    cfg = model_config(n_heads=8, n_kv_heads=2, shared_classifier=False, norm_eps=1e-6,
                       rope_theta=5000.0)
    tensors = {k: round_to(v, "BF16") for k, v in export.random_tensors(cfg, seed).items()}
    return write_meta_dir(directory, cfg, tensors, shards, emb_axis, **params), cfg, tensors


def hf_from_ours(cfg, tensors, **config_overrides):
    """The Hugging Face form of an interleaved model of ours: config.json and
    HF-named tensors, q/k permuted as transformers' conversion script does."""
    config = hf_config(hidden_size=cfg["dim"], intermediate_size=cfg["hidden_dim"],
                       num_hidden_layers=cfg["n_layers"], num_attention_heads=cfg["n_heads"],
                       num_key_value_heads=cfg["n_kv_heads"], vocab_size=cfg["vocab_size"],
                       max_position_embeddings=cfg["seq_len"], rms_norm_eps=cfg["norm_eps"],
                       rope_theta=cfg["rope_theta"], **config_overrides)
    t = {"model.embed_tokens.weight": tensors["token_embedding"],
         "model.norm.weight": tensors["rms_final_weight"], "lm_head.weight": tensors["wcls"]}
    names = {"rms_att_weight": "input_layernorm", "wq": "self_attn.q_proj",
             "wk": "self_attn.k_proj", "wv": "self_attn.v_proj", "wo": "self_attn.o_proj",
             "rms_ffn_weight": "post_attention_layernorm", "w1": "mlp.gate_proj",
             "w2": "mlp.down_proj", "w3": "mlp.up_proj"}
    for l in range(cfg["n_layers"]):
        for ours, theirs in names.items():
            w = tensors[ours][l]
            if ours in ("wq", "wk"):
                w = hf_permute(w, cfg["n_heads"] if ours == "wq" else cfg["n_kv_heads"])
            t[f"model.layers.{l}.{theirs}.weight"] = w
    return config, t


def advised_command(message, after, before=None):
    """The export.py command a message of run's gives (between `after` and
    `before`, or the end), as argv: python3 and export.py become this Python
    and the repository's export.py."""
    text = message.split(after, 1)[1]
    text = text.split(before, 1)[0] if before else text.strip()
    argv = shlex.split(text)
    assert argv[:2] == ["python3", "export.py"], argv
    return [sys.executable, str(ROOT / "export.py")] + argv[2:]


@pytest.mark.parametrize("source", ["safetensors", "config-json", "meta-pth"])
def test_source_given_to_run_converts_as_the_message_says(source, tmp_path, syn_tokenizer):
    """`run` given a Hugging Face model's model.safetensors or config.json, or
    a Meta consolidated.00.pth, as the checkpoint names the export.py command
    that converts its folder; run as printed, it writes a checkpoint that runs."""
    if source == "meta-pth":
        pytest.importorskip("torch")
        src, _, _ = meta_model(tmp_path / "meta")
        path = src / "consolidated.00.pth"
    else:
        src, _, _ = make_hf(tmp_path / "hf")
        path = src / ("model.safetensors" if source == "safetensors" else "config.json")
    p = run(path, "-z", syn_tokenizer, "-i", "the cat")
    err = p.stderr.decode()
    assert p.returncode == 1 and err.startswith(f"{path}: not a checkpoint: "), err
    out = tmp_path / "out"
    out.mkdir()
    command = advised_command(err, "with: ", " (a Hugging Face" if source == "meta-pth" else None)
    conv = subprocess.run(command, cwd=out, capture_output=True)
    assert conv.returncode == 0, conv.stderr
    run_ok(out / "model.bin", "-z", syn_tokenizer, "-t", "0", "-n", "2", "-i", "the cat")


@pytest.mark.parametrize("shards,emb_axis", [(1, 0), (2, 1), (2, 0)],
                         ids=["one-shard", "two-shards-llama2-embedding-split",
                              "two-shards-llama3-embedding-split"])
def test_meta_matches_reference(shards, emb_axis, tmp_path, syn_tokenizer, text_file, text_ids):
    """Shards joined along the right axis, both layouts: run equals the
    interleaved reference on the original weights, and equals the export of
    the same model from its Hugging Face form."""
    src, cfg, tensors = meta_model(tmp_path / "meta", shards, emb_axis, seed=40 + shards)
    ctx = 2 * cfg["seq_len"]
    ref = ppl_reference(Reference(cfg, tensors), text_ids, ctx, 1, cfg["seq_len"])
    nll = {}
    for layout in ("interleaved", "neox"):
        out = tmp_path / f"{layout}.bin"
        export_ok(out, "--meta-llama", src, "--rope-layout", layout)
        back, _ = export.read_checkpoint(out)
        assert (back["hidden_dim"], back["vocab_size"], back["n_kv_heads"], back["rope_layout"],
                back["shared_classifier"]) == (96, SYN_VOCAB, 2, layout, False)
        got = run_ppl(out, syn_tokenizer, text_file, ctx)
        check_nll(got, ref)
        nll[layout] = got["nll"]
    config, hf_tensors = hf_from_ours(cfg, tensors)
    hf_dir = write_hf_dir(tmp_path / "hf", config, hf_tensors, "BF16")
    export_ok(tmp_path / "hf.bin", "--hf", hf_dir)
    hf_nll = run_ppl(tmp_path / "hf.bin", syn_tokenizer, text_file, ctx)["nll"]
    assert abs(hf_nll - nll["interleaved"]) < LAYOUT_TOL
    assert abs(nll["neox"] - nll["interleaved"]) < LAYOUT_TOL


def test_meta_scaled_rope(tmp_path, syn_tokenizer, text_file, text_ids):
    """use_scaled_rope is Llama 3.1's llama3 scaling with Meta's hard-coded
    numbers; without max_seq_len a training context is chosen and said."""
    src, cfg, tensors = meta_model(tmp_path / "meta", 2, 0, seed=7, use_scaled_rope=True,
                                   max_seq_len=None, rope_theta=500000.0)
    err = export_ok(tmp_path / "m.bin", "--meta-llama", src)
    assert "use_scaled_rope" in err and "max_seq_len" in err, err
    h = export.read_header(tmp_path / "m.bin")
    assert (h["rope_scaling"], h["rope_orig_ctx"], h["seq_len"]) == (5, 8192, 131072)
    assert (h["rope_factor"], h["llama3_low_freq"], h["llama3_high_freq"]) == (8.0, 1.0, 4.0)
    # against the HF-semantics reference of the same model with HF's llama3 config
    cfg = dict(cfg, rope_theta=500000.0)
    config, hf_tensors = hf_from_ours(cfg, tensors, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192})
    ref = ppl_reference(HFReference(config, hf_tensors), text_ids, 64, 1, 8192)
    got = run_ppl(tmp_path / "m.bin", syn_tokenizer, text_file, 64)
    check_nll(got, ref, buckets=False)
    export_ok(tmp_path / "s.bin", "--meta-llama", src, "--seq-len", "64")
    assert export.read_header(tmp_path / "s.bin")["seq_len"] == 64


def _meta_bad(tmp_path, kind):
    torch = pytest.importorskip("torch", reason="python3-torch is not installed")
    params = dict(moe_args={"num_experts": 16}) if kind == "moe-params" else {}
    src, cfg, tensors = meta_model(tmp_path / "meta", 2, 1, **params)
    shard1 = src / "consolidated.01.pth"
    if kind == "no-params":
        (src / "params.json").unlink()
        return src, [str(src), "params.json"]
    if kind in ("missing-tensor", "shape-mismatch", "bias"):
        sd = torch.load(shard1)
        if kind == "missing-tensor":
            del sd["layers.1.feed_forward.w2.weight"]
        elif kind == "shape-mismatch":
            sd["layers.0.attention.wk.weight"] = sd["layers.0.attention.wk.weight"][:4]
        else:
            sd["layers.0.attention.wq.bias"] = torch.zeros(32)
        torch.save(sd, shard1)
        word = {"missing-tensor": "layers.1.feed_forward.w2.weight",
                "shape-mismatch": "layers.0.attention.wk.weight", "bias": "bias"}[kind]
        return src, [str(shard1), word]
    if kind == "truncated":
        data = shard1.read_bytes()
        shard1.write_bytes(data[:len(data) // 2])
        return src, [str(shard1)]
    if kind == "garbage":
        shard1.write_bytes(b"not a torch file" * 100)
        return src, [str(shard1)]
    if kind == "shard-gap":
        shard1.rename(src / "consolidated.02.pth")
        return src, ["consolidated.02.pth", "consolidated.01.pth"]
    if kind == "moe-params":
        return src, [str(src / "params.json"), "moe_args"]
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["no-params", "missing-tensor", "shape-mismatch", "bias",
                                  "truncated", "garbage", "shard-gap", "moe-params"])
def test_meta_bad_source(kind, tmp_path):
    src, words = _meta_bad(tmp_path, kind)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    code, err = export_run(out_dir / "m.bin", "--meta-llama", src)
    assert code == 1, err
    assert len(err.strip().splitlines()) == 1, err
    for w in words:
        assert w in err, (w, err)
    assert sorted(p.name for p in out_dir.iterdir()) == []


def test_meta_without_torch_says_so(tmp_path, monkeypatch):
    src = tmp_path / "meta"
    src.mkdir()
    (src / "params.json").write_text(json.dumps({"dim": 64, "n_layers": 2, "n_heads": 4}))
    (src / "consolidated.00.pth").write_bytes(b"PK")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    code, err = export_run(tmp_path / "m.bin", "--meta-llama", src)
    assert code == 1 and "torch" in err and str(src) in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "m.bin").exists()


# --------------------------------------------------------------------------
# Tokenizer

def test_tokenizer_export_gives_sentencepiece_ids(tmp_path):
    """--tokenizer on the Llama 2 sentencepiece model: the file equals
    llama2.c's tokenizer.bin, and run tokenizes with it exactly as
    sentencepiece does."""
    model, ref_bin = need_shared("llama2-tokenizer.model", "llama2-tokenizer.bin")
    spm = pytest.importorskip("sentencepiece", reason="python3-sentencepiece is not installed")
    tok = tmp_path / "tok.bin"
    p = export_cli(tok, "--tokenizer", model)
    assert p.returncode == 0, p.stderr
    assert tok.read_bytes() == ref_bin.read_bytes()
    sp = spm.SentencePieceProcessor()
    sp.Load(str(model))
    ckpt, _, _ = make_model(tmp_path, dim=16, hidden_dim=16, n_layers=1, n_heads=2,
                            n_kv_heads=2, vocab_size=32000, seq_len=64)
    for text in ["Hello world", "Once upon a time, there was a little girl named Lily.",
                 "  leading spaces and trailing  ", "naïve café — ünïcödé 日本語 🙂",
                 "tabs\tand\nnewlines\n\n", "1234567890 + 3.14159 = ?", "<s> is not BOS"]:
        assert tokenize(ckpt, tok, text) == [1] + sp.encode(text), text
