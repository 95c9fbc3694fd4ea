"""What each mode of tools/extrapolation.py's command line does once the options
are read: the whole study on this machine (study_main), --list, --cell,
--collect and --stream-cell. Each exits with a one-line message on failure."""
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from .cells import outcome, read_cells, run_cell, run_cells, study_record
from .collect import collect, kept_trials, shown_folder, write_outputs
from .commands import ROOT, Where
from .config import cell_name, parse_cell_name
from .files import OutputError, folder_problem, make_folder
from .plan import (all_jobs, cell_command, config_cells, make_studies, plan_args, plan_config, plan_of_studies,
                   same_study)
from .stats import clock
from .texts import stream_cell


def stream_cell_main(args):
    """--stream-cell: one sinks cell, its JSON on stdout."""
    if not args.window or not args.ctx:
        sys.exit("extrapolation: --stream-cell needs --window E and --ctx L")
    ckpt, text = map(Path, args.stream_cell)
    for p in (ckpt, text):
        if not p.is_file():
            sys.exit(f"extrapolation: {p}: no such file")
    problem = folder_problem("--segments", args.segments) if args.segments else None
    if problem:
        sys.exit(f"extrapolation: {problem}")
    with tempfile.TemporaryDirectory() as tmp:
        work = args.segments or Path(tmp)
        try:
            make_folder(work)
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
    """--cell: run one cell of the plan (its text made here) and write its file.
    A name that is no cell of the plan is refused before any text is made."""
    try:
        study, _, _ = parse_cell_name(name)
    except ValueError as e:
        sys.exit(f"extrapolation: --cell {e}")
    config = plan_config(plan)
    if study not in config:
        sys.exit(f"extrapolation: --cell {name}: expected a study of the plan ({', '.join(config)}), got {study}")
    if name not in {cell_name(study, m, k) for m, k in config_cells(study, config[study])}:
        sys.exit(f"extrapolation: --cell {name}: expected a cell of the plan (`--list` with the same options names "
                 f"them), got one it does not run")
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
    try:
        files = write_outputs(ppl, passkey, studies, out, meta)
    except OutputError as e:
        sys.exit(f"extrapolation: {e}")
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
            if rec["study"]["name"] in records and not same_study(rec["study"], records[rec["study"]["name"]]):
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
        try:
            files = write_outputs(ppl, passkey, studies, out, meta)
        except OutputError as e:
            sys.exit(f"extrapolation: {e}")
    print(f"extrapolation: {meta['wall_s'] / 60:.1f} min; wrote {', '.join(files)} in {out}", file=sys.stderr)
