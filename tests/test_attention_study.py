"""tools/attention_study.py, the study's attention statistics:

- merge_stats (a sinks cell's segments as one run) weights each position bucket's
  entropy by its queries and the mass by each run's queries, checked on two made-up
  runs by hand; buckets are known by their start (a shorter run's last bucket ends
  sooner);
- two real cells of the bundled model (none at 1x; sinks at 4x, streamed in
  segments): none's statistics are what its command, as the cell file shows it,
  writes when run again; sinks' hold the mass on the sinks; --collect writes the
  tables (every method's row, "missing" for the cells not run) and the plot;
- sinks at 1x, the baseline for the sinks' mass, evicts nothing: on a text shorter
  than L its entropy and loss are plain RoPE's, and the weight on the first 4
  tokens is counted apart;
- a bad cell name is one line, exit 1.

The real cells need the books of ../shared; skipped with a message without them.
"""
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import HANG_GUARD_S, ROOT, SHARED, run_ok

sys.path.insert(0, str(ROOT / "tools"))
import attention_study as at  # noqa: E402
import extrapolation as ex  # noqa: E402

TOOL = [sys.executable, str(ROOT / "tools" / "attention_study.py")]


def _run(start_ends, queries, entropy, mass, sink=None):
    r = dict(layers=1, heads=1, queries=queries,
             position_buckets=[dict(start=s, end=e, queries=q) for (s, e), q in start_ends],
             distance_buckets=[dict(start=s, end=e) for (s, e), _ in start_ends],
             entropy=[[entropy]], mass=[[mass]])
    if sink is not None:
        r["sink_mass"] = [[sink]]
    return r


def test_merge_weights_by_queries():
    a = _run([((0, 128), 128), ((128, 256), 128), ((256, 300), 44)], 300, [2.0, 3.0, 4.0], [0.5, 0.3, 0.2], 0.1)
    b = _run([((0, 100), 100)], 100, [1.0], [1.0], 0.3)
    m = at.merge_stats([a, b])
    assert m["queries"] == 400
    assert [(x["start"], x["end"], x["queries"]) for x in m["position_buckets"]] == [(0, 128, 228), (128, 256, 128),
                                                                                      (256, 300, 44)]
    assert m["entropy"][0][0] == pytest.approx([(2.0 * 128 + 1.0 * 100) / 228, 3.0, 4.0])
    assert m["mass"][0][0] == pytest.approx([(0.5 * 300 + 1.0 * 100) / 400, 0.3 * 300 / 400, 0.2 * 300 / 400])
    assert m["sink_mass"][0][0] == pytest.approx((0.1 * 300 + 0.3 * 100) / 400)
    assert sum(m["mass"][0][0]) + m["sink_mass"][0][0] == pytest.approx((300 * 1.1 + 100 * 1.3) / 400)


@pytest.fixture(scope="module")
def two_cells(tmp_path_factory):
    if not (SHARED / "data" / "books").is_dir():
        pytest.skip(f"{SHARED / 'data' / 'books'} not found (set SHARED_DIR to the shared folder)")
    tmp = tmp_path_factory.mktemp("attn")
    for name in ("attn-bundled_none_1x", "attn-bundled_sinks_4x"):
        p = subprocess.run(TOOL + ["--cell", name, "--results", str(tmp / "cells")], capture_output=True, text=True,
                           cwd=ROOT, timeout=HANG_GUARD_S)
        assert p.returncode == 0, p.stderr[-2000:]
    return tmp


def test_cell_is_what_its_command_writes(two_cells, tmp_path):
    rec = json.loads((two_cells / "cells" / "attn-bundled_none_1x.json").read_text())
    at.make_text("bundled", tmp_path)  # books.txt, made as the cell made it
    argv = shlex.split(rec["command"])
    argv[argv.index("-f") + 1] = str(tmp_path / "books.txt")
    argv[argv.index("--attn-stats") + 1] = str(tmp_path / "again.json")
    ppl = json.loads(run_ok(*argv[1:]).stdout)
    again = json.loads((tmp_path / "again.json").read_text())
    assert {k: v for k, v in again.items() if k != "file"} == {k: v for k, v in rec["stats"].items() if k != "file"}
    assert ppl["ppl"] == rec["ppl"]["ppl"] and rec["k"] == 1 and rec["ctx"] == 256


def test_sinks_cell_streams_segments(two_cells):
    rec = json.loads((two_cells / "cells" / "attn-bundled_sinks_4x.json").read_text())
    s = rec["stats"]
    assert s["keys"] == "sinks" and s["streaming"] and "segment-NNNN.txt" in rec["command"]
    assert s["file"].endswith("segments") and int(s["file"].split()[0]) >= 16
    assert max(b["end"] for b in s["position_buckets"]) == 1024  # segments of one 4x window
    assert 0 < at.sink_mass(s) < 1
    total = sum(sum(h) for layer in s["mass"] for h in layer) + sum(h for layer in s["sink_mass"] for h in layer)
    assert total == pytest.approx(s["layers"] * s["heads"], rel=1e-6)  # every query's weights sum to 1


def test_collect(two_cells):
    out = two_cells / "out"
    p = subprocess.run(TOOL + ["--collect", str(two_cells / "cells"), "--out", str(out)], capture_output=True,
                       text=True, cwd=ROOT, timeout=HANG_GUARD_S)
    assert p.returncode == 0, p.stderr
    assert "attn-bundled_none_4x" in p.stderr.split("; missing ")[1]
    table = (out / "attention.md").read_text()
    assert "| none, 1x | " in table and "| sinks, 4x | " in table
    assert "| sinks, 1x | missing |" in table and "| yarn, 4x | missing |" in table and "| yarn-attn1, 4x | missing |" in table
    assert (out / "attention.png").stat().st_size > 10000
    assert len(json.loads((out / "attention.json").read_text())["cells"]) == 2


def test_sinks_at_1x_is_none(tmp_path):
    """The sinks-at-1x cell's claim: its segments (cut as run_cell cuts them) fit the
    cache, so nothing is evicted and --streaming --sinks 4 is plain RoPE, the first 4
    tokens' weight counted apart. Tolerance 1e-5 nats: the same float32 scores,
    summed in another order by the sinks' block path."""
    if not (SHARED / "data" / "books").is_dir():
        pytest.skip(f"{SHARED / 'data' / 'books'} not found (set SHARED_DIR to the shared folder)")
    study = at.make_text("bundled", tmp_path)
    count = ex.TokenCounter(study.ckpt, study.tok, tmp_path)
    seg = at.sinks_segments(study, 1, tmp_path)[0]
    assert study.ctx(1) - 12 <= count(seg) + count.bos <= study.ctx(1)  # nearly a full cache, none evicted
    (tmp_path / "segment.txt").write_text(seg, encoding="utf-8")
    runs = {}
    for method in ("none", "sinks"):
        cmd = at.cell_command(study, tmp_path / "segment.txt", method, 1, tmp_path / f"{method}.json")
        runs[method] = ex.run_json(cmd, 1), json.loads((tmp_path / f"{method}.json").read_text())
    (p_none, s_none), (p_sinks, s_sinks) = runs["none"], runs["sinks"]
    assert s_sinks["streaming"] and s_sinks["sinks"] == 4 and s_sinks["ctx"] == study.L
    assert p_sinks["tokens"] == p_none["tokens"] == count(seg) + count.bos - 1
    assert p_sinks["nll"] == pytest.approx(p_none["nll"], abs=1e-6)
    for l in range(s_none["layers"]):
        for h in range(s_none["heads"]):
            assert s_sinks["entropy"][l][h] == pytest.approx(s_none["entropy"][l][h], abs=1e-5)
            assert sum(s_sinks["mass"][l][h]) + s_sinks["sink_mass"][l][h] == pytest.approx(1, abs=1e-6)
            # the sinks' weight is taken from the distance buckets, never added
            assert all(a >= b - 1e-6 for a, b in zip(s_none["mass"][l][h], s_sinks["mass"][l][h]))
    assert not s_none.get("sink_mass")
    assert 0 < at.sink_mass(s_sinks) < 1


def test_bad_cell_name():
    p = subprocess.run(TOOL + ["--cell", "attn-bundled_yarn_1x"], capture_output=True, text=True, cwd=ROOT)
    err = p.stderr.strip().splitlines()
    assert p.returncode == 1 and len(err) == 1 and "expected attn-STUDY_METHOD_Kx" in err[0], err
