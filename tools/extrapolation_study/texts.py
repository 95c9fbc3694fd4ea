"""Texts: prefixes and segments cut at white space, counted by run's tokenizer
(TokenCounter). A perplexity study's text is the longest prefix of its source
with at most its tokens (prefix_bytes); a sinks cell cuts its text into
segments of one window each, streams each through the rolling cache, and
combines their scores as if one run had scored them all (stream_cell,
combine_scores)."""
import math
import os
import re
import subprocess
from pathlib import Path

from .commands import RUN, Where, model_args, run_json, stream_command
from .config import Z95
from .files import write_text


class TokenCounter:
    """Text tokens (BOS not counted) of a string, as `run -m tokenize` encodes it."""

    def __init__(self, ckpt, tok, work):
        self.base = [RUN] + model_args(ckpt, tok) + ["-m", "tokenize"]
        self.probe = Path(work) / f"probe-{os.getpid()}-{id(self)}.txt"
        # a BOS, when the tokenizer adds one, is the same first id for any text
        self.bos = int(self.ids("a")[0] == self.ids("z")[0])

    def ids(self, text):
        self.probe.write_text(text, encoding="utf-8")
        p = subprocess.run([str(c) for c in self.base + ["-f", self.probe]], capture_output=True)
        if p.returncode != 0:
            raise RuntimeError(f"tokenize: {p.stderr.decode(errors='replace').strip()}")
        return p.stdout.split()

    def __call__(self, text):
        return len(self.ids(text)) - self.bos


def cut_points(text):
    """(end of a piece, start of the next) at every run of white space."""
    return [(m.start(), m.end()) for m in re.finditer(r"\s+", text)]


def longest_piece(text, start, max_tokens, count, cuts=None):
    """The end e of the longest text[start:e] with at most max_tokens tokens,
    e the whole text's end or the start of a run of white space; and where the
    next piece starts. Binary search, since longer pieces have more tokens."""
    if count(text[start:]) <= max_tokens:
        return len(text), len(text)
    cuts = [c for c in (cut_points(text) if cuts is None else cuts) if c[0] > start]
    lo, hi = -1, len(cuts) - 1  # cuts[lo] fits (-1: none yet); every cut after hi is too long
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count(text[start:cuts[mid][0]]) <= max_tokens:
            lo = mid
        else:
            hi = mid - 1
    if lo < 0:
        raise ValueError(f"no piece of at most {max_tokens} tokens starts at character {start}")
    return cuts[lo]


def split_segments(text, max_tokens, count):
    """text cut at white space into consecutive segments of at most max_tokens
    tokens, each as long as fits; the white space at a cut is in neither."""
    cuts, out, start = cut_points(text), [], 0
    while start < len(text):
        end, start_next = longest_piece(text, start, max_tokens, count, cuts)
        out.append(text[start:end])
        start = start_next
    return out


def prefix_bytes(text, max_tokens, count):
    """(prefix, bytes): the longest prefix of text cut at white space with at
    most max_tokens tokens, and its length in UTF-8 bytes (for head -c)."""
    # search a slice a little longer than needed, estimated from a sample
    sample = text[:20000]
    per_token = len(sample) / max(1, count(sample))
    limit = min(len(text), int(max_tokens * per_token * 1.5) + 1000)
    end, _ = longest_piece(text[:limit], 0, max_tokens, count)
    if end == limit and limit < len(text):
        raise RuntimeError("prefix_bytes: the estimate of characters per token was too low")
    prefix = text[:end]
    return prefix, len(prefix.encode("utf-8"))


def combine_scores(parts):
    """One score from the runs of several segments, as if one run had scored
    them all as windows: the token-weighted mean NLL, its standard error with
    the tokens as independent draws (from each part's nll_se: sum of squares =
    se^2 n (n - 1) + sum^2 / n) and with the segments as the units (the ratio
    estimator of run's nll_se_windows), the 95% interval, and the mean NLL at
    every position over the segments that reach it."""
    n_tot, s_tot, sq_tot, win = 0, 0.0, 0.0, []
    npos = max(len(p.get("per_position") or []) for p in parts)
    pos_sum, pos_cnt = [0.0] * npos, [0] * npos
    for p in parts:
        n, m = p["tokens"], p["nll"]
        s = n * m
        se = p["nll_se"] if p["nll_se"] is not None else 0.0
        sq = se * se * n * (n - 1) + s * s / n
        n_tot, s_tot, sq_tot = n_tot + n, s_tot + s, sq_tot + sq
        win.append((s, n))
        for i, v in enumerate(p.get("per_position") or []):
            if v is not None:
                pos_sum[i] += v
                pos_cnt[i] += 1
    nll = s_tot / n_tot
    var = (sq_tot - s_tot * s_tot / n_tot) / (n_tot - 1) if n_tot > 1 else float("nan")
    se = math.sqrt(max(var, 0.0) / n_tot) if n_tot > 1 else None
    W = len(win)
    se_w = (math.sqrt(W / (W - 1) * sum((s - nll * n) ** 2 for s, n in win)) / n_tot) if W > 1 else None
    out = dict(tokens=n_tot, nll=nll, ppl=math.exp(nll), nll_se=se, nll_se_windows=se_w,
               ppl_lo=math.exp(nll - Z95 * se) if se is not None else None,
               ppl_hi=math.exp(nll + Z95 * se) if se is not None else None,
               windows=W, streaming=True,
               per_position=[pos_sum[i] / pos_cnt[i] if pos_cnt[i] else None for i in range(npos)])
    for key in ("ctx", "sinks", "orig_ctx", "scaling", "position"):
        if key in parts[0]:
            out[key] = parts[0][key]
    return out


def stream_cell(ckpt, tok, text, window, ctx, work, where=None, threads=1):
    """A sinks cell: text cut into segments of one window each (window tokens
    with BOS: window - 1 text tokens; without BOS, window), each streamed
    through a rolling cache of ctx tokens with SINKS sinks (`threads` threads
    per run); the combined score."""
    count = TokenCounter(ckpt, tok, work)
    segments = split_segments(Path(text).read_text(encoding="utf-8"), window - count.bos, count)
    count.probe.unlink(missing_ok=True)
    folder = Path(work) / f"segments-{Path(ckpt).stem}-{window}"
    parts = []
    for i, seg in enumerate(segments):
        f = folder / f"{i:04d}.txt"
        write_text(f, seg)  # in --segments DIR they are kept: whole, or an OutputError
        parts.append(run_json(stream_command(ckpt, tok, f, ctx), threads))
    r = combine_scores(parts)
    r["segment_command"] = (where or Where(work)).command(stream_command(ckpt, tok, folder / "NNNN.txt", ctx))
    return r
