#!/usr/bin/env python3
"""Seed corpora and fixed tokenizers for the fuzz targets in tests/fuzz/.

    python3 tests/fuzz/make_seeds.py OUT_DIR

writes (small valid inputs of every variant, built with export.py, so the
fuzzers start from files the loaders accept and mutate from there):

    OUT_DIR/checkpoint/   option bytes + a checkpoint: format versions 0 (llama2.c),
                          1 and 2; float32 and q8_0; shared and unshared classifier;
                          interleaved and neox; GQA; every stored scaling; biases,
                          a sliding window, LongRoPE; a kv_dim of 32 with the q8_0
                          KV cache (fuzz_checkpoint.c says what the option bytes choose)
    OUT_DIR/tokenizer/    vocab_size - 1, bos_id + 1, eos_id + 1 (u16 each) + a tokenizer file:
                          llama2.c's version 1, LTOK version 3 sentencepiece-type and
                          byte-level (with merges, special pieces, a chat template,
                          stop ids and system texts)
    OUT_DIR/encode/       a selector byte + text (plain, UTF-8, invalid UTF-8,
                          typed special pieces, long runs)
    OUT_DIR/chat/         a selector byte + a conversation file ("role: text" lines)
    OUT_DIR/chat_input/   a selector byte (the line reader's bound) + what a user types:
                          turns, CRLF lines, a NUL byte, a long line, no final newline
    OUT_DIR/gguf/         option bytes + a small GGUF (tests/fuzz/gguf_seeds.py): each
                          tensor type run reads and one it refuses, scaling keys,
                          every metadata value type; vocabularies alone (sentencepiece,
                          byte-level with the ChatML and Llama 3.1 templates); qwen2 and
                          phi3 files (tests/fuzz/gguf_arch_seeds.py)
    OUT_DIR/tokenizers/   the two fixed tokenizers fuzz_encode and fuzz_chat load:
                          sp.bin (the bundled models/tokenizer.bin, copied) and
                          bpe.bin (a byte-level BPE vocabulary with ChatML pieces)
"""
import itertools
import os
import shutil
import struct
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
import export  # noqa: E402

SMALL = dict(dim=16, hidden_dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=40, seq_len=16)

# (name, config changes) for the checkpoint seeds
CHECKPOINTS = [
    ("v1-f32", {}),
    ("v1-q8", dict(weight_type="q8_0", group_size=8)),
    ("v1-unshared-neox", dict(shared_classifier=False, rope_layout="neox")),
    ("v1-partial-rotary", dict(rot_dim=2, rope_theta=500.0)),
    ("v1-yarn", dict(rope_scaling="yarn", rope_factor=4.0, rope_orig_ctx=8)),
    ("v1-llama3", dict(rope_scaling="llama3", rope_factor=8.0, rope_orig_ctx=8)),
    ("v1-dynamic", dict(rope_scaling="dynamic", rope_factor=2.0)),
    ("v2-biases-window", dict(qkv_bias=True, o_bias=True, mlp_bias=True, sliding_window=3,
                              window_first_layer=1)),
    ("v2-longrope-q8", dict(rope_scaling="longrope", rope_factor=4.0, rope_orig_ctx=4,
                            weight_type="q8_0", group_size=8, qkv_bias=True)),
]
OPTIONS = [(0, 20), (1 | 2, 35), (4, 30), (8 | 16, 25), (12, 39), (32 | 64, 10), (128 | 1, 20)]
# A checkpoint whose kv_dim (2 kv heads x 16) holds q8_0 cache blocks, with the
# q8_0 cache (option bit 7) and each key strategy, a window, YaRN, portable kernels
KV32 = dict(SMALL, dim=64, hidden_dim=32)
KV32_OPTIONS = [(128, 30), (128 | 2 | 4, 25), (128 | 8, 39), (128 | 12, 30), (128 | 16 | 64, 20)]


def byte_level_tokenizer():
    """A small byte-level BPE vocabulary (GPT-2 pre-tokenizer): the 256 bytes,
    merges that spell a few English words, and ChatML's special pieces."""
    pieces, merges = [bytes([b]) for b in range(256)], []
    for word in (b"th", b"he", b"the", b" t", b" the", b"in", b" in", b"an", b"and", b" and"):
        left, right = word[:-1], word[-1:]
        if left not in pieces:
            continue
        merges.append((pieces.index(left), pieces.index(right)))
        pieces.append(word)
    kinds = [export.PIECE_NORMAL] * len(pieces)
    for special in (b"<|endoftext|>", b"<|im_start|>", b"<|im_end|>"):
        pieces.append(special)
        kinds.append(export.PIECE_SPECIAL)
    end = len(pieces) - 1
    return dict(type="byte_bpe", pre="gpt2", pieces=pieces, kinds=kinds, merges=merges,
                bos_id=-1, eos_id=end - 2, eot_id=end, pad_id=-1, add_bos=False, chat="chatml",
                stop_ids=[end - 2, end], system_default="You are a test.", system_prefix="")


def main():
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "tests" / "fuzz" / "build" / "seeds"
    for sub in ("checkpoint", "tokenizer", "encode", "chat", "chat_input", "tokenizers"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    tmp = out / "tmp.bin"

    for name, change in CHECKPOINTS:
        cfg = export.normalize_config(dict(SMALL, **change))
        export.write_checkpoint(tmp, cfg, export.random_tensors(cfg, seed=1))
        data = tmp.read_bytes()
        for opt, ctx in OPTIONS:
            (out / "checkpoint" / f"{name}-{opt}").write_bytes(bytes([opt, ctx]) + data)
    cfg = export.normalize_config(KV32)
    export.write_checkpoint(tmp, cfg, export.random_tensors(cfg, seed=3))
    for opt, ctx in KV32_OPTIONS:
        (out / "checkpoint" / f"v1-kv32-{opt}").write_bytes(bytes([opt, ctx]) + tmp.read_bytes())
    from conftest import write_legacy  # llama2.c's format, the test-only writer
    cfg = export.normalize_config(SMALL)
    write_legacy(tmp, cfg, export.random_tensors(cfg, seed=2))
    (out / "checkpoint" / "v0-legacy").write_bytes(bytes([0, 16]) + tmp.read_bytes())

    sp = ROOT / "models" / "tokenizer.bin"  # version 1, 4096 sentencepiece pieces
    shutil.copyfile(sp, out / "tokenizers" / "sp.bin")
    bpe = byte_level_tokenizer()
    (out / "tokenizers" / "bpe.bin").write_bytes(export.pack_tokenizer_ltok(bpe))

    def tok_seed(name, vocab, bos, eos, data):
        (out / "tokenizer" / name).write_bytes(struct.pack("<HHH", vocab - 1, bos + 1, eos + 1) + data)

    pieces = [b"<unk>", b"\n<s>\n", b"\n</s>\n"] + [b"<0x%02X>" % i for i in range(256)] + \
        [c.encode() for c in " etaonis"] + [b"th", b" t", b"the", b" the"]
    scores = [0.0] * 259 + [-float(i) for i in range(len(pieces) - 259)]
    tok_seed("v1-sentencepiece", len(pieces), 1, 2, export.pack_tokenizer_v1(pieces, scores))
    sp_ltok = dict(type="sentencepiece", pieces=pieces, scores=scores,
                   kinds=[export.PIECE_NORMAL, export.PIECE_SPECIAL, export.PIECE_SPECIAL] +
                   [export.PIECE_BYTE] * 256 + [export.PIECE_NORMAL] * (len(pieces) - 259),
                   bos_id=1, eos_id=2, eot_id=-1, pad_id=-1, add_bos=True, chat="llama2",
                   stop_ids=[2])
    tok_seed("v3-sentencepiece", len(pieces), 1, 2, export.pack_tokenizer_ltok(sp_ltok))
    n_bpe = len(bpe["pieces"])
    tok_seed("v3-byte-bpe", n_bpe, -1, n_bpe - 3, export.pack_tokenizer_ltok(bpe))
    for pre in ("llama3", "qwen2", "smollm"):
        tok_seed(f"v3-byte-bpe-{pre}", n_bpe, -1, n_bpe - 3,
                 export.pack_tokenizer_ltok(dict(bpe, pre=pre, chat="llama3" if pre == "llama3"
                                                 else "plain")))

    texts = [b"", b"the cat sat on the mat", "na\u00efve caf\u00e9 \u4e2d\u6587 \U0001f600".encode(),
             b"\xff\xfe bad \xc3", b"<|im_start|>user\nhi<|im_end|>", b"<s> [INST] x [/INST]",
             b"a" * 300, b"  \n\n\t 12345 67890 ", b"don't I'll we've"]
    for i, (sel, text) in enumerate(itertools.product(range(4), texts)):
        (out / "encode" / f"text-{i}").write_bytes(bytes([sel]) + text)
    convs = [b"user: hi", b"system: be brief\nuser: hi\nassistant: hello\nuser: and?",
             b"user: a\\nb \\t c \\\\ d\r\nassistant: ok", "user: caf\u00e9 <|im_end|>".encode(),
             b"assistant: first", b"user: x\\", b"user: x\\q", b"nobody: hi"]
    for i, (sel, conv) in enumerate(itertools.product(range(8), convs)):
        (out / "chat" / f"conv-{i}").write_bytes(bytes([sel]) + conv)
    typed = [b"hello\nhow are you?\n", b"user: hi\r\nassistant: yo\r\nuser: and?", b"a\0b\n",
             b"x" * 300 + b"\n", b"no final newline", b"\n\n\n", "caf\u00e9 \u4e2d\n".encode(),
             b"system: s\nuser: u\\n\\t\\\\\n"]
    for i, (sel, text) in enumerate(itertools.product((0, 1, 5, 31), typed)):
        (out / "chat_input" / f"typed-{i}").write_bytes(bytes([sel]) + text)
    tmp.unlink()
    from gguf_seeds import write_gguf_seeds, write_vocabulary_seeds  # beside this file: small GGUFs for fuzz_gguf
    write_gguf_seeds(out / "gguf")
    write_vocabulary_seeds(out / "gguf")
    from gguf_arch_seeds import write_arch_seeds  # beside this file: qwen2 and phi3 GGUFs
    write_arch_seeds(out / "gguf")
    print(f"make_seeds: wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
