"""Files in and out, for the three studies (this one, tools/finetune_study.py and
tools/attention_study.py): every file they write goes through write_output,
whole or not at all; every cell file they read goes through read_json; and a
flag that names a folder is checked by folder_problem before any work starts.
Each failure is one line naming the file (docs/robustness.md, "The study
tools")."""
import json
import math
import os
import stat
from pathlib import Path

MAX_NESTING = 32  # a cell file nests 7 deep (a fine-tune cell's budgets, rows, depths); JSON deeper is not one


class OutputError(RuntimeError):
    """A file the tool could not write; the message is one line naming it."""


def what_is(path):
    """What is at path, in a few words: 'a folder', 'a file', 'a device',
    'a FIFO', 'a socket', 'a dangling symbolic link', 'nothing', 'a path
    through a file' (a/b where a is a file)."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return "a dangling symbolic link" if path.is_symlink() else "nothing"
    except NotADirectoryError:
        return "a path through a file"
    except OSError as e:
        return f"something that cannot be examined ({e.strerror})"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISREG(mode):
        return "a file"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a special file"


def folder_problem(flag, path):
    """None when path is a folder, or nothing yet (it is made when written);
    else the one line that says so: '--out X: expected a folder, got a file'."""
    got = what_is(path)
    return None if got in ("a folder", "nothing") else f"{flag} {path}: expected a folder, got {got}"


def make_folder(path):
    """mkdir -p path; OutputError naming it when it cannot be made (a file in
    the way, no permission, a full disk)."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        got = what_is(path)
        why = f"got {got}" if got not in ("a folder", "nothing") else f"cannot make it ({e.strerror or e})"
        raise OutputError(f"{path}: expected a folder to write in, {why}") from None


def write_output(path, write, binary=False):
    """path := what write(f) writes to an open file (text, UTF-8, newlines as
    written; or bytes with binary). It goes to a temporary file beside path,
    is flushed to the disk and renamed over path (os.replace), so a reader
    finds the old file or the new one, whole, never a part. When it cannot be
    written (a full disk, no permission, a folder where the file goes):
    OutputError naming path, the temporary removed, a file already at path
    left as it was."""
    path = Path(path)
    make_folder(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # never *.json: a folder's glob skips it
    try:
        with open(tmp, "wb") if binary else open(tmp, "w", encoding="utf-8", newline="") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())  # a full disk may say so only here
        os.replace(tmp, path)
    except OSError as e:
        got = what_is(path)
        why = e.strerror or str(e)
        if got not in ("a file", "nothing"):
            why = f"expected a file or nothing there, got {got}"
        raise OutputError(f"{path}: cannot write it: {why} (nothing written; a file there before is kept)") \
            from None
    finally:
        tmp.unlink(missing_ok=True)  # gone after os.replace; a failed write's part otherwise


def write_text(path, text):
    """path := text, through write_output."""
    write_output(path, lambda f: f.write(text))


def write_json(path, value, indent=None):
    """path := value as JSON and a newline, through write_output. A NaN or an
    infinity is refused (JSON has neither; a reader would take it for a
    number): OutputError, nothing written."""
    try:
        text = json.dumps(value, indent=indent, allow_nan=False) + "\n"
    except ValueError as e:
        raise OutputError(f"{path}: expected finite numbers to write, got a NaN or an infinity ({e}); "
                          "nothing written there") from None
    write_text(path, text)


def save_figure(fig, path):
    """A matplotlib figure as PNG at path (110 dpi), through write_output."""
    write_output(path, lambda f: fig.savefig(f, format="png", dpi=110), binary=True)


def finite_float(text):
    """A JSON number as a float; ValueError for one a float cannot hold (1e999)."""
    x = float(text)
    if not math.isfinite(x):
        raise ValueError(f"the number {text}, beyond what a float holds")
    return x


def no_constant(name):
    """json's hook for NaN, Infinity and -Infinity, which JSON has not: refused."""
    raise ValueError(f"{name}, which JSON has not")


def nesting(value):
    """How deep value nests: 0 for a number or a string, 1 for [] or {}, ..."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        v, depth = todo.pop()
        if isinstance(v, (list, dict)):
            deepest = max(deepest, depth)
            todo += [(x, depth + 1) for x in (v.values() if isinstance(v, dict) else v)]
    return deepest


def read_json(path, expected):
    """The JSON value in the file at path. ValueError, one line naming the file
    and saying `expected` (e.g. "a cell file"), when it is not a regular file
    (a dangling link, a folder, a device or FIFO: not read), cannot be read,
    is not UTF-8 JSON, holds NaN, an infinity or a number beyond a float, or
    nests deeper than MAX_NESTING."""
    path = Path(path)
    got = what_is(path)
    if got != "a file":
        raise ValueError(f"{path}: expected {expected} (JSON), got {got}")
    try:
        value = json.loads(path.read_text(encoding="utf-8"), parse_constant=no_constant, parse_float=finite_float)
    except OSError as e:
        raise ValueError(f"{path}: expected {expected} (JSON), got a file that cannot be read ({e.strerror})") \
            from None
    except RecursionError:
        raise ValueError(f"{path}: expected {expected} (JSON), got JSON nested too deep to read") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: expected {expected} (JSON), got unreadable JSON ({e})") from None
    if nesting(value) > MAX_NESTING:
        raise ValueError(f"{path}: expected {expected} (JSON nested at most {MAX_NESTING} deep), got JSON nested "
                         f"{nesting(value)} deep")
    return value


# The kinds of value shape_problem checks, and how a message names each.
KINDS = {
    "count": "an integer >= 0",
    "positive": "an integer >= 1",
    "number": "a number",
    "nonneg": "a number >= 0",
    "text": "a string",
    "list": "a list",
    "object": "an object",
    "bool": "true or false",
}


def fits(value, kind):
    """Whether value is of kind (KINDS); a bool is not a number here."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    integer = isinstance(value, int) and not isinstance(value, bool)
    return {"count": integer and value >= 0, "positive": integer and value >= 1, "number": number,
            "nonneg": number and value >= 0, "text": isinstance(value, str), "list": isinstance(value, list),
            "object": isinstance(value, dict), "bool": isinstance(value, bool)}[kind]


def shape_problem(record, fields, where=""):
    """What is wrong with record for fields ({key: kind}, kind one of KINDS, a
    trailing '?' for a key that may be absent or null), in a few words, or
    None: 'result.cells[2].correct: expected an integer >= 0, got -1'."""
    if not isinstance(record, dict):
        return f"{where or 'the file'}: expected an object, got {json.dumps(record)[:40]}"
    for key, kind in fields.items():
        optional, kind = kind.endswith("?"), kind.rstrip("?")
        value, name = record.get(key), f"{where}.{key}" if where else key
        if value is None and optional:
            continue
        if key not in record:
            return f"{name}: expected {KINDS[kind]}, got none"
        if not fits(value, kind):
            return f"{name}: expected {KINDS[kind]}, got {json.dumps(value)[:40]}"
    return None


def list_problem(records, fields, where):
    """shape_problem of each record of a list, named where[i]; the first found, or None."""
    for i, r in enumerate(records):
        problem = shape_problem(r, fields, f"{where}[{i}]")
        if problem:
            return problem
    return None
