"""Seeds for tests/fuzz/fuzz_gguf.c (make_seeds.py calls write_gguf_seeds):
small GGUF files of the Llama architecture written with the gguf package's
GGUFWriter, two option bytes before each (fuzz_gguf.c says what they choose).

Variants: each tensor type run reads (F32, F16, BF16, Q8_0, Q4_0, Q4_1,
Q5_0, Q5_1, and the K-quants Q4_K, Q5_K, Q6_K in a Q4_K_M-like mix and a
Q5_K file, whose 256-value blocks need rows of 256) and one it refuses
(Q2_K); tied and untied classifier; linear and YaRN scaling keys;
general.alignment 64; GGUF version 2 (the same layout, another number);
metadata of every value type, arrays of each, and nested arrays (for the
parser). Each file is a seed twice: with option bytes 0 (the loader's
default: Q4_0 and Q4_1 kept, the other quantized types made q8_0) and 7 (f16
cache, portable kernels, float32 conversion); the Q4_0 and Q4_1 files a third
time with 8 (everything made q8_0); and every file with 16 (a q8_0 KV cache,
which runs the 64-wide files, kv_dim 32, and refuses the small ones, kv_dim
16). The small-* seeds
repeat the block types in one layer of width 32 (a few KB each instead of
40-270): a mutant of a small file costs a tenth of the time, so a long
campaign reaches millions of executions in hours."""
import numpy as np

DIM, HIDDEN, LAYERS, HEADS, KV_HEADS, VOCAB, CTX = 64, 96, 2, 4, 2, 40, 16
NAMES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_down", "ffn_up")


def _shapes(dim, hidden):
    kv = dim // HEADS * KV_HEADS
    return {"attn_q": (dim, dim), "attn_k": (kv, dim), "attn_v": (kv, dim), "attn_output": (dim, dim),
            "ffn_gate": (hidden, dim), "ffn_down": (dim, hidden), "ffn_up": (hidden, dim)}


def _add(w, gguf, name, a, qtype, rng):
    """Tensor a (float32) as qtype, or as the type qtype(name) gives when it
    is a function. The types gguf cannot quantize (the K-quants) get random
    blocks of bytes below 0x18, so that every half scale is small and finite."""
    qtype = qtype(name) if callable(qtype) else qtype
    if qtype == gguf.GGMLQuantizationType.F32:
        w.add_tensor(name, a)
    elif qtype == gguf.GGMLQuantizationType.F16:
        w.add_tensor(name, a.astype(np.float16))
    else:
        try:
            w.add_tensor(name, gguf.quants.quantize(a, qtype), raw_dtype=qtype)
        except NotImplementedError:
            block, size = gguf.GGML_QUANT_SIZES[qtype]
            raw = rng.integers(0, 0x18, size=(a.shape[0], a.shape[1] // block * size), dtype=np.uint8)
            w.add_tensor(name, raw, raw_dtype=qtype)


def write_one(gguf, path, qtype, tied=False, scaling=None, alignment=None, every_type=False, dim=DIM,
              hidden=HIDDEN, layers=LAYERS):
    """One small llama GGUF at path."""
    rng = np.random.default_rng(1)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32("llama.context_length", CTX)
    w.add_uint32("llama.embedding_length", dim)
    w.add_uint32("llama.block_count", layers)
    w.add_uint32("llama.feed_forward_length", hidden)
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
    _add(w, gguf, "token_embd.weight", rng.standard_normal((VOCAB, dim), np.float32), qtype, rng)
    w.add_tensor("output_norm.weight", np.ones(dim, np.float32))
    if not tied:
        _add(w, gguf, "output.weight", rng.standard_normal((VOCAB, dim), np.float32) * 0.1, qtype, rng)
    for layer in range(layers):
        w.add_tensor(f"blk.{layer}.attn_norm.weight", np.ones(dim, np.float32))
        w.add_tensor(f"blk.{layer}.ffn_norm.weight", np.ones(dim, np.float32))
        for name, shape in _shapes(dim, hidden).items():
            a = rng.standard_normal(shape, np.float32) * shape[1] ** -0.5
            _add(w, gguf, f"blk.{layer}.{name}.weight", a, qtype, rng)
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
    k_sizes = dict(dim=256, hidden=256, layers=1)  # K-quant rows are whole blocks of 256

    def k_m(name):  # llama.cpp's Q4_K_M in small: Q6_K for attn_v, ffn_down and the classifier
        return Q.Q6_K if any(part in name for part in ("attn_v", "ffn_down", "output.")) else Q.Q4_K

    variants = [("f32", Q.F32, {}), ("f16-tied", Q.F16, dict(tied=True)), ("bf16", Q.BF16, {}),
                ("q8_0", Q.Q8_0, {}), ("q8_0-tied-yarn", Q.Q8_0, dict(tied=True, scaling="yarn")),
                ("f32-linear-align64", Q.F32, dict(scaling="linear", alignment=64)),
                ("q4_0", Q.Q4_0, {}), ("q4_1-tied", Q.Q4_1, dict(tied=True)), ("q5_0", Q.Q5_0, {}),
                ("q5_1", Q.Q5_1, {}), ("q4_k_m", k_m, k_sizes), ("q5_k-tied", Q.Q5_K, dict(tied=True, **k_sizes)),
                ("q2_k-refused", Q.Q2_K, k_sizes), ("f16-every-type", Q.F16, dict(every_type=True))]
    small = dict(dim=32, hidden=32, layers=1)
    variants += [("small-f32-linear", Q.F32, dict(scaling="linear", **small)),
                 ("small-f16-tied", Q.F16, dict(tied=True, **small)), ("small-bf16", Q.BF16, small),
                 ("small-q8_0-yarn", Q.Q8_0, dict(scaling="yarn", **small)), ("small-q4_0", Q.Q4_0, small),
                 ("small-q4_1-tied", Q.Q4_1, dict(tied=True, **small)), ("small-q5_0", Q.Q5_0, small),
                 ("small-q5_1", Q.Q5_1, small)]
    for name, qtype, kw in variants:
        data = write_one(gguf, tmp, qtype, **kw)
        for opt, ctx in ((0, 20), (7, 9), (16, 14)) + (((8, 12),) if qtype in (Q.Q4_0, Q.Q4_1) else ()):
            (out / f"{name}-{opt}").write_bytes(bytes([opt, ctx]) + data)
    data = bytearray(write_one(gguf, tmp, Q.F32))
    data[4:8] = (2).to_bytes(4, "little")  # version 2: the same layout for a little-endian file
    (out / "f32-v2").write_bytes(bytes([0, 12]) + bytes(data))
    tmp.unlink()


# Vocabulary-only GGUFs (no tensors) for the tokenizer path of fuzz_gguf.c
# (gguf_tokenizer.c): a sentencepiece ("llama") vocabulary with byte tokens
# and Llama 2's chat markers, and byte-level ("gpt2") ones with merges,
# special tokens and the ChatML and Llama 3.1 templates.
CHATML_TEMPLATE = ("{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are "
                   "\\'helpful\\'.<|im_end|>\\n' }}{% endif %}{# a comment #}"
                   "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
                   "'<|im_end|>\\n' }}{% endfor %}")
LLAMA31_TEMPLATE = ('{%- set date_string = "26 Jul 2024" %}{{ "<|start_header_id|>system<|end_header_id|>'
                    '\\n\\n" }}{{ "Cutting Knowledge Date: December 2023\\n" }}{{ "Today Date: " + '
                    'date_string + "\\n\\n" }}{{ "<|eot_id|>" }}')


def _vocabulary(gguf, path, entries):
    w = gguf.GGUFWriter(str(path), "llama")
    for key, value in entries:
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


def write_vocabulary_seeds(out):
    """The vocabulary seeds into folder out (which exists)."""
    import gguf
    import export
    tmp = out / "tmp.gguf"
    words = ["\u2581the", "\u2581cat", "\u2581sat", "th", "he", "at", "\u2581", "t", "h", "e", "c", "a", "s"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + words
    types = [2, 3, 3] + [6] * 256 + [1] * len(words)
    scores = [0.0] * 259 + [-float(i) for i in range(len(words))]
    sp = [("tokenizer.ggml.model", "llama"), ("tokenizer.ggml.tokens", tokens),
          ("tokenizer.ggml.token_type", types), ("tokenizer.ggml.scores", scores),
          ("tokenizer.ggml.bos_token_id", 1), ("tokenizer.ggml.eos_token_id", 2),
          ("tokenizer.chat_template", "{% if x %}[INST] <<SYS>>{% endif %}")]
    pieces = [bytes([b]) for b in range(256)] + [b"th", b"the", b" the", b"at", b" cat"]
    merges = [(b"t", b"h"), (b"th", b"e"), (b" ", b"the"), (b"a", b"t"), (b" c", b"at")]
    pieces.insert(256, b" c")
    merges.insert(0, (b" ", b"c"))
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|eot_id|>", "<|start_header_id|>"]
    bpe_tokens = specials + [export.bytes_to_gpt2(p) for p in pieces]
    bpe_types = [3] * len(specials) + [1] * len(pieces)
    bpe_merges = [f"{export.bytes_to_gpt2(a)} {export.bytes_to_gpt2(b)}" for a, b in merges]
    bpe = [("tokenizer.ggml.model", "gpt2"), ("tokenizer.ggml.tokens", bpe_tokens),
           ("tokenizer.ggml.token_type", bpe_types), ("tokenizer.ggml.merges", bpe_merges),
           ("tokenizer.ggml.bos_token_id", 0), ("tokenizer.ggml.eos_token_id", 2)]
    seeds = {"vocab-sentencepiece": sp,
             "vocab-gpt2-chatml": bpe + [("tokenizer.ggml.pre", "smollm"),
                                         ("tokenizer.chat_template", CHATML_TEMPLATE)],
             "vocab-gpt2-llama3": bpe + [("tokenizer.ggml.pre", "llama-bpe"), ("tokenizer.ggml.add_bos_token", True),
                                         ("tokenizer.ggml.eom_token_id", 4),
                                         ("tokenizer.chat_template", LLAMA31_TEMPLATE)]}
    for name, entries in seeds.items():
        (out / f"{name}-0").write_bytes(bytes([0, 8]) + _vocabulary(gguf, tmp, entries))
    tmp.unlink()
