"""What run reads from streams and long inputs: bounded, and every failure said.

- chat's turns come from stdin one line at a time: a line longer than the
  context could hold (its tokens times the longest piece, in bytes) is refused
  before it is tokenized, and so is a turn of several lines (joined by "\")
  longer than that; a NUL byte in a line is refused (it would cut the turn);
  stdin that is a directory or a closed descriptor is refused.
- A conversation from -y or --chat -f that leaves no room for a turn and a
  reply is bad input (exit 1 with the numbers), also when stdin is empty.
- generate and chat refuse an empty prompt file (-i "" is an empty prompt).
- generate refuses a prompt file that cannot fit the context by its bytes,
  before encoding it; tokenize encodes a long file in pieces, with the ids
  sentencepiece gives the whole text.
"""
import os
import re
import subprocess

import pytest

from conftest import ROOT, check_error, run, run_bin, run_ok

MODEL = ROOT / "models" / "model.bin"
TOKENIZER = ROOT / "models" / "tokenizer.bin"
SP_MODEL = ROOT / "models" / "tokenizer.model"
PROSE = ("It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
         "foolishness, it was the epoch of belief, it was the epoch of incredulity. ")


def chat(*args, stdin=b""):
    return run(MODEL, "-z", TOKENIZER, "-m", "chat", "-n", "4", *args, input=stdin)


def test_chat_line_with_a_nul_byte_is_refused():
    p = chat(stdin=b"hel\0lo\n")
    assert p.returncode == 1, p.stderr
    assert p.stderr.decode().strip().splitlines()[-1] == "stdin line 1: holds a NUL byte (expected text)"


def test_chat_line_longer_than_the_context_is_refused_before_tokenizing():
    """The bundled model: 256 tokens of at most max_token_length bytes; a 4 MB
    line is refused as soon as it passes the bound (quickly, in little memory)."""
    p = chat(stdin=b"a" * (4 << 20) + b"\n")
    assert p.returncode == 1, p.stderr
    last = p.stderr.decode().strip().splitlines()[-1]
    assert last.startswith("stdin line 1: longer than ") and "raise --ctx" in last, last


def test_chat_turn_of_several_lines_longer_than_the_context_is_refused():
    """Lines each within the bound, joined by a "\" at their ends into one turn
    past it: refused as soon as the turn passes the bound, naming its lines."""
    p = chat(stdin=(b"a" * 1000 + b"\\\n") * 1000 + b"end\n")
    assert p.returncode == 1, p.stderr
    last = p.stderr.decode().strip().splitlines()[-1]
    assert re.fullmatch(r"stdin lines 1-\d+: one turn of more than \d+ bytes, more than the context can hold "
                        r"\(raise --ctx\)", last), last


def test_chat_line_within_the_bound_is_read_whole():
    """A line just under the bound is read (and then does not fit in tokens:
    the chat says so and ends, as for any turn from stdin)."""
    p = chat(stdin=(PROSE * 20).encode() + b"\n")
    assert p.returncode == 0, p.stderr
    assert "ending the chat" in p.stderr.decode()


@pytest.mark.parametrize("how", ["directory", "closed"])
def test_chat_stdin_that_cannot_be_read_is_refused(tmp_path, how):
    cmd = [str(run_bin()), str(MODEL), "-z", str(TOKENIZER), "-m", "chat", "-n", "4"]
    if how == "directory":
        fd = os.open(tmp_path, os.O_RDONLY)
        p = subprocess.run(cmd, stdin=fd, capture_output=True, timeout=60)
        os.close(fd)
    else:
        p = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, timeout=60,
                           preexec_fn=lambda: os.close(0))
    check_error(p, 1, ["stdin"])


def test_system_prompt_that_cannot_fit_is_bad_input_with_empty_stdin():
    p = chat("-y", PROSE * 40)
    check_error(p, 1, ["prompt"])
    assert "the context holds 256" in p.stderr.decode()


def test_conversation_file_that_cannot_fit_is_bad_input(tmp_path):
    conv = tmp_path / "conv.txt"
    conv.write_text("user: hello\nassistant: " + PROSE * 40 + "\n")
    p = chat("--chat", "-f", conv, stdin=b"and then?\n")
    check_error(p, 1, ["prompt"])
    assert "the context holds 256" in p.stderr.decode()


@pytest.mark.parametrize("mode", ["generate", "chat"])
def test_empty_prompt_file_is_refused(tmp_path, mode):
    """An empty -f (a redirect that failed, the wrong file) is bad input in
    generate and chat, as in ppl and passkey: one line naming it (it used to
    start from BOS alone, or chat on an empty first turn, without a word);
    -i "" is the way to ask for that."""
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    args = [MODEL, "-z", TOKENIZER, "-n", "4", "-f", empty] + (["-m", "chat"] if mode == "chat" else [])
    p = run(*args, input=b"hello\n")
    check_error(p, 1, [f"-f {empty}: empty file"])
    assert run_ok(MODEL, "-z", TOKENIZER, "-t", "0", "-n", "4", "-i", "").stdout.strip(), "-i \"\" starts from BOS"


def test_prompt_file_that_cannot_fit_is_refused_before_encoding(tmp_path):
    big = tmp_path / "big.txt"
    big.write_text(PROSE * 20000)  # 3.4 MB
    p = run(MODEL, "-z", TOKENIZER, "-f", big, "-n", "1")
    check_error(p, 1, [str(big)])
    assert "cannot fit in the context of 256 tokens" in p.stderr.decode()


def test_tokenize_of_a_long_file_equals_sentencepiece(tmp_path):
    """Over ENCODE_PIECE (1 MiB), -m tokenize encodes in pieces: the ids must
    be sentencepiece's for the whole text (BOS first)."""
    sentencepiece = pytest.importorskip("sentencepiece")
    text = "".join(f"{PROSE}Chapter {i}.\n" for i in range(9000))  # 1.6 MB
    path = tmp_path / "long.txt"
    path.write_text(text)
    got = [int(x) for x in run_ok(MODEL, "-z", TOKENIZER, "-m", "tokenize", "-f", path).stdout.split()]
    sp = sentencepiece.SentencePieceProcessor(model_file=str(SP_MODEL))
    assert got == [1] + sp.encode(text)
