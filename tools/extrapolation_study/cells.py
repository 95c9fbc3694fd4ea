"""Running a cell and its file. run_cell runs one job and writes RESULTS/NAME.json
(the plan, the study's record, the cell's result with its command, its wall
time and threads); run_cells runs many at a time, the costliest first;
read_cells reads a set of cell files back, checks what each holds
(cell_problem) and that they belong to one plan."""
import concurrent.futures
import os
import shutil
import sys
import time
from pathlib import Path

from .commands import ROOT, SHARED, Where
from .config import cell_name, factor_label, num, parse_cell_name
from .fanout import collect_folders, write_cell_file
from .files import list_problem, read_json, shape_problem
from .plan import Study, plan_args, plan_config, same_study
from .stats import clock, position_bins

CELL_FORMAT = "extrapolation-cell/1"  # a cell file's "format"; --collect reads no other


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


# What the tables and plots read of a cell file, checked by cell_problem
# (files.shape_problem's kinds; '?': may be absent or null).
CELL_FIELDS = dict(cell="text", plan="object", study="object", threads="positive", wall_s="nonneg", result="object")
PPL_FIELDS = dict(model="text", method="text", k="number", ctx="positive", train_ctx="positive", flags="text",
                  command="text", tokens="count", windows="count", nll="number", ppl="nonneg", ppl_lo="nonneg",
                  ppl_hi="nonneg", nll_se="nonneg?", nll_se_windows="nonneg?", position_bins="list?")
BIN_FIELDS = dict(first="positive", last="positive", n="positive", mean="number", lo="number?", hi="number?")
PASSKEY_FIELDS = dict(model="text", method="text", k="number", ctx="positive", length="count", train_ctx="positive",
                      flags="text", command="text", cells="list")
DEPTH_FIELDS = dict(length="count", depth="number", correct="count", trials="count", runs="list?")


def result_problem(kind, result):
    """What is wrong with a cell's result for the tables and plots, in a few
    words, or None: a field absent or of another kind, a negative count, more
    keys found than tried."""
    if kind == "ppl":
        return (shape_problem(result, PPL_FIELDS, "result")
                or list_problem(result.get("position_bins") or [], BIN_FIELDS, "result.position_bins"))
    problem = shape_problem(result, PASSKEY_FIELDS, "result") or list_problem(result["cells"], DEPTH_FIELDS,
                                                                              "result.cells")
    if problem:
        return problem
    over = [i for i, c in enumerate(result["cells"]) if c["correct"] > c["trials"]]
    return f"result.cells[{over[0]}]: expected correct <= trials, got more" if over else None


def cell_problem(rec):
    """What is wrong with a cell file's record (read_cells has checked its
    format and that it has every field), or None: its fields' kinds, a plan or
    study record this checkout cannot read, a result of another cell or not
    one the tables can show (result_problem)."""
    problem = shape_problem(rec, CELL_FIELDS)
    if problem:
        return problem
    try:
        plan_args(rec["plan"])
        plan_config(rec["plan"])
        study = study_from_record(rec["study"])
        study_name, method, k = parse_cell_name(rec["cell"])
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        return f"expected a plan and a study this checkout reads, got {type(e).__name__} {e}"
    if study.name != study_name or study.kind not in ("ppl", "passkey"):
        return f"expected the study {study_name} (of its name), got {study.name} (kind {study.kind})"
    problem = result_problem(study.kind, rec["result"])
    if problem:
        return problem
    got = (rec["result"]["model"], rec["result"]["method"], rec["result"]["k"])
    return None if got == (study_name, method, k) else f"expected the result of {rec['cell']}, got that of " \
        f"{cell_name(*got)}"


def read_cells(folders):
    """Every cell file (*.json) in the folders, as {name: record} and {name:
    file}. ValueError (one line, naming the file) unless each is a cell file
    (read_json: a regular file of JSON) named after its cell, whose record
    cell_problem finds right, all are of one plan, the cells of a study
    describe it alike, and no cell comes twice."""
    cells, where = {}, {}
    for folder in collect_folders(folders):
        for f in sorted(folder.glob("*.json")):
            rec = read_json(f, "a cell file")
            got = rec.get("format") if isinstance(rec, dict) else type(rec).__name__
            if got != CELL_FORMAT:
                raise ValueError(f"{f}: expected a cell file of format {CELL_FORMAT!r}, got format {got!r}")
            absent = [k for k in ("cell", "plan", "study", "threads", "wall_s", "result") if k not in rec]
            if absent:
                raise ValueError(f"{f}: a cell file without {', '.join(absent)}")
            name = rec["cell"]
            if name != f.stem:
                raise ValueError(f"{f}: holds cell {name}, expected {f.stem} (a cell's file is named after it)")
            problem = cell_problem(rec)
            if problem:
                raise ValueError(f"{f}: not a cell file the study reads: {problem}")
            if name in cells:
                raise ValueError(f"{f}: cell {name} is also in {where[name]}; keep one of them")
            cells[name], where[name] = rec, f
    if not cells:
        raise ValueError(f"--collect {' '.join(map(str, folders))}: no cell files (*.json) there")
    check_one_plan(cells, where)
    return cells, where


def check_one_plan(cells, where):
    """ValueError naming a file unless the cells are of one plan and the cells
    of a study describe it alike."""
    first = min(cells)
    study_seen = {}
    for name in sorted(cells):
        rec = cells[name]
        if rec["plan"] != cells[first]["plan"]:
            shown = [" ".join(plan_args(cells[n]["plan"])) or "the full study" for n in (name, first)]
            raise ValueError(f"{where[name]}: made by the plan {shown[0]!r}, expected {shown[1]!r} as {where[first]}")
        s = rec["study"]["name"]
        if s in study_seen and not same_study(rec["study"], cells[study_seen[s]]["study"]):
            raise ValueError(f"{where[name]}: describes study {s} unlike {where[study_seen[s]]} (another model, "
                             "text or checkout?)")
        study_seen.setdefault(s, name)
