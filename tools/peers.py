"""tools/peers.py: the programs tools/bench.py measures run against, llama.cpp
and llama2.c, as tools/build_peers.sh builds them in a folder outside the
repository: where they are, the model files each needs (written from the
checkpoints the bench already has), their command lines, and how to read
their figures. Nothing here times anything; bench.py does.

The model files:
  llama2.c `run`:   its version-0 file (float32), the same weights as ours
  llama2.c `runq`:  its version-2 file: int8 groups of 64 values with one
                    float32 scale each (32 where 64 does not divide dim and
                    hidden_dim, as its export.py does), norms in float32
  llama.cpp f32:    a GGUF from the version-0 file with its
                    llama-convert-llama2c-to-ggml (the vocabulary copied from
                    the llama2.c tokenizer.bin the bench uses)
  llama.cpp q8_0:   that GGUF through llama-quantize Q8_0
  SmolLM2:          llama.cpp's f32 and q8_0 GGUFs come from the Q4_1 GGUF
                    that `make smollm2` fetches and ours are converted from
                    (bench.py finds it) through llama-quantize --allow-requantize, so both
                    programs run the same dequantized weights; llama2.c has
                    no SmolLM2 (its byte-level BPE tokenizer and RoPE base
                    are not llama2.c's).
"""

import json
import math
import os
import pathlib
import re
import struct
import subprocess
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import export  # noqa: E402
from convert.llama2c import legacy_layout  # noqa: E402

LLAMA2C_Q8_MAGIC = 0x616B3432  # "ak42", llama2.c's version-2 header
LLAMA2C_Q8_HEADER = 256


class Peers:
    """The peer programs built in `folder` (tools/build_peers.sh's DEST);
    each attribute is a path, or None when that program is not there."""

    def __init__(self, folder):
        self.folder = pathlib.Path(folder) if folder else None
        bin_dir = self.folder / "llama.cpp" / "build" / "bin" if folder else None

        def program(path):
            return path if path is not None and os.access(path, os.X_OK) and path.is_file() else None

        self.llama2c_run = program(self.folder / "llama2c" / "run") if folder else None
        self.llama2c_runq = program(self.folder / "llama2c" / "runq") if folder else None
        names = ("llama-bench", "llama-quantize", "llama-convert-llama2c-to-ggml", "llama-perplexity")
        tools = {n: program(bin_dir / n) if folder else None for n in names}
        self.llama_bench = tools["llama-bench"]
        self.llama_quantize = tools["llama-quantize"]
        self.llama_convert = tools["llama-convert-llama2c-to-ggml"]
        self.llama_perplexity = tools["llama-perplexity"]

    @property
    def llama_cpp(self):
        """Whether llama.cpp can run the random-weight shapes (bench, convert, quantize)."""
        return bool(self.llama_bench and self.llama_quantize and self.llama_convert)

    @property
    def llama2c(self):
        return bool(self.llama2c_run and self.llama2c_runq)

    def commit(self, sub):
        """The commit built in folder/sub: its COMMIT file (tools/build_peers.sh
        writes one), else the commit of the git checkout there, else None."""
        path = self.folder / sub
        if (path / "COMMIT").is_file():
            return (path / "COMMIT").read_text().strip()[:9]
        p = subprocess.run(["git", "-C", str(path), "rev-parse", "--short=9", "HEAD"], capture_output=True, text=True)
        return p.stdout.strip() if p.returncode == 0 else None

    def describe(self):
        """One line: which peers were found where, at which commits."""
        if not self.folder or not (self.llama_cpp or self.llama2c):
            return (f"no peers in {self.folder or '(none given)'}: build them with "
                    "tools/build_peers.sh LLAMA_CPP_GIT LLAMA2C_GIT and pass --peers")
        found = [f"{name} (commit {self.commit(sub) or 'unknown'})"
                 for name, sub, ok in (("llama.cpp", "llama.cpp", self.llama_cpp), ("llama2.c", "llama2c", self.llama2c))
                 if ok]
        return f"peers in {self.folder}: {', '.join(found)}" + \
            ("" if self.llama_perplexity else " (no llama-perplexity: long windows without llama.cpp)")


# ---- model files ----------------------------------------------------------

def write_llama2c(path, cfg, tensors):
    """llama2.c's version-0 checkpoint: 7 int32 (vocab_size negative when the
    classifier is not shared), then every float32 tensor in its order, the
    freq_cis tables it skips written as zeros. Written to a temporary name
    first, so that an interrupted run leaves no half-written file."""
    c = cfg
    vocab = c["vocab_size"] if c["shared_classifier"] else -c["vocab_size"]
    dims = (c["dim"], c["hidden_dim"], c["n_layers"], c["n_heads"], c["n_kv_heads"], vocab, c["seq_len"])
    tmp = pathlib.Path(str(path) + ".tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<7i", *dims))
        for name, shape in legacy_layout(dims):
            if name.startswith("freq_cis"):
                f.write(bytes(4 * math.prod(shape)))
            else:
                f.write(np.ascontiguousarray(tensors[name], dtype="<f4").tobytes())
    os.replace(tmp, path)


def llama2c_group_size(dim, hidden_dim, group_size=64):
    """runq's group size: 64, halved until it divides dim and hidden_dim."""
    while dim % group_size or hidden_dim % group_size:
        group_size //= 2
    return group_size


def quantize_q80(w, group_size):
    """(int8 values, float32 scales) of w flattened in groups: scale = max |v|
    / 127 of the group, value = round(v / scale) (0 for an all-zero group)."""
    groups = np.asarray(w, dtype=np.float32).reshape(-1, group_size)
    scale = np.abs(groups).max(axis=1) / 127.0
    safe = np.where(scale > 0, scale, 1.0)
    q = np.round(groups / safe[:, None]).astype(np.int8)
    return q, scale.astype("<f4")


def write_llama2c_q8(path, cfg, tensors):
    """llama2.c's version-2 checkpoint (runq): a 256-byte header (magic "ak42",
    version 2, the 7 dims, a shared-classifier byte, the group size; the rest
    zeros), the norms in float32 (attention, FFN, final), then every matrix, a
    layer at a time, as its int8 values followed by its scales: token
    embedding, wq, wk, wv, wo, w1, w2, w3, and the classifier when not shared."""
    c = cfg
    gs = llama2c_group_size(c["dim"], c["hidden_dim"])
    header = struct.pack("<Ii7iBi", LLAMA2C_Q8_MAGIC, 2, c["dim"], c["hidden_dim"], c["n_layers"], c["n_heads"],
                         c["n_kv_heads"], c["vocab_size"], c["seq_len"], int(c["shared_classifier"]), gs)
    tmp = pathlib.Path(str(path) + ".tmp")
    with open(tmp, "wb") as f:
        f.write(header + bytes(LLAMA2C_Q8_HEADER - len(header)))
        for name in ("rms_att_weight", "rms_ffn_weight", "rms_final_weight"):
            f.write(np.ascontiguousarray(tensors[name], dtype="<f4").tobytes())
        matrices = [tensors["token_embedding"]]
        for name in ("wq", "wk", "wv", "wo", "w1", "w2", "w3"):
            matrices += list(tensors[name])  # one matrix per layer
        if not c["shared_classifier"]:
            matrices.append(tensors["wcls"])
        for w in matrices:
            q, scale = quantize_q80(w, gs)
            f.write(q.tobytes())
            f.write(scale.tobytes())
    os.replace(tmp, path)


def llama2c_files(directory, name, ckpt):
    """(version-0 path, version-2 path) for our float32 checkpoint ckpt,
    written into directory as NAME-llama2c-f32.bin / -q8.bin unless there."""
    f32 = pathlib.Path(directory) / f"{name}-llama2c-f32.bin"
    q8 = pathlib.Path(directory) / f"{name}-llama2c-q8.bin"
    if not (f32.exists() and q8.exists()):
        cfg, tensors = export.read_checkpoint(ckpt)
        print(f"bench: writing {f32} and {q8}", file=sys.stderr)
        write_llama2c(f32, cfg, tensors)
        write_llama2c_q8(q8, cfg, tensors)
    return f32, q8


def run_tool(cmd):
    """Run a model-file tool; raises RuntimeError with the end of its output
    when it fails."""
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed ({p.returncode}): {(p.stderr or p.stdout)[-400:]}")


def gguf_files(peers, directory, name, legacy=None, tokenizer=None, gguf=None):
    """{"f32": path, "q8_0": path}: llama.cpp's GGUFs of one model, made in
    directory unless there, from a llama2.c version-0 file (legacy, with the
    llama2.c tokenizer whose vocabulary the GGUF copies) or from a GGUF
    (requantized). Raises RuntimeError when a tool fails."""
    directory = pathlib.Path(directory)
    out = {"f32": directory / f"{name}-f32.gguf", "q8_0": directory / f"{name}-q8_0.gguf"}
    if not out["f32"].exists():
        tmp = directory / f"{name}-f32.tmp.gguf"
        if legacy is not None:
            run_tool([peers.llama_convert, "--copy-vocab-from-model", tokenizer, "--llama2c-model", legacy,
                      "--llama2c-output-model", tmp])
        else:
            run_tool([peers.llama_quantize, "--allow-requantize", gguf, tmp, "F32"])
        os.replace(tmp, out["f32"])
    if not out["q8_0"].exists():
        tmp = directory / f"{name}-q8_0.tmp.gguf"
        source = out["f32"] if legacy is not None else gguf
        run_tool([peers.llama_quantize] + (["--allow-requantize"] if legacy is None else []) +
                 [source, tmp, "Q8_0"])
        os.replace(tmp, out["q8_0"])
    return out


# llama-quantize's names of the 4-bit files the bench compares on (our dtype names -> its)
LLAMA_QUANT_TYPES = {"q4_0": "Q4_0", "q4_1": "Q4_1", "q4_k_m": "Q4_K_M"}


def quantized_gguf(peers, directory, name, dtype, source):
    """directory/NAME-DTYPE.gguf, llama-quantize's DTYPE (LLAMA_QUANT_TYPES)
    of the GGUF `source` (requantized when it is quantized itself), made
    unless there. Raises RuntimeError when the tool fails."""
    out = pathlib.Path(directory) / f"{name}-{dtype}.gguf"
    if not out.exists():
        tmp = out.with_suffix(".tmp.gguf")
        run_tool([peers.llama_quantize, "--allow-requantize", source, tmp, LLAMA_QUANT_TYPES[dtype]])
        os.replace(tmp, out)
    return out


def streamed_bytes(path):
    """The bytes a program reads per generated token from the model file at
    path: the whole file, except that a GGUF with a classifier of its own
    (output.weight; llama-convert-llama2c-to-ggml writes one, a copy of the
    embedding) reads its token_embd.weight only a row at a time. Our
    checkpoints and llama2.c's here share the classifier with the
    embedding, which is then read whole once per token."""
    size = os.path.getsize(path)
    if str(path).endswith(".gguf"):
        from gguf import GGUFReader  # the gguf package of requirements.txt
        tensors = {t.name: int(t.n_bytes) for t in GGUFReader(str(path)).tensors}
        if "output.weight" in tensors:
            size -= tensors.get("token_embd.weight", 0)
    return size


# ---- command lines and their figures --------------------------------------

def llama_bench_cmd(peers, gguf, n_prompt, n_gen, threads):
    """One llama-bench run (-r 1: bench.py repeats and interleaves) of a
    prompt of n_prompt tokens and n_gen generated ones, JSON on stdout."""
    return [str(peers.llama_bench), "-m", str(gguf), "-p", str(n_prompt), "-n", str(n_gen), "-t", str(threads),
            "-r", "1", "-o", "json"]


def parse_llama_bench(stdout):
    """(prompt tok/s, generation tok/s) from llama-bench's JSON: the test
    with n_prompt > 0 and the one with n_gen > 0; None for one not there."""
    prompt = gen = None
    for test in json.loads(stdout):
        if test.get("n_gen", 0) > 0:
            gen = float(test["avg_ts"])
        elif test.get("n_prompt", 0) > 0:
            prompt = float(test["avg_ts"])
    return prompt, gen


def llama2c_cmd(program, checkpoint, tokenizer, steps):
    """llama2.c generating greedily from its BOS-only prompt for `steps`
    positions (the first is the BOS itself)."""
    return [str(program), str(checkpoint), "-z", str(tokenizer), "-t", "0", "-s", "1", "-n", str(steps), "-i", ""]


def perplexity_cmd(peers, gguf, text, ctx, threads):
    """llama-perplexity over the first window of ctx tokens of text (it wants
    at least 2 x ctx tokens in the file)."""
    return [str(peers.llama_perplexity), "-m", str(gguf), "-f", str(text), "-c", str(ctx), "--chunks", "1",
            "-t", str(threads)]


def parse_seconds_per_pass(output):
    """The "N seconds per pass" llama-perplexity prints for its first window
    (model loading and tokenization excluded); None when absent."""
    m = re.search(r"([0-9.]+) seconds per pass", output)
    return float(m.group(1)) if m else None
