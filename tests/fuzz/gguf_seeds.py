"""Seeds for tests/fuzz/fuzz_gguf.c (make_seeds.py calls write_gguf_seeds):
small GGUF files of the Llama architecture written with the gguf package's
GGUFWriter, two option bytes before each (fuzz_gguf.c says what they choose).

Variants: each tensor type run reads (F32, F16, BF16, Q8_0) and one it
refuses (Q4_1); tied and untied classifier; linear and YaRN scaling keys;
general.alignment 64; GGUF version 2 (the same layout, another number);
metadata of every value type, arrays of each, and nested arrays (for the
parser)."""
import numpy as np

DIM, HIDDEN, LAYERS, HEADS, KV_HEADS, VOCAB, CTX = 64, 96, 2, 4, 2, 40, 16
NAMES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_down", "ffn_up")


def _shapes():
    kv = DIM // HEADS * KV_HEADS
    return {"attn_q": (DIM, DIM), "attn_k": (kv, DIM), "attn_v": (kv, DIM), "attn_output": (DIM, DIM),
            "ffn_gate": (HIDDEN, DIM), "ffn_down": (DIM, HIDDEN), "ffn_up": (HIDDEN, DIM)}


def _add(w, gguf, name, a, qtype):
    """Tensor a (float32) as qtype."""
    if qtype == gguf.GGMLQuantizationType.F32:
        w.add_tensor(name, a)
    elif qtype == gguf.GGMLQuantizationType.F16:
        w.add_tensor(name, a.astype(np.float16))
    else:
        w.add_tensor(name, gguf.quants.quantize(a, qtype), raw_dtype=qtype)


def write_one(gguf, path, qtype, tied=False, scaling=None, alignment=None, every_type=False):
    """One small llama GGUF at path."""
    rng = np.random.default_rng(1)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32("llama.context_length", CTX)
    w.add_uint32("llama.embedding_length", DIM)
    w.add_uint32("llama.block_count", LAYERS)
    w.add_uint32("llama.feed_forward_length", HIDDEN)
    w.add_uint32("llama.attention.head_count", HEADS)
    w.add_uint32("llama.attention.head_count_kv", KV_HEADS)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_uint32("tokenizer.ggml.bos_token_id", 1)
    w.add_uint32("tokenizer.ggml.eos_token_id", 2)
    if alignment:
        w.add_custom_alignment(alignment)
    if scaling == "linear":
        w.add_string("llama.rope.scaling.type", "linear")
        w.add_float32("llama.rope.scaling.factor", 2.0)
    elif scaling == "yarn":
        w.add_string("llama.rope.scaling.type", "yarn")
        w.add_float32("llama.rope.scaling.factor", 4.0)
        w.add_uint32("llama.rope.scaling.original_context_length", 8)
        w.add_float32("llama.rope.scaling.attn_factor", 0.9)
    if every_type:
        w.add_uint8("x.u8", 1), w.add_int8("x.i8", -1), w.add_uint16("x.u16", 2)
        w.add_int16("x.i16", -2), w.add_int32("x.i32", -3), w.add_uint64("x.u64", 4)
        w.add_int64("x.i64", -4), w.add_float64("x.f64", 0.5), w.add_bool("x.bool", True)
        w.add_array("x.strings", ["a", "bc", ""]), w.add_array("x.floats", [1.0, 2.5])
        w.add_array("x.ints", [1, 2, 3]), w.add_array("x.nested", [[1, 2], [3]])
        w.add_array("x.bools", [True, False])
    _add(w, gguf, "token_embd.weight", rng.standard_normal((VOCAB, DIM), np.float32), qtype)
    w.add_tensor("output_norm.weight", np.ones(DIM, np.float32))
    if not tied:
        _add(w, gguf, "output.weight", rng.standard_normal((VOCAB, DIM), np.float32) * 0.1, qtype)
    for layer in range(LAYERS):
        w.add_tensor(f"blk.{layer}.attn_norm.weight", np.ones(DIM, np.float32))
        w.add_tensor(f"blk.{layer}.ffn_norm.weight", np.ones(DIM, np.float32))
        for name, shape in _shapes().items():
            a = rng.standard_normal(shape, np.float32) * shape[1] ** -0.5
            _add(w, gguf, f"blk.{layer}.{name}.weight", a, qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


def write_gguf_seeds(out):
    """The seeds into folder out (created)."""
    import gguf
    import gguf.quants  # noqa: F401
    Q = gguf.GGMLQuantizationType
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "tmp.gguf"
    variants = [("f32", Q.F32, {}), ("f16-tied", Q.F16, dict(tied=True)), ("bf16", Q.BF16, {}),
                ("q8_0", Q.Q8_0, {}), ("q8_0-tied-yarn", Q.Q8_0, dict(tied=True, scaling="yarn")),
                ("f32-linear-align64", Q.F32, dict(scaling="linear", alignment=64)),
                ("q4_1", Q.Q4_1, {}), ("f16-every-type", Q.F16, dict(every_type=True))]
    for name, qtype, kw in variants:
        data = write_one(gguf, tmp, qtype, **kw)
        for opt, ctx in ((0, 20), (3, 9)):
            (out / f"{name}-{opt}").write_bytes(bytes([opt, ctx]) + data)
    data = bytearray(write_one(gguf, tmp, Q.F32))
    data[4:8] = (2).to_bytes(4, "little")  # version 2: the same layout for a little-endian file
    (out / "f32-v2").write_bytes(bytes([0, 12]) + bytes(data))
    tmp.unlink()
