#!/usr/bin/env python3
"""The extrapolation study: how each RoPE method behaves past the training length.

For each model, each method and each context E = k * L (k = 1, 2, 4, 8, 16;
L = the model's training context), run

    run MODEL -m ppl -f TEXT --ctx E --json --per-position  [method flags]

on the same evaluation text, and collect mean NLL / perplexity and the NLL at
every in-window position. Outputs (in --out, default docs/extrapolation/):

    results.json        every run: model, method, k, ctx, flags, tokens, nll, ppl, buckets
    results.csv         one row per (model, method, k)
    table.md            perplexity per method and context, one table per model
    ppl_vs_ctx.png      perplexity against context length, one panel per model
    nll_vs_position.png NLL against in-window position at 16x, one panel per model

Models (each skipped with a message when its files are absent):
    bundled     models/model.bin, scored on the held-out books (tools/prepare_data.py)
    stories260K ../shared/models/stories260K.bin, scored on TinyStories validation text

Method settings at context E = k L (the literature's choices; k = 1 means "no scaling"):
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

Usage:
    .venv/bin/python tools/extrapolation.py [--out DIR] [--tokens N] [--jobs J] [--models a,b]
(`make extrapolation` runs it with the defaults.)
"""
import argparse
import concurrent.futures
import csv
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("SHARED_DIR") or ROOT.parent / "shared")
RUN = Path(os.environ.get("RUN") or ROOT / "run")
sys.path.insert(0, str(ROOT / "tools"))

FACTORS = (1, 2, 4, 8, 16)
METHODS = ("none", "linear", "ntk", "dynamic-hf", "dynamic-exact", "yarn", "llama3", "self-extend")


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


def method_flags(method, k, L):
    """Command-line flags for one method at context k * L."""
    if method == "none" or (k == 1 and method != "self-extend"):
        return []
    if method == "linear":
        return ["--rope-scaling", "linear", "--rope-factor", str(k)]
    if method == "ntk":
        return ["--rope-scaling", "ntk", "--rope-factor", str(2 * k)]
    if method == "dynamic-hf":
        return ["--rope-scaling", "dynamic", "--rope-factor", str(k), "--rope-dynamic", "hf"]
    if method == "dynamic-exact":
        return ["--rope-scaling", "dynamic", "--rope-factor", str(k), "--rope-dynamic", "exact"]
    if method == "yarn":
        return ["--rope-scaling", "yarn", "--rope-factor", str(k)]
    if method == "llama3":
        return ["--rope-scaling", "llama3", "--rope-factor", str(k)]
    if method == "self-extend":
        W = L // 2
        G = self_extend_group(k * L, L, W)
        return ["--self-extend", str(G), str(W)]
    raise ValueError(method)


def train_ctx(path):
    """Training context of a checkpoint (any format run reads), as run reports it."""
    p = subprocess.run([str(RUN), str(path), "-m", "rope", "--json"], capture_output=True, check=True)
    return json.loads(p.stdout)["orig_ctx"]


def cut_to_tokens(text, n_tokens, model, tok, workdir):
    """A prefix of text holding about n_tokens tokens (same file for every run)."""
    probe = Path(workdir) / "probe.txt"
    sample = text[:200_000]
    probe.write_text(sample)
    out = subprocess.run([str(RUN), str(model), "-z", str(tok), "-m", "tokenize", "-f", str(probe)],
                         capture_output=True, check=True).stdout.split()
    chars_per_token = len(sample) / max(1, len(out) - 1)
    return text[:int(n_tokens * chars_per_token)]


def prepare_models(workdir, n_tokens, wanted):
    """[(name, checkpoint, tokenizer, L, text file)] for the models present."""
    models = []
    bundled, btok = ROOT / "models" / "model.bin", ROOT / "models" / "tokenizer.bin"
    if "bundled" in wanted:
        if bundled.is_file() and (SHARED / "data" / "books").is_dir():
            import prepare_data
            text = prepare_data.heldout_text(SHARED)
            path = Path(workdir) / "bundled.txt"
            path.write_text(cut_to_tokens(text, n_tokens, bundled, btok, workdir))
            models.append(("bundled", bundled, btok, train_ctx(bundled), path,
                           "held-out books (Moby Dick, Pride and Prejudice)"))
        else:
            print("extrapolation: skipping the bundled model (models/model.bin or ../shared/data/books absent)",
                  file=sys.stderr)
    s260, s_tok = SHARED / "models" / "stories260K.bin", SHARED / "models" / "tok512.bin"
    stories = SHARED / "data" / "tinystories" / "tinystories_valid_head.txt"
    if "stories260K" in wanted:
        if s260.is_file() and stories.is_file():
            path = Path(workdir) / "stories.txt"
            path.write_text(cut_to_tokens(stories.read_text(), n_tokens, s260, s_tok, workdir))
            models.append(("stories260K", s260, s_tok, train_ctx(s260), path, "TinyStories validation stream"))
        else:
            print("extrapolation: skipping stories260K (../shared/models or ../shared/data/tinystories absent)",
                  file=sys.stderr)
    return models


def run_one(job):
    name, ckpt, tok, L, text, method, k = job
    flags = method_flags(method, k, L)
    cmd = [str(RUN), str(ckpt), "-z", str(tok), "-m", "ppl", "-f", str(text), "--ctx", str(k * L), "--json",
           "--per-position"] + flags
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run(cmd, capture_output=True, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}: {p.stderr.decode(errors='replace')}")
    r = json.loads(p.stdout)
    r.update(model=name, method=method, k=k, flags=" ".join(flags), train_ctx=L)
    return r


def smooth(values, width):
    """Moving average over `width` positions, skipping missing entries."""
    out, acc, cnt, window = [], 0.0, 0, []
    for v in values:
        window.append(v)
        if v is not None:
            acc, cnt = acc + v, cnt + 1
        if len(window) > width:
            old = window.pop(0)
            if old is not None:
                acc, cnt = acc - old, cnt - 1
        out.append(acc / cnt if cnt else None)
    return out


def write_outputs(results, models, out):
    out.mkdir(parents=True, exist_ok=True)
    # per_position is only for the plot; "file" is a temporary path, kept as its name
    slim = [{k: (Path(v).name if k == "file" else v) for k, v in r.items() if k != "per_position"}
            for r in results]
    (out / "results.json").write_text(json.dumps(slim, indent=1) + "\n")
    with open(out / "results.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["model", "method", "k", "ctx", "train_ctx", "flags", "tokens", "nll", "ppl"])
        for r in slim:
            w.writerow([r["model"], r["method"], r["k"], r["ctx"], r["train_ctx"], r["flags"], r["tokens"],
                        f"{r['nll']:.5f}", f"{r['ppl']:.3f}"])
    lines = []
    for name, _, _, L, _, data in models:
        rows = [r for r in results if r["model"] == name]
        lines += [f"### {name} (training context L = {L}; {data}; {rows[0]['tokens']} tokens scored per cell)",
                  "", "| method | " + " | ".join(f"{k}x ({k * L})" for k in FACTORS) + " |",
                  "|---|" + "---:|" * len(FACTORS)]
        for m in METHODS:
            cells = []
            for k in FACTORS:
                hit = [r for r in rows if r["method"] == m and r["k"] == k]
                cells.append(f"{hit[0]['ppl']:.2f}" if hit else "")
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
        lines.append("")
    (out / "table.md").write_text("\n".join(lines))

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def decorate(ax, L, xlabel, ylabel, title):  # log2 x axis, a line at the training length
        ax.set_xscale("log", base=2)
        ax.axvline(L, color="grey", lw=0.8, ls="--")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3)

    def finish(fig, axes, path):
        axes[0][0].legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
    n = len(models)
    fig, axes = plt.subplots(1, n, figsize=(6.5 * n, 4.5), squeeze=False)
    for ax, (name, _, _, L, _, _) in zip(axes[0], models):
        for m in METHODS:
            pts = sorted((r["ctx"], r["ppl"]) for r in results if r["model"] == name and r["method"] == m)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=m)
        ax.set_yscale("log")
        decorate(ax, L, "context length (tokens)", "perplexity", f"{name}: perplexity vs context (L = {L})")
    finish(fig, axes, out / "ppl_vs_ctx.png")

    fig, axes = plt.subplots(1, n, figsize=(6.5 * n, 4.5), squeeze=False)
    kmax = max(FACTORS)
    for ax, (name, _, _, L, _, _) in zip(axes[0], models):
        for m in METHODS:
            hit = [r for r in results if r["model"] == name and r["method"] == m and r["k"] == kmax]
            if not hit:
                continue
            curve = smooth(hit[0]["per_position"], max(8, L // 8))
            xs = [p for p, v in enumerate(curve) if v is not None and p > 0]
            ax.plot(xs, [curve[p] for p in xs], lw=1.2, label=m)
        decorate(ax, L, "position in the window (tokens)",
                 f"NLL (nats), moving average over {max(8, L // 8)} positions",
                 f"{name}: NLL by position at {kmax}x (ctx {kmax * L})")
    finish(fig, axes, out / "nll_vs_position.png")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "extrapolation", help="output folder")
    ap.add_argument("--tokens", type=int, default=16384, help="tokens of evaluation text per model")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="runs in parallel (one thread each)")
    ap.add_argument("--models", default="bundled,stories260K", help="comma-separated: bundled, stories260K")
    args = ap.parse_args()
    if not RUN.is_file():
        sys.exit(f"extrapolation: {RUN} not found; build it with `make`")
    with tempfile.TemporaryDirectory() as work:
        models = prepare_models(work, args.tokens, args.models.split(","))
        if not models:
            sys.exit("extrapolation: no model to study (see the messages above)")
        jobs = [(name, ckpt, tok, L, text, m, k) for name, ckpt, tok, L, text, _ in models
                for m in METHODS for k in FACTORS]
        jobs.sort(key=lambda j: -j[6])  # longest contexts first, so the pool ends evenly
        results = []
        with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
            for i, r in enumerate(pool.map(run_one, jobs), 1):
                results.append(r)
                print(f"[{i}/{len(jobs)}] {r['model']:12s} {r['method']:14s} {r['k']:2d}x ctx {r['ctx']:6d}: "
                      f"ppl {r['ppl']:10.3f}", file=sys.stderr, flush=True)
        results.sort(key=lambda r: (r["model"], METHODS.index(r["method"]), r["k"]))
        write_outputs(results, models, args.out)
    print(f"extrapolation: wrote {args.out}/results.json, results.csv, table.md, ppl_vs_ctx.png, "
          f"nll_vs_position.png", file=sys.stderr)


if __name__ == "__main__":
    main()
