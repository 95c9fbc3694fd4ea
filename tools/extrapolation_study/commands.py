"""Commands: where the files are (ROOT, SHARED, RUN), the `run` commands of a
cell as lists of str and Path, shown with paths a user can type (Where), and
running them: run_json runs one; passkey_by_trials runs a passkey command a
trial at a time, keeping each trial, so that a stopped cell goes on from there."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from .config import SINKS, num
from .fanout import write_cell_file
from .files import read_json, shape_problem
from .stats import clock

ROOT = Path(__file__).resolve().parents[2]  # the repository (this file is tools/extrapolation_study/commands.py)
SHARED = Path(os.environ.get("SHARED_DIR") or ROOT.parent / "shared")
RUN = Path(os.environ.get("RUN") or ROOT / "run")


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
    """[ckpt] and -z TOK unless TOK is the tokenizer.bin run finds beside the checkpoint; a GGUF
    with --gguf-convert q8_0: the studies' cells were made with q8_0 weights (model-q8_0.bin's),
    and run now keeps a GGUF's Q4_0 and Q4_1 matrices as stored by default."""
    args = [Path(ckpt)] + (["--gguf-convert", "q8_0"] if str(ckpt).endswith(".gguf") else [])
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
    """The command that reproduces a whole sinks cell (tools/extrapolation.py's --stream-cell)."""
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


PART_FIELDS = dict(command="text", threads="positive", wall_s="nonneg", cell="object")
PART_CELL_FIELDS = dict(length="count", depth="number", correct="count", trials="list")


def read_part(f):
    """A kept trial (passkey_by_trials writes them); RuntimeError, one line
    naming it, for a file that is not one."""
    try:
        part = read_json(f, "a kept trial of a passkey cell")
    except ValueError as e:
        raise RuntimeError(f"{e}; remove it to run the trial again") from None
    problem = shape_problem(part, PART_FIELDS) or shape_problem(part["cell"], PART_CELL_FIELDS, "cell")
    if problem:
        raise RuntimeError(f"{f}: expected a kept trial of a passkey cell, got one with {problem}; remove it to run "
                           "the trial again")
    return part


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
                part = read_part(f)
                if part["command"] != shown:
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
