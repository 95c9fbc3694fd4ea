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
              E - 9 tokens (room for the 9-token answer), T keys per cell.

Studies (each skipped with a message when its files are absent):
  bundled      perplexity, models/model.bin (L = 256) on the held-out books, k = 1..16
  stories260K  perplexity, ../shared/models/stories260K.bin (L = 512) on TinyStories
               validation text, k = 1..16
  retrieval    passkey, models/retrieval/model.bin (the bundled model's recipe trained
               with passkey samples, L = 256), k = 1..16, every method
  smollm2      perplexity and passkey, models/smollm2/model-q8_0.bin (`make smollm2`;
               SmolLM2-135M-Instruct, L = 8192), k = 1/4, 1/2, 1, 2, methods none,
               ntk, yarn, self-extend, sinks; few windows and trials (it scores about
               60-100 tokens/s on one core), which its tables say; at 2x Self-Extend
               and sinks are left out (sinks go token by token, an hour or more;
               Self-Extend did too when the results were made, and takes minutes now)

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
                  and each segment is streamed token by token through the cache
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
    results.json          every cell: its command, scores, passkey trials; the run's timing
    results.csv           one row per perplexity cell
    passkey.csv           one row per passkey cell (study, method, k, depth)
    table.md              the tables, with the command that reproduces every cell
    ppl_vs_ctx.png        perplexity against context, one panel per study, 95% bars
    nll_vs_position.png   NLL by in-window position at the largest k, with a 95% band
    passkey_<study>.png   passkey accuracy heatmaps (length x depth), one panel per method

Texts (made here, in a temporary folder; table.md states the same commands):
    heldout.txt   .venv/bin/python tools/prepare_data.py --heldout heldout.txt
    books.txt     head -c N heldout.txt > books.txt  (N: the longest prefix, cut at
                  white space, with at most --tokens tokens)
    smollm2-books.txt, stories.txt likewise (stories.txt from TinyStories validation)

Usage:
    .venv/bin/python tools/extrapolation.py [--out DIR] [--jobs J] [--studies a,b] [--tokens N]
    .venv/bin/python tools/extrapolation.py --quick        # a small subset, a few minutes
    .venv/bin/python tools/extrapolation.py --stream-cell CKPT TEXT --window E --ctx L [-z TOK]
(`make extrapolation` runs it with the defaults, about an hour on 2 cores;
`make extrapolation EXTRAPOLATION_ARGS=--quick` the subset. --quick writes to a
new temporary folder unless --out is given, so it never replaces the study.)
"""
import argparse
import concurrent.futures
import csv
import json
import math
import os
import re
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
SMOL_FACTORS = (0.25, 0.5, 1, 2)
METHODS = ("none", "linear", "ntk", "dynamic-hf", "dynamic-exact", "yarn", "llama3", "self-extend")
ROWS = METHODS + ("sinks",)
SMOL_ROWS = ("none", "ntk", "yarn", "self-extend", "sinks")
SINKS = 4
DEPTHS = (0, 0.25, 0.5, 0.75, 1)
ANSWER_TOKENS = 5 + 4  # run -m passkey's default: 5-digit keys, answered in digits + 4 tokens
Z95 = 1.96

# The studies: what each measures and how much. "tokens": the evaluation text's
# size (at most; a prefix cut at white space); "trials": passkey keys per
# (length, depth) cell, or a dict k -> trials.
FULL = {
    "bundled": dict(kind="ppl", factors=FACTORS, rows=ROWS, tokens=16384),
    "stories260K": dict(kind="ppl", factors=FACTORS, rows=ROWS, tokens=16384),
    "retrieval": dict(kind="passkey", factors=FACTORS, rows=ROWS, depths=DEPTHS, trials=5),
    # Self-Extend and sinks went token by token through the pre-RoPE cache
    # when these results were made; on SmolLM2 at 2x (one window of 16384
    # tokens) each such cell was still running after 15 CPU-minutes: not run.
    # Self-Extend now goes in blocks (run.c, rope_stage): its 2x cell took 217 s
    # on 2 threads by hand (docs/long-context.md); sinks still go token by token.
    "smollm2": dict(kind="ppl", factors=SMOL_FACTORS, rows=SMOL_ROWS, tokens=16384,
                    at={2: dict(rows=("none", "ntk", "yarn"))},
                    note="sinks score SmolLM2 token by token through the pre-RoPE cache: at 2x a cell was still "
                         "running after 15 CPU-minutes, about an hour or more; Self-Extend, left out with it when it "
                         "went token by token too, now goes in blocks (its 2x cell took 217 s on 2 threads)"),
    # A 16k-token prompt costs SmolLM2 5-6 CPU-minutes (none, yarn), and more
    # than twice that through the pre-RoPE cache of sinks (and of Self-Extend
    # when these results were made; it goes in blocks now): at 2x one key, at
    # depth 0 (the farthest), for none and yarn; the rest not run.
    "smollm2-passkey": dict(kind="passkey", factors=SMOL_FACTORS, rows=SMOL_ROWS, depths=(0, 0.5, 1), trials=1,
                            at={0.25: dict(trials=2), 0.5: dict(trials=2),
                                2: dict(rows=("none", "yarn"), depths=(0,))},
                            note="a prompt of 16k tokens takes SmolLM2 minutes on one core"),
}
# --quick: every kind of cell (every method, sinks, a passkey heatmap, SmolLM2's
# "= none" cells) on little text, a few minutes on 2 cores.
QUICK = {
    "bundled": dict(kind="ppl", factors=(1, 4), rows=ROWS, tokens=2048),
    "retrieval": dict(kind="passkey", factors=(1, 4), rows=ROWS, depths=(0, 0.5, 1), trials=1),
    "smollm2": dict(kind="ppl", factors=(0.25,), rows=SMOL_ROWS, tokens=2048),
    "smollm2-passkey": dict(kind="passkey", factors=(0.25,), rows=SMOL_ROWS, depths=(0.5,), trials=1),
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
        if rp.is_relative_to(ROOT):
            return str(rp.relative_to(ROOT))
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


def passkey_command(ckpt, tok, filler, ctx, length, depths, trials, flags):
    return [RUN] + model_args(ckpt, tok) + [
        "-m", "passkey", "-f", Path(filler), "--ctx", str(ctx), "--lengths", str(length),
        "--depths", ",".join(num(d) for d in depths), "--trials", str(trials), "--json"] + list(flags)


def run_json(cmd):
    """Run one command (one thread) and parse its JSON; a one-line error otherwise."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
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
    for key in ("ctx", "sinks", "orig_ctx", "scaling"):
        if key in parts[0]:
            out[key] = parts[0][key]
    return out


def stream_cell(ckpt, tok, text, window, ctx, work, where=None):
    """A sinks cell: text cut into segments of one window each (window tokens
    with BOS: window - 1 text tokens; without BOS, window), each streamed
    through a rolling cache of ctx tokens with SINKS sinks; the combined score."""
    count = TokenCounter(ckpt, tok, work)
    segments = split_segments(Path(text).read_text(encoding="utf-8"), window - count.bos, count)
    count.probe.unlink(missing_ok=True)
    folder = Path(work) / f"segments-{Path(ckpt).stem}-{window}"
    folder.mkdir(parents=True, exist_ok=True)
    parts = []
    for i, seg in enumerate(segments):
        f = folder / f"{i:04d}.txt"
        f.write_text(seg, encoding="utf-8")
        parts.append(run_json(stream_command(ckpt, tok, f, ctx)))
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


def ppl_cell(r):
    """'88.16 [86.90, 89.45]'; '= none' for a cell that is none's run; 'not run'."""
    if r.get("not_run"):
        return "not run"
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
    [(first, last, mean, se)] for the bins holding values, se from the
    scatter of the bin's values (as if they were independent; None for one)."""
    bins = {}
    for p, v in enumerate(values):
        if p >= 1 and v is not None:
            bins.setdefault(math.floor(per_octave * math.log2(p) + 1e-9), []).append((p, v))
    out = []
    for j in sorted(bins):
        pv = bins[j]
        vals = [v for _, v in pv]
        m = sum(vals) / len(vals)
        se = math.sqrt(sum((x - m) ** 2 for x in vals) / (len(vals) - 1) / len(vals)) if len(vals) > 1 else None
        out.append((pv[0][0], pv[-1][0], m, se))
    return out


# --------------------------------------------------------------------------
# The plan: studies -> jobs

class Study:
    """One study: a model, its training context L, and the cells to measure."""

    def __init__(self, name, kind, ckpt, tok, L, factors, rows, data="", text=None, text_recipe=(),
                 tokens=None, depths=(), trials=None, filler=None, at=None, note=""):
        self.name, self.kind, self.ckpt, self.tok, self.L = name, kind, Path(ckpt), tok, L
        self.factors, self.rows, self.data = tuple(factors), tuple(rows), data
        self.text, self.text_recipe, self.tokens = text, list(text_recipe), tokens
        self.depths, self.trials, self.filler = tuple(depths), trials, filler
        self.at = at or {}  # k -> {"rows", "depths", "trials"}: what differs at that factor
        self.note = note  # why the plan differs by length, for the table
        self.title = name.replace("-passkey", "")  # smollm2-passkey is smollm2's passkey study
        # Up to the training context the methods change nothing; a study with
        # factors below 1 (SmolLM2) runs none alone at k <= 1.
        self.reuse_below_1 = min(self.factors) < 1

    def trials_at(self, k):
        return self.at.get(k, {}).get("trials", self.trials)

    def depths_at(self, k):
        return tuple(self.at.get(k, {}).get("depths", self.depths))

    def rows_at(self, k):
        return tuple(self.at.get(k, {}).get("rows", self.rows))

    def not_run(self, method, k):
        """A cell left out for time (its command is still listed)."""
        return method not in self.rows_at(k) and not self.same_as_none(method, k)

    def ctx(self, k):
        return round(k * self.L)

    def cells(self, not_run=False):
        """(method, k) of the cells to run; with not_run, of those left out for time."""
        return [(m, k) for m in self.rows for k in self.factors
                if not self.same_as_none(m, k) and self.not_run(m, k) == not_run]

    def same_as_none(self, method, k):
        return self.reuse_below_1 and k <= 1 and method != "none"


def job_cost(study, method, tokens, E):
    """A rough relative cost, only to start the longest runs first: tokens fed,
    times the attention span, times the model's size (SmolLM2 ~100x the
    small models), times ~4 for the methods run one token at a time (the
    pre-RoPE cache of exact dynamic NTK and sinks)."""
    size = 100 if "smollm2" in study.name else 1
    one_at_a_time = method in ("dynamic-exact", "sinks")
    return tokens * (1 + E / 2048) * size * (4 if one_at_a_time else 1)


def ppl_jobs(study, where, not_run=False):
    """[(study, method, k, command-to-show, runner)] for a perplexity study; with
    not_run, the cells left out for time instead (their commands)."""
    jobs = []
    for m, k in study.cells(not_run):
        E = study.ctx(k)
        if m == "sinks":
            shown = stream_cell_command(study.ckpt, study.tok, study.text, E, study.L)
            run = (lambda s=study, E=E: stream_cell(s.ckpt, s.tok, s.text, E, s.L, where.work, where))
        else:
            cmd = ppl_command(study.ckpt, study.tok, study.text, E, method_flags(m, k, study.L))
            shown, run = cmd, (lambda c=cmd: run_json(c))
        jobs.append(dict(study=study, method=m, k=k, ctx=E, shown=where.command(shown), run=run,
                         flags=" ".join(method_flags(m, k, study.L)),
                         cost=job_cost(study, m, study.tokens or E, E)))
    return jobs


def passkey_jobs(study, where, not_run=False):
    """[(study, method, k, command-to-show, runner)] for a passkey study; with
    not_run, the cells left out for time instead (their commands, at the
    factor's depths and trials)."""
    jobs = []
    for m, k in study.cells(not_run):
        E = study.ctx(k)
        ctx = study.L if m == "sinks" else E
        flags = method_flags(m, k, study.L)
        T, depths = study.trials_at(k), study.depths_at(k)
        cmd = passkey_command(study.ckpt, study.tok, study.filler, ctx, E - ANSWER_TOKENS, depths, T, flags)
        jobs.append(dict(study=study, method=m, k=k, ctx=ctx, length=E - ANSWER_TOKENS, shown=where.command(cmd),
                         run=(lambda c=cmd: run_json(c)), flags=" ".join(flags),
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
    """Markdown lines: one study's perplexity table, its notes and its commands.
    A result with not_run is a cell left out for time (its command is listed)."""
    listed = [r for r in results if r["model"] == study.name]
    rows = [r for r in listed if not r.get("not_run")]  # the cells measured
    if not rows:
        return []
    none = {r["k"]: r for r in rows if r["method"] == "none"}
    tokens = sorted({r["tokens"] for r in rows if not r.get("streaming") and not r.get("same_as")})
    seg_tokens = sorted({r["tokens"] for r in rows if r.get("streaming") and not r.get("same_as")})
    tok_txt = "/".join(str(t) for t in tokens) + " tokens scored per cell"
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
        half.append(f"±{Z95 * max(ws):.3f}" if ws else "n/a (1 window)")
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
    if any(r.get("not_run") for r in listed):
        lines.append("\"not run\": left out to keep the study's time" + (f" ({study.note})" if study.note else "")
                     + "; its command is listed below.")
    lines += ["", "Commands (from the repository root, after `make`):", "", "```"]
    lines += study.text_recipe
    for m in study.rows:
        for k in study.factors:
            hit = [r for r in listed if r["method"] == m and r["k"] == k and not r.get("same_as")]
            if hit:
                lines.append(f"# {m}, {factor_label(k)}" + (": not run" if hit[0].get("not_run") else ""))
                lines.append(hit[0]["command"])
    seg = [r["segment_command"] for r in rows if r.get("segment_command")]
    if seg:
        lines.append("# a sinks cell scores each segment NNNN.txt (--stream-cell --segments DIR keeps them) with")
        lines.append("# " + seg[0])
    lines += ["```", ""]
    return lines


def passkey_table(study, results):
    """Markdown lines: one passkey study's tables (pooled over depths, then by
    depth) and its commands. A result with not_run is a cell left out for time."""
    rows = [r for r in results if r["model"] == study.name]
    if not rows:
        return []
    trials = sorted({c["trials"] for r in rows for c in r["cells"]})
    head = "| method | " + " | ".join(f"{factor_label(k)} ({study.ctx(k) - ANSWER_TOKENS})"
                                     for k in study.factors) + " |"
    lines = [f"### {study.title}: passkey accuracy ({Where().path(study.ckpt)}, L = {study.L}; filler: "
             f"held-out books; 5-digit keys; prompts of k L - {ANSWER_TOKENS} tokens; "
             f"{'/'.join(map(str, trials))} trial{'s' if trials != [1] else ''} per (length, depth))", ""]
    if study.at:
        def what(d):
            parts = []
            if "trials" in d:
                parts.append(f"{d['trials']} trial{'s' if d['trials'] != 1 else ''}")
            if "depths" in d:
                parts.append("depth" + ("s " if len(d["depths"]) > 1 else " ") + ", ".join(map(num, d["depths"])))
            if "rows" in d:
                parts.append("methods " + ", ".join(d["rows"]))
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
        return "not run" if r.get("not_run") else f"= {r['same_as']}" if r.get("same_as") else None

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
    if any(r.get("not_run") for r in rows):
        lines.append("\"not run\": left out to keep the study's time; its command is listed below.")
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
                lines += [f"# {m}, {factor_label(k)}" + (": not run" if r.get("not_run") else ""), r["command"]]
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
    "window (at most E tokens with BOS), and each segment is streamed token by token (`-m ppl --streaming --sinks "
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
        for r in (r for r in ppl if not r.get("not_run")):  # the cells measured; results.json lists all
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


def finish_axes(ax, L, xlabel, ylabel, title):
    """A log2 x axis with the training context L marked, labels, grid, legend."""
    ax.set_xscale("log", base=2)
    ax.axvline(L, color="grey", lw=0.8, ls="--")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
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
            pts = sorted((r["ctx"], r["ppl"], r["ppl_lo"], r["ppl_hi"]) for r in ppl
                         if r["model"] == s.name and r["method"] == m and not r.get("not_run"))
            if not pts:
                continue
            x, y = [p[0] for p in pts], [p[1] for p in pts]
            err = [[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]]
            ax.errorbar(x, y, yerr=err, marker="o", ms=4, capsize=3, label=m if m != "sinks" else f"sinks ({SINKS})",
                        ls="--" if m == "sinks" else "-")
        ax.set_yscale("log")
        finish_axes(ax, s.L, "context length (tokens)", "perplexity (bars: 95% interval)",
                    f"{s.name}: perplexity vs context (L = {s.L})")
    fig.tight_layout()
    fig.savefig(out / "ppl_vs_ctx.png", dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, n, figsize=(6.5 * n, 4.8), squeeze=False)
    for ax, s in zip(axes[0], studies):
        kmax = max(s.factors)
        for m in s.rows:
            hit = [r for r in ppl if r["model"] == s.name and r["method"] == m and r["k"] == kmax
                   and r.get("per_position")]
            if not hit:
                continue
            bins = log_bins(hit[0]["per_position"])
            xs = [math.sqrt(b[0] * b[1]) for b in bins]
            line, = ax.plot(xs, [b[2] for b in bins], lw=1.2, label=m if m != "sinks" else f"sinks ({SINKS})")
            band = [(x, b[2], b[3]) for x, b in zip(xs, bins) if b[3] is not None]
            ax.fill_between([b[0] for b in band], [b[1] - Z95 * b[2] for b in band],
                            [b[1] + Z95 * b[2] for b in band], color=line.get_color(), alpha=0.15, lw=0)
        finish_axes(ax, s.L, "position in the window (tokens)", "NLL (nats): mean per quarter octave, 95% band",
                    f"{s.name}: NLL by position at {factor_label(kmax)} (ctx {s.ctx(kmax)})")
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
            if hit and hit[0].get("not_run"):
                ax.text(j, (len(study.depths) - 1) / 2, "not\nrun", ha="center", va="center", fontsize=7)
            for di, d in enumerate(study.depths):
                c = [c for c in hit[0]["cells"] if c["depth"] == d] if hit else []
                if c:
                    grid[di][j] = c[0]["correct"] / c[0]["trials"]
                    mark = "=" if hit[0].get("same_as") else ""
                    ax.text(j, di, f"{mark}{c[0]['correct']}/{c[0]['trials']}", ha="center", va="center",
                            fontsize=7, color="white" if grid[di][j] < 0.6 else "black")
        im = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto")
        ax.set_xticks(range(len(study.factors)))
        ax.set_xticklabels([f"{factor_label(k)}\n{study.ctx(k) - ANSWER_TOKENS}" for k in study.factors], fontsize=7)
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


def write_outputs(ppl, passkey, studies, out, meta):
    """results.json, results.csv, passkey.csv, table.md and the plots."""
    out.mkdir(parents=True, exist_ok=True)
    slim_ppl = [{k: v for k, v in r.items() if k != "per_position"} for r in ppl]
    (out / "results.json").write_text(json.dumps(dict(meta=meta, ppl=slim_ppl, passkey=passkey), indent=1) + "\n")
    write_csvs(slim_ppl, passkey, out)
    files = ["results.json", "results.csv", "passkey.csv", "table.md"]
    lines = [f"# Extrapolation study: tables", "",
             f"Made by `{meta['command']}` in {meta['wall_s'] / 60:.1f} minutes: {meta['jobs']} runs at a time, "
             f"one thread each, on {meta['cpus']} cores (1-minute load average {meta.get('load_before', '?')} "
             f"before the study, so other work shared the cores; the runs' wall times add up to "
             f"{meta.get('cpu_s', 0) / 60:.0f} minutes). Every cell's command is listed under its table; they run "
             "from the repository root.", ""] + PREAMBLE
    for s in studies:
        lines += ppl_table(s, ppl) if s.kind == "ppl" else passkey_table(s, passkey)
    (out / "table.md").write_text("\n".join(lines))
    files += plot_ppl(ppl, [s for s in studies if s.kind == "ppl"], out)
    for s in studies:
        if s.kind == "passkey":
            name = plot_passkey(s, passkey, out)
            if name:
                files.append(name)
    return files


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
        elif name in ("retrieval", "smollm2-passkey"):
            if name == "retrieval":
                ckpt = Path(passkey_ckpt) if passkey_ckpt else ROOT / "models" / "retrieval" / "model.bin"
            else:
                ckpt = ROOT / "models" / "smollm2" / "model-q8_0.bin"
            if not ckpt.is_file() or need_heldout() is None:
                skip(name, f"{Where().path(ckpt)} or ../shared/data/books absent")
                continue
            studies.append(Study(name, "passkey", ckpt, None, train_ctx(ckpt), cfg["factors"], cfg["rows"],
                                 depths=cfg["depths"], trials=cfg["trials"], at=cfg.get("at"), note=cfg.get("note", ""),
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


def run_jobs(jobs, n_parallel):
    """Run every job (longest first, so the pool ends evenly); (job, JSON, seconds) in job order."""
    order = sorted(range(len(jobs)), key=lambda i: -jobs[i]["cost"])
    done = [None] * len(jobs)

    def one(i):
        t0 = time.time()
        r = jobs[i]["run"]()
        return i, r, time.time() - t0

    with concurrent.futures.ThreadPoolExecutor(max_workers=n_parallel) as pool:
        futures = [pool.submit(one, i) for i in order]
        for n, f in enumerate(concurrent.futures.as_completed(futures), 1):
            i, r, dt = f.result()
            done[i] = (jobs[i], r, dt)
            j = jobs[i]
            what = f"ppl {r['ppl']:9.3f}" if "ppl" in r else \
                f"passkey {sum(c['correct'] for c in r['cells'])}/{sum(len(c['trials']) for c in r['cells'])}"
            print(f"[{n}/{len(jobs)}] {j['study'].name:15s} {j['method']:14s} {factor_label(j['k']):>5s} "
                  f"ctx {j['ctx']:6d}: {what} ({dt:.0f} s)", file=sys.stderr, flush=True)
    return done


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="output folder (default docs/extrapolation; --quick: a new temporary one)")
    ap.add_argument("--quick", action="store_true", help="a small subset (every kind of cell), a few minutes")
    ap.add_argument("--studies", help="comma-separated subset of: " + ", ".join(FULL))
    ap.add_argument("--tokens", type=int, help="evaluation text per perplexity study, tokens (default per study)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="runs in parallel (one thread each)")
    ap.add_argument("--passkey-model", type=Path, help="checkpoint for the retrieval study "
                    "(default models/retrieval/model.bin)")
    ap.add_argument("--stream-cell", nargs=2, metavar=("CKPT", "TEXT"),
                    help="score one sinks cell: TEXT in segments of --window tokens, each streamed through a "
                         "rolling cache of --ctx tokens with 4 sinks; prints the combined JSON")
    ap.add_argument("--window", type=int, help="--stream-cell: tokens per segment, BOS included")
    ap.add_argument("--ctx", type=int, help="--stream-cell: the rolling cache's size (the training context)")
    ap.add_argument("-z", dest="tok", type=Path, help="--stream-cell: tokenizer, if not tokenizer.bin beside CKPT")
    ap.add_argument("--segments", type=Path, help="--stream-cell: keep the segment files in this folder")
    args = ap.parse_args(argv)
    if not RUN.is_file():
        sys.exit(f"extrapolation: {RUN.name} not found; build it with `make`")
    if args.stream_cell:
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
                r = stream_cell(ckpt, args.tok, text, args.window, args.ctx, work)
            except (RuntimeError, ValueError) as e:
                sys.exit(f"extrapolation: {e}")
        if args.segments:
            print(f"extrapolation: segments and the command of each: {args.segments}, {r['segment_command']}",
                  file=sys.stderr)
        r.pop("segment_command")
        print(json.dumps(r))
        return
    config = QUICK if args.quick else FULL
    if args.studies:
        names = args.studies.split(",")
        bad = [n for n in names if n not in FULL]
        if bad:
            sys.exit(f"extrapolation: unknown stud{'ies' if len(bad) > 1 else 'y'} {', '.join(bad)} "
                     f"(expected some of {', '.join(FULL)})")
        config = {n: (QUICK.get(n) or FULL[n]) if args.quick else FULL[n] for n in names}
    if args.tokens is not None and args.tokens < 16:
        sys.exit(f"extrapolation: --tokens {args.tokens}: expected at least 16")
    out = args.out or (Path(tempfile.mkdtemp(prefix="extrapolation-quick-")) if args.quick
                       else ROOT / "docs" / "extrapolation")
    t0, load0 = time.time(), os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as work:
        where = Where(work)
        try:
            studies = make_studies(config, work, args.tokens, args.passkey_model)
        except (RuntimeError, ValueError) as e:
            sys.exit(f"extrapolation: {e}")
        if not studies:
            sys.exit("extrapolation: no study to run (see the messages above)")
        jobs = []
        for s in studies:
            jobs += ppl_jobs(s, where) if s.kind == "ppl" else passkey_jobs(s, where)
        print(f"extrapolation: {len(jobs)} runs, {args.jobs} at a time", file=sys.stderr)
        try:
            done = run_jobs(jobs, args.jobs)
        except RuntimeError as e:
            sys.exit(f"extrapolation: {e}")
        ppl = [ppl_result(j, r) for j, r, _ in done if j["study"].kind == "ppl"]
        ppl += [dict(model=j["study"].name, method=j["method"], k=j["k"], ctx=j["ctx"], train_ctx=j["study"].L,
                     flags=j["flags"], command=j["shown"], not_run=True)
                for s in studies if s.kind == "ppl" for j in ppl_jobs(s, where, not_run=True)]
        passkey = [passkey_result(j, r) for j, r, _ in done if j["study"].kind == "passkey"]
        passkey += [dict(model=j["study"].name, method=j["method"], k=j["k"], ctx=j["ctx"], length=j["length"],
                         train_ctx=j["study"].L, flags=j["flags"], command=j["shown"], not_run=True, cells=[])
                    for s in studies if s.kind == "passkey" for j in passkey_jobs(s, where, not_run=True)]
        ppl = fill_same_as_none(ppl, [s for s in studies if s.kind == "ppl"])
        passkey = fill_same_as_none(passkey, [s for s in studies if s.kind == "passkey"])
        key = lambda r: (r["model"], ROWS.index(r["method"]), r["k"])  # noqa: E731
        ppl.sort(key=key)
        passkey.sort(key=key)
        cmd = ".venv/bin/python tools/extrapolation.py" + (" --quick" if args.quick else "") + \
            (f" --studies {args.studies}" if args.studies else "") + \
            (f" --tokens {args.tokens}" if args.tokens else "")
        meta = dict(command=cmd, wall_s=round(time.time() - t0, 1), jobs=args.jobs, cpus=os.cpu_count(),
                    load_before=round(load0, 2), load_after=round(os.getloadavg()[0], 2),
                    cpu_s=round(sum(dt for _, _, dt in done), 1),
                    run_seconds={f"{j['study'].name} {j['method']} {factor_label(j['k'])}": round(dt, 1)
                                 for j, _, dt in done})
        files = write_outputs(ppl, passkey, studies, out, meta)
    print(f"extrapolation: {meta['wall_s'] / 60:.1f} min; wrote {', '.join(files)} in {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
