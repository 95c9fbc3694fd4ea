#!/usr/bin/env python3
"""The fine-tuned rows of the extrapolation study: each RoPE method fine-tuned at 4x
for a few budgets, scored by the same cells as the training-free rows.

A cell is one (base model, method): tools/finetune.py continues the base at
E = 4L = 1024 tokens with the method (factor 4; ntk alpha 8, the study's settings)
for the largest budget, exporting the model after each smaller budget on the way
(--save-at); then `run` scores every exported model, with the scaling its header
carries (no flags), at every context of the training-free study:

  ft-bundled_METHOD_4x    models/model.bin on the training books; perplexity of
                          books.txt at k = 1..16 (the bundled study's text and windows)
  ft-retrieval_METHOD_4x  models/retrieval/model.bin with its passkey mix; passkey at
                          k = 1..16 (the retrieval study's depths, keys and filler)

Budgets: 25, 100 and 400 steps of 4 windows of 1,024 tokens (0.1, 0.4 and 1.6 M
tokens). The rate is constant after a 10-step warmup (--min-lr-ratio 1, as position
interpolation and YaRN fine-tuned), so the model after 25 steps of the 400-step run is
exactly a 25-step fine-tune's (tests/test_finetune.py checks that equality), and one
run per cell gives the three budgets. Methods: linear (position interpolation), ntk
and yarn.

The control, ft-BASE_continued_1x: the same steps and tokens at L = 256 (16 windows
of 256 tokens a step) with plain RoPE. It is scored as it is and with training-free
YaRN at factor 4 on top, so that what a fine-tune at 4x owes to its longer windows
is told apart from what it owes to more training.

Outputs (in --out, default docs/extrapolation/):
    finetune.json   every cell: the fine-tune's command, steps, tokens and CPU time,
                    each budget's scores, and the training-free rows compared
    finetune.md     the tables: per base and method, the training-free row (the
                    method at factor k, from results.json) and each budget's row
                    (factor 4 at every k), 95% intervals; the costs; the commands
    finetune.png    perplexity (and passkey accuracy) at 4x against steps, and against
                    context for the largest budget beside the training-free rows

Usage:
    .venv/bin/python tools/finetune_study.py [--jobs J] [--results DIR] [--out DIR]
    .venv/bin/python tools/finetune_study.py --list [--results DIR]   # one command per cell
    .venv/bin/python tools/finetune_study.py --cell NAME [--results DIR]
    .venv/bin/python tools/finetune_study.py --collect DIR [DIR ...] [--out DIR]
    .venv/bin/python tools/finetune_study.py --quick   # 1 and 2 steps of 1 window of one book, bundled,
                                                       # 1x and 4x: the whole pipeline in under a minute

Each cell writes RESULTS/NAME.json and keeps its fine-tuned models in
RESULTS/checkpoints/NAME/ (model.bin after the largest budget, step-N/model.bin
after N steps); a cell whose fine-tune is already there only scores it. Cells run
anywhere with the same checkout, models and ../shared, in any order; --collect reads
them from any number of folders (a cell missing is shown as missing). The training-
free rows come from docs/extrapolation/results.json (tools/extrapolation.py).
"""
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import extrapolation as ex  # noqa: E402  (the study's texts, commands, intervals and axes)

CELL_FORMAT = "finetune-cell/1"
K_FT = 4  # the fine-tuning context, E = K_FT * L
METHODS = ("linear", "ntk", "yarn")
# The control: the same steps and tokens at L (windows of L, K_FT times as many a
# step) with plain RoPE, so that what a fine-tune at 4x gains from its longer
# windows is told apart from what any further training gains. Scored as it is
# (plain RoPE) and with training-free YaRN at factor K_FT on top.
CONTROL = "continued"
CONTROL_FLAGS = ["--rope-scaling", "yarn", "--rope-factor", str(K_FT)]
BASES = {
    "bundled": dict(ckpt="models/model.bin", kind="ppl", extra=[]),
    "retrieval": dict(ckpt="models/retrieval/model.bin", kind="passkey",
                      extra=["--tokenizer", "models/tokenizer.model", "--passkey-mix", "0.5",
                             "--passkey-answer-weight", "8", "--passkey-eval", "0"]),
}
# The plan: budgets (steps; the last is the run's --max-steps), windows per step, the
# contexts scored, and the training-free study whose text, depths and trials the cells use.
FULL = dict(steps=(25, 100, 400), batch=4, factors=ex.FACTORS, bases=tuple(BASES))
QUICK = dict(steps=(1, 2), batch=1, factors=(1, 4), bases=("bundled",), books=("cranford",))


def cell_name(base, method):
    """ft-bundled_yarn_4x; the control ft-bundled_continued_1x."""
    return f"ft-{base}_{method}_{1 if method == CONTROL else K_FT}x"


def parse_cell_name(name):
    """(base, method) of a cell name; ValueError if it is not one."""
    for base in BASES:
        for method in METHODS + (CONTROL,):
            if name == cell_name(base, method):
                return base, method
    raise ValueError(f"cell {name!r}: expected ft-BASE_METHOD_{K_FT}x with BASE one of {', '.join(BASES)} and "
                     f"METHOD one of {', '.join(METHODS)}, or ft-BASE_{CONTROL}_1x")


def fine_tune_shape(method, plan):
    """(seq_len, scaling, windows per step) of a cell's fine-tune: the method at K_FT L,
    or the control at L with K_FT times the windows (the same tokens a step)."""
    if method == CONTROL:
        return 256, "none", plan["batch"] * K_FT
    return K_FT * 256, method, plan["batch"]


def finetune_command(base, method, plan, out, threads):
    """tools/finetune.py's command line for one cell (run from the repository root)."""
    b = BASES[base]
    steps = plan["steps"]
    seq_len, scaling, batch = fine_tune_shape(method, plan)
    cmd = [".venv/bin/python", "tools/finetune.py", b["ckpt"]] + b["extra"] + [
        "--seq-len", str(seq_len), "--rope-scaling", scaling, "--batch-size", str(batch),
        "--max-steps", str(steps[-1])]
    if len(steps) > 1:
        cmd += ["--save-at"] + [str(s) for s in steps[:-1]]
    if plan.get("books"):  # --quick: one small training book, encoded in a second
        cmd += ["--books"] + list(plan["books"])
    return cmd + ["--warmup", str(warmup(plan)), "--lr", "2e-4", "--min-lr-ratio", "1", "--eval-every", "0",
                  "--no-final-eval", "--log-every", "25", "--threads", str(threads), "--out-dir", str(out)]


def warmup(plan):
    """Warmup steps: 10, or fewer when the smallest budget is shorter (--quick)."""
    return min(10, plan["steps"][0])


def snapshot(out, steps, plan):
    """The exported model after `steps` steps."""
    return Path(out) / ("model.bin" if steps == plan["steps"][-1] else f"step-{steps}/model.bin")


def eval_study(base, plan, work):
    """The training-free study whose cells the fine-tuned models get: its text or filler,
    depths and trials (the extrapolation study's settings, tools/extrapolation_study/)."""
    name = base
    cfg = dict(ex.FULL[name], factors=plan["factors"])
    studies = ex.make_studies({name: cfg}, work)
    if not studies:
        raise RuntimeError(f"{BASES[base]['ckpt']} or ../shared/data/books absent")
    return studies[0]


def score(ckpt, shown_ckpt, study, k, threads, where, flags=()):
    """One context's score of a fine-tuned model, run with its header's scaling (or
    flags); the command as shown names the model shown_ckpt."""
    E = study.ctx(k)
    if study.kind == "ppl":
        cmd = ex.ppl_command(ckpt, None, study.text, E, flags)
        r = ex.run_json(cmd, threads)
        keep = ("tokens", "windows", "nll", "nll_se", "nll_se_windows", "ppl", "ppl_lo", "ppl_hi", "scaling")
        r = {key: r[key] for key in keep if key in r}
    else:
        cmd = ex.passkey_command(ckpt, None, study.filler, E, E - study.answer_tokens, study.depths, study.trials,
                                 flags)
        r = ex.run_json(cmd, threads)
        r = dict(cells=[dict(depth=c["depth"], correct=c["correct"], trials=len(c["trials"])) for c in r["cells"]])
        r["correct"] = sum(c["correct"] for c in r["cells"])
        r["trials"] = sum(c["trials"] for c in r["cells"])
    shown = where.command([shown_ckpt if c == Path(ckpt) else c for c in cmd])
    return dict(r, k=k, ctx=E, command=shown)


def run_cell(name, plan, threads, results):
    """Fine-tune (unless RESULTS/checkpoints/NAME holds this command's models), score every
    budget at every factor, write RESULTS/NAME.json (through a temporary name)."""
    base, method = parse_cell_name(name)
    results = Path(results).resolve()  # finetune.py runs from the repository root, wherever we are
    out = results / "checkpoints" / name
    cmd = finetune_command(base, method, plan, out, threads)
    t0 = time.time()
    summary_file = out / "summary.json"
    done = summary_file.is_file() and all(snapshot(out, s, plan).is_file() for s in plan["steps"])
    if done:
        have = ex.read_json(summary_file, "a fine-tune's summary")
        seq_len, scaling, batch = fine_tune_shape(method, plan)
        want = dict(steps=plan["steps"][-1], batch_size=batch, seq_len=seq_len, scaling=scaling)
        got = dict(steps=have["steps"], batch_size=have["batch_size"], seq_len=have["seq_len"],
                   scaling=have["rope"]["scaling"])
        if got != want:
            raise RuntimeError(f"{summary_file}: a fine-tune of {got}, expected {want}; remove {out} to redo it")
    if done:
        print(f"finetune_study: {name}: the fine-tune is in {out}; scoring it", file=sys.stderr)
    else:
        print(f"finetune_study: {name}: " + " ".join(cmd), file=sys.stderr, flush=True)
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        last = ""
        with subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True) as p:
            for line in p.stderr:  # its progress, each line named by the cell (cells run side by side)
                last = line.strip() or last
                print(f"{name}: {line.rstrip()}", file=sys.stderr, flush=True)
        if p.returncode != 0:
            raise RuntimeError(f"{name}: tools/finetune.py exit {p.returncode}: {last or 'no message'}")
    summary = ex.read_json(summary_file, "a fine-tune's summary")
    answer_nll = None  # the passkey answer tokens' training loss at the end (the last log record's EMA)
    for line in (out / "log.jsonl").read_text().splitlines():
        answer_nll = json.loads(line).get("answer_nll_ema", answer_nll)
    with tempfile.TemporaryDirectory() as work:
        study = eval_study(base, plan, work)
        where = ex.Where(work)
        budgets = []
        for steps in plan["steps"]:
            ckpt = snapshot(out, steps, plan)
            shown_ckpt = "RESULTS/" + str(ckpt.relative_to(results))
            rows = [score(ckpt, shown_ckpt, study, k, threads, where) for k in plan["factors"]]
            budgets.append(dict(steps=steps, tokens=steps * plan["batch"] * K_FT * study.L,
                                checkpoint=str(ckpt.relative_to(results)), rows=rows))
            if method == CONTROL:  # and with training-free YaRN at factor K_FT (from 1x on, as a fine-tune's factor)
                budgets[-1]["rows_yarn"] = [score(ckpt, shown_ckpt, study, k, threads, where, CONTROL_FLAGS)
                                            for k in plan["factors"]]
            shown = ", ".join(f"{ex.factor_label(r['k'])} " + (f"{r['ppl']:.2f}" if "ppl" in r else
                                                              f"{r['correct']}/{r['trials']}") for r in rows)
            print(f"finetune_study: {name}, {steps} steps: {shown}", file=sys.stderr, flush=True)
    shown_cmd = " ".join(shlex.quote(str(a)) for a in cmd).replace(str(results), "RESULTS")
    rec = dict(format=CELL_FORMAT, cell=name, plan=plan, base=base, method=method, kind=BASES[base]["kind"],
               L=study.L, E=fine_tune_shape(method, plan)[0], text=study.text.name if study.text else None,
               depths=list(study.depths), trials=study.trials,
               finetune_command=shown_cmd, finetune_cpu_s=round(summary["train_cpu_s"], 1),
               finetune_wall_s=round(summary["train_wall_s"], 1), threads=threads, reused_finetune=done,
               final_answer_nll=answer_nll,
               wall_s=round(time.time() - t0, 1), finished=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               budgets=budgets)
    ex.write_cell_file(results / f"{name}.json", rec)
    return rec


def all_cells(plan):
    return [cell_name(b, m) for b in plan["bases"] for m in METHODS + (CONTROL,)]


def cell_command(name, quick, threads, results):
    args = [".venv/bin/python", "tools/finetune_study.py", "--cell", name] + (["--quick"] if quick else []) + \
        ["--threads", str(threads), "--results", str(results)]
    return " ".join(shlex.quote(a) for a in args)


# --------------------------------------------------------------------------
# Collecting: tables and plot

# What the tables and plot read of a cell file, checked by cell_problem (the
# kinds of tools/extrapolation_study/files.py's shape_problem; '?': may be null).
CELL_FIELDS = dict(plan="object", base="text", method="text", budgets="list", finetune_command="text",
                   finetune_cpu_s="nonneg", threads="positive", wall_s="nonneg", reused_finetune="bool",
                   final_answer_nll="number?")
PLAN_FIELDS = dict(steps="list", batch="positive", factors="list", bases="list")
BUDGET_FIELDS = dict(steps="positive", tokens="count", rows="list")
ROW_FIELDS = dict(ppl=dict(k="nonneg", command="text", ppl="nonneg", ppl_lo="nonneg", ppl_hi="nonneg"),
                  passkey=dict(k="nonneg", command="text", correct="count", trials="count"))


def plan_problem(plan):
    """What is wrong with a cell's plan for the tables, in a few words, or None."""
    problem = ex.shape_problem(plan, PLAN_FIELDS, "plan")
    if problem:
        return problem
    if not all(ex.fits(s, "positive") for s in plan["steps"]) or not plan["steps"]:
        return f"plan.steps: expected integers >= 1, got {json.dumps(plan['steps'])[:40]}"
    if not all(ex.fits(k, "nonneg") for k in plan["factors"]):
        return f"plan.factors: expected numbers >= 0, got {json.dumps(plan['factors'])[:40]}"
    bad = [b for b in plan["bases"] if b not in BASES]
    return f"plan.bases: expected some of {', '.join(BASES)}, got {bad[0]!r}" if bad else None


def budget_problem(b, i, kind, control):
    """What is wrong with a cell's budget i (its rows, and for the control its
    rows with YaRN on top, which the plot reads at K_FT), or None."""
    problem = ex.shape_problem(b, BUDGET_FIELDS, f"budgets[{i}]")
    if problem:
        return problem
    for key in ("rows", "rows_yarn") if control else ("rows",):
        rows = b.get(key)
        if not isinstance(rows, list) or not rows:
            return f"budgets[{i}].{key}: expected a list of rows, got {json.dumps(rows)[:40]}"
        problem = ex.list_problem(rows, ROW_FIELDS[kind], f"budgets[{i}].{key}")
        if problem:
            return problem
        if kind == "passkey" and any(r["correct"] > r["trials"] for r in rows):
            return f"budgets[{i}].{key}: expected correct <= trials, got more"
    if control and not any(r["k"] == K_FT for r in b["rows_yarn"]):
        return f"budgets[{i}].rows_yarn: expected a row at k = {K_FT}, got none"
    return None


def cell_problem(rec):
    """What is wrong with a fine-tune cell file's record for the tables and
    plot, in a few words, or None: a field absent or of another kind, a
    negative count, a base or method not its name's, a budget of its plan
    missing."""
    problem = ex.shape_problem(rec, CELL_FIELDS) or plan_problem(rec["plan"])
    if problem:
        return problem
    try:
        named = parse_cell_name(rec["cell"])
    except ValueError as e:
        return str(e)
    if (rec["base"], rec["method"]) != named:
        return f"expected base and method of {rec['cell']}, got {rec['base']} and {rec['method']}"
    for i, b in enumerate(rec["budgets"]):
        problem = budget_problem(b, i, BASES[rec["base"]]["kind"], rec["method"] == CONTROL)
        if problem:
            return problem
    absent = sorted(set(rec["plan"]["steps"]) - {b["steps"] for b in rec["budgets"]})
    return f"budgets: expected one of {absent[0]} steps (its plan's), got none" if absent else None


def read_cells(folders):
    """{name: record} of the cell files in the folders, all of one plan; ValueError naming a bad file."""
    cells = ex.read_cell_files(folders, "ft-*.json", CELL_FORMAT, "a fine-tune", check=cell_problem)
    plans = {json.dumps(r["plan"], sort_keys=True) for r in cells.values()}
    if len(plans) > 1:
        raise ValueError("the cell files come from different plans (--quick and the full study?); collect one")
    return cells


def training_free(out):
    """The training-free rows of results.json in out: {(model, method, k): row}, or {}."""
    try:
        saved = ex.read_json(Path(out) / "results.json", "the study's results")
    except ValueError:
        return {}
    rows = {}
    for r in saved.get("ppl", []) + saved.get("passkey", []):
        if ex.measured(r) and not r.get("same_as"):
            rows[(r["model"], r["method"], r["k"])] = r
    return rows


def passkey_counts(r):
    c = sum(x["correct"] for x in r["cells"])
    n = sum(x.get("trials", len(x.get("runs", []))) for x in r["cells"])
    return c, n


def cell_text(r, kind):
    if r is None:
        return "-"
    if kind == "ppl":
        return ex.ppl_cell(r)
    return ex.passkey_cell(*passkey_counts(r), interval=True)


def budget_label(steps):
    return f"fine-tuned {steps} step{'s' if steps != 1 else ''} (factor {K_FT})"


def tables(cells, plan, free):
    lines = []
    factors = plan["factors"]
    for base in plan["bases"]:
        kind = BASES[base]["kind"]
        what = "perplexity of books.txt" if kind == "ppl" else "passkey retrieval, correct / keys"
        lines += [f"### {base}: {what}, fine-tuned at {K_FT}x (E = {K_FT * 256}) against training-free", "",
                  "| method | rows | " + " | ".join(f"{ex.factor_label(k)} ({256 * k})" for k in factors) + " |",
                  "|---|---|" + "---:|" * len(factors)]
        for m in METHODS:
            free_row = [cell_text(free.get((base, m, k)), kind) for k in factors]
            lines.append(f"| {m} | training-free (factor k) | " + " | ".join(free_row) + " |")
            rec = cells.get(cell_name(base, m))
            for steps in plan["steps"]:
                if rec is None:
                    lines.append(f"| {m} | {budget_label(steps)} | " + " | ".join("missing" for _ in factors) + " |")
                    continue
                b = next(b for b in rec["budgets"] if b["steps"] == steps)
                by_k = {r["k"]: r for r in b["rows"]}
                lines.append(f"| {m} | {budget_label(steps)} | "
                             + " | ".join(cell_text(by_k.get(k), kind) for k in factors) + " |")
        rec = cells.get(cell_name(base, CONTROL))
        for key, what in (("rows", "plain RoPE"), ("rows_yarn", f"then training-free YaRN factor {K_FT}")):
            for steps in plan["steps"]:
                label = f"{CONTROL} at L, {steps} step{'s' if steps != 1 else ''}, {what}"
                if rec is None:
                    lines.append(f"| control | {label} | " + " | ".join("missing" for _ in factors) + " |")
                    continue
                b = next(b for b in rec["budgets"] if b["steps"] == steps)
                by_k = {r["k"]: r for r in b[key]}
                lines.append(f"| control | {label} | " + " | ".join(cell_text(by_k.get(k), kind) for k in factors)
                             + " |")
        base_1x = free.get((base, "none", 1))
        lines += ["", f"The control continues training at L = 256 with plain RoPE for the same steps and tokens "
                      f"({K_FT} times the windows of a step, each a quarter as long)."]
        if base_1x is not None:
            lines += [f"The base model at 1x: {cell_text(base_1x, kind)}."]
        lines.append("")
    lines += ["### Costs", "", "| cell | steps | tokens | fine-tune CPU time | threads | scoring and all, wall | "
              "answer tokens' training loss at the end |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name in all_cells(plan):
        rec = cells.get(name)
        if rec is None:
            lines.append(f"| {name} | missing | | | | | |")
            continue
        last = rec["budgets"][-1]
        lines.append(f"| {name} | {last['steps']} | {last['tokens']:,} | {rec['finetune_cpu_s'] / 60:.1f} min | "
                     f"{rec['threads']} | {rec['wall_s'] / 60:.1f} min"
                     + (" (fine-tune reused)" if rec["reused_finetune"] else "") + " | "
                     + (f"{rec['final_answer_nll']:.3f} nats" if rec.get("final_answer_nll") is not None else "")
                     + " |")
    lines += ["", "Commands (from the repository root; each cell's file and models go to RESULTS):", ""]
    for name in all_cells(plan):
        rec = cells.get(name)
        if rec:
            lines += [f"- {name}: `{rec['finetune_command']}`; scored by "
                      f"`{rec['budgets'][-1]['rows'][0]['command']}` and likewise at each context"]
    return lines + [""]


def plot(cells, plan, free, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    bases = [b for b in plan["bases"] if any(cells.get(cell_name(b, m)) for m in METHODS)]
    if not bases:
        return None
    fig, axes = plt.subplots(len(bases), 2, figsize=(13, 4.8 * len(bases)), squeeze=False)
    for row, base in zip(axes, bases):
        kind = BASES[base]["kind"]
        ax_steps, ax_ctx = row
        xs_steps = [0] + list(plan["steps"])
        for i, m in enumerate(METHODS):
            color = f"C{i}"
            rec = cells.get(cell_name(base, m))
            pts = []  # (steps, value, lo, hi) at K_FT
            r0 = free.get((base, m, K_FT))
            if r0 is not None:
                pts.append((0,) + value(r0, kind))
            if rec:
                for b in rec["budgets"]:
                    r = next((r for r in b["rows"] if r["k"] == K_FT), None)
                    if r:
                        pts.append((b["steps"],) + value(r, kind))
            if pts:
                x = [xs_steps.index(p[0]) for p in pts]
                ax_steps.errorbar(x, [p[1] for p in pts], yerr=[[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]],
                                  marker="o", ms=4, capsize=3, color=color, label=m)
            fr = [(k,) + value(free[(base, m, k)], kind) for k in plan["factors"] if (base, m, k) in free]
            if fr:
                ax_ctx.plot([256 * p[0] for p in fr], [p[1] for p in fr], ls="--", color=color, marker=".",
                            label=f"{m}, training-free (factor k)")
            if rec:
                last = rec["budgets"][-1]
                pr = [(r["k"],) + value(r, kind) for r in last["rows"]]
                ax_ctx.errorbar([256 * p[0] for p in pr], [p[1] for p in pr],
                                yerr=[[p[1] - p[2] for p in pr], [p[3] - p[1] for p in pr]], color=color,
                                marker="o", ms=4, capsize=3, label=f"{m}, {budget_label(last['steps'])}")
        ctrl = cells.get(cell_name(base, CONTROL))
        if ctrl:  # the control with YaRN factor K_FT on top, at K_FT x, against its steps
            pts = [(0,) + value(free[(base, "yarn", K_FT)], kind)] if (base, "yarn", K_FT) in free else []
            pts += [(b["steps"],) + value(next(r for r in b["rows_yarn"] if r["k"] == K_FT), kind)
                    for b in ctrl["budgets"]]
            ax_steps.errorbar([xs_steps.index(p[0]) + 0.06 for p in pts], [p[1] for p in pts],
                              yerr=[[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]], marker="s", ms=4,
                              capsize=3, color="grey", ls="--",
                              label=f"control: trained on at L, then yarn factor {K_FT} training-free")
        r1 = free.get((base, "none", 1))
        ylabel = "perplexity (bars: 95% interval)" if kind == "ppl" else "passkey accuracy (bars: 95% Wilson)"
        if r1 is not None:
            v = value(r1, kind)[0]
            for ax in row:
                ax.axhline(v, color="grey", lw=0.8, ls=":", label="base model at 1x")
        ax_steps.set_xticks(range(len(xs_steps)), [str(s) for s in xs_steps])
        ax_steps.set_xlabel(f"fine-tuning steps ({plan['batch']} x {K_FT * 256} tokens each; 0 = training-free)")
        ax_steps.set_ylabel(ylabel)
        ax_steps.set_title(f"{base}: at {K_FT}x (ctx {K_FT * 256}) against fine-tuning steps")
        ax_steps.grid(alpha=0.3)
        ax_steps.legend(fontsize=8)
        if kind == "ppl":
            for ax in row:
                ax.set_yscale("log")
                lo, hi = ax.get_ylim()
                ex.plain_ticks(ax.yaxis, ex.nice_log_ticks(lo, hi))
                ax.set_ylim(lo, hi)
        ex.finish_axes(ax_ctx, 256, "context length (tokens)", ylabel,
                       f"{base}: against context (grey line: L = 256; fine-tuned at {K_FT * 256})",
                       [256 * k for k in plan["factors"]])
        ax_ctx.axvline(K_FT * 256, color="grey", lw=0.8, ls="-.")
    fig.tight_layout()
    ex.save_figure(fig, out / "finetune.png")
    plt.close(fig)
    return "finetune.png"


def value(r, kind):
    """(value, lo, hi): perplexity and its 95% interval, or passkey accuracy and its Wilson interval."""
    if kind == "ppl":
        return r["ppl"], r["ppl_lo"], r["ppl_hi"]
    c, n = passkey_counts(r) if "cells" in r and "correct" not in r else (r["correct"], r["trials"])
    lo, hi = ex.wilson(c, n)
    return c / n if n else math.nan, lo, hi


def collect(folders, out, free_from=None):
    cells = read_cells(folders)
    plan = next(iter(cells.values()))["plan"]
    plan = dict(plan, steps=tuple(plan["steps"]), factors=tuple(plan["factors"]), bases=tuple(plan["bases"]))
    free = training_free(free_from or out)
    out = Path(out)
    ex.make_folder(out)
    missing = [n for n in all_cells(plan) if n not in cells]
    lines = ["# Extrapolation study: fine-tuned rows", "",
             f"Made by `.venv/bin/python tools/finetune_study.py` (tools/finetune_study.py says what a cell is). "
             f"Each method fine-tuned at {K_FT}x for {', '.join(map(str, plan['steps']))} steps of "
             f"{plan['batch']} window{'s' if plan['batch'] > 1 else ''} of {K_FT * 256} tokens, a constant rate "
             f"2e-4 after a {warmup(plan)}-step warmup; the "
             f"fine-tuned models run with the factor they were trained with ({K_FT}; ntk alpha {2 * K_FT}) at "
             "every context, the training-free rows with factor k (results.json). Intervals: 95%, as in table.md; "
             "the rows of a column score the same tokens (or keys), so their differences are more certain than "
             "either interval."
             + (f" Missing: {', '.join(missing)}." if missing else ""), ""]
    if not free:
        lines += [f"(No results.json in {ex.shown_folder(free_from or out)}: the training-free rows are empty.)", ""]
    lines += tables(cells, plan, free)
    ex.write_text(out / "finetune.md", "\n".join(lines))
    ex.write_json(out / "finetune.json", dict(plan=plan, cells=[cells[n] for n in sorted(cells)], missing=missing),
                  indent=1)
    files = ["finetune.md", "finetune.json"]
    name = plot(cells, plan, free, out)
    if name:
        files.append(name)
    return files, missing


# --------------------------------------------------------------------------

def main(argv=None):
    ap = ex.fanout_parser(__doc__, "cell files and fine-tuned models (default: results)",
                          "output folder (default docs/extrapolation; --quick: a temporary one)")
    ap.add_argument("--quick", action="store_true", help="1 and 2 steps of 1 window of one book, bundled only, 1x and 4x")
    args = ap.parse_args(argv)
    ex.check_fanout_args(args, "finetune_study")
    plan = dict(QUICK if args.quick else FULL)
    out = args.out or (Path(tempfile.mkdtemp(prefix="finetune-quick-")) if args.quick
                       else ROOT / "docs" / "extrapolation")
    free_from = ROOT / "docs" / "extrapolation"
    results = args.results or Path("results")
    try:
        if args.collect:
            files, missing = collect(args.collect, out, free_from)
            ex.report_written("finetune_study", files, out, missing)
            return
        if not ex.RUN.is_file():
            sys.exit("finetune_study: run not found; build it with `make`")
        if args.list:
            for name in all_cells(plan):
                print(cell_command(name, args.quick, args.threads, results))
            return
        if args.cell is not None:
            try:
                base, _ = parse_cell_name(args.cell)
            except ValueError as e:
                sys.exit(f"finetune_study: --cell {e}")
            if base not in plan["bases"]:
                sys.exit(f"finetune_study: --cell {args.cell}: not a cell of this plan ({', '.join(all_cells(plan))})")
            run_cell(args.cell, plan, args.threads, results)
            print(f"finetune_study: wrote {results / (args.cell + '.json')}", file=sys.stderr)
            return
        names = []
        for n in all_cells(plan):  # a cell whose file is there, of this plan, is not run again
            f = results / f"{n}.json"
            if f.is_file():
                have = ex.read_json(f, "a fine-tune cell file")
                if not isinstance(have, dict) or have.get("plan") != json.loads(json.dumps(plan)):
                    sys.exit(f"finetune_study: {f}: made by another plan; give another --results folder")
                continue
            names.append(n)
        jobs = args.jobs or max(1, (os.cpu_count() or 1) // args.threads)
        ex.run_pool("finetune_study", names, lambda n: run_cell(n, plan, args.threads, results), jobs)
        files, missing = collect([results], out, free_from)
        ex.report_written("finetune_study", files, out, missing)
    except (RuntimeError, ValueError) as e:
        sys.exit(f"finetune_study: {e}")


if __name__ == "__main__":
    main()
