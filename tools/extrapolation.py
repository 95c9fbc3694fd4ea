#!/usr/bin/env python3
"""The extrapolation study: how each RoPE method behaves past the training length.

Two measurements, each a set of `run` commands whose JSON this script collects:

  perplexity  run MODEL -m ppl -f TEXT --ctx E --json --per-position [method flags]
              on the same text for every method and every context E = k L
              (L = the model's training context), in non-overlapping windows of
              E tokens (docs/rope.md §12.2);
  passkey     run MODEL -m passkey -f heldout.txt --ctx E --lengths E-9
              --depths 0,...,1 --trials T --json [method flags]
              (docs/passkey.md): a 5-digit key hidden at each depth of a prompt of
              E - 9 tokens (room for the 9-token answer), T keys per cell; with
              --chat (smollm2-chat) the prompt in the chat template, E - 21 tokens.

Studies (each skipped with a message when its files are absent):
  bundled      perplexity, models/model.bin (L = 256) on the held-out books, k = 1..16
  stories260K  perplexity, ../shared/models/stories260K.bin (L = 512) on TinyStories
               validation text, k = 1..16
  retrieval    passkey, models/retrieval/model.bin (the bundled model's recipe trained
               with passkey samples, L = 256), k = 1..16, every method
  smollm2      perplexity, models/smollm2/model-q8_0.bin (`make smollm2`;
               SmolLM2-135M-Instruct, L = 8192) on 98,304 tokens of the held-out
               books, k = 1/4, 1/2, 1, 2, 4, every method (4x: 3 windows of 32,768)
  smollm2-passkey, smollm2-chat
               passkey on SmolLM2 in both prompt forms: plain text, and the chat
               form (-m passkey --chat, the checkpoint's template; prompts of
               E - 21 tokens, room for a reply that restates the question);
               k = 1/4 .. 1 with 10 keys per (length, depth), 2x with 5 keys,
               every method

Methods at context E = k L (the literature's choices; at k <= 1 no scaling):
    none          plain RoPE
    linear        position interpolation, factor s = k
    ntk           static NTK-aware, alpha = 2k for k >= 2 (alpha must exceed the
                  extension ratio: bloc97 ran 2k-trained LLaMA past 8k with alpha 8)
    dynamic-hf    dynamic NTK, factor k, Hugging Face semantics (keys keep their rotation)
    dynamic-exact dynamic NTK, factor k, every key re-rotated for the current length
    yarn          YaRN, factor k, beta_fast 32, beta_slow 1, attention factor 0.1 ln k + 1
    llama3        Llama 3.1 rule, factor k, low/high frequency factors 1 and 4
    self-extend   Self-Extend, neighbour window W = L/2 and the smallest group size G
                  whose reach G (L - W) + G floor(W/G) covers E (docs/rope.md §10.2), so
                  that no relative position reaches L
    sinks         attention sinks (StreamingLLM): a rolling cache of L tokens, the
                  first 4 kept (--sinks 4); no RoPE scaling. Perplexity: the text is cut
                  into segments of one window each (E tokens with BOS, at white space),
                  and each segment is streamed through the cache, every token scored
                  (run -m ppl --streaming --ctx L --sinks 4); so the column compares the
                  same text, read as documents of E tokens, with every other method's
                  window; past L tokens each token sees the 4 sinks and the last L - 4.
                  `--stream-cell` below runs one such cell. Passkey: --ctx L --sinks 4,
                  the prompt rolls through the cache.
For SmolLM2 the methods are identical at k <= 1 (no scaling, G = 1, a cache that
never fills), so only none runs there and the other rows say "= none".

Error bars: `run -m ppl --json` reports nll_se (the tokens as independent draws),
nll_se_windows (the windows, or segments, as the independent units) and the 95%
interval [ppl_lo, ppl_hi] = exp(nll -+ 1.96 nll_se). Tables and plots show that
interval; each table adds the windows-based half-width per column, which is wider
(tokens of one window share their text). Both are for one cell alone: the methods of
a column score the same tokens, so their differences are more certain than either.
Passkey cells show correct / trials and a 95% Wilson interval.

Outputs (in --out, default docs/extrapolation/):
    results.json          every cell: its command, scores, passkey trials; the cells' times and threads,
                          the CPU time by study and factor, the cells missing
    results.csv           one row per perplexity cell
    passkey.csv           one row per passkey cell (study, method, k, depth)
    table.md              the tables, with the command that reproduces every cell; the CPU time
    ppl_vs_ctx.png        perplexity against context, one panel per study, 95% bars
    nll_vs_position.png   NLL by in-window position at the largest k, with a 95% bootstrap
                          band (position_bins() says why a bootstrap); results.json keeps
                          the bins it draws
    passkey_<study>.png   passkey accuracy heatmaps (length x depth), one panel per method
Log axes are labelled with plain numbers (256, 90). --replot draws the plots again
from the results.json in --out, running nothing.

Texts (made here, in a temporary folder; table.md states the same commands):
    heldout.txt   .venv/bin/python tools/prepare_data.py --heldout heldout.txt
    books.txt     head -c N heldout.txt > books.txt  (N: the longest prefix, cut at
                  white space, with at most --tokens tokens)
    smollm2-books.txt, stories.txt likewise (stories.txt from TinyStories validation)

Cells and their files (the study fans out): every cell (study, method, k) has
a name, study_method_kx (bundled_yarn_4x, smollm2_none_0.25x), and a command of
its own that makes its text, runs it and writes RESULTS/NAME.json: the plan
(--quick, --studies, --tokens, --passkey-model), the study's settings, the
cell's result and command, its wall time and threads. A passkey cell runs
a trial at a time and keeps its finished trials in RESULTS/NAME.parts until
its file is written, so a cell stopped partway resumes from there when run
again (passkey_by_trials; the study's own, docs/extrapolation/cells, are kept
in git, and a NAME.parts left beside a finished cell's file is removed).
--list prints those commands, the costliest first; they run anywhere with
the same checkout, models and ../shared, in any order. --collect reads the files of one plan from
any number of folders and writes the outputs below; a cell without a file is
"missing" in every table (a gap in the plots), and table.md ends with the CPU
time (wall x threads) by study and factor. Without --list, --cell or
--collect, the script does all three here: it runs the cells --jobs at a time
(default one per core) with --threads each (default cores / jobs, so jobs x
threads <= cores), printing cells done / total, elapsed and the time left, and
collects them (the files go to a temporary folder, or to --results DIR, where
cells already there are not run again).

Usage:
    .venv/bin/python tools/extrapolation.py [--out DIR] [--jobs J] [--threads T] [--studies a,b] [--tokens N]
                                            [--results DIR]
    .venv/bin/python tools/extrapolation.py --quick        # a small subset, a few minutes
    .venv/bin/python tools/extrapolation.py --list [--quick ...] [--threads T] [--results DIR] > cells.txt
    .venv/bin/python tools/extrapolation.py --cell NAME [--quick ...] [--threads T] [--results DIR]
    .venv/bin/python tools/extrapolation.py --collect DIR [DIR ...] [--out DIR]
    .venv/bin/python tools/extrapolation.py --stream-cell CKPT TEXT --window E --ctx L [-z TOK]
    .venv/bin/python tools/extrapolation.py --replot [--out DIR]   # the plots from DIR/results.json
(`make extrapolation` runs it with the defaults and --results docs/extrapolation/cells,
so only the cells without a committed file; from scratch the cells take about 0.9
CPU-hours without SmolLM2 and 36 with it (docs/extrapolation/README.md, "What it
costs"). `make extrapolation EXTRAPOLATION_ARGS=--quick` runs the subset. --quick, and
--collect of a --quick plan, write to a new temporary folder unless --out is
given, so they never replace the study.)
"""
import argparse
import concurrent.futures
import csv
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("SHARED_DIR") or ROOT.parent / "shared")
RUN = Path(os.environ.get("RUN") or ROOT / "run")
sys.path.insert(0, str(ROOT / "tools"))

FACTORS = (1, 2, 4, 8, 16)
SMOL_FACTORS = (0.25, 0.5, 1, 2, 4)
SMOL_PASSKEY_FACTORS = (0.25, 0.5, 1, 2)
METHODS = ("none", "linear", "ntk", "dynamic-hf", "dynamic-exact", "yarn", "llama3", "self-extend")
ROWS = METHODS + ("sinks",)
SINKS = 4
DEPTHS = (0, 0.25, 0.5, 0.75, 1)
ANSWER_TOKENS = 5 + 4  # run -m passkey's default: 5-digit keys, answered in digits + 4 tokens
CHAT_ANSWER_TOKENS = 5 + 16  # the chat form's (docs/passkey.md section 4): the reply may restate the question
Z95 = 1.96

# The studies: what each measures and how much. "tokens": the evaluation text's
# size (at most; a prefix cut at white space); "trials": passkey keys per
# (length, depth) cell, or a dict k -> trials.
FULL = {
    "bundled": dict(kind="ppl", factors=FACTORS, rows=ROWS, tokens=16384),
    "stories260K": dict(kind="ppl", factors=FACTORS, rows=ROWS, tokens=16384),
    "retrieval": dict(kind="passkey", factors=FACTORS, rows=ROWS, depths=DEPTHS, trials=5),
    # SmolLM2 (L = 8192): every method; 98,304 tokens of the held-out books, so
    # that 4x has 3 windows of 32,768 tokens (2x: 6, 1x: 12). At k <= 1 the
    # methods change nothing and only none runs.
    "smollm2": dict(kind="ppl", factors=SMOL_FACTORS, rows=ROWS, tokens=3 * 4 * 8192),
    # Passkey in both prompt forms (docs/passkey.md): plain text, and the
    # chat form (--chat: the checkpoint's template, the question as one user
    # turn). 10 keys per (length, depth) up to 1x; at 2x, every method with 5
    # keys (a 16k-token prompt costs SmolLM2 about 3.5 CPU-minutes, so each
    # such cell is about 50 CPU-minutes, exact dynamic NTK's about three times that).
    "smollm2-passkey": dict(kind="passkey", factors=SMOL_PASSKEY_FACTORS, rows=ROWS, depths=(0, 0.5, 1), trials=10,
                            at={2: dict(trials=5)},
                            note="a 16k-token prompt costs SmolLM2 about 3.5 CPU-minutes"),
    "smollm2-chat": dict(kind="passkey", factors=SMOL_PASSKEY_FACTORS, rows=ROWS, depths=(0, 0.5, 1), trials=10,
                         at={2: dict(trials=5)}, chat=True,
                         note="a 16k-token prompt costs SmolLM2 about 3.5 CPU-minutes"),
}
# --quick: every kind of cell (every method, sinks, a passkey heatmap, SmolLM2's
# "= none" cells) on little text, a few minutes on 2 cores.
QUICK = {
    "bundled": dict(kind="ppl", factors=(1, 4), rows=ROWS, tokens=2048),
    "retrieval": dict(kind="passkey", factors=(1, 4), rows=ROWS, depths=(0, 0.5, 1), trials=1),
    "smollm2": dict(kind="ppl", factors=(0.25,), rows=ROWS, tokens=2048),
    "smollm2-passkey": dict(kind="passkey", factors=(0.25,), rows=ROWS, depths=(0.5,), trials=1),
    "smollm2-chat": dict(kind="passkey", factors=(0.25,), rows=ROWS, depths=(0.5,), trials=1, chat=True),
}


# --------------------------------------------------------------------------
# Method settings

def self_extend_reach(G, L, W):
    """Tokens Self-Extend with group size G and window W covers for a model
    trained on L: a query at position m sees a far key at n at relative
    position floor(m/G) - floor(n/G) + W - floor(W/G), largest for n = 0, and
    that stays below L exactly while m < G (L - W) + G floor(W/G). When G
    divides W this is the familiar (L - W) G + W; otherwise it is less."""
    return G * (L - W) + G * (W // G)


def self_extend_group(E, L, W):
    """The smallest group size G >= 1 whose reach covers a context of E tokens."""
    if W >= L:
        raise ValueError(f"Self-Extend window W = {W} must be below the training length L = {L}")
    G = 1
    while self_extend_reach(G, L, W) < E:
        G += 1
    return G


def num(k):
    """A factor as the command line writes it: 2, not 2.0."""
    return str(int(k)) if float(k).is_integer() else str(k)


def method_flags(method, k, L):
    """Command-line flags for one method at context k * L (no scaling at k <= 1;
    Self-Extend then has G = 1, which moves no position). sinks: the rolling
    cache only; its --ctx (L) and --streaming are the caller's."""
    if method == "sinks":
        return ["--sinks", str(SINKS)]
    if method == "none" or (k <= 1 and method != "self-extend"):
        return []
    if method == "linear":
        return ["--rope-scaling", "linear", "--rope-factor", num(k)]
    if method == "ntk":
        return ["--rope-scaling", "ntk", "--rope-factor", num(2 * k)]
    if method == "dynamic-hf":
        return ["--rope-scaling", "dynamic", "--rope-factor", num(k), "--rope-dynamic", "hf"]
    if method == "dynamic-exact":
        return ["--rope-scaling", "dynamic", "--rope-factor", num(k), "--rope-dynamic", "exact"]
    if method == "yarn":
        return ["--rope-scaling", "yarn", "--rope-factor", num(k)]
    if method == "llama3":
        return ["--rope-scaling", "llama3", "--rope-factor", num(k)]
    if method == "self-extend":
        W = L // 2
        G = self_extend_group(round(k * L), L, W)
        return ["--self-extend", str(G), str(W)]
    raise ValueError(f"unknown method {method!r}")


def factor_label(k):
    """1x, 2x, 1/4x."""
    if float(k).is_integer():
        return f"{int(k)}x"
    return f"1/{round(1 / k)}x"


def cell_name(study, method, k):
    """A cell's name, which is also its file's: study_method_kx, e.g.
    bundled_yarn_4x, smollm2_none_0.25x (no study or method has a '_')."""
    return f"{study}_{method}_{num(k)}x"


def parse_cell_name(name):
    """(study, method, k) of a cell name; ValueError if it is not one."""
    parts = name.split("_")
    if len(parts) != 3 or not parts[2].endswith("x"):
        raise ValueError(f"cell {name!r}: expected STUDY_METHOD_Kx, e.g. bundled_yarn_4x")
    try:
        k = float(parts[2][:-1])
    except ValueError:
        raise ValueError(f"cell {name!r}: the factor {parts[2]!r} is not a number followed by x") from None
    return parts[0], parts[1], int(k) if k.is_integer() else k


# --------------------------------------------------------------------------
# Commands: lists of str and Path; shown with paths a user can type

class Where:
    """How paths are shown: the run binary as ./run, files in the repository
    relative to it, files in the shared folder as ../shared/..., files in the
    temporary folder by name (table.md says how to make them)."""

    def __init__(self, work=None):
        self.work = Path(work).resolve() if work else None

    def path(self, p):
        p = Path(p)
        if p == RUN:
            return "./run"
        rp = p.resolve()
        if self.work and rp.is_relative_to(self.work):
            return str(rp.relative_to(self.work))
        for q in (Path(os.path.abspath(p)), rp):  # models/smollm2 may be a link to elsewhere
            if q.is_relative_to(ROOT):
                return str(q.relative_to(ROOT))
        if rp.is_relative_to(SHARED.resolve()):
            return "../shared/" + str(rp.relative_to(SHARED.resolve()))
        return p.name

    def command(self, cmd):
        return " ".join(self.path(c) if isinstance(c, Path) else c for c in cmd)


def model_args(ckpt, tok):
    """[ckpt] and -z TOK unless TOK is the tokenizer.bin run finds beside the checkpoint."""
    args = [Path(ckpt)]
    if tok is not None and Path(tok).resolve() != (Path(ckpt).parent / "tokenizer.bin").resolve():
        args += ["-z", Path(tok)]
    return args


def ppl_command(ckpt, tok, text, ctx, flags):
    return [RUN] + model_args(ckpt, tok) + ["-m", "ppl", "-f", Path(text), "--ctx", str(ctx), "--json",
                                            "--per-position"] + list(flags)


def stream_command(ckpt, tok, segment, ctx):
    """One segment of a sinks cell."""
    return [RUN] + model_args(ckpt, tok) + ["-m", "ppl", "-f", Path(segment), "--ctx", str(ctx), "--streaming",
                                            "--sinks", str(SINKS), "--json", "--per-position"]


def stream_cell_command(ckpt, tok, text, window, ctx):
    """The command that reproduces a whole sinks cell (this script's --stream-cell)."""
    cmd = [".venv/bin/python", "tools/extrapolation.py", "--stream-cell"] + [Path(ckpt), Path(text)]
    cmd += ["--window", str(window), "--ctx", str(ctx)]
    if tok is not None and Path(tok).resolve() != (Path(ckpt).parent / "tokenizer.bin").resolve():
        cmd += ["-z", Path(tok)]
    return cmd


def passkey_command(ckpt, tok, filler, ctx, length, depths, trials, flags, chat=False):
    return [RUN] + model_args(ckpt, tok) + [
        "-m", "passkey", "-f", Path(filler), "--ctx", str(ctx), "--lengths", str(length),
        "--depths", ",".join(num(d) for d in depths), "--trials", str(trials), "--json"] + \
        (["--chat"] if chat else []) + list(flags)


def passkey_by_trials(cmd, depths, trials, threads, parts, where):
    """Run a passkey command (one length) one trial at a time, as `cmd
    --depths d --trials 1 --skip-draws n` (the same key and prompt as trial n
    of cmd: docs/passkey.md §2), each trial's JSON kept in the folder parts as
    it ends, so that a cell stopped partway (a session's end, a preempted
    job) goes on from its last trial when run again. A trial that takes a
    minute or more prints a progress line. Returns cmd's JSON (cells by
    depth, trials in order) with wall_s, the seconds its trials took over
    every run (a trial run on other threads counted by its CPU time, so that
    wall_s x threads stays the cell's CPU time), and resumed, the trials an
    earlier run made. A part made by another command (other flags, model or
    text) is an error."""
    parts = Path(parts)
    cells, wall, resumed = [], 0.0, 0
    i = cmd.index("--depths")
    for di, d in enumerate(depths):
        cell = dict(length=None, depth=d, trials=[], correct=0)
        for t in range(trials):
            n = di * trials + t
            one = cmd[:i] + ["--depths", num(d)] + cmd[i + 2:] + ["--skip-draws", str(n)]
            one[one.index("--trials") + 1] = "1"
            shown, f = where.command(one), parts / f"trial-{n}.json"
            if f.exists():
                part = json.loads(f.read_text(encoding="utf-8"))
                if part.get("command") != shown:
                    raise RuntimeError(f"{f}: a trial of `{part.get('command')}`, expected `{shown}`; remove "
                                       f"{parts} to run the cell anew")
                resumed += 1
            else:
                t0 = time.time()
                out = run_json(one, threads)
                part = dict(command=shown, threads=threads, wall_s=round(time.time() - t0, 2),
                            cell=out["cells"][0])
                write_cell_file(f, part)
                if part["wall_s"] >= 60:
                    print(f"extrapolation: {parts.name}: trial {n + 1} of {len(depths) * trials} "
                          f"({'correct' if part['cell']['correct'] else 'wrong'}) in {clock(part['wall_s'])}",
                          file=sys.stderr, flush=True)
            cell["length"], cell["depth"] = part["cell"]["length"], part["cell"]["depth"]  # as the run prints them
            cell["trials"] += part["cell"]["trials"]
            cell["correct"] += part["cell"]["correct"]
            wall += part["wall_s"] * part["threads"] / threads
        cells.append(cell)
    return dict(cells=cells, wall_s=round(wall, 2), resumed=resumed)


def run_json(cmd, threads=1):
    """Run one command with `threads` OpenMP threads and parse its JSON; a one-line error otherwise."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    p = subprocess.run([str(c) for c in cmd], capture_output=True, env=env)
    if p.returncode != 0:
        err = p.stderr.decode(errors="replace").strip().splitlines()
        raise RuntimeError(f"{Where().command(cmd)}: exit {p.returncode}: {err[-1] if err else 'no message'}")
    return json.loads(p.stdout)


# --------------------------------------------------------------------------
# Texts: prefixes and segments cut at white space, counted by run's tokenizer

class TokenCounter:
    """Text tokens (BOS not counted) of a string, as `run -m tokenize` encodes it."""

    def __init__(self, ckpt, tok, work):
        self.base = [RUN] + model_args(ckpt, tok) + ["-m", "tokenize"]
        self.probe = Path(work) / f"probe-{os.getpid()}-{id(self)}.txt"
        # a BOS, when the tokenizer adds one, is the same first id for any text
        self.bos = int(self.ids("a")[0] == self.ids("z")[0])

    def ids(self, text):
        self.probe.write_text(text, encoding="utf-8")
        p = subprocess.run([str(c) for c in self.base + ["-f", self.probe]], capture_output=True)
        if p.returncode != 0:
            raise RuntimeError(f"tokenize: {p.stderr.decode(errors='replace').strip()}")
        return p.stdout.split()

    def __call__(self, text):
        return len(self.ids(text)) - self.bos


def cut_points(text):
    """(end of a piece, start of the next) at every run of white space."""
    return [(m.start(), m.end()) for m in re.finditer(r"\s+", text)]


def longest_piece(text, start, max_tokens, count, cuts=None):
    """The end e of the longest text[start:e] with at most max_tokens tokens,
    e the whole text's end or the start of a run of white space; and where the
    next piece starts. Binary search, since longer pieces have more tokens."""
    if count(text[start:]) <= max_tokens:
        return len(text), len(text)
    cuts = [c for c in (cut_points(text) if cuts is None else cuts) if c[0] > start]
    lo, hi = -1, len(cuts) - 1  # cuts[lo] fits (-1: none yet); every cut after hi is too long
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count(text[start:cuts[mid][0]]) <= max_tokens:
            lo = mid
        else:
            hi = mid - 1
    if lo < 0:
        raise ValueError(f"no piece of at most {max_tokens} tokens starts at character {start}")
    return cuts[lo]


def split_segments(text, max_tokens, count):
    """text cut at white space into consecutive segments of at most max_tokens
    tokens, each as long as fits; the white space at a cut is in neither."""
    cuts, out, start = cut_points(text), [], 0
    while start < len(text):
        end, start_next = longest_piece(text, start, max_tokens, count, cuts)
        out.append(text[start:end])
        start = start_next
    return out


# --------------------------------------------------------------------------
# Combining the segments of a sinks cell

def combine_scores(parts):
    """One score from the runs of several segments, as if one run had scored
    them all as windows: the token-weighted mean NLL, its standard error with
    the tokens as independent draws (from each part's nll_se: sum of squares =
    se^2 n (n - 1) + sum^2 / n) and with the segments as the units (the ratio
    estimator of run's nll_se_windows), the 95% interval, and the mean NLL at
    every position over the segments that reach it."""
    n_tot, s_tot, sq_tot, win = 0, 0.0, 0.0, []
    npos = max(len(p.get("per_position") or []) for p in parts)
    pos_sum, pos_cnt = [0.0] * npos, [0] * npos
    for p in parts:
        n, m = p["tokens"], p["nll"]
        s = n * m
        se = p["nll_se"] if p["nll_se"] is not None else 0.0
        sq = se * se * n * (n - 1) + s * s / n
        n_tot, s_tot, sq_tot = n_tot + n, s_tot + s, sq_tot + sq
        win.append((s, n))
        for i, v in enumerate(p.get("per_position") or []):
            if v is not None:
                pos_sum[i] += v
                pos_cnt[i] += 1
    nll = s_tot / n_tot
    var = (sq_tot - s_tot * s_tot / n_tot) / (n_tot - 1) if n_tot > 1 else float("nan")
    se = math.sqrt(max(var, 0.0) / n_tot) if n_tot > 1 else None
    W = len(win)
    se_w = (math.sqrt(W / (W - 1) * sum((s - nll * n) ** 2 for s, n in win)) / n_tot) if W > 1 else None
    out = dict(tokens=n_tot, nll=nll, ppl=math.exp(nll), nll_se=se, nll_se_windows=se_w,
               ppl_lo=math.exp(nll - Z95 * se) if se is not None else None,
               ppl_hi=math.exp(nll + Z95 * se) if se is not None else None,
               windows=W, streaming=True,
               per_position=[pos_sum[i] / pos_cnt[i] if pos_cnt[i] else None for i in range(npos)])
    for key in ("ctx", "sinks", "orig_ctx", "scaling", "position"):
        if key in parts[0]:
            out[key] = parts[0][key]
    return out


def stream_cell(ckpt, tok, text, window, ctx, work, where=None, threads=1):
    """A sinks cell: text cut into segments of one window each (window tokens
    with BOS: window - 1 text tokens; without BOS, window), each streamed
    through a rolling cache of ctx tokens with SINKS sinks (`threads` threads
    per run); the combined score."""
    count = TokenCounter(ckpt, tok, work)
    segments = split_segments(Path(text).read_text(encoding="utf-8"), window - count.bos, count)
    count.probe.unlink(missing_ok=True)
    folder = Path(work) / f"segments-{Path(ckpt).stem}-{window}"
    folder.mkdir(parents=True, exist_ok=True)
    parts = []
    for i, seg in enumerate(segments):
        f = folder / f"{i:04d}.txt"
        f.write_text(seg, encoding="utf-8")
        parts.append(run_json(stream_command(ckpt, tok, f, ctx), threads))
    r = combine_scores(parts)
    r["segment_command"] = (where or Where(work)).command(stream_command(ckpt, tok, folder / "NNNN.txt", ctx))
    return r


# --------------------------------------------------------------------------
# Statistics and formatting

def wilson(c, n, z=Z95):
    """95% Wilson score interval of a binomial proportion c / n."""
    if n == 0:
        return 0.0, 1.0
    p = c / n
    d = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / d
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, mid - half), min(1.0, mid + half)


def fmt(v):
    """A perplexity: 4.28, 88.16, 172.1, 1234."""
    if v is None:
        return "-"
    if v >= 1000:
        return f"{v:.0f}"
    if v >= 100:
        return f"{v:.1f}"
    return f"{v:.2f}"


MISSING_NOTE = ("\"missing\": no file of this cell was among those collected (--collect); its command is listed "
                "below, and `tools/extrapolation.py --list` gives the one that writes its file.")
GAP = (math.nan, math.nan, math.nan)  # a missing cell's (ppl, lo, hi) in a plot: a gap in its line


def measured(r):
    """Whether a result row holds a measurement (not a missing cell)."""
    return not r.get("missing")


def command_mark(r):
    """What follows '# method, k' above a cell's command: ': missing' or nothing."""
    return ": missing" if r.get("missing") else ""


def ppl_cell(r):
    """'88.16 [86.90, 89.45]'; '= none' for a cell that is none's run;
    'missing' for a cell whose file was not collected."""
    if r.get("missing"):
        return "missing"
    if r.get("same_as"):
        return f"= {r['same_as']}"
    return f"{fmt(r['ppl'])} [{fmt(r['ppl_lo'])}, {fmt(r['ppl_hi'])}]"


def passkey_cell(c, n, interval=False):
    """'7/10', or with interval '7/10 [40%, 89%]'."""
    if not interval:
        return f"{c}/{n}"
    lo, hi = wilson(c, n)
    return f"{c}/{n} [{100 * lo:.0f}%, {100 * hi:.0f}%]"


def log_bins(values, per_octave=4):
    """The per-position values (index = position; None = nothing scored) in
    bins of equal width on a log axis, per_octave to a doubling: bin j holds
    positions p >= 1 with floor(per_octave log2 p) = j. Returns
    [(first, last, [values])] for the bins holding values."""
    bins = {}
    for p, v in enumerate(values):
        if p >= 1 and v is not None:
            bins.setdefault(math.floor(per_octave * math.log2(p) + 1e-9), []).append((p, v))
    return [(bins[j][0][0], bins[j][-1][0], [v for _, v in bins[j]]) for j in sorted(bins)]


BOOTSTRAP = 2000  # resamples per bin for the NLL-by-position band


def position_bins(values, per_octave=4):
    """The mean NLL per log bin of position (log_bins) with a 95% bootstrap
    interval: [dict(first, last, n, mean, lo, hi)], lo and hi None for a bin
    of one position.

    Why a bootstrap: a value is the mean NLL at one position over the windows,
    and with one window (SmolLM2 at 2x) it is one token's NLL, a long-tailed
    quantity (most tokens near 0 nats, a few far above). mean -+ 1.96 standard
    errors assumes the mean is normal, and in a bin of a few such values it
    reaches below 0, which no NLL can. The percentile bootstrap resamples the
    bin's values with replacement and takes the 2.5th and 97.5th percentiles
    of the resampled means: it stays within the values' range (never below 0)
    and follows their skew. Fixed seed: a replot draws the same band."""
    import numpy as np
    rng = np.random.default_rng(0)
    out = []
    for first, last, vals in log_bins(values, per_octave):
        v = np.asarray(vals, dtype=np.float64)
        lo = hi = None
        if len(v) > 1:
            means = v[rng.integers(0, len(v), size=(BOOTSTRAP, len(v)))].mean(axis=1)
            lo, hi = (float(x) for x in np.percentile(means, [2.5, 97.5]))
        out.append(dict(first=first, last=last, n=len(v), mean=float(v.mean()), lo=lo, hi=hi))
    return out


# --------------------------------------------------------------------------
# The plan: studies -> jobs

class Study:
    """One study: a model, its training context L, and the cells to measure."""

    def __init__(self, name, kind, ckpt, tok, L, factors, rows, data="", text=None, text_recipe=(),
                 tokens=None, depths=(), trials=None, filler=None, at=None, note="", chat=False):
        self.name, self.kind, self.ckpt, self.tok, self.L = name, kind, Path(ckpt), tok, L
        self.factors, self.rows, self.data = tuple(factors), tuple(rows), data
        self.text, self.text_recipe, self.tokens = text, list(text_recipe), tokens
        self.depths, self.trials, self.filler = tuple(depths), trials, filler
        self.at = at or {}  # k -> {"depths", "trials"}: what differs at that factor
        self.note = note  # why the plan differs by length, for the table
        self.title = name.replace("-passkey", "")  # smollm2-passkey is smollm2's passkey study
        self.chat = chat  # passkey: the prompts in the checkpoint's chat template (run -m passkey --chat)
        self.answer_tokens = CHAT_ANSWER_TOKENS if chat else ANSWER_TOKENS  # a prompt is k L - this
        # Up to the training context the methods change nothing; a study with
        # factors below 1 (SmolLM2) runs none alone at k <= 1.
        self.reuse_below_1 = min(self.factors) < 1

    def trials_at(self, k):
        return self.at.get(k, {}).get("trials", self.trials)

    def depths_at(self, k):
        return tuple(self.at.get(k, {}).get("depths", self.depths))

    def ctx(self, k):
        return round(k * self.L)

    def cells(self):
        """(method, k) of the cells to run: every method at every factor, but
        at k <= 1 (reuse_below_1) only none."""
        return [(m, k) for m in self.rows for k in self.factors if not self.same_as_none(m, k)]

    def same_as_none(self, method, k):
        return self.reuse_below_1 and k <= 1 and method != "none"


def job_cost(study, method, tokens, E):
    """A rough relative cost, only to start the longest runs first: tokens fed,
    times the attention span (sinks: the cache of L), times the model's size
    (SmolLM2 ~100x the small models), times ~4 for exact dynamic NTK, whose
    keys are rotated per query inside attention (kernels.h's QueryFrames);
    sinks cost what none does (SmolLM2 at 2x: 22 and 20 min on one thread)."""
    size = 100 if "smollm2" in study.name else 1
    span = study.L if method == "sinks" else E
    return tokens * (1 + span / 2048) * size * (4 if method == "dynamic-exact" else 1)


def ppl_jobs(study, where):
    """[(study, method, k, name, command-to-show, runner)] for a perplexity
    study, the runner a function of the threads per run and a folder for a
    cell's parts (passkey_by_trials; unused here)."""
    jobs = []
    for m, k in study.cells():
        E = study.ctx(k)
        if m == "sinks":
            shown = stream_cell_command(study.ckpt, study.tok, study.text, E, study.L)
            run = (lambda threads, parts, s=study, E=E: stream_cell(s.ckpt, s.tok, s.text, E, s.L, where.work,
                                                                    where, threads))
        else:
            cmd = ppl_command(study.ckpt, study.tok, study.text, E, method_flags(m, k, study.L))
            shown, run = cmd, (lambda threads, parts, c=cmd: run_json(c, threads))
        jobs.append(dict(study=study, method=m, k=k, name=cell_name(study.name, m, k), ctx=E,
                         shown=where.command(shown), run=run,
                         flags=" ".join(method_flags(m, k, study.L)),
                         cost=job_cost(study, m, study.tokens or E, E)))
    return jobs


def passkey_jobs(study, where):
    """[(study, method, k, name, command-to-show, runner)] for a passkey study,
    each at its factor's depths and trials."""
    jobs = []
    for m, k in study.cells():
        E = study.ctx(k)
        ctx = study.L if m == "sinks" else E
        flags = method_flags(m, k, study.L)
        T, depths = study.trials_at(k), study.depths_at(k)
        length = E - study.answer_tokens
        cmd = passkey_command(study.ckpt, study.tok, study.filler, ctx, length, depths, T, flags, study.chat)
        jobs.append(dict(study=study, method=m, k=k, name=cell_name(study.name, m, k), ctx=ctx,
                         length=length, shown=where.command(cmd),
                         run=(lambda threads, parts, c=cmd, d=depths, T=T: passkey_by_trials(c, d, T, threads, parts,
                                                                                            where)),
                         flags=" ".join(flags),
                         cost=job_cost(study, m, E * T * len(depths), E)))
    return jobs


def ppl_result(job, r):
    """A perplexity cell: the run's JSON (or the combined segments') with the cell's identity."""
    s = job["study"]
    r = {k: v for k, v in r.items() if k not in ("file",)}
    r.update(model=s.name, method=job["method"], k=job["k"], ctx=job["ctx"], train_ctx=s.L, flags=job["flags"],
             command=job["shown"], text=Path(s.text).name)
    return r


def passkey_result(job, r):
    """A passkey job's cells (one per depth): correct, trials, and each trial's key and answer."""
    s = job["study"]
    cells = []
    for c in r["cells"]:
        trials = [{k: t[k] for k in ("key", "answer", "text", "correct", "prompt_tokens", "start") if k in t}
                  for t in c["trials"]]
        cells.append(dict(length=c["length"], depth=c["depth"], correct=c["correct"], trials=len(trials),
                          runs=trials))
    return dict(model=s.name, method=job["method"], k=job["k"], ctx=job["ctx"], length=job["length"],
                train_ctx=s.L, flags=job["flags"], command=job["shown"], filler=Path(s.filler).name,
                cells=cells)


def fill_same_as_none(results, studies):
    """Add the cells a study runs as none's (k <= 1 on SmolLM2), copied, marked same_as."""
    out = list(results)
    for s in studies:
        for m in s.rows:
            for k in s.factors:
                if not s.same_as_none(m, k):
                    continue
                base = [r for r in results if r["model"] == s.name and r["method"] == "none" and r["k"] == k]
                if base:
                    copy = dict(base[0], method=m, same_as="none")
                    out.append(copy)
    return out


# --------------------------------------------------------------------------
# Writers

def windows_note(rows_by_k, factors):
    """'65 | 33 | ...': windows (segments) per column, from none's cells."""
    return [str(rows_by_k[k]["windows"]) if k in rows_by_k else "" for k in factors]


def ppl_table(study, results):
    """Markdown lines: one study's perplexity table, its notes and its commands."""
    listed = [r for r in results if r["model"] == study.name]
    rows = [r for r in listed if measured(r)]
    if not listed:
        return []
    none = {r["k"]: r for r in rows if r["method"] == "none"}
    tokens = sorted({r["tokens"] for r in rows if not r.get("streaming") and not r.get("same_as")})
    seg_tokens = sorted({r["tokens"] for r in rows if r.get("streaming") and not r.get("same_as")})
    tok_txt = "/".join(str(t) for t in tokens) + " tokens scored per cell" if tokens else "no cell measured"
    if seg_tokens:
        tok_txt += f" ({SINKS} sinks: {seg_tokens[0]}" + (f"-{seg_tokens[-1]}" if len(seg_tokens) > 1 else "") + \
            ", the same text cut at white space)"
    lines = [f"### {study.name}: perplexity (training context L = {study.L}; {study.data}; {tok_txt})", "",
             "| method | " + " | ".join(f"{factor_label(k)} ({study.ctx(k)})" for k in study.factors) + " |",
             "|---|" + "---:|" * len(study.factors)]
    for m in study.rows:
        cells = []
        for k in study.factors:
            hit = [r for r in listed if r["method"] == m and r["k"] == k]
            cells.append(ppl_cell(hit[0]) if hit else "")
        label = f"sinks ({SINKS})" if m == "sinks" else m
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("| windows per cell | " + " | ".join(windows_note(none, study.factors)) + " |")
    half = []
    for k in study.factors:
        ws = [r["nll_se_windows"] for r in rows if r["k"] == k and r.get("nll_se_windows") is not None
              and not r.get("same_as")]
        ran = any(r["k"] == k and measured(r) for r in rows)
        half.append(f"±{Z95 * max(ws):.3f}" if ws else "n/a (1 window)" if ran else "missing")
    lines.append("| windows-based 95% half-width, nats (largest in column) | " + " | ".join(half) + " |")
    few = [factor_label(k) for k in study.factors if k in none and none[k]["windows"] < 4]
    lines += ["", "Cells: perplexity [95% interval with the tokens as independent draws: run's ppl_lo, ppl_hi]. "
              "The windows-based half-width (nats, on the mean NLL) treats the windows (sinks: segments) as "
              "the independent units; exp(±0.1) is ±10.5% on the perplexity."]
    if few:
        lines.append(f"The {', '.join(few)} column{'s rest' if len(few) > 1 else ' rests'} on fewer than 4 "
                     "windows: the windows-based estimate is rough or undefined there.")
    if any(r.get("same_as") for r in rows):
        lines.append("\"= none\": at k <= 1 the method changes nothing (no scaling; Self-Extend G = 1; a cache "
                     "that never fills), so the cell is none's run.")
    if any(r.get("missing") for r in listed):
        lines.append(MISSING_NOTE)
    lines += ["", "Commands (from the repository root, after `make`):", "", "```"]
    lines += study.text_recipe
    for m in study.rows:
        for k in study.factors:
            hit = [r for r in listed if r["method"] == m and r["k"] == k and not r.get("same_as")]
            if hit:
                lines.append(f"# {m}, {factor_label(k)}" + command_mark(hit[0]))
                lines.append(hit[0]["command"])
    seg = [r["segment_command"] for r in rows if r.get("segment_command")]
    if seg:
        lines.append("# a sinks cell scores each segment NNNN.txt (--stream-cell --segments DIR keeps them) with")
        lines.append("# " + seg[0])
    lines += ["```", ""]
    return lines


def passkey_table(study, results):
    """Markdown lines: one passkey study's tables (pooled over depths, then by
    depth) and its commands."""
    rows = [r for r in results if r["model"] == study.name]
    if not rows:
        return []
    trials = sorted({c["trials"] for r in rows for c in r["cells"]})
    head = "| method | " + " | ".join(f"{factor_label(k)} ({study.ctx(k) - study.answer_tokens})"
                                     for k in study.factors) + " |"
    lines = [f"### {study.title}: passkey accuracy ({Where().path(study.ckpt)}, L = {study.L}; filler: "
             f"held-out books; 5-digit keys; prompts of k L - {study.answer_tokens} tokens"
             + (" in the chat template (--chat), the question one user turn" if study.chat else ", plain text")
             + "; "
             f"{'/'.join(map(str, trials))} trial{'s' if trials != [1] else ''} per (length, depth))", ""]
    if study.at:
        def what(d):
            parts = []
            if "trials" in d:
                parts.append(f"{d['trials']} trial{'s' if d['trials'] != 1 else ''}")
            if "depths" in d:
                parts.append("depth" + ("s " if len(d["depths"]) > 1 else " ") + ", ".join(map(num, d["depths"])))
            return " and ".join(parts)
        lines += [f"Depths {', '.join(map(num, study.depths))}, {what(dict(trials=study.trials))} per cell; "
                  + "; ".join(f"at {factor_label(k)} {what(d)}" for k, d in sorted(study.at.items()))
                  + (f" ({study.note})" if study.note else "") + ".", ""]
    lines += ["All depths pooled: correct / prompts [95% Wilson interval].", "", head,
              "|---|" + "---:|" * len(study.factors)]

    def find(m, k):
        hit = [r for r in rows if r["method"] == m and r["k"] == k]
        return hit[0] if hit else None

    def mark(r):
        if r.get("missing"):
            return "missing"
        return f"= {r['same_as']}" if r.get("same_as") else None

    for m in study.rows:
        cells = []
        for k in study.factors:
            r = find(m, k)
            if r is None:
                cells.append("")
            elif mark(r):
                cells.append(mark(r))
            else:
                cells.append(passkey_cell(sum(c["correct"] for c in r["cells"]),
                                          sum(c["trials"] for c in r["cells"]), interval=True))
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    lines += ["", "By depth (0: the key right after the task line, 1: right before the question): correct / trials.",
              "", "| method | depth | " + " | ".join(factor_label(k) for k in study.factors) + " |",
              "|---|---:|" + "---:|" * len(study.factors)]
    for m in study.rows:
        for d in study.depths:
            cells = []
            for k in study.factors:
                r = find(m, k)
                c = [c for c in r["cells"] if c["depth"] == d] if r else []
                cells.append(mark(r) if r and mark(r) else passkey_cell(c[0]["correct"], c[0]["trials"]) if c else "")
            lines.append(f"| {m} | {num(d)} | " + " | ".join(cells) + " |")
    lines.append("")
    if any(r.get("same_as") for r in rows):
        lines.append("\"= none\": up to the training context the method changes nothing, so the cell is none's run.")
    if any(r.get("missing") for r in rows):
        lines.append(MISSING_NOTE)
    few = sorted({c["trials"] for r in rows for c in r["cells"] if c["trials"] < 5})
    if few:
        lines.append(f"Cells of {'/'.join(map(str, few))} trial{'s' if few != [1] else ''} say little alone: "
                     f"the Wilson interval of 1/1 is [{100 * wilson(1, 1)[0]:.0f}%, 100%], of 0/1 "
                     f"[0%, {100 * wilson(0, 1)[1]:.0f}%].")
    lines += ["", "Commands (from the repository root, after `make`):", "", "```"] + study.text_recipe
    for m in study.rows:
        for k in study.factors:
            r = find(m, k)
            if r and not r.get("same_as"):
                lines += [f"# {m}, {factor_label(k)}" + command_mark(r), r["command"]]
    lines += ["```", ""]
    return lines


PREAMBLE = [
    "## What a cell is", "",
    "- Perplexity at k x L (L: the training context): `run -m ppl --ctx E` with E = kL scores the text in "
    "non-overlapping windows of E tokens (BOS and E - 1 text tokens; each token given its in-window prefix), the same "
    "text in every cell of a table. Methods at E = kL: linear, dynamic (hf: keys keep the rotation they arrived "
    "with; exact: every key re-rotated for the current length), YaRN and Llama 3 with factor k; NTK with alpha = 2k; "
    "Self-Extend with W = L/2 and the smallest group G whose reach G(L - W) + G floor(W/G) covers E. "
    "At k <= 1 no method scales.",
    f"- sinks ({SINKS}): StreamingLLM's rolling cache of L tokens, the first {SINKS} kept and the oldest of the rest "
    "evicted, positions by place in the cache, no RoPE scaling. The text is cut at white space into segments of one "
    "window (at most E tokens with BOS), and each segment is streamed through the cache, every token scored (`-m ppl --streaming --sinks "
    f"{SINKS} --ctx L`): the same text, read as documents of E tokens, as in the other rows; past L tokens a token "
    f"sees the {SINKS} sinks and the last L - {SINKS}. At 1x the cache never fills, so the cell differs from none's "
    "only by where its segments start (at white space rather than every L - 1 tokens).",
    "- Perplexity intervals: [lo, hi] is run's 95% interval exp(nll -+ 1.96 nll_se), nll_se counting the tokens "
    "as independent draws. Tokens of one window share their text, so that understates the spread between texts; "
    "the windows-based row gives the half-width with the windows (segments) as the independent units, and it is "
    "itself rough with few windows. Both are for a cell alone: the cells of a column score the same tokens, so "
    "differences between methods are more certain than either interval.",
    "- Passkey at k x L: `run -m passkey` hides a 5-digit key at each depth (0 = right after the task line, "
    "1 = right before the question) of a prompt of kL - 9 tokens (filler: sentences of the held-out books, from a "
    "random start), and the model must write the key greedily within 9 tokens. Keys and starts come from seed 0, so "
    "every method sees the same prompts. Cells: correct / trials and a 95% Wilson interval.",
    "",
]


def write_csvs(ppl, passkey, out):
    with open(out / "results.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["model", "method", "k", "ctx", "train_ctx", "flags", "tokens", "windows", "nll", "nll_se",
                    "nll_se_windows", "ppl", "ppl_lo", "ppl_hi", "same_as", "command"])
        for r in (r for r in ppl if measured(r)):  # the cells measured; results.json lists all
            g = lambda key, f: "" if r.get(key) is None else f.format(r[key])  # noqa: E731
            w.writerow([r["model"], r["method"], r["k"], r["ctx"], r["train_ctx"], r["flags"], r["tokens"],
                        r["windows"], g("nll", "{:.5f}"), g("nll_se", "{:.5f}"), g("nll_se_windows", "{:.5f}"),
                        g("ppl", "{:.3f}"), g("ppl_lo", "{:.3f}"), g("ppl_hi", "{:.3f}"), r.get("same_as", ""),
                        "" if r.get("same_as") else r["command"]])
    with open(out / "passkey.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["model", "method", "k", "ctx", "length", "depth", "correct", "trials", "same_as", "command"])
        for r in passkey:
            for c in r["cells"]:
                w.writerow([r["model"], r["method"], r["k"], r["ctx"], r["length"], c["depth"], c["correct"],
                            c["trials"], r.get("same_as", ""), "" if r.get("same_as") else r["command"]])


def nice_log_ticks(lo, hi):
    """Round values in [lo, hi] for a log axis, the coarsest set that gives at
    least 3 and leaves no gap (ends included) wider than 30% of the axis:
    the powers of 10, then 1-2-5, 1-2-3-5-7, every digit, and finer."""
    span = math.log10(hi / lo)
    ticks = []
    for subs in ((1,), (1, 2, 5), (1, 2, 3, 5, 7), (1, 2, 3, 4, 5, 6, 7, 8, 9),
                 (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 7, 8, 9)):
        ticks = [s * 10.0 ** e for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
                 for s in subs if lo <= s * 10.0 ** e <= hi]
        edges = [lo] + ticks + [hi]
        if len(ticks) >= 3 and max(math.log10(b / a) for a, b in zip(edges, edges[1:])) <= 0.3 * span:
            break
    return ticks


def plain_ticks(axis, ticks):
    """Label a log axis at ticks with plain numbers (256, 90), not 2^8 or
    9x10^1; no labels on the minor ticks."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter
    axis.set_major_locator(FixedLocator(ticks))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def finish_axes(ax, L, xlabel, ylabel, title, xticks):
    """A log2 x axis labelled at xticks with the training context L marked,
    labels, grid, legend."""
    ax.set_xscale("log", base=2)
    plain_ticks(ax.xaxis, xticks)
    ax.axvline(L, color="grey", lw=0.8, ls="--")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)


def plot_ppl(ppl, studies, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    studies = [s for s in studies if any(r["model"] == s.name for r in ppl)]
    if not studies:
        return []
    n = len(studies)
    fig, axes = plt.subplots(1, n, figsize=(6.5 * n, 4.8), squeeze=False)
    for ax, s in zip(axes[0], studies):
        for m in s.rows:
            pts = sorted((r["ctx"], r["ppl"], r["ppl_lo"], r["ppl_hi"]) if not r.get("missing") else (r["ctx"],) + GAP
                         for r in ppl if r["model"] == s.name and r["method"] == m)
            if not pts:
                continue
            x, y = [p[0] for p in pts], [p[1] for p in pts]
            err = [[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]]
            ax.errorbar(x, y, yerr=err, marker="o", ms=4, capsize=3, label=m if m != "sinks" else f"sinks ({SINKS})",
                        ls="--" if m == "sinks" else "-")
        ax.set_yscale("log")
        lo, hi = ax.get_ylim()
        plain_ticks(ax.yaxis, nice_log_ticks(lo, hi))
        ax.set_ylim(lo, hi)
        finish_axes(ax, s.L, "context length (tokens)", "perplexity (bars: 95% interval)",
                    f"{s.name}: perplexity vs context (L = {s.L})", [s.ctx(k) for k in s.factors])
    fig.tight_layout()
    fig.savefig(out / "ppl_vs_ctx.png", dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, n, figsize=(6.5 * n, 4.8), squeeze=False)
    for ax, s in zip(axes[0], studies):
        kmax = plotted_factor(s, ppl)
        later = [factor_label(k) for k in s.factors if k > kmax]  # the larger factors, still missing
        for m in s.rows:
            hit = [r for r in ppl if r["model"] == s.name and r["method"] == m and r["k"] == kmax
                   and r.get("position_bins")]
            if not hit:
                if any(r.get("missing") for r in ppl if r["model"] == s.name and r["method"] == m and r["k"] == kmax):
                    ax.plot([], [], " ", label=f"{m}: missing")  # named in the legend, no line
                continue
            bins = hit[0]["position_bins"]
            xs = [math.sqrt(b["first"] * b["last"]) for b in bins]
            line, = ax.plot(xs, [b["mean"] for b in bins], lw=1.2, label=m if m != "sinks" else f"sinks ({SINKS})")
            band = [(x, b) for x, b in zip(xs, bins) if b["lo"] is not None]
            ax.fill_between([x for x, _ in band], [b["lo"] for _, b in band], [b["hi"] for _, b in band],
                            color=line.get_color(), alpha=0.15, lw=0)
        finish_axes(ax, s.L, "position in the window (tokens)",
                    "NLL (nats): mean per quarter octave, 95% bootstrap band",
                    f"{s.name}: NLL by position at {factor_label(kmax)} (ctx {s.ctx(kmax)})"
                    + (f"; {', '.join(later)} missing" if later else ""),
                    [4 ** i for i in range(1 + round(math.log(s.ctx(kmax), 4)))])
    fig.tight_layout()
    fig.savefig(out / "nll_vs_position.png", dpi=110)
    plt.close(fig)
    return ["ppl_vs_ctx.png", "nll_vs_position.png"]


def plot_passkey(study, passkey, out):
    """passkey_<study>.png: one heatmap per method, depth (rows) x length (columns), counts in the cells."""
    rows = [r for r in passkey if r["model"] == study.name]
    if not rows:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    methods = [m for m in study.rows if any(r["method"] == m for r in rows)]
    ncol = min(3, len(methods))
    nrow = math.ceil(len(methods) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(max(8.0, 1.1 * len(study.factors) * ncol + 1.5),
                                                  0.55 * len(study.depths) * nrow + 1.4 * nrow + 0.6), squeeze=False)
    im = None
    for i, ax in enumerate(axes.flat):
        if i >= len(methods):
            ax.axis("off")
            continue
        m = methods[i]
        grid = [[math.nan] * len(study.factors) for _ in study.depths]
        for j, k in enumerate(study.factors):
            hit = [r for r in rows if r["method"] == m and r["k"] == k]
            if hit and hit[0].get("missing"):
                ax.text(j, (len(study.depths) - 1) / 2, "missing", ha="center", va="center", fontsize=7)
            for di, d in enumerate(study.depths):
                c = [c for c in hit[0]["cells"] if c["depth"] == d] if hit else []
                if c:
                    grid[di][j] = c[0]["correct"] / c[0]["trials"]
                    mark = "=" if hit[0].get("same_as") else ""
                    ax.text(j, di, f"{mark}{c[0]['correct']}/{c[0]['trials']}", ha="center", va="center",
                            fontsize=7, color="white" if grid[di][j] < 0.6 else "black")
        im = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto")
        ax.set_xticks(range(len(study.factors)))
        ax.set_xticklabels([f"{factor_label(k)}\n{study.ctx(k) - study.answer_tokens}" for k in study.factors],
                           fontsize=7)
        ax.set_yticks(range(len(study.depths)))
        ax.set_yticklabels([num(d) for d in study.depths], fontsize=7)
        ax.set_title(m if m != "sinks" else f"sinks ({SINKS})", fontsize=9)
        if i % ncol == 0:
            ax.set_ylabel("key depth")
    fig.suptitle(f"{study.title}: passkey accuracy by prompt length (tokens) and key depth; L = {study.L}"
                 + ("\n=: none's run (no scaling up to L)" if any(r.get("same_as") for r in rows) else ""),
                 fontsize=10)
    fig.tight_layout()
    if im is not None:
        fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.6, label="correct / trials")
    name = f"passkey_{study.title}.png"
    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    return name


def made_by(meta):
    """table.md's opening sentence: how the cells were run (one machine) or gathered (--collect)."""
    cpu = f"{meta.get('cpu_s', 0) / 60:.0f} minutes"
    if "collected_files" in meta:
        return (f"Collected by `{meta['command']}` from {meta['collected_files']} cell files in "
                f"{meta['collected_folders']} folder{'s' if meta['collected_folders'] != 1 else ''}, run where and "
                f"when their commands (`tools/extrapolation.py --list`) were; the cells' wall times times their "
                f"threads add up to {meta.get('cpu_s', 0) / 60:.1f} CPU-minutes (by study and factor at the end). "
                "Every cell's command is listed under its table; they run from the repository root.")
    threads = meta.get("threads", 1)
    return (f"Made by `{meta['command']}` in {meta['wall_s'] / 60:.1f} minutes: {meta['jobs']} runs at a time, "
            f"{'one thread' if threads == 1 else f'{threads} threads'} each, on {meta['cpus']} cores (1-minute load "
            f"average {meta.get('load_before', '?')} before the study, so other work shared the cores; the runs' "
            f"wall times{' times their threads' if threads != 1 else ''} add up to {cpu}). Every cell's command is "
            "listed under its table; they run from the repository root.")


def cost_table(meta):
    """Markdown lines: CPU time (wall x threads) by study and factor, from
    meta's cost (written by collect); nothing without it."""
    cost = meta.get("cost")
    if not cost:
        return []
    lines = ["## What the cells cost", "",
             "CPU time of each cell is its wall time times its threads, as the cell's file records them; the cells "
             "shared their machines with whatever else ran there, so these are what the runs took, not a benchmark.",
             "", "| study | factor | cells | missing | CPU-minutes | longest cell, CPU-minutes |",
             "|---|---:|---:|---:|---:|---:|"]
    for g in cost:
        lines.append(f"| {g['study']} | {factor_label(g['k'])} | {g['cells']} | {g['missing']} | "
                     f"{g['cpu_s'] / 60:.2f} | {g['longest_s'] / 60:.2f} |")
    total = sum(g["cpu_s"] for g in cost)
    missing = len(meta.get("missing", []))  # with those of studies of which no cell came
    lines += ["", f"In all {total / 60:.2f} CPU-minutes ({total / 3600:.2f} CPU-hours)"
              + (f", without the {missing} missing cell{'s' if missing != 1 else ''}." if missing else "."), ""]
    kept = meta.get("kept_trials")
    if kept:
        lines += ["Missing cells with finished trials kept (NAME.parts beside the cell files; running the cell goes "
                  "on from them): " + ", ".join(f"{n} ({k} trial{'s' if k != 1 else ''})" for n, k in kept.items())
                  + ".", ""]
    return lines


def kept_trials(folders, missing):
    """{name: trials kept} for the missing cells that have finished trials
    in a NAME.parts folder in one of the folders (passkey_by_trials writes
    them for passkey cells; a trial kept in two folders counts twice)."""
    kept = {}
    for name in missing:
        n = sum(len(list((Path(f) / f"{name}.parts").glob("trial-*.json"))) for f in folders)
        if n:
            kept[name] = n
    return kept


def plotted_factor(study, ppl):
    """The k whose cells nll_vs_position.png draws for a perplexity study: the
    largest with a result (a study still missing its largest k shows the next)."""
    have = {r["k"] for r in ppl if r["model"] == study.name and measured(r)}
    done = [k for k in study.factors if k in have]
    return max(done) if done else max(study.factors)


def add_position_bins(ppl, studies):
    """position_bins() of the cells nll_vs_position.png draws (each perplexity
    study's largest k with results: plotted_factor), on those cells and no
    other: results.json keeps them, not the per-position values, so that
    --replot can draw the plot again. A cell file holds its bins already
    (run_cell); per-position values, where a result still has them, are
    binned here."""
    for s in studies:
        if s.kind != "ppl":
            continue
        kmax = plotted_factor(s, ppl)
        for r in ppl:
            if r["model"] != s.name:
                continue
            if r["k"] != kmax:
                r.pop("position_bins", None)
            elif r.get("per_position"):
                r["position_bins"] = position_bins(r["per_position"])


def draw_plots(ppl, passkey, studies, out):
    """The plots of the studies (file names, in out)."""
    files = plot_ppl(ppl, [s for s in studies if s.kind == "ppl"], out)
    for s in studies:
        if s.kind == "passkey":
            name = plot_passkey(s, passkey, out)
            if name:
                files.append(name)
    return files


def write_outputs(ppl, passkey, studies, out, meta):
    """results.json, results.csv, passkey.csv, table.md and the plots."""
    out.mkdir(parents=True, exist_ok=True)
    add_position_bins(ppl, studies)
    slim_ppl = [{k: v for k, v in r.items() if k != "per_position"} for r in ppl]
    (out / "results.json").write_text(json.dumps(dict(meta=meta, ppl=slim_ppl, passkey=passkey), indent=1) + "\n")
    write_csvs(slim_ppl, passkey, out)
    files = ["results.json", "results.csv", "passkey.csv", "table.md"]
    lines = [f"# Extrapolation study: tables", "", made_by(meta), ""] + PREAMBLE
    for s in studies:
        lines += ppl_table(s, ppl) if s.kind == "ppl" else passkey_table(s, passkey)
    lines += absent_studies(meta) + cost_table(meta)
    (out / "table.md").write_text("\n".join(lines))
    return files + draw_plots(ppl, passkey, studies, out)


def replot(out):
    """--replot: draw the plots again from out/results.json, running nothing.
    The studies' methods (their order) are FULL's; the factors, depths and
    training contexts are the results'. Returns the files drawn, and a message for
    nll_vs_position.png when results.json has no position bins (results made
    before they were saved): that plot is then left as it is."""
    try:
        saved = json.loads((out / "results.json").read_text())
        ppl, passkey = saved["ppl"], saved["passkey"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise RuntimeError(f"{out / 'results.json'}: cannot read the results ({e})") from None
    studies = []
    for name, cfg in FULL.items():
        rows = [r for r in (ppl if cfg["kind"] == "ppl" else passkey) if r["model"] == name]
        if rows:
            depths = sorted({c["depth"] for r in rows for c in r.get("cells", [])})
            studies.append(Study(name, cfg["kind"], "", None, rows[0]["train_ctx"], sorted({r["k"] for r in rows}),
                                 cfg["rows"], depths=depths, at=cfg.get("at"), chat=cfg.get("chat", False)))
    messages = []
    if not any(r.get("position_bins") for r in ppl):
        messages.append("results.json holds no position bins (it was made before the study saved them): "
                        "nll_vs_position.png left as it is; the next make extrapolation (or --collect) saves them")
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        files = draw_plots(ppl, passkey, studies, Path(tmp))
        for name in files:
            if name != "nll_vs_position.png" or not messages:
                (Path(tmp) / name).replace(out / name)
    return [f for f in files if f != "nll_vs_position.png" or not messages], messages


# --------------------------------------------------------------------------
# Preparing the studies

def prefix_bytes(text, max_tokens, count):
    """(prefix, bytes): the longest prefix of text cut at white space with at
    most max_tokens tokens, and its length in UTF-8 bytes (for head -c)."""
    # search a slice a little longer than needed, estimated from a sample
    sample = text[:20000]
    per_token = len(sample) / max(1, count(sample))
    limit = min(len(text), int(max_tokens * per_token * 1.5) + 1000)
    end, _ = longest_piece(text[:limit], 0, max_tokens, count)
    if end == limit and limit < len(text):
        raise RuntimeError("prefix_bytes: the estimate of characters per token was too low")
    prefix = text[:end]
    return prefix, len(prefix.encode("utf-8"))


def make_studies(config, work, tokens_override=None, passkey_ckpt=None):
    """Study objects for the names in config whose files exist; a message for each missing one."""
    work = Path(work)
    studies, heldout = [], None
    heldout_recipe = ".venv/bin/python tools/prepare_data.py --heldout heldout.txt"

    def need_heldout():
        nonlocal heldout
        if heldout is None:
            if not (SHARED / "data" / "books").is_dir():
                return None
            import prepare_data
            heldout = prepare_data.heldout_text(SHARED)
            (work / "heldout.txt").write_text(heldout, encoding="utf-8")
        return heldout

    def skip(name, why):
        print(f"extrapolation: skipping {name} ({why})", file=sys.stderr)

    def ppl_study(name, ckpt, tok, text, fname, source, data, cfg):
        """A perplexity study on the longest prefix of text (the file source,
        as a user names it) with at most the study's tokens."""
        count = TokenCounter(ckpt, tok, work)
        n = tokens_override or cfg["tokens"]
        prefix, nbytes = prefix_bytes(text, n, count)
        (work / fname).write_bytes(prefix.encode("utf-8"))
        recipe = ([heldout_recipe] if source == "heldout.txt" else []) + [f"head -c {nbytes} {source} > {fname}"]
        return Study(name, "ppl", ckpt, tok, train_ctx(ckpt), cfg["factors"], cfg["rows"], data=data,
                     text=work / fname, text_recipe=recipe, tokens=n, at=cfg.get("at"), note=cfg.get("note", ""))

    books_desc = "held-out books (Moby Dick, Pride and Prejudice) from their start"
    for name, cfg in config.items():
        if name == "bundled":
            ckpt = ROOT / "models" / "model.bin"
            if not ckpt.is_file() or need_heldout() is None:
                skip(name, "models/model.bin or ../shared/data/books absent")
                continue
            studies.append(ppl_study(name, ckpt, None, heldout, "books.txt", "heldout.txt", books_desc, cfg))
        elif name == "stories260K":
            ckpt, tok = SHARED / "models" / "stories260K.bin", SHARED / "models" / "tok512.bin"
            src = SHARED / "data" / "tinystories" / "tinystories_valid_head.txt"
            if not (ckpt.is_file() and tok.is_file() and src.is_file()):
                skip(name, "../shared/models or ../shared/data/tinystories absent")
                continue
            studies.append(ppl_study(name, ckpt, tok, src.read_text(encoding="utf-8"), "stories.txt", Where().path(src),
                                     "TinyStories validation stream", cfg))
        elif name == "smollm2":
            ckpt = ROOT / "models" / "smollm2" / "model-q8_0.bin"
            if not ckpt.is_file() or need_heldout() is None:
                skip(name, "models/smollm2/model-q8_0.bin (make smollm2) or ../shared/data/books absent")
                continue
            studies.append(ppl_study(name, ckpt, None, heldout, "smollm2-books.txt", "heldout.txt", books_desc,
                                     cfg))
        elif name in ("retrieval", "smollm2-passkey", "smollm2-chat"):
            if name == "retrieval":
                ckpt = Path(passkey_ckpt) if passkey_ckpt else ROOT / "models" / "retrieval" / "model.bin"
            else:
                ckpt = ROOT / "models" / "smollm2" / "model-q8_0.bin"
            if not ckpt.is_file() or need_heldout() is None:
                skip(name, f"{Where().path(ckpt)} or ../shared/data/books absent")
                continue
            studies.append(Study(name, "passkey", ckpt, None, train_ctx(ckpt), cfg["factors"], cfg["rows"],
                                 depths=cfg["depths"], trials=cfg["trials"], at=cfg.get("at"), note=cfg.get("note", ""),
                                 chat=cfg.get("chat", False),
                                 filler=work / "heldout.txt",
                                 text_recipe=[heldout_recipe], data="held-out books"))
        else:
            raise ValueError(f"unknown study {name!r}")
    return studies


def train_ctx(path):
    """Training context of a checkpoint (any format run reads), as run reports it."""
    p = subprocess.run([str(RUN), str(path), "-m", "rope", "--json"], capture_output=True)
    if p.returncode != 0:
        raise RuntimeError(f"{path}: {p.stderr.decode(errors='replace').strip()}")
    return json.loads(p.stdout)["orig_ctx"]


# --------------------------------------------------------------------------
# Fan-out: every cell a command of its own that writes one file; --collect
# builds the outputs from a set of such files, wherever they were made.

CELL_FORMAT = "extrapolation-cell/1"  # a cell file's "format"; --collect reads no other


def make_plan(quick=False, studies=None, tokens=None, passkey_model=None):
    """What a study measures, as the options that choose it: --quick,
    --studies (None: every study of the configuration), --tokens and
    --passkey-model (relative to the repository root). Every cell file records
    its plan; --collect expects the plan's cells."""
    plan = dict(quick=bool(quick), studies=list(studies) if studies else None, tokens=tokens,
                passkey_model=passkey_model)
    if plan["studies"] == list(QUICK if quick else FULL):
        plan["studies"] = None  # the same plan, however it was typed
    return plan


def plan_config(plan):
    """The plan's studies: name -> settings (QUICK's where --quick has them)."""
    if plan["studies"] is None:
        return dict(QUICK if plan["quick"] else FULL)
    return {n: (QUICK.get(n) or FULL[n]) if plan["quick"] else FULL[n] for n in plan["studies"]}


def plan_args(plan):
    """The options that make the plan, for a command line."""
    args = ["--quick"] if plan["quick"] else []
    if plan["studies"] is not None:
        args += ["--studies", ",".join(plan["studies"])]
    if plan["tokens"]:
        args += ["--tokens", str(plan["tokens"])]
    if plan["passkey_model"]:
        args += ["--passkey-model", plan["passkey_model"]]
    return args


def plan_of_studies(plan, studies):
    """The plan narrowed to the studies made (those whose files are here), so
    that --collect expects no cell of a study skipped for its absent files."""
    return make_plan(plan["quick"], [s.name for s in studies], plan["tokens"], plan["passkey_model"])


def all_jobs(studies, where):
    """Every cell the studies run."""
    return [j for s in studies for j in (ppl_jobs(s, where) if s.kind == "ppl" else passkey_jobs(s, where))]


def cell_command(plan, name, threads, results):
    """The shell command, run from the repository root, that runs one cell
    with `threads` threads and writes RESULTS/NAME.json."""
    args = [".venv/bin/python", "tools/extrapolation.py", "--cell", name] + plan_args(plan) + \
        ["--threads", str(threads), "--results", str(results)]
    return " ".join(shlex.quote(a) for a in args)


def study_record(s):
    """What --collect needs of a study (every field but its files' folder),
    the paths as the commands show them."""
    w = Where()
    return dict(name=s.name, kind=s.kind, ckpt=w.path(s.ckpt), tok=w.path(s.tok) if s.tok else None, L=s.L,
                factors=list(s.factors), rows=list(s.rows), data=s.data,
                text=Path(s.text).name if s.text else None, text_recipe=s.text_recipe, tokens=s.tokens,
                depths=list(s.depths), trials=s.trials, filler=Path(s.filler).name if s.filler else None,
                at={num(k): d for k, d in s.at.items()}, note=s.note, chat=s.chat)


def study_from_record(d):
    """The Study of a record, its files where the shown commands name them
    (the text files by name, as if in the repository root)."""
    def path(p):
        if p is None:
            return None
        return SHARED / p[len("../shared/"):] if p.startswith("../shared/") else ROOT / p

    def number(x):
        return int(x) if float(x).is_integer() else float(x)

    return Study(d["name"], d["kind"], path(d["ckpt"]), path(d["tok"]), d["L"], [number(k) for k in d["factors"]],
                 d["rows"], data=d["data"], text=path(d["text"]), text_recipe=d["text_recipe"], tokens=d["tokens"],
                 depths=d["depths"], trials=d["trials"], filler=path(d["filler"]),
                 at={number(k): v for k, v in d["at"].items()}, note=d["note"], chat=d.get("chat", False))


def outcome(kind, result):
    """A cell's result in a few characters, for the progress lines."""
    if kind == "ppl":
        return f"ppl {result['ppl']:9.3f}"
    return f"passkey {sum(c['correct'] for c in result['cells'])}/{sum(c['trials'] for c in result['cells'])}"


def run_cell(job, plan, threads, results):
    """Run one cell with `threads` threads per run and write RESULTS/NAME.json:
    the plan, the study, the cell's wall time and threads, and its result
    (with its command). Written under a temporary name and renamed, so a cell
    that fails or is stopped leaves no file. A passkey cell keeps its
    finished trials in RESULTS/NAME.parts until then (passkey_by_trials), so
    that running it again goes on where it stopped; its wall time is its
    trials' over every run, and resumed_trials says how many an earlier run
    made. Returns the record."""
    t0, load0 = time.time(), os.getloadavg()[0]
    parts = Path(results) / f"{job['name']}.parts"
    r = job["run"](threads, parts)
    wall = time.time() - t0
    s = job["study"]
    resumed = 0
    if s.kind == "passkey":
        wall, resumed = r.get("wall_s", wall), r.get("resumed", 0)
    result = ppl_result(job, r) if s.kind == "ppl" else passkey_result(job, r)
    if "per_position" in result:  # the file keeps the plot's bins, a few kB, not a value per position
        result["position_bins"] = position_bins(result.pop("per_position"))
    rec = dict(format=CELL_FORMAT, cell=job["name"], plan=plan, study=study_record(s), threads=threads,
               wall_s=round(wall, 2), cpus=os.cpu_count(), load_before=round(load0, 2),
               finished=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), result=result)
    if resumed:
        rec["resumed_trials"] = resumed
    write_cell_file(Path(results) / f"{job['name']}.json", rec)
    shutil.rmtree(parts, ignore_errors=True)
    return rec


def read_cell_files(folders, pattern, fmt, what):
    """{name: record} of the files matching pattern in the folders (the fine-tune
    and attention studies' cells; this study's own go through read_cells):
    ValueError, one line naming the file, for a file that is not JSON of format
    fmt, or a cell found twice, and when there is no file at all."""
    cells = {}
    for folder in map(Path, folders):
        if not folder.is_dir():
            raise ValueError(f"--collect {folder}: no such folder")
        for f in sorted(folder.glob(pattern)):
            try:
                rec = json.loads(f.read_text(encoding="utf-8"))
            except (ValueError, UnicodeDecodeError) as e:
                raise ValueError(f"{f}: expected {what} cell file (JSON), got unreadable JSON ({e})") from None
            if not isinstance(rec, dict) or rec.get("format") != fmt:
                raise ValueError(f"{f}: expected format {fmt!r}")
            if rec["cell"] in cells:
                raise ValueError(f"{f}: cell {rec['cell']} collected twice; keep one")
            cells[rec["cell"]] = rec
    if not cells:
        raise ValueError(f"--collect {' '.join(map(str, folders))}: no {what} cell files ({pattern}) there")
    return cells


def write_cell_file(path, rec):
    """path := rec as JSON, written under a temporary name and renamed, so that a
    file there is a finished cell."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(rec) + "\n")
    os.replace(tmp, path)


def fanout_parser(description, results_help, out_help):
    """The command line the fine-tune and attention studies share with this one's
    fan-out: --list, --cell, --collect, --results, --out, --jobs, --threads."""
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--list", action="store_true", help="print every cell's command")
    ap.add_argument("--cell", metavar="NAME", help="run one cell (a name from --list)")
    ap.add_argument("--collect", nargs="+", type=Path, metavar="DIR", help="tables and plot from these folders")
    ap.add_argument("--results", type=Path, help=results_help)
    ap.add_argument("--out", type=Path, help=out_help)
    ap.add_argument("--jobs", type=int, help="cells at a time (default: one per core)")
    ap.add_argument("--threads", type=int, default=1, help="threads per cell (default 1)")
    return ap


def check_fanout_args(args, tool):
    """Exit with one line for two modes at once or a count below 1."""
    if sum(bool(x) for x in (args.list, args.cell, args.collect)) > 1:
        sys.exit(f"{tool}: expected at most one of --list, --cell, --collect")
    for flag, v in (("--jobs", args.jobs), ("--threads", args.threads)):
        if v is not None and v < 1:
            sys.exit(f"{tool}: {flag} {v}: expected at least 1")

def run_pool(tool, names, run, jobs):
    """run(name) for every name, `jobs` at a time, a progress line per cell done
    (the fine-tune and attention studies; this study's own cells go through
    run_cells, which also estimates the time left)."""
    t0 = time.time()
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(run, n): n for n in names}
        for i, f in enumerate(concurrent.futures.as_completed(futures), 1):
            f.result()
            print(f"{tool}: [{i}/{len(names)}] {futures[f]} done, {clock(time.time() - t0)} elapsed",
                  file=sys.stderr, flush=True)


def report_written(tool, files, out, missing=()):
    """The closing line of a collect: the files written, and the cells missing."""
    print(f"{tool}: wrote {', '.join(files)} in {out}" + (f"; missing {', '.join(missing)}" if missing else ""),
          file=sys.stderr)


def clock(seconds):
    """42 s, 3.5 min, 1.2 h."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def run_cells(jobs, plan, results, n_parallel, threads):
    """Run the cells, n_parallel at a time with `threads` threads each, the
    costliest first (so the pool ends evenly), each writing its file in
    results. Prints a line per cell: cells done / total, elapsed, and the time
    left as estimated from job_cost (rough). The first cell that fails raises
    RuntimeError once the cells already running end (the rest are cancelled)."""
    order = sorted(jobs, key=lambda j: -j["cost"])
    total, done_cost, t0 = sum(j["cost"] for j in order), 0.0, time.time()
    with concurrent.futures.ThreadPoolExecutor(max_workers=n_parallel) as pool:
        futures = {pool.submit(run_cell, j, plan, threads, results): j for j in order}
        try:
            for n, f in enumerate(concurrent.futures.as_completed(futures), 1):
                j, rec = futures[f], f.result()
                done_cost += j["cost"]
                elapsed = time.time() - t0
                left = elapsed * (total - done_cost) / done_cost if done_cost else 0.0
                print(f"[{n:{len(str(len(order)))}d}/{len(order)}] {j['study'].name:15s} {j['method']:14s} "
                      f"{factor_label(j['k']):>5s} ctx {j['ctx']:6d}: {outcome(j['study'].kind, rec['result'])} "
                      f"({rec['wall_s']:.0f} s); "
                      f"{clock(elapsed)} elapsed, about {clock(left)} left", file=sys.stderr, flush=True)
        except BaseException:
            for f in futures:
                f.cancel()
            raise


def read_cells(folders):
    """Every cell file (*.json) in the folders, as {name: record} and {name:
    file}. ValueError (one line, naming the file) unless each is a cell file
    named after its cell, all are of one plan, the cells of a study describe
    it alike, and no cell comes twice."""
    cells, where = {}, {}
    for folder in map(Path, folders):
        if not folder.is_dir():
            raise ValueError(f"--collect {folder}: no such folder")
        for f in sorted(folder.glob("*.json")):
            try:
                rec = json.loads(f.read_text(encoding="utf-8"))
            except (ValueError, UnicodeDecodeError) as e:
                raise ValueError(f"{f}: expected a cell file (JSON), got unreadable JSON ({e})") from None
            got = rec.get("format") if isinstance(rec, dict) else type(rec).__name__
            if got != CELL_FORMAT:
                raise ValueError(f"{f}: expected a cell file of format {CELL_FORMAT!r}, got format {got!r}")
            absent = [k for k in ("cell", "plan", "study", "threads", "wall_s", "result") if k not in rec]
            if absent:
                raise ValueError(f"{f}: a cell file without {', '.join(absent)}")
            name = rec["cell"]
            if name != f.stem:
                raise ValueError(f"{f}: holds cell {name}, expected {f.stem} (a cell's file is named after it)")
            if name in cells:
                raise ValueError(f"{f}: cell {name} is also in {where[name]}; keep one of them")
            cells[name], where[name] = rec, f
    if not cells:
        raise ValueError(f"--collect {' '.join(map(str, folders))}: no cell files (*.json) there")
    first = min(cells)
    study_seen = {}
    for name in sorted(cells):
        rec = cells[name]
        if rec["plan"] != cells[first]["plan"]:
            shown = [" ".join(plan_args(cells[n]["plan"])) or "the full study" for n in (name, first)]
            raise ValueError(f"{where[name]}: made by the plan {shown[0]!r}, expected {shown[1]!r} as {where[first]}")
        s = rec["study"]["name"]
        if s in study_seen and rec["study"] != cells[study_seen[s]]["study"]:
            raise ValueError(f"{where[name]}: describes study {s} unlike {where[study_seen[s]]} (another model, "
                             "text or checkout?)")
        study_seen.setdefault(s, name)
    return cells, where


def missing_row(job):
    """The result row of a cell without a file: missing=True, with its command."""
    s = job["study"]
    r = dict(model=s.name, method=job["method"], k=job["k"], ctx=job["ctx"])
    if s.kind == "passkey":
        r["length"] = job["length"]
    r.update(train_ctx=s.L, flags=job["flags"], command=job["shown"], missing=True)
    if s.kind == "passkey":
        r["cells"] = []
    return r


def config_cells(name, cfg):
    """(method, k) of the cells a study of the configuration runs; no files needed."""
    return Study(name, cfg["kind"], "", None, None, cfg["factors"], cfg["rows"], at=cfg.get("at")).cells()


def cost_groups(cells, jobs):
    """CPU time by (study, factor): cells measured and missing, their wall
    time times threads summed, and the longest cell's."""
    groups = {}
    for j in jobs:
        g = groups.setdefault((j["study"].name, j["k"]), dict(study=j["study"].name, k=j["k"], cells=0, missing=0,
                                                              cpu_s=0.0, longest_s=0.0))
        rec = cells.get(j["name"])
        if rec is None:
            g["missing"] += 1
            continue
        cpu = rec["wall_s"] * rec["threads"]
        g["cells"] += 1
        g["cpu_s"] = round(g["cpu_s"] + cpu, 2)
        g["longest_s"] = max(g["longest_s"], round(cpu, 2))
    return list(groups.values())


def collect(cells, meta):
    """(ppl results, passkey results, studies, meta) from the cell records:
    every cell of their plan, those without a file marked missing. meta
    gains the cells' CPU time and its groups, their wall times, and the
    studies of which no cell came."""
    plan = next(iter(cells.values()))["plan"]
    records = {}
    for name in sorted(cells):
        records.setdefault(cells[name]["study"]["name"], cells[name]["study"])
    studies, absent = [], {}
    for name, cfg in plan_config(plan).items():
        if name in records:
            studies.append(study_from_record(records[name]))
        else:
            absent[name] = [cell_name(name, m, k) for m, k in config_cells(name, cfg)]
    jobs = all_jobs(studies, Where())
    expected = {j["name"] for j in jobs}
    stray = sorted(set(cells) - expected)
    if stray:
        shown = " ".join(plan_args(plan)) or "the full study"
        raise ValueError(f"cell {stray[0]}: expected a cell of its plan ({shown}), got one it does not run")
    ppl, passkey = [], []
    for s in studies:
        for j in (ppl_jobs if s.kind == "ppl" else passkey_jobs)(s, Where()):
            rec = cells.get(j["name"])
            (ppl if s.kind == "ppl" else passkey).append(rec["result"] if rec else missing_row(j))
    ppl = fill_same_as_none(ppl, [s for s in studies if s.kind == "ppl"])
    passkey = fill_same_as_none(passkey, [s for s in studies if s.kind == "passkey"])
    key = lambda r: (r["model"], ROWS.index(r["method"]), r["k"])  # noqa: E731
    ppl.sort(key=key)
    passkey.sort(key=key)
    ran = [j for j in jobs if j["name"] in cells]
    meta = dict(meta, cpu_s=round(sum(cells[j["name"]]["wall_s"] * cells[j["name"]]["threads"] for j in ran), 1),
                run_seconds={f"{j['study'].name} {j['method']} {factor_label(j['k'])}": cells[j["name"]]["wall_s"]
                             for j in ran},
                run_threads=sorted({cells[j["name"]]["threads"] for j in ran}),
                missing=sorted(expected - set(cells)) + [n for names in absent.values() for n in names],
                cost=cost_groups(cells, jobs))
    if absent:
        meta["absent_studies"] = absent
    return ppl, passkey, studies, meta


def absent_studies(meta):
    """Markdown lines for the studies of the plan of which no cell was collected."""
    lines = []
    for name, names in meta.get("absent_studies", {}).items():
        lines += [f"### {name}: no cell collected", "",
                  f"All {len(names)} cells of this study are missing (no file among those collected): "
                  f"{', '.join(names)}. `tools/extrapolation.py --list` gives their commands.", ""]
    return lines


def shown_folder(p):
    """A folder as table.md names it: relative to the repository, else its name."""
    return Where().path(Path(p))


# --------------------------------------------------------------------------
# The command line: the whole study here, --list, --cell, --collect, --stream-cell

def stream_cell_main(args):
    """--stream-cell: one sinks cell, its JSON on stdout."""
    if not args.window or not args.ctx:
        sys.exit("extrapolation: --stream-cell needs --window E and --ctx L")
    ckpt, text = map(Path, args.stream_cell)
    for p in (ckpt, text):
        if not p.is_file():
            sys.exit(f"extrapolation: {p}: no such file")
    with tempfile.TemporaryDirectory() as tmp:
        work = args.segments or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        try:
            r = stream_cell(ckpt, args.tok, text, args.window, args.ctx, work, threads=args.threads or 1)
        except (RuntimeError, ValueError) as e:
            sys.exit(f"extrapolation: {e}")
    if args.segments:
        print(f"extrapolation: segments and the command of each: {args.segments}, {r['segment_command']}",
              file=sys.stderr)
    r.pop("segment_command")
    print(json.dumps(r))


def prepare(plan, work):
    """The plan's studies with their texts made in work (those whose files are
    here), and the plan narrowed to them; exits with a message on failure."""
    try:
        model = ROOT / plan["passkey_model"] if plan["passkey_model"] else None
        studies = make_studies(plan_config(plan), work, plan["tokens"], model)
    except (RuntimeError, ValueError) as e:
        sys.exit(f"extrapolation: {e}")
    if not studies:
        sys.exit("extrapolation: no study to run (see the messages above)")
    return studies, plan_of_studies(plan, studies)


def list_main(plan, threads, results):
    """--list: every cell's command, the costliest first (so that a pool that
    takes them in order ends evenly)."""
    with tempfile.TemporaryDirectory() as work:
        studies, plan = prepare(plan, work)
        jobs = sorted(all_jobs(studies, Where(work)), key=lambda j: -j["cost"])
    for j in jobs:
        print(cell_command(plan, j["name"], threads, results))
    print(f"extrapolation: {len(jobs)} cells, the costliest first, each writing {results}/NAME.json"
          + f"; then: .venv/bin/python tools/extrapolation.py --collect {results}", file=sys.stderr)


def cell_main(name, plan, threads, results):
    """--cell: run one cell of the plan (its text made here) and write its file."""
    try:
        study, _, _ = parse_cell_name(name)
    except ValueError as e:
        sys.exit(f"extrapolation: --cell {e}")
    config = plan_config(plan)
    if study not in config:
        sys.exit(f"extrapolation: --cell {name}: expected a study of the plan ({', '.join(config)}), got {study}")
    with tempfile.TemporaryDirectory() as work:
        studies, _ = prepare(dict(plan, studies=[study]), work)
        jobs = [j for j in all_jobs(studies, Where(work)) if j["name"] == name]
        if not jobs:
            sys.exit(f"extrapolation: --cell {name}: not a cell this plan runs (`--list` with the same options "
                     "names them)")
        try:
            rec = run_cell(jobs[0], plan, threads, results)
        except RuntimeError as e:
            sys.exit(f"extrapolation: {e}")
    print(f"extrapolation: {name}: {outcome(studies[0].kind, rec['result']).strip()} in {clock(rec['wall_s'])} "
          f"on {threads} thread{'s' if threads != 1 else ''}; wrote {Path(results) / (name + '.json')}",
          file=sys.stderr)


def default_out(plan):
    """docs/extrapolation, or for --quick a new temporary folder (never the study's)."""
    return Path(tempfile.mkdtemp(prefix="extrapolation-quick-")) if plan["quick"] else ROOT / "docs" / "extrapolation"


def collect_main(folders, out):
    """--collect: the tables and plots from the cell files in the folders."""
    try:
        cells, _ = read_cells(folders)
        plan = next(iter(cells.values()))["plan"]
        meta = dict(command="tools/extrapolation.py --collect " + " ".join(shown_folder(f) for f in folders),
                    collected_files=len(cells), collected_folders=len(set(folders)))
        ppl, passkey, studies, meta = collect(cells, meta)
    except ValueError as e:
        sys.exit(f"extrapolation: {e}")
    kept = kept_trials(folders, meta["missing"])
    if kept:
        meta["kept_trials"] = kept
    out = out or default_out(plan)
    files = write_outputs(ppl, passkey, studies, out, meta)
    missing = meta["missing"]
    print(f"extrapolation: {len(cells)} cells collected, {len(missing)} missing"
          + (f" ({', '.join(missing[:8])}{', ...' if len(missing) > 8 else ''})" if missing else "")
          + (f", {sum(kept.values())} trials of them kept" if kept else "")
          + f"; wrote {', '.join(files)} in {out}", file=sys.stderr)


def study_main(plan, out, n_jobs, threads, results):
    """The whole study on this machine: its cells, n_jobs at a time, each
    writing its file in results (a temporary folder unless given; a cell whose
    file is already there is not run again), then collected into out."""
    t0, load0 = time.time(), os.getloadavg()[0]
    command = " ".join([".venv/bin/python tools/extrapolation.py"] + plan_args(plan))
    with tempfile.TemporaryDirectory() as work, tempfile.TemporaryDirectory() as tmp_results:
        studies, plan = prepare(plan, work)
        jobs = all_jobs(studies, Where(work))
        results = Path(results or tmp_results)
        try:
            have, where = read_cells([results]) if results.is_dir() and any(results.glob("*.json")) else ({}, {})
        except ValueError as e:
            sys.exit(f"extrapolation: {e}")
        records = {s.name: json.loads(json.dumps(study_record(s))) for s in studies}
        for name, rec in have.items():
            if rec["plan"] != plan:
                sys.exit(f"extrapolation: {where[name]}: made by another plan ({' '.join(plan_args(rec['plan']))})"
                         f"; give another --results folder")
            if rec["study"]["name"] in records and rec["study"] != records[rec["study"]["name"]]:
                sys.exit(f"extrapolation: {where[name]}: made with other settings of study {rec['study']['name']} "
                         "(its text, tokens, methods or factors changed since); move it away to run it again")
        for name in have:  # a cell whose file was written but whose kept trials were not removed (stopped
            shutil.rmtree(results / f"{name}.parts", ignore_errors=True)  # between the two): they are in the file
        todo = [j for j in jobs if j["name"] not in have]
        print(f"extrapolation: {len(jobs)} cells, {n_jobs} at a time, {threads} thread{'s' if threads != 1 else ''} "
              f"each" + (f"; {len(jobs) - len(todo)} already in {results}" if len(todo) < len(jobs) else ""),
              file=sys.stderr)
        try:
            run_cells(todo, plan, results, n_jobs, threads)
            cells, _ = read_cells([results])
            meta = dict(command=command, wall_s=round(time.time() - t0, 1), jobs=n_jobs, threads=threads,
                        cpus=os.cpu_count(), load_before=round(load0, 2), load_after=round(os.getloadavg()[0], 2))
            ppl, passkey, studies, meta = collect(cells, meta)
        except (RuntimeError, ValueError) as e:
            sys.exit(f"extrapolation: {e}")
        out = out or default_out(plan)
        files = write_outputs(ppl, passkey, studies, out, meta)
    print(f"extrapolation: {meta['wall_s'] / 60:.1f} min; wrote {', '.join(files)} in {out}", file=sys.stderr)


def build_parser():
    """The command line's options (main reads them; the tests parse --list's commands with them)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="output folder (default docs/extrapolation; --quick: a new temporary one)")
    ap.add_argument("--quick", action="store_true", help="a small subset (every kind of cell), a few minutes")
    ap.add_argument("--studies", help="comma-separated subset of: " + ", ".join(FULL))
    ap.add_argument("--tokens", type=int, help="evaluation text per perplexity study, tokens (default per study)")
    ap.add_argument("--jobs", type=int, help="cells at a time (default: one per core)")
    ap.add_argument("--threads", type=int, help="threads per cell (default: cores / jobs, at least 1; "
                    "--list, --cell and --stream-cell: 1)")
    ap.add_argument("--passkey-model", type=Path, help="checkpoint for the retrieval study "
                    "(default models/retrieval/model.bin)")
    ap.add_argument("--list", action="store_true", help="print every cell's command (one line each, the costliest "
                    "first), which writes RESULTS/CELL.json")
    ap.add_argument("--cell", metavar="NAME", help="run one cell (a name from --list) and write RESULTS/NAME.json")
    ap.add_argument("--results", type=Path, help="the cell files' folder (--list, --cell: default results; the "
                    "whole study: a temporary one, else cells already there are not run again)")
    ap.add_argument("--collect", nargs="+", action="extend", type=Path, metavar="DIR",
                    help="make the tables and plots from the cell files in these folders (repeatable)")
    ap.add_argument("--stream-cell", nargs=2, metavar=("CKPT", "TEXT"),
                    help="score one sinks cell: TEXT in segments of --window tokens, each streamed through a "
                         "rolling cache of --ctx tokens with 4 sinks; prints the combined JSON")
    ap.add_argument("--window", type=int, help="--stream-cell: tokens per segment, BOS included")
    ap.add_argument("--ctx", type=int, help="--stream-cell: the rolling cache's size (the training context)")
    ap.add_argument("-z", dest="tok", type=Path, help="--stream-cell: tokenizer, if not tokenizer.bin beside CKPT")
    ap.add_argument("--segments", type=Path, help="--stream-cell: keep the segment files in this folder")
    ap.add_argument("--replot", action="store_true",
                    help="run nothing: draw the plots again from the results.json in --out (default docs/extrapolation)")
    return ap


def plan_from_args(args):
    """The plan the options choose; exits with a one-line message on a bad option."""
    names = args.studies.split(",") if args.studies else None
    bad = [n for n in names or [] if n not in FULL]
    if bad:
        sys.exit(f"extrapolation: unknown stud{'ies' if len(bad) > 1 else 'y'} {', '.join(bad)} "
                 f"(expected some of {', '.join(FULL)})")
    if args.tokens is not None and args.tokens < 16:
        sys.exit(f"extrapolation: --tokens {args.tokens}: expected at least 16")
    model = args.passkey_model
    if model is not None:  # relative to the repository root, as the listed commands run there
        model = model.resolve()
        model = str(model.relative_to(ROOT)) if model.is_relative_to(ROOT) else str(model)
    return make_plan(args.quick, names, args.tokens, model)


def main(argv=None):
    args = build_parser().parse_args(argv)
    modes = [m for m, on in (("--list", args.list), ("--cell", args.cell), ("--collect", args.collect),
                             ("--stream-cell", args.stream_cell), ("--replot", args.replot)) if on]
    if len(modes) > 1:
        sys.exit(f"extrapolation: expected at most one of --list, --cell, --collect, --stream-cell, --replot, got "
                 f"{' and '.join(modes)}")
    if args.replot:
        out = args.out or ROOT / "docs" / "extrapolation"
        try:
            files, messages = replot(out)
        except RuntimeError as e:
            sys.exit(f"extrapolation: {e}")
        for m in messages:
            print(f"extrapolation: {m}", file=sys.stderr)
        print(f"extrapolation: drew {', '.join(files)} in {out} from results.json", file=sys.stderr)
        return
    for flag, v in (("--jobs", args.jobs), ("--threads", args.threads)):
        if v is not None and v < 1:
            sys.exit(f"extrapolation: {flag} {v}: expected at least 1")
    if args.collect:
        given = [f for f, v in (("--quick", args.quick), ("--studies", args.studies), ("--tokens", args.tokens),
                                ("--passkey-model", args.passkey_model)) if v]
        if given:
            sys.exit(f"extrapolation: --collect takes its plan from the cell files; expected no {', '.join(given)}")
        collect_main(args.collect, args.out)
        return
    if not RUN.is_file():
        sys.exit(f"extrapolation: {RUN.name} not found; build it with `make`")
    if args.stream_cell:
        stream_cell_main(args)
        return
    plan = plan_from_args(args)
    if args.list:
        list_main(plan, args.threads or 1, args.results or Path("results"))
    elif args.cell:
        cell_main(args.cell, plan, args.threads or 1, args.results or Path("results"))
    else:
        cpus = os.cpu_count() or 1
        n_jobs = args.jobs or cpus
        threads = args.threads or max(1, cpus // n_jobs)
        if n_jobs * threads > cpus:
            print(f"extrapolation: --jobs {n_jobs} x --threads {threads} = {n_jobs * threads} threads on {cpus} "
                  "cores: the cells' times (and CPU-hours) will include the waiting", file=sys.stderr)
        study_main(plan, args.out, n_jobs, threads, args.results)


if __name__ == "__main__":
    main()
