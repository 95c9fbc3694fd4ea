"""What the fine-tune and attention studies (tools/finetune_study.py,
tools/attention_study.py) share with this study's fan-out: the command line of
--list, --cell and --collect (fanout_parser, check_fanout_args), cell files
written whole or not at all (write_cell_file) and read back (read_cell_files),
a pool that runs the cells (run_pool), and the closing line of a collect."""
import argparse
import concurrent.futures
import json
import os
import sys
import time
from pathlib import Path

from .stats import clock


def write_cell_file(path, rec):
    """path := rec as JSON, written under a temporary name and renamed, so that a
    file there is a finished cell."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(rec) + "\n")
    os.replace(tmp, path)


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
