"""tools/finetune_study.py, the fine-tuned rows of the study, on its --quick plan (1 and
2 steps of one window of one training book, bundled model, 1x and 4x):

- every cell writes its file and its models; each score in the file is what its
  command, as the file shows it, prints when run again (the same binary, so equal);
- the models run with the scaling they were fine-tuned with (no flags): the 4x
  score of the 2-step linear model differs from the base model's training-free
  linear score at 4x, and -m rope of a snapshot says linear, factor 4;
- a second run reuses the fine-tunes (the file says so) and gives the same scores;
- --collect writes the table (a training-free row and a row per budget for each
  method, from the committed results.json), finetune.json and the plot;
- --list prints one command per cell; a bad cell name is one line, exit 1.

Needs the books of ../shared; skipped with a message without them.
"""
import json
import shlex
import subprocess
import sys

import pytest

from conftest import HANG_GUARD_S, ROOT, SHARED, run_ok

TOOL = [sys.executable, str(ROOT / "tools" / "finetune_study.py")]
CELLS = ["ft-bundled_linear_4x", "ft-bundled_ntk_4x", "ft-bundled_yarn_4x", "ft-bundled_continued_1x"]


def need_books():
    if not (SHARED / "data" / "books" / "cranford.txt").is_file():
        pytest.skip(f"{SHARED / 'data' / 'books'} not found (set SHARED_DIR to the shared folder)")


def tool(*args):
    return subprocess.run(TOOL + list(args), capture_output=True, text=True, cwd=ROOT, timeout=HANG_GUARD_S)


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    need_books()
    tmp = tmp_path_factory.mktemp("ftstudy")
    p = tool("--quick", "--results", str(tmp / "results"), "--out", str(tmp / "out"))
    assert p.returncode == 0, p.stderr[-3000:]
    return tmp, p.stderr


def rerun(command, results, work):
    """A score's command as the cell file shows it, run again: RESULTS/ is the results
    folder, books.txt the bundled study's text (made the same way, in work)."""
    argv = [a.replace("RESULTS/", f"{results}/") for a in shlex.split(command)]
    argv[0] = str(ROOT / "run")
    argv[argv.index("-f") + 1] = str(work / "books.txt")
    return json.loads(run_ok(*argv[1:]).stdout)


def test_cells_and_their_scores(quick, tmp_path):
    tmp, _ = quick
    results = tmp / "results"
    sys.path.insert(0, str(ROOT / "tools"))
    import finetune_study
    finetune_study.eval_study("bundled", finetune_study.QUICK, tmp_path)  # writes books.txt in tmp_path
    for name in CELLS:
        rec = json.loads((results / f"{name}.json").read_text())
        assert [b["steps"] for b in rec["budgets"]] == [1, 2]
        assert (results / "checkpoints" / name / "step-1" / "model.bin").is_file()
        control = rec["method"] == "continued"
        assert rec["E"] == (256 if control else 1024)
        for b in rec["budgets"]:
            assert [r["k"] for r in b["rows"]] == [1, 4] and [r["ctx"] for r in b["rows"]] == [256, 1024]
            assert ("rows_yarn" in b) == control
            for r in b["rows"] + b.get("rows_yarn", []):
                again = rerun(r["command"], results, tmp_path)
                assert again["ppl"] == r["ppl"] and again["tokens"] == r["tokens"], (name, r["command"])
            assert all(r["scaling"] == ("none" if control else rec["method"]) for r in b["rows"])
            assert all(r["scaling"] == "yarn" and "--rope-factor 4" in r["command"] for r in b.get("rows_yarn", []))
    summary = json.loads((results / "checkpoints" / CELLS[3] / "summary.json").read_text())
    assert (summary["seq_len"], summary["batch_size"], summary["rope"]["scaling"]) == (256, 4, "none")
    rope = json.loads(run_ok(results / "checkpoints" / "ft-bundled_linear_4x" / "step-1" / "model.bin",
                             "-m", "rope", "--json").stdout)
    assert (rope["scaling"], rope["factor"]) == ("linear", 4)


def test_finetuned_differs_from_training_free(quick):
    tmp, _ = quick
    rec = json.loads((tmp / "results" / "ft-bundled_linear_4x.json").read_text())
    free = json.loads((ROOT / "docs" / "extrapolation" / "results.json").read_text())
    free4 = [r for r in free["ppl"] if (r["model"], r["method"], r["k"]) == ("bundled", "linear", 4)]
    ft4 = [r for r in rec["budgets"][-1]["rows"] if r["k"] == 4][0]
    if free4 and free4[0].get("ppl"):
        assert ft4["ppl"] != free4[0]["ppl"]


def test_second_run_reuses_the_finetunes(quick):
    tmp, _ = quick
    before = {n: json.loads((tmp / "results" / f"{n}.json").read_text()) for n in CELLS}
    p = tool("--cell", CELLS[0], "--quick", "--results", str(tmp / "results"))
    assert p.returncode == 0, p.stderr[-2000:]
    assert "the fine-tune is in" in p.stderr and "tools/finetune.py" not in p.stderr
    after = json.loads((tmp / "results" / f"{CELLS[0]}.json").read_text())
    assert after["reused_finetune"] is True
    assert after["budgets"] == before[CELLS[0]]["budgets"]


def test_collected_outputs(quick):
    tmp, _ = quick
    out = tmp / "out"
    table = (out / "finetune.md").read_text()
    assert "| control | continued at L, 2 steps, then training-free YaRN factor 4 |" in table
    for m in ("linear", "ntk", "yarn"):
        assert f"| {m} | training-free (factor k) |" in table
        for steps in (1, 2):
            assert f"| {m} | {'fine-tuned 1 step' if steps == 1 else 'fine-tuned 2 steps'} (factor 4) |" in table
    assert "missing" not in table.split("### Costs")[0]
    saved = json.loads((out / "finetune.json").read_text())
    assert sorted(c["cell"] for c in saved["cells"]) == sorted(CELLS) and saved["missing"] == []
    assert (out / "finetune.png").stat().st_size > 10000


def test_collect_marks_a_missing_cell(quick, tmp_path):
    tmp, _ = quick
    part = tmp_path / "part"
    part.mkdir()
    (part / f"{CELLS[1]}.json").write_text((tmp / "results" / f"{CELLS[1]}.json").read_text())
    p = tool("--collect", str(part), "--out", str(tmp_path / "out"))
    assert p.returncode == 0, p.stderr
    assert "missing ft-bundled_linear_4x, ft-bundled_yarn_4x, ft-bundled_continued_1x" in p.stderr
    assert "| linear | fine-tuned 1 step (factor 4) | missing | missing |" in (tmp_path / "out" / "finetune.md").read_text()


def test_list_and_bad_cell():
    p = tool("--list", "--results", "R")
    assert p.returncode == 0
    lines = p.stdout.splitlines()
    assert len(lines) == 8 and all(" --cell ft-" in x and x.endswith("--results R") for x in lines)
    assert sum("_continued_1x" in x for x in lines) == 2
    p = tool("--cell", "ft-bundled_dynamic_4x")
    err = p.stderr.strip().splitlines()
    assert p.returncode == 1 and len(err) == 1 and "expected ft-BASE_METHOD_4x" in err[0], err
