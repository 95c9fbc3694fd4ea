"""Statistics and formatting: the 95% Wilson interval of a passkey cell, the
mean NLL by log bin of position with a bootstrap band (position_bins), and how
a perplexity, a table cell and a duration are written."""
import math

from .config import Z95


def wilson(c, n, z=Z95):
    """95% Wilson score interval of a binomial proportion c / n."""
    if n == 0:
        return 0.0, 1.0
    p = c / n
    d = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / d
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, mid - half), min(1.0, mid + half)


def fmt(v):
    """A perplexity: 4.28, 88.16, 172.1, 1234."""
    if v is None:
        return "-"
    if v >= 1000:
        return f"{v:.0f}"
    if v >= 100:
        return f"{v:.1f}"
    return f"{v:.2f}"


def measured(r):
    """Whether a result row holds a measurement (not a missing cell)."""
    return not r.get("missing")


def ppl_cell(r):
    """'88.16 [86.90, 89.45]'; '= none' for a cell that is none's run;
    'missing' for a cell whose file was not collected."""
    if r.get("missing"):
        return "missing"
    if r.get("same_as"):
        return f"= {r['same_as']}"
    return f"{fmt(r['ppl'])} [{fmt(r['ppl_lo'])}, {fmt(r['ppl_hi'])}]"


def passkey_cell(c, n, interval=False):
    """'7/10', or with interval '7/10 [40%, 89%]'."""
    if not interval:
        return f"{c}/{n}"
    lo, hi = wilson(c, n)
    return f"{c}/{n} [{100 * lo:.0f}%, {100 * hi:.0f}%]"


def log_bins(values, per_octave=4):
    """The per-position values (index = position; None = nothing scored) in
    bins of equal width on a log axis, per_octave to a doubling: bin j holds
    positions p >= 1 with floor(per_octave log2 p) = j. Returns
    [(first, last, [values])] for the bins holding values."""
    bins = {}
    for p, v in enumerate(values):
        if p >= 1 and v is not None:
            bins.setdefault(math.floor(per_octave * math.log2(p) + 1e-9), []).append((p, v))
    return [(bins[j][0][0], bins[j][-1][0], [v for _, v in bins[j]]) for j in sorted(bins)]


BOOTSTRAP = 2000  # resamples per bin for the NLL-by-position band


def position_bins(values, per_octave=4):
    """The mean NLL per log bin of position (log_bins) with a 95% bootstrap
    interval: [dict(first, last, n, mean, lo, hi)], lo and hi None for a bin
    of one position.

    Why a bootstrap: a value is the mean NLL at one position over the windows,
    and with one window (SmolLM2 at 2x) it is one token's NLL, a long-tailed
    quantity (most tokens near 0 nats, a few far above). mean -+ 1.96 standard
    errors assumes the mean is normal, and in a bin of a few such values it
    reaches below 0, which no NLL can. The percentile bootstrap resamples the
    bin's values with replacement and takes the 2.5th and 97.5th percentiles
    of the resampled means: it stays within the values' range (never below 0)
    and follows their skew. Fixed seed: a replot draws the same band."""
    import numpy as np
    rng = np.random.default_rng(0)
    out = []
    for first, last, vals in log_bins(values, per_octave):
        v = np.asarray(vals, dtype=np.float64)
        lo = hi = None
        if len(v) > 1:
            means = v[rng.integers(0, len(v), size=(BOOTSTRAP, len(v)))].mean(axis=1)
            lo, hi = (float(x) for x in np.percentile(means, [2.5, 97.5]))
        out.append(dict(first=first, last=last, n=len(v), mean=float(v.mean()), lo=lo, hi=hi))
    return out


def clock(seconds):
    """42 s, 3.5 min, 1.2 h."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"
