"""The plots: perplexity against context and NLL by position (plot_ppl), the
passkey heatmaps (plot_passkey), their log axes labelled with plain numbers,
and --replot, which draws them again from results.json (replot)."""
import math
import tempfile
from pathlib import Path

from .config import FULL, SINKS, factor_label, num
from .files import read_json, save_figure
from .plan import Study
from .stats import measured, position_bins

GAP = (math.nan, math.nan, math.nan)  # a missing cell's (ppl, lo, hi) in a plot: a gap in its line


def nice_log_ticks(lo, hi):
    """Round values in [lo, hi] for a log axis, the coarsest set that gives at
    least 3 and leaves no gap (ends included) wider than 30% of the axis:
    the powers of 10, then 1-2-5, 1-2-3-5-7, every digit, and finer."""
    span = math.log10(hi / lo)
    ticks = []
    for subs in ((1,), (1, 2, 5), (1, 2, 3, 5, 7), (1, 2, 3, 4, 5, 6, 7, 8, 9),
                 (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 7, 8, 9)):
        ticks = [s * 10.0 ** e for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
                 for s in subs if lo <= s * 10.0 ** e <= hi]
        edges = [lo] + ticks + [hi]
        if len(ticks) >= 3 and max(math.log10(b / a) for a, b in zip(edges, edges[1:])) <= 0.3 * span:
            break
    return ticks


def plain_ticks(axis, ticks):
    """Label a log axis at ticks with plain numbers (256, 90), not 2^8 or
    9x10^1; no labels on the minor ticks."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter
    axis.set_major_locator(FixedLocator(ticks))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def finish_axes(ax, L, xlabel, ylabel, title, xticks):
    """A log2 x axis labelled at xticks with the training context L marked,
    labels, grid, legend."""
    ax.set_xscale("log", base=2)
    plain_ticks(ax.xaxis, xticks)
    ax.axvline(L, color="grey", lw=0.8, ls="--")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)


def plot_ppl(ppl, studies, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    studies = [s for s in studies if any(r["model"] == s.name for r in ppl)]
    if not studies:
        return []
    n = len(studies)
    fig, axes = plt.subplots(1, n, figsize=(6.5 * n, 4.8), squeeze=False)
    for ax, s in zip(axes[0], studies):
        for m in s.rows:
            pts = sorted((r["ctx"], r["ppl"], r["ppl_lo"], r["ppl_hi"]) if not r.get("missing") else (r["ctx"],) + GAP
                         for r in ppl if r["model"] == s.name and r["method"] == m)
            if not pts:
                continue
            x, y = [p[0] for p in pts], [p[1] for p in pts]
            err = [[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]]
            ax.errorbar(x, y, yerr=err, marker="o", ms=4, capsize=3, label=m if m != "sinks" else f"sinks ({SINKS})",
                        ls="--" if m == "sinks" else "-")
        ax.set_yscale("log")
        lo, hi = ax.get_ylim()
        plain_ticks(ax.yaxis, nice_log_ticks(lo, hi))
        ax.set_ylim(lo, hi)
        finish_axes(ax, s.L, "context length (tokens)", "perplexity (bars: 95% interval)",
                    f"{s.name}: perplexity vs context (L = {s.L})", [s.ctx(k) for k in s.factors])
    fig.tight_layout()
    save_figure(fig, out / "ppl_vs_ctx.png")
    plt.close(fig)

    fig, axes = plt.subplots(1, n, figsize=(6.5 * n, 4.8), squeeze=False)
    for ax, s in zip(axes[0], studies):
        kmax = plotted_factor(s, ppl)
        later = [factor_label(k) for k in s.factors if k > kmax]  # the larger factors, still missing
        for m in s.rows:
            hit = [r for r in ppl if r["model"] == s.name and r["method"] == m and r["k"] == kmax
                   and r.get("position_bins")]
            if not hit:
                if any(r.get("missing") for r in ppl if r["model"] == s.name and r["method"] == m and r["k"] == kmax):
                    ax.plot([], [], " ", label=f"{m}: missing")  # named in the legend, no line
                continue
            bins = hit[0]["position_bins"]
            xs = [math.sqrt(b["first"] * b["last"]) for b in bins]
            line, = ax.plot(xs, [b["mean"] for b in bins], lw=1.2, label=m if m != "sinks" else f"sinks ({SINKS})")
            band = [(x, b) for x, b in zip(xs, bins) if b["lo"] is not None]
            ax.fill_between([x for x, _ in band], [b["lo"] for _, b in band], [b["hi"] for _, b in band],
                            color=line.get_color(), alpha=0.15, lw=0)
        finish_axes(ax, s.L, "position in the window (tokens)",
                    "NLL (nats): mean per quarter octave, 95% bootstrap band",
                    f"{s.name}: NLL by position at {factor_label(kmax)} (ctx {s.ctx(kmax)})"
                    + (f"; {', '.join(later)} missing" if later else ""),
                    [4 ** i for i in range(1 + round(math.log(s.ctx(kmax), 4)))])
    fig.tight_layout()
    save_figure(fig, out / "nll_vs_position.png")
    plt.close(fig)
    return ["ppl_vs_ctx.png", "nll_vs_position.png"]


def plot_passkey(study, passkey, out):
    """passkey_<study>.png: one heatmap per method, depth (rows) x length (columns), counts in the cells."""
    rows = [r for r in passkey if r["model"] == study.name]
    if not rows:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    methods = [m for m in study.rows if any(r["method"] == m for r in rows)]
    ncol = min(3, len(methods))
    nrow = math.ceil(len(methods) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(max(8.0, 1.1 * len(study.factors) * ncol + 1.5),
                                                  0.55 * len(study.depths) * nrow + 1.4 * nrow + 0.6), squeeze=False)
    im = None
    for i, ax in enumerate(axes.flat):
        if i >= len(methods):
            ax.axis("off")
            continue
        m = methods[i]
        grid = [[math.nan] * len(study.factors) for _ in study.depths]
        for j, k in enumerate(study.factors):
            hit = [r for r in rows if r["method"] == m and r["k"] == k]
            if hit and hit[0].get("missing"):
                ax.text(j, (len(study.depths) - 1) / 2, "missing", ha="center", va="center", fontsize=7)
            for di, d in enumerate(study.depths):
                c = [c for c in hit[0]["cells"] if c["depth"] == d] if hit else []
                if c:
                    grid[di][j] = c[0]["correct"] / c[0]["trials"]
                    mark = "=" if hit[0].get("same_as") else ""
                    ax.text(j, di, f"{mark}{c[0]['correct']}/{c[0]['trials']}", ha="center", va="center",
                            fontsize=7, color="white" if grid[di][j] < 0.6 else "black")
        im = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto")
        ax.set_xticks(range(len(study.factors)))
        ax.set_xticklabels([f"{factor_label(k)}\n{study.ctx(k) - study.answer_tokens}" for k in study.factors],
                           fontsize=7)
        ax.set_yticks(range(len(study.depths)))
        ax.set_yticklabels([num(d) for d in study.depths], fontsize=7)
        ax.set_title(m if m != "sinks" else f"sinks ({SINKS})", fontsize=9)
        if i % ncol == 0:
            ax.set_ylabel("key depth")
    fig.suptitle(f"{study.title}: passkey accuracy by prompt length (tokens) and key depth; L = {study.L}"
                 + ("\n=: none's run (no scaling up to L)" if any(r.get("same_as") for r in rows) else ""),
                 fontsize=10)
    fig.tight_layout()
    if im is not None:
        fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.6, label="correct / trials")
    name = f"passkey_{study.title}.png"
    save_figure(fig, out / name)
    plt.close(fig)
    return name


def plotted_factor(study, ppl):
    """The k whose cells nll_vs_position.png draws for a perplexity study: the
    largest with a result (a study still missing its largest k shows the next)."""
    have = {r["k"] for r in ppl if r["model"] == study.name and measured(r)}
    done = [k for k in study.factors if k in have]
    return max(done) if done else max(study.factors)


def add_position_bins(ppl, studies):
    """position_bins() of the cells nll_vs_position.png draws (each perplexity
    study's largest k with results: plotted_factor), on those cells and no
    other: results.json keeps them, not the per-position values, so that
    --replot can draw the plot again. A cell file holds its bins already
    (run_cell); per-position values, where a result still has them, are
    binned here."""
    for s in studies:
        if s.kind != "ppl":
            continue
        kmax = plotted_factor(s, ppl)
        for r in ppl:
            if r["model"] != s.name:
                continue
            if r["k"] != kmax:
                r.pop("position_bins", None)
            elif r.get("per_position"):
                r["position_bins"] = position_bins(r["per_position"])


def draw_plots(ppl, passkey, studies, out):
    """The plots of the studies (file names, in out)."""
    files = plot_ppl(ppl, [s for s in studies if s.kind == "ppl"], out)
    for s in studies:
        if s.kind == "passkey":
            name = plot_passkey(s, passkey, out)
            if name:
                files.append(name)
    return files


def replot(out):
    """--replot: draw the plots again from out/results.json, running nothing.
    The studies' methods (their order) are FULL's; the factors, depths and
    training contexts are the results'. Returns the files drawn, and a message for
    nll_vs_position.png when results.json has no position bins (results made
    before they were saved): that plot is then left as it is."""
    try:
        saved = read_json(out / "results.json", "the study's results")
    except ValueError as e:
        raise RuntimeError(str(e)) from None
    try:
        ppl, passkey = saved["ppl"], saved["passkey"]
    except (KeyError, TypeError) as e:
        raise RuntimeError(f"{out / 'results.json'}: cannot read the results ({e})") from None
    studies = []
    for name, cfg in FULL.items():
        rows = [r for r in (ppl if cfg["kind"] == "ppl" else passkey) if r["model"] == name]
        if rows:
            depths = sorted({c["depth"] for r in rows for c in r.get("cells", [])})
            studies.append(Study(name, cfg["kind"], "", None, rows[0]["train_ctx"], sorted({r["k"] for r in rows}),
                                 cfg["rows"], depths=depths, at=cfg.get("at"), chat=cfg.get("chat", False)))
    messages = []
    if not any(r.get("position_bins") for r in ppl):
        messages.append("results.json holds no position bins (it was made before the study saved them): "
                        "nll_vs_position.png left as it is; the next make extrapolation (or --collect) saves them")
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        files = draw_plots(ppl, passkey, studies, Path(tmp))
        for name in files:
            if name != "nll_vs_position.png" or not messages:
                (Path(tmp) / name).replace(out / name)
    return [f for f in files if f != "nll_vs_position.png" or not messages], messages
