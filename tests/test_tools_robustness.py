"""The study tools (tools/extrapolation.py, tools/finetune_study.py,
tools/attention_study.py) and tools/finetune.py against bad input: one line on
stderr naming the file or flag with the expected and the actual value, exit 1
(bad input) or 2 (bad usage), no traceback, no half-written output
(docs/robustness.md, "The study tools").

- An empty or unknown --cell is refused before any cell, text or pool starts.
- Every output goes through one helper (tools/extrapolation_study/files.py's
  write_output): a temporary file beside it, renamed when whole. A write that
  fails (a monkeypatched failure here, everywhere; a full 64 kB tmpfs where
  the tests run as root and may mount one) leaves no part of a file, and a
  file there before is kept.
- A cell file that is a dangling link, a folder, a FIFO, JSON nested too deep,
  holds a NaN, an infinity, a result of the wrong kind, a negative count: one
  line naming it, and nothing written.
- --out or --results naming a file or a device: one line, before any work.
- tools/finetune.py's bad flags and files are refused before torch loads.

The full-disk and fine-tune cases read the committed study files
(docs/extrapolation/) and the books of ../shared; a case whose inputs are
absent is skipped with a message.
"""
import errno
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import HANG_GUARD_S, ROOT, SHARED

sys.path.insert(0, str(ROOT / "tools"))
import attention_study as at  # noqa: E402
import extrapolation as ex  # noqa: E402
import finetune_study as fs  # noqa: E402
from extrapolation_study import modes as ex_modes  # noqa: E402

STUDY = ROOT / "docs" / "extrapolation"
CELLS = STUDY / "cells"
ATTENTION_CELLS = STUDY / "attention-cells"
TOOLS = {name: ROOT / "tools" / f"{name}.py" for name in ("extrapolation", "finetune_study", "attention_study")}


def one_line_exit(call):
    """The message of the SystemExit that call() ends with: one line (sys.exit(str): exit status 1)."""
    with pytest.raises(SystemExit) as e:
        call()
    assert isinstance(e.value.code, str) and "\n" not in e.value.code, e.value.code
    return e.value.code


def never(what):
    """A stand-in for a function that must not run: fails the test, naming what started."""
    def fail(*args, **kwargs):
        pytest.fail(f"{what} started", pytrace=False)
    return fail


def run_tool(argv, timeout=HANG_GUARD_S):
    p = subprocess.run([sys.executable] + [str(a) for a in argv], capture_output=True, text=True, cwd=ROOT,
                       timeout=timeout)
    return p, p.stderr.strip().splitlines()


def finetune_cells(folder):
    """The committed fine-tune cells (kept in finetune.json) as cell files in folder."""
    if not (STUDY / "finetune.json").is_file():
        pytest.skip(f"{STUDY / 'finetune.json'} not found")
    folder.mkdir()
    for rec in json.loads((STUDY / "finetune.json").read_text())["cells"]:
        (folder / f"{rec['cell']}.json").write_text(json.dumps(rec))
    return folder


# --------------------------------------------------------------------------
# 1. --cell

@pytest.mark.parametrize("name", ["", "  ", "bundled_bogus_4x", "bundled_yarn_3x"])
def test_extrapolation_refuses_an_empty_or_unknown_cell_before_anything_runs(name, tmp_path, monkeypatch):
    monkeypatch.setattr(ex, "study_main", never("the whole study"))
    monkeypatch.setattr(ex_modes, "prepare", never("making the cell's text"))
    message = one_line_exit(lambda: ex.main(["--cell", name, "--results", str(tmp_path / "r")]))
    assert message.startswith("extrapolation: --cell ") and "expected" in message, message
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("tool, name", [(fs, ""), (fs, "ft-bundled_bogus_4x"), (at, ""), (at, "attn-bundled_x_4x")])
def test_fanout_tools_refuse_an_empty_or_unknown_cell(tool, name, tmp_path, monkeypatch):
    if not ex.RUN.is_file():
        pytest.skip(f"{ex.RUN} not built")
    monkeypatch.setattr(ex, "run_pool", never("the pool of every cell"))
    monkeypatch.setattr(tool, "run_cell", never("a cell"))
    message = one_line_exit(lambda: tool.main(["--cell", name, "--results", str(tmp_path / "r")]))
    assert "--cell " in message and "expected" in message, message
    assert not (tmp_path / "r").exists()


# --------------------------------------------------------------------------
# 2. writing whole or not at all

def test_write_output_keeps_the_old_file_when_a_write_fails(tmp_path):
    target = tmp_path / "results.json"
    target.write_text("the old results\n")

    def half_then_full(f):
        f.write("{\"half\": ")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    with pytest.raises(ex.OutputError) as e:
        ex.write_output(target, half_then_full)
    message = str(e.value)
    assert "\n" not in message and str(target) in message and "No space left on device" in message, message
    assert target.read_text() == "the old results\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]  # no temporary left
    ex.write_text(target, "new\n")
    assert target.read_text() == "new\n" and sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]
    # a folder where the file goes, or a file where its folder goes
    (tmp_path / "table.md").mkdir()
    with pytest.raises(ex.OutputError, match="table.md: cannot write it: expected a file or nothing there, got a "
                                             "folder"):
        ex.write_text(tmp_path / "table.md", "x")
    with pytest.raises(ex.OutputError, match="results.json: expected a folder to write in, got a file"):
        ex.write_text(target / "x.csv", "x")


def test_write_json_refuses_nan_and_writes_nothing(tmp_path):
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ex.OutputError, match="expected finite numbers"):
            ex.write_json(tmp_path / "results.json", dict(meta={}, ppl=[dict(ppl=bad)]))
    assert list(tmp_path.iterdir()) == []


def test_collect_whose_write_fails_leaves_no_part(tmp_path, monkeypatch):
    """--collect when the disk fills (fsync is where a full disk may first say
    so): one line naming results.json, no part of it, an earlier one kept."""
    if not CELLS.is_dir():
        pytest.skip(f"{CELLS} not found")
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text("earlier\n")

    def no_room(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(os, "fsync", no_room)
    message = one_line_exit(lambda: ex.main(["--collect", str(CELLS), "--out", str(out)]))
    assert f"{out / 'results.json'}: cannot write it: No space left on device" in message, message
    assert sorted(p.name for p in out.iterdir()) == ["results.json"] and (out / "results.json").read_text() == \
        "earlier\n"


@pytest.fixture
def full_disk(tmp_path):
    """A folder on a 64 kB tmpfs (root only: mount(8)); skipped where it cannot be mounted."""
    folder = tmp_path / "full"
    folder.mkdir()
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("a full disk needs a small tmpfs, mounted as root; not root here "
                    "(test_collect_whose_write_fails_leaves_no_part covers the helper)")
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)], capture_output=True,
                       text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({p.stderr.strip()}); "
                    "test_collect_whose_write_fails_leaves_no_part covers the helper")
    try:
        yield folder
    finally:
        if subprocess.run(["umount", str(folder)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(folder)], capture_output=True)


@pytest.mark.parametrize("tool, json_name", [("extrapolation", "results.json"), ("finetune_study", "finetune.json"),
                                             ("attention_study", "attention.json")])
def test_collect_on_a_full_disk(tool, json_name, full_disk, tmp_path):
    """--collect into 64 kB: the JSON does not fit. One line naming it, exit 1;
    what is there is whole (a file written before it, byte for byte what a
    roomy disk gets) and an earlier file of that name is kept."""
    cells = {"extrapolation": CELLS, "attention_study": ATTENTION_CELLS}.get(tool) or finetune_cells(tmp_path / "ft")
    if not cells.is_dir():
        pytest.skip(f"{cells} not found")
    good = tmp_path / "good"
    p, err = run_tool([TOOLS[tool], "--collect", cells, "--out", good])
    assert p.returncode == 0, p.stderr
    (full_disk / json_name).write_text("earlier\n")
    p, err = run_tool([TOOLS[tool], "--collect", cells, "--out", full_disk])
    assert p.returncode == 1 and len(err) == 1, p.stderr
    assert f"{full_disk / json_name}: cannot write it: No space left on device" in err[0], err
    assert (full_disk / json_name).read_text() == "earlier\n"
    for f in full_disk.iterdir():
        assert not f.name.startswith("."), f.name  # no temporary left
        if f.name != json_name:
            assert f.read_bytes() == (good / f.name).read_bytes(), f.name  # whole, never a part


# --------------------------------------------------------------------------
# 3. cell files and folders

def small_study(folder):
    """Two committed cells (one of each kind) in folder: a plan the tools collect, the rest missing."""
    if not CELLS.is_dir():
        pytest.skip(f"{CELLS} not found")
    folder.mkdir()
    for name in ("bundled_none_1x", "retrieval_yarn_4x"):
        shutil.copy(CELLS / f"{name}.json", folder)
    return folder


def edited(cell, change):
    """The committed cell's record with change(rec) applied, as JSON text."""
    rec = json.loads((CELLS / f"{cell}.json").read_text())
    change(rec)
    return json.dumps(rec)


def make_bad(path, kind):
    """path made into a bad cell file of this kind; returns the words the message must hold."""
    if kind == "dangling link":
        path.symlink_to(path.parent / "nowhere.json")
        return "expected a cell file (JSON), got a dangling symbolic link"
    if kind == "folder":
        path.mkdir()
        return "expected a cell file (JSON), got a folder"
    if kind == "nested deep":
        path.write_text("[" * 200000 + "]" * 200000)
        return "got JSON nested too deep to read"
    if kind == "nested 40":
        path.write_text(edited("bundled_none_1x", lambda r: r["result"].update(extra=json.loads("[" * 40 + "]" * 40))))
        return "got JSON nested 42 deep"
    if kind == "result null":
        path.write_text(edited("bundled_none_1x", lambda r: r.update(result=None)))
        return "result: expected an object, got null"
    if kind == "result string":
        path.write_text(edited("bundled_none_1x", lambda r: r.update(result="90.5")))
        return "result: expected an object, got \"90.5\""
    if kind == "nan":
        path.write_text(edited("bundled_none_1x", lambda r: r["result"].update(ppl=12345.5)).replace("12345.5", "NaN"))
        return "NaN, which JSON has not"
    if kind == "huge":
        path.write_text(edited("bundled_none_1x", lambda r: r.update(wall_s=12345.5)).replace("12345.5", "1e999"))
        return "the number 1e999, beyond what a float holds"
    if kind == "negative tokens":
        path.write_text(edited("bundled_none_1x", lambda r: r["result"].update(tokens=-5)))
        return "result.tokens: expected an integer >= 0, got -5"
    if kind == "negative correct":
        path.write_text(edited("retrieval_yarn_4x", lambda r: r["result"]["cells"][2].update(correct=-1)))
        return "result.cells[2].correct: expected an integer >= 0, got -1"
    if kind == "more correct than trials":
        path.write_text(edited("retrieval_yarn_4x", lambda r: r["result"]["cells"][0].update(correct=99)))
        return "result.cells[0]: expected correct <= trials"
    if kind == "zero threads":
        path.write_text(edited("bundled_none_1x", lambda r: r.update(threads=0)))
        return "threads: expected an integer >= 1, got 0"
    assert False, kind


CELL_CASES = ["dangling link", "folder", "nested deep", "nested 40", "result null", "result string", "nan", "huge",
              "negative tokens", "negative correct", "more correct than trials", "zero threads"]


@pytest.mark.parametrize("kind", CELL_CASES)
def test_a_bad_cell_file_is_one_line_naming_it(kind, tmp_path):
    folder = small_study(tmp_path / "cells")
    name = "retrieval_yarn_4x" if "correct" in kind else "bundled_none_1x"
    bad = folder / f"{name}.json"
    bad.unlink()
    words = make_bad(bad, kind)
    out = tmp_path / "out"
    message = one_line_exit(lambda: ex.main(["--collect", str(folder), "--out", str(out)]))
    assert message.startswith(f"extrapolation: {bad}: ") and words in message, message
    assert not out.exists()


def test_a_fifo_cell_file_is_refused_without_waiting(tmp_path):
    """A FIFO named like a cell file is never opened (reading it would wait for a writer)."""
    folder = small_study(tmp_path / "cells")
    fifo = folder / "bundled_yarn_4x.json"
    os.mkfifo(fifo)
    p, err = run_tool([TOOLS["extrapolation"], "--collect", folder, "--out", tmp_path / "out"], timeout=60)
    assert p.returncode == 1 and err == [f"extrapolation: {fifo}: expected a cell file (JSON), got a FIFO"], err


def test_another_cells_result_is_refused(tmp_path):
    folder = small_study(tmp_path / "cells")
    (folder / "bundled_yarn_1x.json").write_text(edited("bundled_none_1x", lambda r: r.update(cell="bundled_yarn_1x")))
    message = one_line_exit(lambda: ex.main(["--collect", str(folder), "--out", str(tmp_path / "out")]))
    assert "bundled_yarn_1x.json: not a cell file the study reads: expected the result of bundled_yarn_1x, got that " \
           "of bundled_none_1x" in message, message


def test_a_good_collect_of_a_small_study_still_works(tmp_path):
    folder = small_study(tmp_path / "cells")
    ex.main(["--collect", str(folder), "--out", str(tmp_path / "out")])
    saved = (tmp_path / "out" / "results.json").read_text()
    assert "NaN" not in saved and "Infinity" not in saved
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if p.name.startswith(".")) == []


def attention_case(rec, kind):
    """An attention cell's record made bad; returns the words the message must hold."""
    if kind == "stats null":
        rec["stats"] = None
        return "stats: expected an object, got null"
    if kind == "negative queries":
        rec["stats"]["position_buckets"][1]["queries"] = -3
        return "stats.position_buckets[1].queries: expected an integer >= 0, got -3"
    if kind == "short grid":
        rec["stats"]["entropy"][2].pop()
        return "stats.entropy[2]: expected a list of 4"
    if kind == "other method":
        rec["method"] = "yarn"
        return "expected the study, method and factor of attn-bundled_none_1x"
    assert False, kind


@pytest.mark.parametrize("kind", ["stats null", "negative queries", "short grid", "other method", "nan", "folder"])
def test_a_bad_attention_cell_file_is_one_line(kind, tmp_path):
    if not ATTENTION_CELLS.is_dir():
        pytest.skip(f"{ATTENTION_CELLS} not found")
    folder = tmp_path / "cells"
    shutil.copytree(ATTENTION_CELLS, folder)
    bad = folder / "attn-bundled_none_1x.json"
    rec = json.loads(bad.read_text())
    bad.unlink()
    if kind == "folder":
        bad.mkdir()
        words = "got a folder"
    elif kind == "nan":
        bad.write_text(json.dumps(rec).replace("\"wall_s\": ", "\"wall_s\": NaN, \"was\": ", 1))
        words = "NaN, which JSON has not"
    else:
        words = attention_case(rec, kind)
        bad.write_text(json.dumps(rec))
    message = one_line_exit(lambda: at.main(["--collect", str(folder), "--out", str(tmp_path / "out")]))
    assert message.startswith(f"attention_study: {bad}: ") and words in message, message
    assert not (tmp_path / "out").exists()


def finetune_case(rec, kind):
    """A fine-tune cell's record made bad; returns the words the message must hold."""
    if kind == "budgets null":
        rec["budgets"] = None
        return "budgets: expected a list, got null"
    if kind == "negative trials":
        rec["budgets"][0]["rows"][1]["trials"] = -2
        return "budgets[0].rows[1].trials: expected an integer >= 0, got -2"
    if kind == "a budget missing":
        rec["budgets"].pop(1)
        return "budgets: expected one of 100 steps (its plan's), got none"
    if kind == "string steps":
        rec["plan"]["steps"] = "25"
        return "plan.steps: expected a list"
    assert False, kind


@pytest.mark.parametrize("kind", ["budgets null", "negative trials", "a budget missing", "string steps"])
def test_a_bad_finetune_cell_file_is_one_line(kind, tmp_path):
    folder = finetune_cells(tmp_path / "cells")
    name = "ft-retrieval_yarn_4x" if kind == "negative trials" else "ft-bundled_yarn_4x"
    bad = folder / f"{name}.json"
    rec = json.loads(bad.read_text())
    words = finetune_case(rec, kind)
    bad.write_text(json.dumps(rec))
    message = one_line_exit(lambda: fs.main(["--collect", str(folder), "--out", str(tmp_path / "out")]))
    assert message.startswith(f"finetune_study: {bad}: ") and words in message, message
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("target", ["a file", "/dev/null"])
@pytest.mark.parametrize("tool", ["extrapolation", "finetune_study", "attention_study"])
def test_out_naming_a_file_or_a_device_is_one_line(tool, target, tmp_path):
    where = tmp_path / "a-file.md" if target == "a file" else target
    if target == "a file":
        where.write_text("keep me\n")
    got = "got a file" if target == "a file" else "got a device"
    module = {"extrapolation": ex, "finetune_study": fs, "attention_study": at}[tool]
    message = one_line_exit(lambda: module.main(["--collect", str(tmp_path / "none"), "--out", str(where)]))
    assert message == f"{tool}: --out {where}: expected a folder, {got}", message
    if target == "a file":
        assert where.read_text() == "keep me\n"


@pytest.mark.parametrize("tool, cell", [("extrapolation", "bundled_yarn_4x"), ("finetune_study", "ft-bundled_yarn_4x"),
                                        ("attention_study", "attn-bundled_yarn_4x")])
def test_results_naming_a_file_is_refused_before_the_cell_runs(tool, cell, tmp_path, monkeypatch):
    if not ex.RUN.is_file():
        pytest.skip(f"{ex.RUN} not built")
    module = {"extrapolation": ex, "finetune_study": fs, "attention_study": at}[tool]
    monkeypatch.setattr(ex_modes, "prepare", never("making the cell's text"))
    if module is not ex:
        monkeypatch.setattr(module, "run_cell", never("the cell"))
    results = tmp_path / "results.txt"
    results.write_text("")
    message = one_line_exit(lambda: module.main(["--cell", cell, "--results", str(results)]))
    assert message == f"{tool}: --results {results}: expected a folder, got a file", message


# --------------------------------------------------------------------------
# 4. tools/finetune.py: refused before torch loads

FINETUNE_BASE = ["models/model.bin", "--seq-len", "512", "--rope-scaling", "yarn", "--max-steps", "1",
                 "--batch-size", "1", "--books", "cranford", "--eval-every", "0", "--no-final-eval"]
# Runs tools/finetune.py as `python tools/finetune.py ARGS` would, then says on
# stdout whether torch was loaded by the time it exited.
TORCH_PROBE = ("import atexit, runpy, sys\n"
               "atexit.register(lambda: print('torch loaded' if 'torch' in sys.modules else 'no torch'))\n"
               "sys.argv = ['tools/finetune.py'] + sys.argv[1:]\n"
               "sys.path.insert(0, 'tools')\n"
               "runpy.run_path('tools/finetune.py', run_name='__main__')\n")


def finetune_refusal(tmp_path, extra, books=True):
    """(exit status, stderr lines, stdout) of finetune.py with FINETUNE_BASE + extra, out-dir tmp_path/out."""
    if books and not (SHARED / "data" / "books" / "cranford.txt").is_file():
        pytest.skip(f"{SHARED / 'data' / 'books'} not found (set SHARED_DIR to the shared folder)")
    argv = FINETUNE_BASE + ["--cache-dir", str(tmp_path / "cache"), "--out-dir", str(tmp_path / "out")] + extra
    p = subprocess.run([sys.executable, "-c", TORCH_PROBE] + argv, capture_output=True, text=True, cwd=ROOT,
                       timeout=HANG_GUARD_S)
    return p.returncode, p.stderr.strip().splitlines(), p.stdout.strip()


@pytest.mark.parametrize("extra, code, words", [
    (["--lr", "-1"], 2, "--lr -1: expected a finite number > 0"),
    (["--lr", "nan"], 2, "--lr nan: expected a finite number > 0"),
    (["--lr", "inf"], 2, "--lr inf: expected a finite number > 0"),
    (["--threads", "0"], 2, "--threads 0: expected >= 1"),
    (["--grad-clip", "0"], 2, "--grad-clip 0: expected a finite number > 0"),
    (["--seed", "-1"], 2, "--seed -1: expected >= 0"),
])
def test_finetune_refuses_a_bad_flag_before_torch_loads(extra, code, words, tmp_path):
    rc, err, out = finetune_refusal(tmp_path, extra, books=False)
    assert rc == code and len(err) == 1 and err[0].startswith(f"finetune.py: {words}"), err
    assert out == "no torch" and not (tmp_path / "out").exists()


@pytest.mark.parametrize("case", ["truncated tokenizer", "missing eval text", "out-dir a file", "out-dir a device"])
def test_finetune_refuses_a_bad_file_before_torch_loads(case, tmp_path):
    truncated = tmp_path / "tokenizer.model"
    truncated.write_bytes((ROOT / "models" / "tokenizer.model").read_bytes()[:1000])
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    extra, words = {
        "truncated tokenizer": (["--tokenizer", str(truncated)], f"--tokenizer {truncated}: expected a sentencepiece "
                                                                 "model, got a file it cannot read"),
        "missing eval text": (["--eval-text", str(tmp_path / "missing.txt")],
                              f"--eval-text {tmp_path / 'missing.txt'}: expected a UTF-8 text file, got nothing"),
        "out-dir a file": (["--out-dir", str(a_file)], f"--out-dir {a_file}: expected a folder, got a file"),
        "out-dir a device": (["--out-dir", "/dev/null"], "--out-dir /dev/null: expected a folder, got a device"),
    }[case]
    rc, err, out = finetune_refusal(tmp_path, extra)
    assert rc == 1 and len(err) == 1 and err[0].startswith(f"finetune.py: {words}"), err
    assert out == "no torch" and not (tmp_path / "out").exists()
    assert a_file.read_text() == ""
