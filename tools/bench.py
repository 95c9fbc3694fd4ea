#!/usr/bin/env python3
"""tools/bench.py: tokens per second of ./run against the peers' figures.

    make bench                      (= .venv/bin/python tools/bench.py, in the venv)
    python3 tools/bench.py [--reps N] [--shapes 15M,42M,110M] [--dtypes f32,q8_0]
                           [--threads 1,2] [--prompt-tokens N] [--long-ctx 4096,8192] [--dir DIR]

What it does:
  1. writes random-weight checkpoints shaped like stories15M, stories42M and
     stories110M (vocab 32000) with export.py, float32 and q8_0, into --dir
     (default /tmp/run-bench; reused when already there);
  2. times whole processes (start-up and loading included):
       generation  = 200 / (time of -n 201 - time of -n 1), --ignore-eos, a
                     one-token prompt (BOS)
       prompt      = (P - 1) / (time with a P-token prompt - time with a
                     one-token prompt), -n 1
     each repeated --reps times at every thread count (--threads N);
  3. prints medians with min-max, peak resident memory (the -n 201 runs), the
     weight bytes generation streams per second (tok/s x checkpoint size: every
     weight is read once per token) as a share of this machine's read
     bandwidth at the same thread count (tools/peak.c), the prompt's
     achieved GFLOP/s (flops()), and the ratio to the reference figures of the
     peers (llama2.c run/runq, llama.cpp f32/q8_0; see REFERENCE and
     LLAMA_CPP_XEON);
  4. long-window perplexity, where extrapolation sweeps spend their time: the
     15M shape (float32) scoring one window of --long-ctx tokens with -m ppl
     at the highest thread count: seconds per window, tokens/s, and the
     achieved GFLOP/s of the whole window and of its attention alone, next to
     this machine's peak (tools/peak.c: independent FMA chains at the widest
     vector width, compiled here with cc -O2 -march=native). Floating-point
     operations are counted from the shapes (flops()); the attention's time is
     the window's minus that of the same tokens in windows of 256 (whose
     attention is small), so it is an estimate.

It is a benchmark, not a test: it exits 0 whatever the numbers are, and a
failed run is reported in the table instead of stopping the benchmark. On a
shared machine single figures move 20-40%; compare the ratios of one run.
"""

import argparse
import os
import pathlib
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import export  # noqa: E402

# dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len
SHAPES = {
    "15M": (288, 768, 6, 6, 6, 32000, 1024),
    "42M": (512, 1376, 8, 8, 8, 32000, 1024),
    "110M": (768, 2048, 12, 12, 12, 32000, 1024),
}

# Reference tokens/s measured on a 2-core AMD EPYC Zen 4 with 23 GB/s of read
# bandwidth per thread (the project's performance targets): (shape, threads) ->
# llama2.c run (f32), llama2.c runq (int8), llama.cpp f32 gen, f32 prompt,
# llama.cpp q8_0 gen, q8_0 prompt
REFERENCE = {
    ("15M", 1): (340, 353, 307, 3903, 824, 4746),
    ("15M", 2): (564, 525, 362, 6054, 731, 5359),
    ("42M", 1): (125, 130, 107, 1142, 347, 1536),
    ("42M", 2): (190, 210, 177, 1715, 427, 2220),
    ("110M", 1): (45, 73, 50, 377, 131, 502),
    ("110M", 2): (63, 134, 78, 676, 178, 890),
}
# The targets at 2 threads: f32 gen, q8_0 gen, f32 prompt
TARGETS = {"15M": (680, 730, 4800), "42M": (230, 430, 1370), "110M": (78, 178, 540)}
# llama.cpp (CPU build) at 2 threads on a 2-core Intel Xeon with AVX-512 VNNI
# (2.8 GHz), the same random-weight shapes, median of 5 interleaved rounds:
# (shape, dtype) -> (generation tok/s, prompt tok/s of a 310-token prompt),
# None where not measured; and llama-perplexity on the 15M shape, float32:
# ctx -> tokens/s.
LLAMA_CPP_XEON = {("110M", "f32"): (45, 772), ("110M", "q8_0"): (108, 632), ("15M", "q8_0"): (627, None)}
LLAMA_CPP_XEON_PPL = {4096: 1220, 8192: 8192 / 10.5}

WORDS = ("once upon a time there was a little girl named lily she loved to play outside "
         "in the park with her dog and her friends one day they found a big red ball").split()


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
    of 32000 pieces (byte tokens plus the prompt's words)."""
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


def timed(cmd, threads):
    """Wall time and peak RSS (MiB) of one process; None when it failed."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    start = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(p.pid, 0)
    elapsed = time.perf_counter() - start
    err = p.stderr.read().decode(errors="replace")
    p.stderr.close()
    if status != 0:
        print(f"bench: failed ({status}): {' '.join(map(str, cmd))}\n{err[-500:]}", file=sys.stderr)
        return None, None
    return elapsed, usage.ru_maxrss / 1024.0


def prompt_text(run, ckpt, tok, n_tokens):
    """Text whose encoding (BOS included) has about n_tokens tokens."""
    words = []
    while True:
        words.append(WORDS[len(words) % len(WORDS)])
        if len(words) % 50 == 0 or len(words) >= n_tokens:
            out = subprocess.run([run, ckpt, "-z", tok, "-m", "tokenize", "-i", " ".join(words)],
                                 capture_output=True, text=True)
            n = len(out.stdout.split()) if out.returncode == 0 else len(words) + 1
            if n >= n_tokens:
                return " ".join(words), n


def stats(values):
    values = [v for v in values if v is not None and v > 0]
    if not values:
        return None
    return statistics.median(values), min(values), max(values)


def fmt(s):
    return "failed" if s is None else f"{s[0]:7.1f} ({s[1]:.0f}-{s[2]:.0f})"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reps", type=int, default=5, help="repetitions per figure (default 5)")
    p.add_argument("--shapes", default="15M,42M,110M")
    p.add_argument("--dtypes", default="f32,q8_0")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--prompt-tokens", type=int, default=300, help="long prompt length (default 300)")
    p.add_argument("--gen-tokens", type=int, default=200, help="generated tokens (default 200)")
    p.add_argument("--long-ctx", default="4096,8192", help="long-window ppl contexts (default 4096,8192; "
                   "empty: skip)")
    p.add_argument("--dir", default="/tmp/run-bench", help="where checkpoints go (not committed)")
    p.add_argument("--run", default=str(ROOT / "run"))
    a = p.parse_args(argv)
    directory = pathlib.Path(a.dir)
    directory.mkdir(parents=True, exist_ok=True)
    run = a.run
    rows = []
    try:
        tok = tokenizer(directory)
        for shape in a.shapes.split(","):
            for dtype in a.dtypes.split(","):
                ckpt = checkpoint(directory, shape, dtype)
                text, n_prompt = prompt_text(run, ckpt, tok, a.prompt_tokens)
                for threads in [int(t) for t in a.threads.split(",")]:
                    base = [run, ckpt, "-z", tok, "-t", "0", "--ignore-eos", "-s", "1"]
                    gen, pp, pp8, mem = [], [], [], []
                    for _ in range(a.reps):
                        t1, _m = timed(base + ["-n", "1", "-i", ""], threads)
                        tg, m = timed(base + ["-n", str(a.gen_tokens + 1), "-i", ""], threads)
                        tp, _m2 = timed(base + ["-n", "1", "-i", text], threads)
                        if t1 is not None and tg is not None and tg > t1:
                            gen.append(a.gen_tokens / (tg - t1))
                        if t1 is not None and tp is not None and tp > t1:
                            pp.append((n_prompt - 1) / (tp - t1))
                        if dtype == "q8_0":  # the same prompt with int8 activations
                            tp8, _m3 = timed(base + ["--q8-activations", "int8", "-n", "1", "-i", text], threads)
                            if t1 is not None and tp8 is not None and tp8 > t1:
                                pp8.append((n_prompt - 1) / (tp8 - t1))
                        mem.append(m)
                    row = dict(shape=shape, dtype=dtype, threads=threads, gen=stats(gen), prompt=stats(pp),
                               prompt_int8=stats(pp8), mem=stats(mem), n_prompt=n_prompt,
                               bytes=os.path.getsize(ckpt))
                    rows.append(row)
                    print(f"bench: {shape} {dtype} {threads} thread(s): gen {fmt(row['gen'])}, "
                          f"prompt {fmt(row['prompt'])} tok/s"
                          + (f", int8 activations {fmt(row['prompt_int8'])}" if pp8 else ""), file=sys.stderr)
        long_rows = long_windows(run, directory, tok, a) if a.long_ctx else []
    except Exception as e:  # a benchmark reports, it does not fail
        print(f"bench: stopped early: {e}", file=sys.stderr)
        long_rows = []
    machine_peaks = peaks(pathlib.Path(a.dir))
    report(rows, a, machine_peaks)
    report_long(long_rows, a, machine_peaks)
    return 0


def flops(shape, ctx, n_tokens, classifier=True):
    """(all, attention) floating-point operations of scoring n_tokens in windows
    of ctx tokens, from the 15M/42M/110M shapes: per token, 2 per weight of
    every matrix (q, k, v, o, the three FFN ones, the classifier; the embedding
    is a lookup), and attention 4 x dim per earlier position per layer (q.k
    and the weighted sum of v: 2 x dim each). classifier=False: a prompt,
    whose tokens but the last skip the classifier (left out altogether)."""
    dim, hidden, layers, heads, kv_heads, vocab, _ = SHAPES[shape]
    kv_dim = dim * kv_heads // heads
    matmul = 2 * (layers * (2 * dim * dim + 2 * dim * kv_dim + 3 * dim * hidden) + (vocab * dim if classifier else 0))
    windows, rest = divmod(n_tokens, ctx)
    positions = windows * ctx * (ctx + 1) / 2 + rest * (rest + 1) / 2  # sum over tokens of (position + 1)
    attention = 4 * layers * dim * positions
    return matmul * n_tokens + attention, attention


def peaks(directory):
    """This machine's peaks (tools/peak.c, built with cc -O2 -march=native
    -fopenmp): ({threads: FMA GFLOP/s}, {threads: read GB/s}), empty tables
    when it does not build or run."""
    exe = directory / "peak"
    cc = subprocess.run(["cc", "-O2", "-march=native", "-fopenmp", "-o", str(exe), str(ROOT / "tools" / "peak.c")],
                        capture_output=True, text=True)
    if cc.returncode != 0:
        print(f"bench: cannot build tools/peak.c: {cc.stderr[-300:]}", file=sys.stderr)
        return {}, {}
    lines = subprocess.run([str(exe)], capture_output=True, text=True).stdout.splitlines()
    table = {"fma": {}, "read": {}}
    for line in lines:  # "fma threads N: G GFLOP/s ...", "read threads N: G GB/s"
        head, _, rest = line.partition(":")
        words = head.split()
        if len(words) == 3 and words[0] in table and rest.split():
            table[words[0]][int(words[2])] = float(rest.split()[0])
    return table["fma"], table["read"]


def long_windows(run, directory, tok, a):
    """One window of each --long-ctx with the 15M float32 shape at the highest
    thread count, a.reps times; the same tokens in windows of 256 alongside."""
    ckpt = checkpoint(directory, "15M", "f32")
    threads = max(int(t) for t in a.threads.split(","))
    rows = []
    for ctx in [int(c) for c in a.long_ctx.split(",")]:
        text, n = prompt_text(run, ckpt, tok, ctx)  # BOS + >= ctx - 1 text tokens
        path = directory / f"long-{ctx}.txt"
        path.write_text(text)
        scored = min(n, ctx) - 1
        base = [run, ckpt, "-z", tok, "-m", "ppl", "-f", path]
        long_t, short_t = [], []
        for _ in range(a.reps):
            t, _m = timed(base + ["--ctx", str(ctx)], threads)
            ts, _m = timed(base + ["--ctx", "256"], threads)
            long_t.append(t)
            short_t.append(ts)
        rows.append(dict(ctx=ctx, threads=threads, n=n, scored=scored, long=stats(long_t), short=stats(short_t)))
        print(f"bench: ppl --ctx {ctx}: {fmt(rows[-1]['long'])} s per run", file=sys.stderr)
    return rows


def report_long(rows, a, machine_peaks):
    if not rows:
        return
    fma, _read = machine_peaks
    print(f"\nlong-window perplexity: 15M shape, float32, -m ppl, {rows[0]['threads']} threads, "
          f"{a.reps} repetitions, median (min-max); a text of about one window; "
          "s per window = the whole process's time / windows")
    print("FMA peak (tools/peak.c): " +
          ("; ".join(f"{t} thread(s) {g:.0f} GFLOP/s" for t, g in sorted(fma.items())) or "unknown"))
    head = (f"{'ctx':>6} | {'s per window':>18} {'tok/s':>8} {'GFLOP/s':>8} | "
            f"{'attention GFLOP/s (estimate)':>28} {'attention share':>15}")
    print(head)
    print("-" * len(head))
    for r in rows:
        if not r["long"]:
            print(f"{r['ctx']:>6} | failed")
            continue
        windows = -(-(r["n"] - 1) // (r["ctx"] - 1))
        per_window = r["long"][0] / windows
        total, attention = flops("15M", r["ctx"], windows * (r["ctx"] - 1))
        gflops = total / r["long"][0] / 1e9
        att = ""
        if r["short"] and r["long"][0] > r["short"][0]:
            att_time = r["long"][0] - r["short"][0]
            att = f"{attention / att_time / 1e9:28.1f} {attention / total:15.0%}"
        print(f"{r['ctx']:>6} | {per_window:8.2f} ({r['long'][1] / windows:.2f}-{r['long'][2] / windows:.2f}) "
              f"{r['scored'] / r['long'][0]:8.0f} {gflops:8.1f} | {att}")
    ratios = [f"--ctx {r['ctx']} {r['scored'] / r['long'][0] / LLAMA_CPP_XEON_PPL[r['ctx']]:.2f}x"
              for r in rows if r["long"] and r["ctx"] in LLAMA_CPP_XEON_PPL]
    print("Reference: llama.cpp's llama-perplexity on a 2-core Xeon with AVX-512 VNNI (2.8 GHz), this shape: "
          + ", ".join(f"--ctx {c} {v:.0f} tok/s" for c, v in LLAMA_CPP_XEON_PPL.items())
          + (f"; ratio: {', '.join(ratios)}" if ratios else ""))


def report(rows, a, machine_peaks):
    peak, bandwidth = machine_peaks
    print(f"\nrun benchmark: {a.reps} repetitions, median (min-max) tokens/s; generation = "
          f"{a.gen_tokens} tokens (--ignore-eos), prompt = {rows[0]['n_prompt'] if rows else '?'} tokens")
    print(f"machine: {machine()}")
    print("read bandwidth (tools/peak.c): " +
          ("; ".join(f"{t} thread(s) {g:.1f} GB/s" for t, g in sorted(bandwidth.items())) or "unknown") +
          "; FMA peak: " +
          ("; ".join(f"{t} thread(s) {g:.0f} GFLOP/s" for t, g in sorted(peak.items())) or "unknown"))
    print("gen GB/s = generation tok/s x checkpoint bytes (its share of the read bandwidth at that thread count); "
          "prompt GFLOP/s from the shapes (its share of the FMA peak)\n")
    head = (f"{'shape':5} {'weights':7} {'thr':>3} | {'generation':>20} {'gen GB/s':>12} {'prompt':>22} "
            f"{'GFLOP/s':>11} {'peak MiB':>9} | {'gen/llama2.c':>12} {'gen/llama.cpp':>13} {'prompt/llama.cpp':>16} "
            f"| target")
    print(head)
    print("-" * len(head))
    for r in rows:
        ref = REFERENCE.get((r["shape"], r["threads"]))
        q8 = r["dtype"] == "q8_0"
        g = r["gen"][0] if r["gen"] else None
        pp = r["prompt"][0] if r["prompt"] else None
        ratio = lambda x, y: f"{x / y:5.2f}x" if x and y else "  -"  # noqa: E731
        share = lambda x, y: f"({x / y:4.0%})" if x and y else ""  # noqa: E731
        l2c = ref[1] if q8 else ref[0]
        lcpp_gen, lcpp_pp = (ref[4], ref[5]) if q8 else (ref[2], ref[3])
        target = ""
        if r["threads"] == 2 and r["shape"] in TARGETS:
            tg32, tq8, tpp = TARGETS[r["shape"]]
            tgen = tq8 if q8 else tg32
            target = f"gen >= {tgen}: {'yes' if g and g >= tgen else 'no'}"
            if not q8:
                target += f", prompt >= {tpp}: {'yes' if pp and pp >= tpp else 'no'}"
        mem = f"{r['mem'][0]:9.0f}" if r["mem"] else f"{'-':>9}"
        gbs = f"{g * r['bytes'] / 1e9:5.1f} {share(g * r['bytes'] / 1e9, bandwidth.get(r['threads'])):>6}" if g else "-"
        total, _att = flops(r["shape"], 1 << 30, r["n_prompt"] - 1, classifier=False)
        gf = total / (r["n_prompt"] - 1) * pp / 1e9 if pp else None
        gfs = f"{gf:4.0f} {share(gf, peak.get(r['threads'])):>6}" if gf else "-"
        print(f"{r['shape']:5} {r['dtype']:7} {r['threads']:>3} | {fmt(r['gen']):>20} {gbs:>12} {fmt(r['prompt']):>22} "
              f"{gfs:>11} {mem} | {ratio(g, l2c):>12} {ratio(g, lcpp_gen):>13} {ratio(pp, lcpp_pp):>16} | {target}")
    int8 = [r for r in rows if r.get("prompt_int8")]
    if int8:
        print("\nq8_0 prompts with --q8-activations int8 (activations quantized, as llama.cpp and llama2.c's runq do): "
              + "; ".join(f"{r['shape']} {r['threads']} thread(s) {fmt(r['prompt_int8'])}" for r in int8))
    print("\nReference: llama2.c run/runq and llama.cpp f32/q8_0 on a 2-core AMD EPYC Zen 4; "
          "gen/llama2.c compares f32 with run and q8_0 with runq.")
    xeon = [(r, LLAMA_CPP_XEON[(r["shape"], r["dtype"])]) for r in rows
            if r["threads"] == 2 and (r["shape"], r["dtype"]) in LLAMA_CPP_XEON]
    if xeon:
        print("Against llama.cpp measured on a 2-core Xeon with AVX-512 VNNI (2.8 GHz), 2 threads:")
        for r, (lg, lp) in xeon:
            g = r["gen"][0] if r["gen"] else None
            pp = r["prompt"][0] if r["prompt"] else None
            parts = [f"gen {g:.0f} / {lg} = {g / lg:.2f}x" if g else "gen -"]
            if lp:
                parts.append(f"prompt {pp:.0f} / {lp} = {pp / lp:.2f}x" if pp else "prompt -")
            if lp and r.get("prompt_int8"):
                p8 = r["prompt_int8"][0]
                parts.append(f"prompt with --q8-activations int8 (llama.cpp's arithmetic) {p8:.0f} / {lp} = "
                             f"{p8 / lp:.2f}x")
            print(f"  {r['shape']} {r['dtype']}: " + ", ".join(parts))


def machine():
    try:
        model = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                     if line.startswith("model name"))
    except (OSError, StopIteration):
        model = "unknown CPU"
    return f"{model}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}"


if __name__ == "__main__":
    sys.exit(main())
