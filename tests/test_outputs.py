"""What run writes: nothing lost without a message, nothing clobbered.

- stdout: a write that fails (a full disk; /dev/full here) is one line on
  stderr and exit 1, in every mode; a reader that closes a pipe ends the
  program quietly (SIGPIPE), as for cat.
- --save-logits PATH: written beside PATH under a unique name and renamed when
  complete; PATH that exists and is not a regular file (a symlink, a FIFO, a
  device) or is one of the run's inputs is refused and left as it was; an
  unrelated PATH.tmp is left alone; Ctrl-C or SIGTERM leaves no temporary
  file behind.
- --save-logits -, --attn-stats -: refused (stdout carries the report).
- --kl-base: a baseline with a NaN or infinite logit, or a directory, is bad
  input, named as such.
- export.py OUT: an OUT that exists and is not a regular file is refused and
  left as it is; a write that fails for lack of space names OUT.
"""
import os
import signal
import stat
import struct
import subprocess
import time

import pytest

from conftest import ROOT, check_error, run, run_bin, run_ok

MODEL = ROOT / "models" / "model.bin"
TOKENIZER = ROOT / "models" / "tokenizer.bin"
TEXT = ("It was the best of times, it was the worst of times, it was the age of wisdom, it was the age "
        "of foolishness. ") * 40


@pytest.fixture()
def text(tmp_path):
    path = tmp_path / "text.txt"
    path.write_text(TEXT)
    return path


def full_stdout(*args):
    """Run with stdout on /dev/full."""
    with open("/dev/full", "wb") as full:
        return subprocess.run([str(run_bin())] + [str(a) for a in args], stdout=full, stderr=subprocess.PIPE,
                              timeout=300)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full on this system")
@pytest.mark.parametrize("mode_args", [
    ["-i", "It was", "-n", "8"],
    ["-m", "ppl", "--json"],
    ["-m", "ppl"],
    ["-m", "tokenize", "-i", "hello"],
    ["-m", "rope", "--json"],
    ["-m", "passkey", "--lengths", "80", "--trials", "1", "--depths", "0.5"],
], ids=["generate", "ppl-json", "ppl", "tokenize", "rope", "passkey"])
def test_write_error_on_stdout_is_exit_1(text, mode_args):
    args = [MODEL, *mode_args]
    if "-m" not in mode_args or mode_args[1] != "rope":
        args += ["-z", TOKENIZER]
    if mode_args[:2] == ["-m", "ppl"]:
        args += ["-f", text]
    p = full_stdout(*args)
    err = p.stderr.decode()
    assert p.returncode == 1, (p.returncode, err)
    assert err.strip().splitlines()[-1].startswith("stdout: write failed"), err


def test_closed_pipe_ends_quietly():
    p = subprocess.Popen([str(run_bin()), MODEL, "-z", TOKENIZER, "-i", "It was", "-n", "4000", "--ctx", "4096",
                          "--sinks", "4", "-t", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.read(5)
    p.stdout.close()  # the reader goes away
    _, err = p.communicate(timeout=300)
    assert p.returncode == -signal.SIGPIPE, (p.returncode, err.decode())
    assert b"write failed" not in err


def read_header(path):
    data = path.read_bytes()
    return struct.unpack_from("<Iii", data, 0), len(data)


def test_save_logits_writes_a_complete_file_and_no_temporary(tmp_path, text):
    out = tmp_path / "logits.bin"
    run_ok(MODEL, "-z", TOKENIZER, "-m", "ppl", "-f", text, "--save-logits", out)
    (magic, version, vocab), size = read_header(out)
    assert (magic, version) == (0x474F4C4C, 1) and size > 64
    assert sorted(p.name for p in tmp_path.iterdir()) == ["logits.bin", "text.txt"]


@pytest.mark.parametrize("kind", ["symlink", "fifo", "directory"])
def test_save_logits_refuses_a_path_that_is_not_a_regular_file(tmp_path, text, kind):
    target = tmp_path / "target.bin"
    target.write_bytes(b"keep me")
    path = tmp_path / "out"
    if kind == "symlink":
        path.symlink_to(target)
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
    before = os.lstat(path)
    p = run(MODEL, "-z", TOKENIZER, "-m", "ppl", "-f", text, "--save-logits", path)
    check_error(p, 1, ["--save-logits", str(path)])
    assert "not a regular file" in p.stderr.decode()
    after = os.lstat(path)
    assert stat.S_IFMT(after.st_mode) == stat.S_IFMT(before.st_mode) and after.st_ino == before.st_ino
    assert target.read_bytes() == b"keep me"
    assert sorted(q.name for q in tmp_path.iterdir()) == sorted(["out", "target.bin", "text.txt"])


@pytest.mark.parametrize("flag", ["--attn-stats", "--save-logits"])
def test_a_dash_is_no_output_path(tmp_path, text, flag):
    """`--attn-stats -` and `--save-logits -` are refused (bad usage, exit 2):
    stdout carries ppl's report, and a file named "-" is what they used to
    write. The run's folder is left as it was."""
    p = subprocess.run([str(run_bin()), str(MODEL), "-z", str(TOKENIZER), "-m", "ppl", "-f", str(text), flag, "-"],
                       cwd=tmp_path, capture_output=True, timeout=300)
    check_error(p, 2, [f"{flag} -"])
    assert "stdout" in p.stderr.decode(), p.stderr
    assert sorted(q.name for q in tmp_path.iterdir()) == ["text.txt"]


@pytest.mark.skipif(os.geteuid() != 0, reason="making a device node needs root")
def test_save_logits_refuses_a_device(tmp_path):
    """A device node of its own (the null device's numbers) in the test's
    folder: a build that replaced devices would destroy only this copy."""
    dev = tmp_path / "null-device"
    os.mknod(dev, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    p = run(MODEL, "-z", TOKENIZER, "-m", "ppl", "-f", MODEL.parent / "README.md", "--save-logits", dev)
    check_error(p, 1, ["--save-logits", str(dev)])
    after = os.lstat(dev)
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == os.makedev(1, 3)


@pytest.mark.parametrize("which", ["text", "tokenizer", "kl-base"])
def test_save_logits_refuses_an_input_of_the_run(tmp_path, text, which):
    """Copies of the inputs, so that a build that overwrote them could not
    clobber the repository's."""
    tok = tmp_path / "tokenizer.bin"
    tok.write_bytes(TOKENIZER.read_bytes())
    base = tmp_path / "base.bin"
    run_ok(MODEL, "-z", tok, "-m", "ppl", "-f", text, "--save-logits", base)
    target = {"text": text, "tokenizer": tok, "kl-base": base}[which]
    before = target.read_bytes()
    extra = ["--kl-base", base] if which == "kl-base" else []
    p = run(MODEL, "-z", tok, "-m", "ppl", "-f", text, *extra, "--save-logits", target)
    check_error(p, 1, ["--save-logits"])
    assert "input" in p.stderr.decode()
    assert target.read_bytes() == before


def test_save_logits_leaves_an_existing_tmp_file_alone(tmp_path, text):
    out = tmp_path / "logits.bin"
    stray = tmp_path / "logits.bin.tmp"
    stray.write_bytes(b"somebody else's")
    run_ok(MODEL, "-z", TOKENIZER, "-m", "ppl", "-f", text, "--save-logits", out)
    assert stray.read_bytes() == b"somebody else's"
    assert read_header(out)[0][0] == 0x474F4C4C


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupted_save_logits_leaves_no_temporary(tmp_path, text, sig):
    """One token at a time (exact dynamic NTK) over a long text: slow enough
    to be interrupted while the file is being written."""
    long_text = tmp_path / "long.txt"
    long_text.write_text(TEXT * 20)
    out = tmp_path / "logits.bin"
    p = subprocess.Popen([str(run_bin()), MODEL, "-z", TOKENIZER, "-m", "ppl", "-f", long_text, "--ctx", "1024",
                          "--rope-scaling", "dynamic", "--rope-factor", "4", "--rope-dynamic", "exact",
                          "--save-logits", out], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while time.time() < deadline and not any(q.name.startswith("logits.bin.") for q in tmp_path.iterdir()):
        time.sleep(0.05)
    assert any(q.name.startswith("logits.bin.") for q in tmp_path.iterdir()), "no temporary file appeared"
    p.send_signal(sig)
    p.communicate(timeout=60)
    assert p.returncode == -sig, p.returncode
    assert sorted(q.name for q in tmp_path.iterdir()) == ["long.txt", "text.txt"]


def test_kl_base_with_a_non_finite_logit_is_bad_input(tmp_path, text):
    base = tmp_path / "base.bin"
    run_ok(MODEL, "-z", TOKENIZER, "-m", "ppl", "-f", text, "--save-logits", base)
    data = bytearray(base.read_bytes())
    vocab = struct.unpack_from("<i", data, 8)[0]
    record = 4 + 4 * vocab
    for value, name in ((float("nan"), "nan"), (float("inf"), "inf")):
        bad = tmp_path / f"{name}.bin"
        patched = bytearray(data)
        struct.pack_into("<f", patched, 64 + 3 * record + 4 + 4 * 11, value)  # token 3, logit 11
        bad.write_bytes(patched)
        p = run(MODEL, "-z", TOKENIZER, "-m", "ppl", "-f", text, "--kl-base", bad)
        check_error(p, 1, ["--kl-base", str(bad)])
        assert "token 3" in p.stderr.decode() and "finite" in p.stderr.decode()


def test_kl_base_directory_is_named_as_such(tmp_path, text):
    p = run(MODEL, "-z", TOKENIZER, "-m", "ppl", "-f", text, "--kl-base", tmp_path)
    check_error(p, 1, ["--kl-base", str(tmp_path)])
    assert "directory" in p.stderr.decode()


# ---- export.py's output file ------------------------------------------------

from test_convert import export_run  # noqa: E402  (export.py's main in this process)

import convert.common  # noqa: E402
from conftest import make_model  # noqa: E402


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_export_refuses_an_output_that_is_not_a_regular_file(tmp_path, kind):
    target = tmp_path / "target.bin"
    target.write_bytes(b"keep me")
    out = tmp_path / "out.bin"
    if kind == "symlink":
        out.symlink_to(target)
    else:
        os.mkfifo(out)
    code, err = export_run(out, "--random", "64,96,2,4,4,300,32")
    assert code == 1, err
    assert str(out) in err and "not a regular file" in err, err
    assert target.read_bytes() == b"keep me"
    assert (out.is_symlink() if kind == "symlink" else stat.S_ISFIFO(os.lstat(out).st_mode))


def test_export_full_disk_names_the_output(tmp_path, monkeypatch):
    """A write that fails for lack of space is reported against the output
    (it named the input before), and leaves no temporary file."""
    source, _, _ = make_model(tmp_path, name="in.bin")
    out = tmp_path / "out.bin"

    class FullDisk:
        def __init__(self, f):
            self.f = f

        def write(self, data):
            raise OSError(28, "No space left on device")

        def __getattr__(self, name):
            return getattr(self.f, name)

    enter = convert.common._AtomicFile.__enter__
    monkeypatch.setattr(convert.common._AtomicFile, "__enter__", lambda self: FullDisk(enter(self)))
    code, err = export_run(out, "--checkpoint", source)
    assert code == 1, err
    assert err.strip().splitlines() == [f"export.py: {out}: write failed: No space left on device"], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.bin"]
