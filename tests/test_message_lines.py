"""Messages beside the output: never glued to a partial line of it.

- A message on stderr printed while stdout holds a partial line (generated
  text, chat's "Assistant: ", a row of passkey's table, passkey's JSON) starts
  a line of its own where the two streams meet: one pipe (2>&1), one terminal
  (a pty here). The newline goes to stderr: stdout's bytes are the same
  whether or not stderr shares its file, and stderr written apart gets no
  blank line.
- generate's summary line: the time to the first new token; the prompt's
  rate only for a prompt of 8 tokens or more (fewer: "prompt too short to
  time"); generation's rate only when there is a token after the first.
- A path holding a newline is shown quoted and escaped: every message stays
  one line.
- make run's defaults (PROMPT, RUN_ARGS) fit the bundled model's context:
  the run ends where -n says, with no context-full notice.
"""
import os
import re
import struct
import subprocess

import pytest

import export
from conftest import HANG_GUARD_S, ROOT, SYN_PIECES, SYN_SCORES, make_model, run_bin, run_ok, tokenize

MODEL = ROOT / "models" / "model.bin"
TOKENIZER = ROOT / "models" / "tokenizer.bin"


def run_env():
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "2")
    return env


def run_apart(*args, stdin=b""):
    """stdout and stderr in two pipes: (exit code, stdout, stderr)."""
    p = subprocess.run([str(run_bin())] + [str(a) for a in args], input=stdin, capture_output=True,
                       timeout=HANG_GUARD_S, env=run_env())
    return p.returncode, p.stdout, p.stderr


def run_joined(*args, stdin=b""):
    """stdout and stderr in one pipe, as 2>&1 makes them: (exit code, bytes)."""
    p = subprocess.run([str(run_bin())] + [str(a) for a in args], input=stdin, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=HANG_GUARD_S, env=run_env())
    return p.returncode, p.stdout


def run_on_pty(*args, typed=None, after=b""):
    """stdin, stdout and stderr on one pseudo-terminal: (exit code, what the
    terminal shows, with its \r\n line ends). typed: bytes typed once the
    terminal shows `after` (stdin is empty without it)."""
    master, slave = os.openpty()
    p = subprocess.Popen([str(run_bin())] + [str(a) for a in args],
                         stdin=slave if typed is not None else subprocess.DEVNULL, stdout=slave, stderr=slave,
                         env=run_env())
    os.close(slave)
    shown = b""
    while True:
        if typed is not None and after in shown:
            os.write(master, typed)
            typed = None
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the program closed the terminal's last descriptor
            break
        if not chunk:
            break
        shown += chunk
    os.close(master)
    return p.wait(timeout=HANG_GUARD_S), shown


def untimed(text):
    """text with its timings (seconds, ms, tok/s) replaced by '#', so that two
    runs of the same command compare equal."""
    return re.sub(rb"[0-9.]+( s| ms| tok/s)", rb"#\1", text)


@pytest.fixture(scope="module")
def nan_model(tmp_path_factory):
    """A model whose first wq weight is NaN: the first forward step (after
    the prompt's text is printed) stops with a message. Its tokenizer."""
    d = tmp_path_factory.mktemp("nan")
    tok = d / "tokenizer.bin"
    export.write_tokenizer(tok, SYN_PIECES, SYN_SCORES)
    ckpt, cfg, _ = make_model(d)
    layout, _ = export.tensor_layout(cfg)
    _, _, offset, _ = next(entry for entry in layout if entry[0] == "wq")
    data = bytearray(ckpt.read_bytes())
    struct.pack_into("<f", data, offset, float("nan"))
    ckpt.write_bytes(bytes(data))
    return ckpt, tok


def test_a_failure_after_partial_text_starts_a_line(nan_model):
    """generate prints the prompt's text, then the forward step fails: the
    message starts a line in one pipe, stdout keeps exactly the text, and
    stderr written apart has no blank line."""
    ckpt, tok = nan_model
    args = (ckpt, "-z", tok, "-t", "0", "-n", "4", "-i", "the cat")
    code, out, err = run_apart(*args)
    assert code == 1 and out == b"the cat", (out, err)
    load, message = err.split(b"\n", 1)
    assert message.startswith(b"forward: ") and b"NaN" in message and message.count(b"\n") == 1, err
    code, joined = run_joined(*args)
    assert code == 1
    assert untimed(joined) == untimed(load + b"\n" + out + b"\n" + message), joined


def test_a_failure_after_partial_text_starts_a_line_on_a_terminal(nan_model):
    ckpt, tok = nan_model
    code, shown = run_on_pty(ckpt, "-z", tok, "-t", "0", "-n", "4", "-i", "the cat")
    assert code == 1
    assert re.search(rb"\r\nthe cat\r\nforward: [^\r\n]*NaN[^\r\n]*\r\n$", shown), shown


def test_chat_failure_after_the_reply_label_starts_a_line(nan_model):
    """chat prints "Assistant: ", then the reply's first step fails."""
    ckpt, tok = nan_model
    args = (ckpt, "-z", tok, "-m", "chat", "--chat-template", "llama2", "-t", "0", "-n", "4")
    code, out, err = run_apart(*args, stdin=b"hello\n")
    assert code == 1 and out == b"User: hello\nAssistant: ", (out, err)
    load, message = err.split(b"\n", 1)
    assert message.startswith(b"forward: ") and message.count(b"\n") == 1, err
    code, joined = run_joined(*args, stdin=b"hello\n")
    assert code == 1
    assert untimed(joined) == untimed(load + b"\n" + out + b"\n" + message), joined


def test_chat_notice_after_a_typed_line_on_a_terminal():
    """On a terminal the user's Enter ends the line "User: ..." (chat's line
    editor ends it): the notice that the turn does not fit follows with no
    blank line. (The line is longer than the terminal, so the editor shows its
    end after the prompt.)"""
    code, shown = run_on_pty(MODEL, "-z", TOKENIZER, "-m", "chat", "--ctx", "32", "-n", "4",
                             typed=b"the dog ran to the park and back again " * 4 + b"\n", after=b"User: ")
    assert code == 0, shown
    assert re.search(rb"User: ([^\r\n]*back again )\r\nchat: the next turn needs [^\r\n]*\r\n$", shown), shown


def test_context_full_notice_starts_a_line():
    """The text fills --ctx 32 before -n: the notice comes after the text's
    final newline, on a line of its own, and stdout is the text alone."""
    args = (MODEL, "-z", TOKENIZER, "-t", "0", "-n", "100", "--ignore-eos", "--ctx", "32", "-i", "It was")
    code, out, err = run_apart(*args)
    assert code == 0 and out.endswith(b"\n") and not out.endswith(b"\n\n"), out
    lines = err.decode().splitlines(keepends=True)
    assert len(lines) == 3 and lines[1].startswith("generate: the context of 32 tokens is full after "), err
    code, joined = run_joined(*args)
    assert code == 0
    assert untimed(joined) == untimed(lines[0].encode() + out + "".join(lines[1:]).encode()), joined


@pytest.mark.parametrize("json_output", [False, True], ids=["table", "json"])
def test_passkey_cell_notices_start_a_line(json_output):
    """passkey's table row (and its JSON, one line) is open while each cell's
    notice prints: in one pipe every notice starts a line, and taking out each
    notice with the newline before it gives stdout's bytes."""
    args = [MODEL, "-z", TOKENIZER, "-m", "passkey", "--lengths", "100", "--depths", "0,1", "--trials", "1"]
    args += ["--json"] if json_output else []
    code, out, err = run_apart(*args)
    assert code == 0, err
    load, notices = err.split(b"\n", 1)
    assert re.fullmatch(rb"(passkey: length 100 depth [01].00: [01] of 1 correct \([0-9.]+ s\)\n){2}", notices), err
    code, joined = run_joined(*args)
    assert code == 0
    first, rest = joined.split(b"\n", 1)
    assert untimed(first) == untimed(load), joined
    assert len(re.findall(rb"\npasskey: length ", rest)) == 2, joined  # each after an inserted newline
    assert re.sub(rb"\npasskey: length [^\n]*\n", b"", rest) == out, joined


def shown(path):
    """A path holding a newline as messages show it (model.h's shown_path)."""
    return '"' + str(path).replace("\\", "\\\\").replace("\n", "\\n") + '"'


def test_a_path_holding_a_newline_stays_on_one_line(tmp_path):
    """A file name may hold a newline. Messages show such a path in double
    quotes with \\n (model.h's shown_path), so each is still one line: a
    missing checkpoint, a truncated tokenizer given with -z, a missing -f, a
    --save-logits path that is a folder, and the load line and summary of a
    run that works."""
    odd = tmp_path / "odd\nname"
    odd.mkdir()
    tok = odd / "tokenizer.bin"
    export.write_tokenizer(tok, SYN_PIECES, SYN_SCORES)
    ckpt, _, _ = make_model(odd)
    (odd / "short.bin").write_bytes(b"LT")
    (odd / "out").mkdir()
    cases = [
        ([odd / "missing.bin", "-i", "the"], f"{shown(odd / 'missing.bin')}: cannot open checkpoint"),
        ([ckpt, "-z", odd / "short.bin", "-i", "the"], f"tokenizer {shown(odd / 'short.bin')} (given with -z): "),
        ([ckpt, "-f", odd / "missing.txt"], f"-f {shown(odd / 'missing.txt')}: "),
        ([ckpt, "-m", "ppl", "-f", tok, "--save-logits", odd / "out"], f"--save-logits {shown(odd / 'out')}: "),
    ]
    for args, start in cases:
        code, out, err = run_apart(*args)
        assert code == 1 and out == b"" and err.decode().startswith(start), (args, err)
        assert err.count(b"\n") == 1, err
    code, out, err = run_apart(ckpt, "-t", "0", "-n", "2", "-i", "the")
    lines = err.decode().splitlines()
    assert code == 0 and len(lines) == 2 and lines[0].startswith(f"{shown(ckpt)}: dim 64"), err
    assert SUMMARY.match(lines[1]), err


SUMMARY = re.compile(r"^(\d+) prompt \+ (\d+) new tokens(; first token after [0-9.]+ ms)?"
                     r"; (prompt [0-9.]+ tok/s|prompt too short to time \(under 8 tokens\))"
                     r"(, generation [0-9.]+ tok/s)?$")


def summary(*args):
    """generate's last stderr line, parsed with SUMMARY."""
    last = run_ok(*args).stderr.decode().splitlines()[-1]
    m = SUMMARY.match(last)
    assert m, last
    return m


def prompt_of(n_tokens):
    """A prompt of the bundled tokenizer that encodes to n_tokens, BOS included."""
    text = " ".join(["the"] * (n_tokens - 1))  # "the" and each " the" are one token
    assert len(tokenize(MODEL, TOKENIZER, text)) == n_tokens, text
    return text


@pytest.mark.parametrize("n_prompt, timed", [(7, False), (8, True), (16, True)])
def test_prompt_rate_only_for_a_prompt_long_enough_to_time(n_prompt, timed):
    m = summary(MODEL, "-z", TOKENIZER, "-t", "0", "-n", "5", "--ignore-eos", "-i", prompt_of(n_prompt))
    assert int(m.group(1)) == n_prompt and int(m.group(2)) == 5
    assert m.group(3) and m.group(5), m.group(0)  # first token, generation
    assert m.group(4).startswith("prompt too short") != timed, m.group(0)


def test_rates_leave_out_what_did_not_happen():
    """-n 0: no new token, so no first token and no generation; -n 1: the
    first token, no rate of the ones after it."""
    prompt = prompt_of(8)
    m0 = summary(MODEL, "-z", TOKENIZER, "-t", "0", "-n", "0", "-i", prompt)
    assert m0.group(2) == "0" and not m0.group(3) and not m0.group(5), m0.group(0)
    m1 = summary(MODEL, "-z", TOKENIZER, "-t", "0", "-n", "1", "--ignore-eos", "-i", prompt)
    assert m1.group(2) == "1" and m1.group(3) and not m1.group(5), m1.group(0)


def test_make_run_defaults_fit_the_context():
    """`make run`'s command (make -n prints it) ends where -n says: its
    prompt and -n new tokens fit the bundled model's 256 positions."""
    dry = subprocess.run(["make", "-s", "-n", "run"], cwd=ROOT, capture_output=True, text=True, check=True)
    command = next(line for line in dry.stdout.splitlines() if line.startswith("./run "))
    n_new = int(re.search(r" -n (\d+)", command).group(1))
    prompt = re.search(r'-i "([^"]*)"', command).group(1)
    assert len(tokenize(MODEL, TOKENIZER, prompt)) + n_new <= 256, command
    p = subprocess.run(command, shell=True, cwd=ROOT, capture_output=True, timeout=HANG_GUARD_S, env=run_env())
    err = p.stderr.decode()
    assert p.returncode == 0 and "is full" not in err, err
