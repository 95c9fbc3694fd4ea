"""What every reader and writer shares: ExportError (the one-line message for
the user), Source (what a checkpoint reader returns), checked numbers from a
source's config, JSON files, atomic file writing and progress lines."""

import collections
import json
import math
import os
import stat
import sys
import time


INT32_MAX = 2**31 - 1


class ExportError(Exception):
    """A problem with an input or an argument; str() is one line for the user."""


# What each checkpoint source's reader returns (read_hf, read_meta, read_gguf,
# read_llama2c): config a dict for write_checkpoint, tensors {name: array or
# lazy tensor}, tokenizer the source's own (a version-3 tokenizer dict; GGUF
# only, else None), notes lines worth telling the user.
Source = collections.namedtuple("Source", "config tensors tokenizer notes")


# ---------------------------------------------------------------------------
# Atomic writing and progress

class _AtomicFile:
    """`with _AtomicFile(path) as f:` writes to a temporary file beside path
    (same directory, so the final rename stays on one file system) and renames
    it over path only if the block finishes without an exception. Otherwise
    the temporary file is removed and path is untouched."""

    def __init__(self, path):
        self.path = os.fspath(path)
        if os.path.isdir(self.path):
            raise ExportError(f"{self.path}: is a directory")
        try:  # an existing path must be a regular file: a device, FIFO or symlink is never replaced
            mode = os.lstat(self.path).st_mode
        except FileNotFoundError:
            mode = None
        except OSError as e:
            raise ExportError(f"{self.path}: cannot check the output path: {e.strerror}") from None
        if mode is not None and not stat.S_ISREG(mode):
            kind = ("a symbolic link" if stat.S_ISLNK(mode) else "a FIFO" if stat.S_ISFIFO(mode)
                    else "a device or socket")
            raise ExportError(f"{self.path}: exists and is not a regular file ({kind}); give a new output path")
        d, base = os.path.split(os.path.abspath(self.path))
        self.tmp = os.path.join(d, f".{base}.{os.getpid()}.{os.urandom(4).hex()}.tmp")

    def __enter__(self):
        try:
            fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except OSError as e:
            raise ExportError(f"{self.path}: cannot create: {e.strerror}") from None
        self.f = os.fdopen(fd, "wb")
        return self.f

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc_type is None:
                self.f.flush()
                os.fsync(self.f.fileno())
            self.f.close()
            if exc_type is None:
                os.replace(self.tmp, self.path)
        except OSError as e:  # a full disk while flushing, closing or renaming: the output's failure
            _remove_quietly(self.tmp)
            raise ExportError(f"{self.path}: write failed: {e.strerror or e}") from None
        except BaseException:
            _remove_quietly(self.tmp)
            raise
        if exc_type is not None:
            _remove_quietly(self.tmp)
            if issubclass(exc_type, OSError) and not getattr(exc, "filename", None):
                # a write into the temporary file failed (no space left): name the output, not an input
                raise ExportError(f"{self.path}: write failed: {exc.strerror or exc}") from None
        return False


def _remove_quietly(path):
    try:
        os.unlink(path)
    except OSError:
        pass


class _Progress:
    """Progress lines on stderr, only once a job has taken more than 2 seconds,
    then at most one a second: `what: text (N s)`."""

    def __init__(self, what):
        self.what, self.start, self.last = what, time.monotonic(), None

    def step(self, text):
        now = time.monotonic()
        if now - self.start > 2.0 and (self.last is None or now - self.last > 1.0):
            print(f"{self.what}: {text} ({now - self.start:.0f} s)", file=sys.stderr, flush=True)
            self.last = now

    def done(self, text="done"):
        if self.last is not None or time.monotonic() - self.start > 2.0:
            print(f"{self.what}: {text} ({time.monotonic() - self.start:.0f} s)", file=sys.stderr,
                  flush=True)


def _text_encoding_problem(data):
    """What is wrong with data as UTF-8 JSON text, when it is empty, UTF-16 or
    starts with a byte-order mark; else None."""
    if not data.strip():
        return "is empty" if not data else "holds only whitespace"
    if data[:2] in (b"\xff\xfe", b"\xfe\xff") or (len(data) > 1 and 0 in data[:2]
                                                    and data[:2].strip(b"\0").isascii()):
        return "is UTF-16 text"
    if data[:3] == b"\xef\xbb\xbf":
        return "starts with a UTF-8 byte-order mark"
    return None


def _read_json(path, what):
    with open(path, "rb") as f:
        data = f.read()
    problem = _text_encoding_problem(data)
    if problem:
        raise ExportError(f"{path}: {problem}; expected {what} (JSON text, UTF-8)")
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        where = f" (line {e.lineno})" if hasattr(e, "lineno") else " (not UTF-8)"
        raise ExportError(f"{path}: not valid JSON{where}; expected {what} (JSON text, UTF-8)") \
            from None
    except RecursionError:  # json recurses once per nesting level
        raise ExportError(f"{path}: JSON nested too deeply ({what})") from None
    if not isinstance(value, dict):
        raise ExportError(f"{path}: expected a JSON object ({what})")
    return value


def _js(v):
    """A config value as config.json writes it (true, null, "silu")."""
    try:
        return json.dumps(v)
    except (TypeError, ValueError):
        return repr(v)


def _number(where, key, v, positive=True):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
            or (positive and v <= 0):
        kind = "a positive number" if positive else "a number"
        raise ExportError(f"{where}: {key}={_js(v)} is not {kind}")
    return float(v)


def _integer(where, key, v, minimum=1):
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum or v > INT32_MAX:
        raise ExportError(f"{where}: {key}={_js(v)} is not an integer >= {minimum}")
    return v


def _head_counts(where, cfg, dim_key, heads_key, kv_key):
    """(dim, heads, kv_heads) from a source config, named by its own keys:
    heads must divide dim and kv_heads (default: heads) must divide heads."""
    dim, heads = cfg[dim_key], cfg[heads_key]
    kv = cfg.get(kv_key)
    kv = heads if kv is None else _integer(where, kv_key, kv)
    if dim % heads:
        raise ExportError(f"{where}: {heads_key}={heads} does not divide {dim_key}={dim}")
    if heads % kv:
        raise ExportError(f"{where}: {kv_key}={kv} does not divide {heads_key}={heads}")
    return dim, heads, kv


def _write_bytes(path, data):
    with _AtomicFile(path) as f:
        f.write(data)


def _check_no_overlap(path, ranges):
    """ranges: {name: (begin, end)} byte ranges of tensor data in one file.
    Raises ExportError naming the first two tensors whose (non-empty) data
    overlap: each tensor owns its bytes."""
    last_name, last_end = None, 0
    for begin, end, name in sorted((b, e, n) for n, (b, e) in ranges.items() if e > b):
        if last_name is not None and begin < last_end:
            b0, e0 = ranges[last_name]
            raise ExportError(f"{path}: the data of tensors {last_name} (bytes {b0}..{e0}) and "
                              f"{name} (bytes {begin}..{end}) overlap; expected separate ranges")
        if end > last_end:
            last_name, last_end = name, end
    return ranges


def _one_line(e, limit=160):
    s = " ".join(str(e).split())
    return s if len(s) <= limit else s[:limit - 3] + "..."
