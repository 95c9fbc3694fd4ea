"""Mutation fuzzing of export.py's parsers: config.json, safetensors, GGUF and
tokenizer.json (issue: every failure is one line, and no partial output).

A seeded generator mutates small valid inputs (the ones the other export tests
build) and runs export.main() in this process on each mutant. Each run must
either succeed or fail cleanly: exit 1 or 2, exactly one line on stderr that
starts with "export.py:", no output file and no temporary file left beside it.
Any uncaught exception (a traceback, RecursionError, MemoryError from an
absurd size) fails the test, since it would escape main().

Mutations: for bytes, flips, random bytes, truncation, a repeated or deleted
chunk, and overwrites of the 8-byte length fields safetensors and GGUF use;
for JSON, a value at a random path replaced (null, negative, huge, wrong type,
deep nesting) or its key deleted. EXPORT_FUZZ_ITERS (default 40 per parser)
sets how many mutants each test tries and EXPORT_FUZZ_SEED which ones; `make
fuzz` runs 2,000 of each.
"""
import contextlib
import copy
import io
import json
import os
import random
import struct

import pytest

import export

ITERS = int(os.environ.get("EXPORT_FUZZ_ITERS", "40"))
SEED = int(os.environ.get("EXPORT_FUZZ_SEED", "0"))  # another seed, other mutants
ODD_VALUES = [None, -1, 0, 1, 2 ** 31, 2 ** 63, 1e308, -1e308, float("nan"), "x", "", [], {}, True,
              [1.0] * 3, {"rope_type": "yarn"}, "longrope"]


def mutate_bytes(data, rng):
    data = bytearray(data)
    kind = rng.randrange(6)
    if kind == 0 and data:    # flip a few bits
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif kind == 1 and data:  # random bytes in a random span
        at = rng.randrange(len(data))
        data[at:at + rng.randint(1, 16)] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
    elif kind == 2:           # truncate
        del data[rng.randrange(len(data) + 1):]
    elif kind == 3 and data:  # repeat or delete a chunk
        a = rng.randrange(len(data))
        b = min(len(data), a + rng.randint(1, 256))
        data[a:b] = data[a:b] * rng.choice([0, 2, 3])
    elif kind == 4 and len(data) >= 8:  # a little-endian u64 length field set to something odd
        at = rng.choice([0, 8, 16, 24]) if rng.random() < 0.7 else rng.randrange(len(data) - 7)
        at = min(at, len(data) - 8)
        struct.pack_into("<Q", data, at, rng.choice([0, 1, 7, 2 ** 31, 2 ** 40, 2 ** 63 - 1, 2 ** 64 - 1]))
    else:                     # append garbage
        data += bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
    return bytes(data)


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node[:8]):
            yield from _paths(v, prefix + (i,))


def mutate_json(obj, rng):
    obj = json.loads(json.dumps(obj))
    paths = [p for p in _paths(obj) if p]
    for _ in range(rng.randint(1, 3)):
        if not paths:
            break
        path = rng.choice(paths)
        parent = obj
        for k in path[:-1]:
            parent = parent[k]
        if rng.random() < 0.2 and isinstance(parent, dict):
            parent.pop(path[-1], None)
        elif rng.random() < 0.05:
            parent[path[-1]] = "__DEEP__"  # replaced by 5,000 nested arrays once dumped
        else:
            parent[path[-1]] = copy.deepcopy(rng.choice(ODD_VALUES))  # never shared: no cycles
        paths = [p for p in _paths(obj) if p]
    return json.dumps(obj, allow_nan=True).replace('"__DEEP__"', "[" * 5000 + "]" * 5000)


def run_export(args):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            code = export.main([str(a) for a in args])
        except SystemExit as e:
            code = e.code
    return code, err.getvalue()


def check_clean(code, err, out, what):
    listing = sorted(os.listdir(out.parent))
    assert not [n for n in listing if n.endswith(".tmp") or ".tmp" in n], (what, listing)
    if code == 0:
        return
    lines = [line for line in err.splitlines() if line.strip()]
    assert code in (1, 2), (what, code, err)
    if code == 1:
        assert len(lines) == 1 and lines[0].startswith("export.py:"), (what, err)
        assert not out.exists(), (what, "partial output left")


@pytest.fixture(scope="module")
def hf_source(tmp_path_factory):
    from test_convert import make_hf
    d, config, _ = make_hf(tmp_path_factory.mktemp("hf") / "m", num_key_value_heads=2,
                           rope_scaling={"rope_type": "yarn", "factor": 2.0,
                                         "original_max_position_embeddings": 16})
    return d, config, (d / "model.safetensors").read_bytes()


def test_fuzz_hf_config(tmp_path, hf_source):
    d, config, _ = hf_source
    rng = random.Random(SEED * 10 + 1)
    for i in range(ITERS):
        src = tmp_path / f"src{i}"
        src.mkdir()
        os.link(d / "model.safetensors", src / "model.safetensors")
        (src / "config.json").write_text(mutate_json(config, rng))
        out = tmp_path / f"out{i}" / "m.bin"
        out.parent.mkdir()
        code, err = run_export([out, "--hf", src])
        check_clean(code, err, out, (src / "config.json").read_text()[:300])


def test_fuzz_safetensors(tmp_path, hf_source):
    d, config, data = hf_source
    rng = random.Random(SEED * 10 + 2)
    for i in range(ITERS):
        src = tmp_path / f"src{i}"
        src.mkdir()
        (src / "config.json").write_text(json.dumps(config))
        (src / "model.safetensors").write_bytes(mutate_bytes(data, rng))
        out = tmp_path / f"out{i}" / "m.bin"
        out.parent.mkdir()
        code, err = run_export([out, "--hf", src])
        check_clean(code, err, out, f"safetensors mutant {i}")


def _gguf_source(tmp_path, arch):
    """A small GGUF: llama (test_gguf's writer), or a phi3 with LongRoPE and a
    window, or a qwen2, as llama.cpp's converter lays them out (test_gguf_archs)."""
    if arch == "llama":
        from test_gguf import make_gguf
        return make_gguf(tmp_path / "m.gguf")[0]
    from test_gguf_archs import gguf_of_hf, hf_model, longrope
    over = dict(longrope(8), sliding_window=24) if arch == "phi3" else {}
    config, tensors = hf_model(tmp_path / "hf", arch, **over)
    return gguf_of_hf(tmp_path / "m.gguf", config, tensors)[0]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "phi3"])
def test_fuzz_gguf(arch, tmp_path):
    pytest.importorskip("gguf")
    path = _gguf_source(tmp_path, arch)
    data = path.read_bytes()
    rng = random.Random(SEED * 10 + 3 + ("llama", "qwen2", "phi3").index(arch) * 1000)
    for i in range(ITERS):
        src = tmp_path / f"mut{i}.gguf"
        src.write_bytes(mutate_bytes(data, rng))
        out = tmp_path / f"out{i}" / "m.bin"
        out.parent.mkdir()
        code, err = run_export([out, "--gguf", src, "--tokenizer-out", out.parent / "tok.bin"])
        check_clean(code, err, out, f"gguf mutant {i}")
        if code != 0:
            assert not (out.parent / "tok.bin").exists(), "a tokenizer left without its checkpoint"


def test_fuzz_tokenizer_json(tmp_path):
    from conftest import trained_byte_vocab
    from test_tokenizer_export import tokenizer_json
    vocab, merges = trained_byte_vocab()
    j = tokenizer_json(dict(vocab), list(merges), "gpt2")
    rng = random.Random(SEED * 10 + 4)
    for i in range(ITERS):
        src = tmp_path / f"tok{i}" / "tokenizer.json"
        src.parent.mkdir()
        text = mutate_json(j, rng) if rng.random() < 0.7 else \
            mutate_bytes(json.dumps(j).encode(), rng).decode("latin-1")
        src.write_text(text, encoding="latin-1" if not text.isascii() else "utf-8")
        out = tmp_path / f"out{i}" / "tokenizer.bin"
        out.parent.mkdir()
        code, err = run_export([out, "--tokenizer", src])
        check_clean(code, err, out, f"tokenizer.json mutant {i}")
