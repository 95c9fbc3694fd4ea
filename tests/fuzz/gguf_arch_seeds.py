"""Seeds for tests/fuzz/fuzz_gguf.c of the qwen2 and phi3 architectures
(make_seeds.py calls write_arch_seeds): small files laid out as llama.cpp's
converter writes them (tests/test_gguf_archs.py says how), so that the
fuzzer starts from Qwen2's biases, Phi-3's fused attn_qkv and gate|up
ffn_up, its window, partial rotary and LongRoPE factor tensors. Two option
bytes before each file, as gguf_seeds.py's."""
import numpy as np

DIM, HIDDEN, LAYERS, HEADS, KV_HEADS, VOCAB, CTX = 64, 96, 2, 4, 2, 40, 16


def _add(w, gguf, name, a, qtype):
    if qtype == gguf.GGMLQuantizationType.F16:
        w.add_tensor(name, a.astype(np.float16))
    elif qtype == gguf.GGMLQuantizationType.Q8_0:
        w.add_tensor(name, gguf.quants.quantize(a, qtype), raw_dtype=qtype)
    else:
        w.add_tensor(name, a)


def write_arch(gguf, path, arch, qtype, tied=False, rot=None, window=0, longrope=False):
    """One small qwen2 or phi3 GGUF at path; returns its bytes."""
    rng = np.random.default_rng(3)
    hs, kv = DIM // HEADS, DIM // HEADS * KV_HEADS
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in (("context_length", CTX), ("embedding_length", DIM), ("block_count", LAYERS),
                       ("feed_forward_length", HIDDEN), ("attention.head_count", HEADS),
                       ("attention.head_count_kv", KV_HEADS)):
        w.add_uint32(f"{arch}.{key}", value)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_float32(f"{arch}.rope.freq_base", 10000.0)
    w.add_uint32("tokenizer.ggml.bos_token_id", 1)
    w.add_uint32("tokenizer.ggml.eos_token_id", 2)
    if arch == "phi3":
        w.add_uint32("phi3.rope.dimension_count", rot or hs)
        w.add_uint32("phi3.rope.scaling.original_context_length", CTX // 2 if longrope else CTX)
        w.add_uint32("phi3.attention.sliding_window", window)
    if longrope:
        w.add_float32("phi3.rope.scaling.attn_factor", 1.2)
        pairs = (rot or hs) // 2
        w.add_tensor("rope_factors_long.weight", np.linspace(1.0, 8.0, pairs, dtype=np.float32))
        w.add_tensor("rope_factors_short.weight", np.linspace(1.0, 1.5, pairs, dtype=np.float32))

    def mat(rows, cols):
        return rng.standard_normal((rows, cols), np.float32) * np.float32(cols ** -0.5)
    _add(w, gguf, "token_embd.weight", rng.standard_normal((VOCAB, DIM), np.float32), qtype)
    w.add_tensor("output_norm.weight", np.ones(DIM, np.float32))
    if not tied:
        _add(w, gguf, "output.weight", mat(VOCAB, DIM), qtype)
    for layer in range(LAYERS):
        b = f"blk.{layer}."
        w.add_tensor(b + "attn_norm.weight", np.ones(DIM, np.float32))
        w.add_tensor(b + "ffn_norm.weight", np.ones(DIM, np.float32))
        _add(w, gguf, b + "attn_output.weight", mat(DIM, DIM), qtype)
        _add(w, gguf, b + "ffn_down.weight", mat(DIM, HIDDEN), qtype)
        if arch == "phi3":  # q | k | v rows, and gate | up rows
            _add(w, gguf, b + "attn_qkv.weight", mat(DIM + 2 * kv, DIM), qtype)
            _add(w, gguf, b + "ffn_up.weight", mat(2 * HIDDEN, DIM), qtype)
            continue
        for name, rows in (("attn_q", DIM), ("attn_k", kv), ("attn_v", kv)):
            _add(w, gguf, b + name + ".weight", mat(rows, DIM), qtype)
            w.add_tensor(b + name + ".bias", rng.standard_normal(rows).astype(np.float32) * np.float32(0.5))
        _add(w, gguf, b + "ffn_gate.weight", mat(HIDDEN, DIM), qtype)
        _add(w, gguf, b + "ffn_up.weight", mat(HIDDEN, DIM), qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


def write_arch_seeds(out):
    """The seeds into folder out (created)."""
    import gguf
    import gguf.quants  # noqa: F401
    Q = gguf.GGMLQuantizationType
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "tmp-arch.gguf"
    variants = [("qwen2-f32", "qwen2", Q.F32, {}), ("qwen2-q8_0-tied", "qwen2", Q.Q8_0, dict(tied=True)),
                ("phi3-f16-window", "phi3", Q.F16, dict(window=6)),
                ("phi3-q8_0-longrope-partial", "phi3", Q.Q8_0, dict(rot=8, longrope=True, tied=True))]
    for name, arch, qtype, kw in variants:
        data = write_arch(gguf, tmp, arch, qtype, **kw)
        for opt, ctx in ((0, 20), (7, 9)):
            (out / f"{name}-{opt}").write_bytes(bytes([opt, ctx]) + data)
    tmp.unlink()
