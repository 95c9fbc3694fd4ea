"""The Makefile: ./run and ./run-reference are rebuilt only when needed, and
`make help` names every target and every variable a user sets.

The build tests copy the Makefile and the C sources into a temporary folder
and build there with -O0 (a few seconds), so they never touch this
checkout's binaries. Needs make and cc.
"""

import re
import shutil
import subprocess

import pytest

from conftest import ROOT

MAKEFILE = (ROOT / "Makefile").read_text()


def make(cwd, *args):
    return subprocess.run(["make", *args], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.fixture
def tree(tmp_path):
    """A copy of the Makefile and the C sources."""
    if not shutil.which("make") or not shutil.which("cc"):
        pytest.skip("make or cc is not installed")
    shutil.copy(ROOT / "Makefile", tmp_path)
    for p in list(ROOT.glob("*.c")) + list(ROOT.glob("*.h")):
        shutil.copy(p, tmp_path)
    return tmp_path


def test_second_make_does_nothing(tree):
    """make builds ./run; a second make, and make -q, find it up to date; a
    touched header, another compile command (make OPT=..., make portable)
    rebuild it; make after make portable builds the optimized one again."""
    fast = "OPT=-O0"
    p = make(tree, fast)
    assert p.returncode == 0 and "-o run " in p.stdout and (tree / "run").is_file(), p.stdout + p.stderr
    p = make(tree, fast)
    assert p.returncode == 0 and "Nothing to be done" in p.stdout, p.stdout
    assert make(tree, fast, "-q").returncode == 0
    assert make(tree, fast, "-q", "build").returncode == 0
    (tree / "run.h").touch()
    assert make(tree, fast, "-q").returncode == 1  # a header changed
    assert make(tree, fast).returncode == 0 and make(tree, fast, "-q").returncode == 0
    assert make(tree, "OPT=-O1", "-q").returncode == 1  # another compile command
    assert (tree / ".run.cmd").read_text().split()[:2] == ["cc", "-O0"]
    p = make(tree, "portable")
    assert p.returncode == 0 and "cc -O2 " in p.stdout, p.stdout
    assert make(tree, "OPT=-O2", "-q").returncode == 0  # what make portable built
    assert make(tree, fast, "-q").returncode == 1  # make after make portable rebuilds


def test_make_run_builds_when_needed_then_generates(tree):
    """make run builds a missing ./run, then runs it (here with a checkpoint
    that does not exist: the command is what matters); with ./run up to date
    it only runs it."""
    p = make(tree, "OPT=-O0", "run")
    assert "-o run " in p.stdout and "./run models/model.bin" in p.stdout, p.stdout
    p = make(tree, "OPT=-O0", "run")
    assert "-o run " not in p.stdout and "./run models/model.bin" in p.stdout, p.stdout


def test_reference_rebuilt_only_when_needed(tree):
    p = make(tree, "reference")
    assert p.returncode == 0 and "-DREFERENCE -o run-reference" in p.stdout, p.stdout + p.stderr
    assert "Nothing to be done" in make(tree, "reference").stdout
    assert make(tree, "-q", "reference").returncode == 0
    (tree / "kernels.c").touch()
    assert make(tree, "-q", "reference").returncode == 1


def test_help_names_every_target_and_variable():
    """Each phony target (but FORCE, an internal prerequisite), each
    variable set with ?= and the ones only the recipes read appear in make
    help."""
    text = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True).stdout
    phony = re.search(r"^\.PHONY:((?:.*\\\n)*.*)$", MAKEFILE, re.M).group(1).replace("\\\n", " ").split()
    targets = [t for t in phony if t not in ("FORCE", "all")]
    assert len(targets) > 15, phony
    for t in targets:
        assert re.search(rf"^  make {re.escape(t)}\b", text, re.M), (t, text)
    variables = re.findall(r"^([A-Z_]+) \?=", MAKEFILE, re.M)
    assert {"PROMPT", "RUN_ARGS", "CC", "VENV", "EXTRAPOLATION_ARGS", "FUZZ_SECONDS"} <= set(variables)
    for v in variables + ["BENCH_ARGS", "EXPORT_FUZZ_ITERS"]:
        assert re.search(rf"\b{v}\b", text), (v, text)
