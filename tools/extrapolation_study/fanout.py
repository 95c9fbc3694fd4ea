"""What the fine-tune and attention studies (tools/finetune_study.py,
tools/attention_study.py) share with this study's fan-out: the command line of
--list, --cell and --collect (fanout_parser, check_fanout_args), cell files
written whole or not at all (write_cell_file) and read back (read_cell_files),
a pool that runs the cells (run_pool), and the closing line of a collect."""
import argparse
import concurrent.futures
import sys
import time
from pathlib import Path

from .files import folder_problem, read_json, what_is, write_json
from .stats import clock


def write_cell_file(path, rec):
    """path := rec as JSON, through write_json (a temporary file renamed), so
    that a file there is a finished cell."""
    write_json(path, rec)


def collect_folders(folders):
    """The --collect folders as Paths; ValueError, one line, for one that is not a folder."""
    for folder in map(Path, folders):
        got = what_is(folder)
        if got != "a folder":
            raise ValueError(f"--collect {folder}: " + ("no such folder" if got == "nothing" else
                                                        f"expected a folder, got {got}"))
    return [Path(f) for f in folders]


def read_cell_files(folders, pattern, fmt, what, check=None):
    """{name: record} of the files matching pattern in the folders (the fine-tune
    and attention studies' cells; this study's own go through read_cells):
    ValueError, one line naming the file, for a file that is not JSON
    (read_json) of format fmt, whose cell is not named as the file is, of which
    check(rec) finds a problem (a few words, or None), or a cell found twice,
    and when there is no file at all."""
    cells = {}
    for folder in collect_folders(folders):
        for f in sorted(folder.glob(pattern)):
            rec = read_json(f, f"{what} cell file")
            if not isinstance(rec, dict) or rec.get("format") != fmt:
                raise ValueError(f"{f}: expected format {fmt!r}")
            if rec.get("cell") != f.stem:
                raise ValueError(f"{f}: holds cell {rec.get('cell')!r}, expected {f.stem} (a cell's file is named "
                                 "after it)")
            problem = check(rec) if check else None
            if problem:
                raise ValueError(f"{f}: not {what} cell this tool reads: {problem}")
            if rec["cell"] in cells:
                raise ValueError(f"{f}: cell {rec['cell']} collected twice; keep one")
            cells[rec["cell"]] = rec
    if not cells:
        raise ValueError(f"--collect {' '.join(map(str, folders))}: no {what} cell files ({pattern}) there")
    return cells


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
    """Exit with one line for two modes at once, an empty --cell, a count below
    1, or an --out or --results that is there but not a folder (a file, a
    device)."""
    modes = [m for m, on in (("--list", args.list), ("--cell", args.cell is not None),
                             ("--collect", args.collect is not None)) if on]
    if len(modes) > 1:
        sys.exit(f"{tool}: expected at most one of --list, --cell, --collect, got {' and '.join(modes)}")
    if args.cell is not None and not args.cell.strip():
        sys.exit(f"{tool}: --cell {args.cell!r}: expected a cell's name (--list names them), got an empty one")
    for flag, v in (("--jobs", args.jobs), ("--threads", args.threads)):
        if v is not None and v < 1:
            sys.exit(f"{tool}: {flag} {v}: expected at least 1")
    for flag, v in (("--out", args.out), ("--results", args.results)):
        problem = folder_problem(flag, v) if v is not None else None
        if problem:
            sys.exit(f"{tool}: {problem}")


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
