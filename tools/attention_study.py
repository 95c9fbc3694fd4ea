#!/usr/bin/env python3
"""The extrapolation study's attention statistics: what the attention does past L,
for each RoPE method, from `run -m ppl --attn-stats`.

For a model with training context L, a cell is one (method, k): `run` scores a
prefix of the held-out books (the text the perplexity study reads) in windows of
kL tokens with the method's flags, and writes,
per layer and head, the attention entropy H = -sum_j p_j ln p_j by query position
bucket and the attention mass by query-key distance bucket (docs/long-context.md).
The cells:

  k = 1   none (every method is none's run up to L), and sinks (nothing evicted, so
          it is none with the weight on the text's first 4 tokens counted apart:
          how much of the sinks' mass at 4x the model puts there anyway)
  k = 4   none, linear, ntk, yarn, yarn-attn1 (YaRN with --rope-attn-factor 1: its
          frequencies without its temperature), self-extend, sinks (streamed
          through a rolling cache of L with 4 sinks, the text cut into segments of
          4L tokens as the perplexity study cuts it; the mass on the sinks apart)

The methods' settings are the extrapolation study's (method_flags,
tools/extrapolation_study/config.py). Studies:

  bundled   models/model.bin, L = 256: the perplexity study's 16,384 tokens, 16
            windows at 4x (seconds a cell)
  smollm2   models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf (make smollm2; run reads
            it as q8_0 under --gguf-convert q8_0, which the study passes: the
            weights of the model-q8_0.bin its cells were made with), L = 8192: one window of 32,768 tokens at 4x (5-14 min a cell
            on one thread; 92 CPU-minutes for its nine cells)

Outputs (in --out, default docs/extrapolation/):
    attention.md     per study: the mean entropy (over layers and heads) by position
                     bucket for each method at 4x beside none at 1x; the mass by
                     distance bucket; the mass on the sinks; every cell's command
    attention.json   every cell's statistics as run wrote them, and its command
    attention.png    per study: entropy against query position, and mass against
                     distance, at 1x and 4x

Usage:
    .venv/bin/python tools/attention_study.py [--studies bundled,smollm2] [--jobs J] [--results DIR] [--out DIR]
    .venv/bin/python tools/attention_study.py --list [--studies ...] [--results DIR]
    .venv/bin/python tools/attention_study.py --cell NAME [--results DIR]
    .venv/bin/python tools/attention_study.py --collect DIR [DIR ...] [--out DIR]

Each cell writes RESULTS/NAME.json (NAME: attn-STUDY_METHOD_Kx); the default
--studies is every study whose model is present (a study without one is skipped
with a message).
"""
import json
import math
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import extrapolation as ex  # noqa: E402  (texts, method flags, commands, axes)

CELL_FORMAT = "attention-cell/1"
K_MAX = 4
METHODS = ("none", "linear", "ntk", "yarn", "yarn-attn1", "self-extend", "sinks")
STUDIES = ("bundled", "smollm2")
TOKENS = dict(bundled=16384, smollm2=K_MAX * 8192 - 1)  # text tokens (smollm2: BOS + these = one 4x window)


def cells_of(study):
    """(method, k) of a study's cells, the same for every study: none and sinks at 1x,
    every method at K_MAX. Sinks at 1x evicts nothing (segments of L through a cache
    of L), so it is none at 1x with the weight on the first 4 tokens counted apart:
    the baseline for the sinks' mass at K_MAX."""
    return [(m, k) for k in (1, K_MAX) for m in METHODS if k == K_MAX or m in ("none", "sinks")]


def cell_name(study, method, k):
    return f"attn-{study}_{method}_{ex.num(k)}x"


def parse_cell_name(name):
    parts = name.split("_")
    if len(parts) == 3 and parts[0].startswith("attn-") and parts[0][5:] in STUDIES:
        for m, k in cells_of(parts[0][5:]):
            if cell_name(parts[0][5:], m, k) == name:
                return parts[0][5:], m, k
    raise ValueError(f"cell {name!r}: expected attn-STUDY_METHOD_Kx, one of --list's names")


def flags(method, k, L):
    """The method's flags at k L (the extrapolation study's), and YaRN without its temperature."""
    if method == "yarn-attn1":
        return ex.method_flags("yarn", k, L) + ["--rope-attn-factor", "1"]
    return ex.method_flags(method, k, L)


def make_text(study, work):
    """The study's Study (tools/extrapolation.py) with its text of TOKENS[study] tokens."""
    cfg = dict(ex.FULL[study], tokens=TOKENS[study])
    made = ex.make_studies({study: cfg}, work)
    if not made:
        raise RuntimeError(f"study {study}: its model or ../shared/data/books is absent")
    return made[0]


def cell_command(study, text, method, k, stats_file):
    """The run command of a cell (list, paths as Path): text in windows of k L, or
    for sinks streamed through the rolling cache."""
    base = [ex.RUN] + ex.model_args(study.ckpt, study.tok) + ["-m", "ppl", "-f", Path(text), "--json",
                                                               "--attn-stats", stats_file]
    if method == "sinks":
        return base + ["--ctx", str(study.L), "--streaming"] + flags(method, k, study.L)
    return base + ["--ctx", str(study.ctx(k))] + flags(method, k, study.L)


def merge_stats(parts):
    """The statistics of several runs (a sinks cell's segments) as one run's: entropy
    and sink mass by position per position bucket weighted by the bucket's queries,
    mass and sink mass by the runs' queries (a bucket a run lacks holds none of its weight)."""
    total = sum(p["queries"] for p in parts)
    # a bucket is known by its start: a shorter run ends its last bucket sooner
    pos = sorted({b["start"] for p in parts for b in p["position_buckets"]})
    dist = sorted({b["start"] for p in parts for b in p["distance_buckets"]})
    pos_end = {s: max(b["end"] for p in parts for b in p["position_buckets"] if b["start"] == s) for s in pos}
    dist_end = {s: max(b["end"] for p in parts for b in p["distance_buckets"] if b["start"] == s) for s in dist}
    layers, heads = parts[0]["layers"], parts[0]["heads"]
    q_pos = {b: 0 for b in pos}
    ent = [[[0.0] * len(pos) for _ in range(heads)] for _ in range(layers)]
    mass = [[[0.0] * len(dist) for _ in range(heads)] for _ in range(layers)]
    sink = [[0.0] * heads for _ in range(layers)]
    sink_pos = [[[0.0] * len(pos) for _ in range(heads)] for _ in range(layers)]
    for p in parts:
        for i, b in enumerate(p["position_buckets"]):
            j = pos.index(b["start"])
            q_pos[pos[j]] += b["queries"]
            for l in range(layers):
                for h in range(heads):
                    ent[l][h][j] += p["entropy"][l][h][i] * b["queries"]
                    if p.get("sink_mass_by_position"):
                        sink_pos[l][h][j] += p["sink_mass_by_position"][l][h][i] * b["queries"]
        for i, b in enumerate(p["distance_buckets"]):
            j = dist.index(b["start"])
            for l in range(layers):
                for h in range(heads):
                    mass[l][h][j] += p["mass"][l][h][i] * p["queries"] / total
        for l in range(layers):
            for h in range(heads):
                sink[l][h] += (p.get("sink_mass") or [[0.0] * heads] * layers)[l][h] * p["queries"] / total
    for j, b in enumerate(pos):
        for l in range(layers):
            for h in range(heads):
                ent[l][h][j] = ent[l][h][j] / q_pos[b] if q_pos[b] else 0.0
                sink_pos[l][h][j] = sink_pos[l][h][j] / q_pos[b] if q_pos[b] else 0.0
    out = dict(parts[0], queries=total, file=f"{len(parts)} segments",
               position_buckets=[dict(start=s, end=pos_end[s], queries=q_pos[s]) for s in pos],
               distance_buckets=[dict(start=s, end=dist_end[s]) for s in dist], entropy=ent, mass=mass)
    if parts[0].get("sink_mass"):
        out["sink_mass"] = sink
    if parts[0].get("sink_mass_by_position"):
        out["sink_mass_by_position"] = sink_pos
    return out


def sinks_segments(study, k, work):
    """A sinks cell's text cut at white space into segments of one window of k L
    tokens each (BOS included), as the perplexity study streams them."""
    count = ex.TokenCounter(study.ckpt, study.tok, work)
    return ex.split_segments(Path(study.text).read_text(encoding="utf-8"), study.ctx(k) - count.bos, count)


def run_cell(name, threads, results):
    study_name, method, k = parse_cell_name(name)
    results = Path(results)
    t0 = time.time()
    with tempfile.TemporaryDirectory() as work:
        study = make_text(study_name, work)
        texts = [study.text]
        if method == "sinks":
            segs = sinks_segments(study, k, work)
            texts = []
            for i, seg in enumerate(segs):
                texts.append(Path(work) / f"segment-{i:04d}.txt")
                ex.write_text(texts[-1], seg)
        parts, ppls = [], []
        for i, text in enumerate(texts):
            stats_file = Path(work) / f"{name}.{i}.stats.json"
            cmd = cell_command(study, text, method, k, stats_file)
            ppls.append(ex.run_json(cmd, threads))
            parts.append(json.loads(stats_file.read_text()))
        stats = merge_stats(parts) if len(parts) > 1 else parts[0]
        ppl = ex.combine_scores(ppls) if len(ppls) > 1 else ppls[0]
        shown_text = "segment-NNNN.txt" if len(texts) > 1 else Path(study.text).name
        if len(texts) == 1:
            stats["file"] = shown_text  # run wrote the temporary folder's path
        shown = ex.Where(work).command([shown_text if c in texts else f"{name}.stats.json" if c == stats_file else c
                                        for c in cmd])
        recipe = study.text_recipe + ([f"segments of {study.ctx(k)} tokens: tools/extrapolation.py --stream-cell "
                                       f"--segments DIR cuts them"] if len(texts) > 1 else [])
    rec = dict(format=CELL_FORMAT, cell=name, study=study_name, method=method, k=k, L=study.L, ctx=study.ctx(k),
               command=shown, text_recipe=recipe, threads=threads, wall_s=round(time.time() - t0, 1),
               finished=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               ppl={key: ppl[key] for key in ("tokens", "nll", "ppl", "ppl_lo", "ppl_hi") if key in ppl},
               stats=stats)
    ex.write_cell_file(results / f"{name}.json", rec)
    print(f"attention_study: {name}: mean entropy {mean_entropy(stats):.3f} nats, ppl {ppl['ppl']:.2f} "
          f"({rec['wall_s']:.0f} s)", file=sys.stderr, flush=True)
    return rec


# --------------------------------------------------------------------------
# Summaries of a cell's statistics: means over layers and heads

def by_position(stats, key="entropy"):
    """[(start, end, queries, mean of stats[key] over layers and heads)] per position
    bucket: the entropy, or the weight on the sinks (sink_mass_by_position)."""
    out = []
    for b, bucket in enumerate(stats["position_buckets"]):
        vals = [head[b] for layer in stats[key] for head in layer]
        if bucket["queries"]:
            out.append((bucket["start"], bucket["end"], bucket["queries"], sum(vals) / len(vals)))
    return out


def mean_entropy(stats):
    """The mean entropy over every counted query, layer and head."""
    rows = by_position(stats)
    return sum(q * h for _, _, q, h in rows) / sum(q for _, _, q, _ in rows)


def by_distance(stats):
    """[(start, end, mean mass over layers and heads)] per distance bucket."""
    out = []
    for b, bucket in enumerate(stats["distance_buckets"]):
        vals = [head[b] for layer in stats["mass"] for head in layer]
        out.append((bucket["start"], bucket["end"], sum(vals) / len(vals)))
    return out


def sinks_by_position(stats):
    """{start: mean weight on the sinks over layers and heads} per position bucket."""
    if not stats.get("sink_mass_by_position"):
        return {}
    return {start: v for start, _, _, v in by_position(stats, "sink_mass_by_position")}


def sinks_share(stats, lo, hi):
    """The mean weight on the sinks of the queries at positions lo..hi-1 (whole
    buckets), over layers and heads; None without the by-position statistics."""
    if not stats.get("sink_mass_by_position"):
        return None
    kept = [(q, v) for start, _, q, v in by_position(stats, "sink_mass_by_position") if lo <= start < hi]
    return sum(q * v for q, v in kept) / sum(q for q, _ in kept) if kept else None


def sink_mass(stats):
    if not stats.get("sink_mass"):
        return None
    vals = [h for layer in stats["sink_mass"] for h in layer]
    return sum(vals) / len(vals)


def buckets_by_start(pairs):
    """[(start, end)] with one entry per start, its largest end (a run over a shorter
    text ends its last bucket sooner)."""
    ends = {}
    for s, e in pairs:
        ends[s] = max(e, ends.get(s, e))
    return sorted(ends.items())


def bucket_label(start, end):
    return f"[{start}, {end})"


# --------------------------------------------------------------------------
# Collect

# What the tables and plot read of a cell file, checked by cell_problem (the
# kinds of tools/extrapolation_study/files.py's shape_problem; '?': may be null).
CELL_FIELDS = dict(study="text", method="text", k="nonneg", L="positive", command="text", text_recipe="list",
                   threads="positive", wall_s="nonneg", stats="object")
STATS_FIELDS = dict(layers="positive", heads="positive", position_buckets="list", distance_buckets="list",
                    entropy="list", mass="list", sink_mass="list?", sink_mass_by_position="list?")
POSITION_FIELDS = dict(start="count", end="count", queries="count")
DISTANCE_FIELDS = dict(start="count", end="count")


def grid_problem(grid, shape, name):
    """What is wrong with grid as nested lists of numbers of the given shape
    (e.g. layers x heads x buckets), in a few words, or None."""
    if not shape:
        return None if ex.fits(grid, "number") else f"{name}: expected a number, got {json.dumps(grid)[:40]}"
    if not isinstance(grid, list) or len(grid) != shape[0]:
        return f"{name}: expected a list of {shape[0]}, got {json.dumps(grid)[:40]}"
    for i, g in enumerate(grid):
        problem = grid_problem(g, shape[1:], f"{name}[{i}]")
        if problem:
            return problem
    return None


def stats_problem(st):
    """What is wrong with a cell's statistics for the tables and plot, or None:
    buckets, and grids of layers x heads (x buckets) of numbers."""
    problem = (ex.shape_problem(st, STATS_FIELDS, "stats")
               or ex.list_problem(st["position_buckets"], POSITION_FIELDS, "stats.position_buckets")
               or ex.list_problem(st["distance_buckets"], DISTANCE_FIELDS, "stats.distance_buckets"))
    if problem:
        return problem
    if not any(b["queries"] for b in st["position_buckets"]):
        return "stats.position_buckets: expected queries in one at least, got none"
    lh, n_pos, n_dist = (st["layers"], st["heads"]), len(st["position_buckets"]), len(st["distance_buckets"])
    grids = [("entropy", lh + (n_pos,)), ("mass", lh + (n_dist,)), ("sink_mass", lh),
             ("sink_mass_by_position", lh + (n_pos,))]
    for key, shape in grids:
        problem = grid_problem(st[key], shape, f"stats.{key}") if st.get(key) else None
        if problem:
            return problem
    return None


def cell_problem(rec):
    """What is wrong with an attention cell file's record for the tables and
    plot, in a few words, or None: a field absent or of another kind, a
    negative count, a study, method or factor not its name's."""
    problem = ex.shape_problem(rec, CELL_FIELDS)
    if problem:
        return problem
    try:
        named = parse_cell_name(rec["cell"])
    except ValueError as e:
        return str(e)
    if (rec["study"], rec["method"], rec["k"]) != named:
        return f"expected the study, method and factor of {rec['cell']}, got {rec['study']}, {rec['method']}, " \
            f"{rec['k']}"
    return stats_problem(rec["stats"])


def read_cells(folders):
    """{name: record} of the cell files in the folders; ValueError naming a bad file."""
    return ex.read_cell_files(folders, "attn-*.json", CELL_FORMAT, "an attention", check=cell_problem)


def study_tables(study, cells):
    got = {(r["method"], r["k"]): r for r in cells.values() if r["study"] == study}
    if not got:
        return []
    L = next(iter(got.values()))["L"]
    ref, sinks1 = got.get(("none", 1)), got.get(("sinks", 1))
    four = [(m, got.get((m, K_MAX))) for m in METHODS]
    ones = [("none, 1x", ref), ("sinks, 1x", sinks1)]
    pos_rows = [r for _, r in four + ones if r]
    buckets = buckets_by_start([(s, e) for r in pos_rows for s, e, _, _ in by_position(r["stats"])])
    lines = [f"### {study}: attention entropy by query position (nats; mean over layers and heads; L = {L})", "",
             "| method | " + " | ".join(bucket_label(s, e) for s, e in buckets) + " | all |",
             "|---|" + "---:|" * (len(buckets) + 1)]

    def entropy_row(label, r):
        if r is None:
            return f"| {label} | " + " | ".join("missing" for _ in buckets) + " | missing |"
        vals = {s: h for s, e, _, h in by_position(r["stats"])}
        return (f"| {label} | " + " | ".join(f"{vals[b[0]]:.3f}" if b[0] in vals else "" for b in buckets)
                + f" | {mean_entropy(r['stats']):.3f} |")

    for label, r in ones:
        lines.append(entropy_row(label, r))
    for m, r in four:
        lines.append(entropy_row(f"{m}, {K_MAX}x", r))
    dist = buckets_by_start([(s, e) for r in pos_rows for s, e, _ in by_distance(r["stats"])])
    lines += ["", f"### {study}: attention mass by query-key distance (mean over layers and heads)", "",
              "| method | " + " | ".join(bucket_label(s, e) for s, e in dist) + " | on the 4 sinks |",
              "|---|" + "---:|" * (len(dist) + 1)]
    for label, r in ones + [(f"{m}, {K_MAX}x", r) for m, r in four]:
        if r is None:
            lines.append(f"| {label} | " + " | ".join("missing" for _ in dist) + " | |")
            continue
        vals = {s: v for s, e, v in by_distance(r["stats"])}
        sm = sink_mass(r["stats"])
        lines.append(f"| {label} | " + " | ".join(f"{vals[b[0]]:.3f}" if b[0] in vals else "" for b in dist)
                     + f" | {'' if sm is None else f'{sm:.3f}'} |")
    sink_rows = [(label, r) for label, r in [("sinks, 1x", sinks1), (f"sinks, {K_MAX}x", got.get(("sinks", K_MAX)))]
                 if r and sinks_by_position(r["stats"])]
    if sink_rows:
        lines += ["", f"### {study}: weight on the 4 sinks by query position (mean over layers and heads)", "",
                  "At 1x nothing is evicted: the weight each segment's first 4 tokens get with no sinks at all.", "",
                  "| method | " + " | ".join(bucket_label(s, e) for s, e in buckets) + " |",
                  "|---|" + "---:|" * len(buckets)]
        for label, r in sink_rows:
            vals = sinks_by_position(r["stats"])
            lines.append(f"| {label} | " + " | ".join(f"{vals[b[0]]:.3f}" if b[0] in vals else "" for b in buckets)
                         + " |")
    lines += ["", "Commands (the text: " + "; ".join(f"`{c}`" for c in next(iter(got.values()))["text_recipe"])
              + "):", ""]
    for m, k in cells_of(study):
        r = got.get((m, k))
        lines.append(f"- {m}, {ex.factor_label(k)}: " + (f"`{r['command']}` ({r['wall_s']:.0f} s, "
                                                         f"{r['threads']} thread{'s' if r['threads'] > 1 else ''})"
                                                         if r else "missing"))
    return lines + [""]


def plot(cells, studies, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    studies = [s for s in studies if any(r["study"] == s for r in cells.values())]
    if not studies:
        return None
    fig, axes = plt.subplots(len(studies), 2, figsize=(13, 4.6 * len(studies)), squeeze=False)
    for (ax_h, ax_m), study in zip(axes, studies):
        got = {(r["method"], r["k"]): r for r in cells.values() if r["study"] == study}
        L = next(iter(got.values()))["L"]
        ref = got.get(("none", 1))
        first4 = got.get(("sinks", 1))  # the first 4 tokens' weight late in L at 1x, beside the sinks' past L
        base = sinks_share(first4["stats"], L // 2, L) if first4 else None
        series = ([("none, 1x", ref, "black", ":")] if ref else []) + \
            [(f"{m}, {K_MAX}x", got[(m, K_MAX)], f"C{i}", "--" if m == "sinks" else "-")
             for i, m in enumerate(METHODS) if (m, K_MAX) in got]
        for label, r, color, ls in series:
            pb = by_position(r["stats"])
            ax_h.plot([math.sqrt(max(1, s) * e) for s, e, _, _ in pb], [h for *_, h in pb], marker="o", ms=3,
                      color=color, ls=ls, label=label)
            db = [(s, e, v) for s, e, v in by_distance(r["stats"]) if v > 0]
            past = sinks_share(r["stats"], L, 1 << 62)
            note = "" if past is None else f" (on the sinks past L {past:.2f}" + (
                "" if base is None else f"; first 4 tokens at 1x, queries in [L/2, L): {base:.2f}") + ")"
            ax_m.plot([math.sqrt(max(1, s) * e) for s, e, _ in db], [v for *_, v in db], marker="o", ms=3,
                      color=color, ls=ls, label=label + note)
        ticks = [L // 2 ** i for i in range(3, -1, -1)] + [L * 2 ** i for i in range(1, 1 + round(math.log2(K_MAX)))]
        ex.finish_axes(ax_h, L, "query position in the window (tokens; bucket midpoints)",
                       "attention entropy (nats), mean over layers and heads",
                       f"{study}: entropy against position, at 1x and {K_MAX}x", ticks)
        ex.finish_axes(ax_m, L, "query-key distance (tokens; bucket midpoints)",
                       "attention mass in the bucket, mean over layers and heads",
                       f"{study}: where the attention goes, at 1x and {K_MAX}x", ticks)
    fig.tight_layout()
    ex.save_figure(fig, out / "attention.png")
    plt.close(fig)
    return "attention.png"


def collect(folders, out, studies):
    cells = read_cells(folders)
    out = Path(out)
    ex.make_folder(out)
    studies = [s for s in studies if any(r["study"] == s for r in cells.values())]
    expected = [cell_name(s, m, k) for s in studies for m, k in cells_of(s)]
    missing = [n for n in expected if n not in cells]
    lines = ["# Extrapolation study: attention statistics", "",
             "Made by `.venv/bin/python tools/attention_study.py` (its docstring says what a cell is): "
             "`run -m ppl --attn-stats` on a prefix of the held-out books (bundled: the perplexity study's "
             "16,383 tokens; SmolLM2: one window of 4L), each method at 4x beside plain RoPE at 1x. Entropy in nats of the attention weights per query, mean over "
             "the queries of a position bucket, then over layers and heads; mass: the share of the weights on keys "
             "at each distance bucket, mean over queries, layers and heads. Sinks at 1x evicts nothing: it is "
             "plain RoPE at 1x with the weight on each segment's first 4 tokens counted apart (its \"on the 4 "
             "sinks\" column), the share the model gives those tokens with no sinks at all; sinks at 4x streams "
             "the text through a rolling cache of L, the first 4 tokens kept."
             + (f" Missing: {', '.join(missing)}." if missing else ""), ""]
    for s in studies:
        lines += study_tables(s, cells)
    ex.write_text(out / "attention.md", "\n".join(lines))
    ex.write_json(out / "attention.json", dict(cells=[cells[n] for n in sorted(cells)], missing=missing))
    files = ["attention.md", "attention.json"]
    name = plot(cells, studies, out)
    return files + ([name] if name else []), missing


def present(study):
    """Whether a study's model is there (a default run skips the others, saying so)."""
    ckpt = {"bundled": ROOT / "models" / "model.bin", "smollm2": ex.SMOLLM2}[study]
    if not ckpt.is_file():
        print(f"attention_study: skipping {study} ({ckpt.relative_to(ROOT)} absent"
              f"{'; make smollm2' if study == 'smollm2' else ''})", file=sys.stderr)
    return ckpt.is_file()


def main(argv=None):
    ap = ex.fanout_parser(__doc__, "cell files (default: results)", "output folder (default docs/extrapolation)")
    ap.add_argument("--studies", help=f"comma-separated subset of {', '.join(STUDIES)} (default: each whose model "
                    "is there)")
    args = ap.parse_args(argv)
    ex.check_fanout_args(args, "attention_study")
    studies = (args.studies.split(",") if args.studies else
               list(STUDIES) if args.collect or args.cell else [s for s in STUDIES if present(s)])
    bad = [s for s in studies if s not in STUDIES]
    if bad:
        sys.exit(f"attention_study: --studies {bad[0]}: expected some of {', '.join(STUDIES)}")
    results = args.results or Path("results")
    out = args.out or ROOT / "docs" / "extrapolation"
    try:
        if args.collect:
            files, missing = collect(args.collect, out, STUDIES)
            ex.report_written("attention_study", files, out, missing)
            return
        if not ex.RUN.is_file():
            sys.exit("attention_study: run not found; build it with `make`")
        names = [cell_name(s, m, k) for s in studies for m, k in cells_of(s)]
        if args.list:
            for n in names:
                print(" ".join(shlex.quote(a) for a in [".venv/bin/python", "tools/attention_study.py", "--cell", n,
                                                        "--threads", str(args.threads), "--results", str(results)]))
            return
        if args.cell is not None:
            try:
                parse_cell_name(args.cell)
            except ValueError as e:
                sys.exit(f"attention_study: --cell {e}")
            run_cell(args.cell, args.threads, results)
            return
        jobs = args.jobs or max(1, (os.cpu_count() or 1) // args.threads)
        todo = [n for n in names if not (results / f"{n}.json").is_file()]
        ex.run_pool("attention_study", todo, lambda n: run_cell(n, args.threads, results), jobs)
        # every study with cells in the folder, also one whose model is absent here
        files, missing = collect([results], out, STUDIES)
        ex.report_written("attention_study", files, out, missing)
    except (RuntimeError, ValueError) as e:
        sys.exit(f"attention_study: {e}")


if __name__ == "__main__":
    main()
