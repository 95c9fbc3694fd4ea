"""The tables: table.md's text (how the cells were made, what a cell is, the
tables of each study with every cell's command, the studies of which no cell
came, what the cells cost), and results.csv and passkey.csv."""
import csv
import io

from .commands import Where
from .config import SINKS, Z95, factor_label, num
from .files import write_text
from .stats import measured, passkey_cell, ppl_cell, wilson

MISSING_NOTE = ("\"missing\": no file of this cell was among those collected (--collect); its command is listed "
                "below, and `tools/extrapolation.py --list` gives the one that writes its file.")


def command_mark(r):
    """What follows '# method, k' above a cell's command: ': missing' or nothing."""
    return ": missing" if r.get("missing") else ""


def windows_note(rows_by_k, factors):
    """'65 | 33 | ...': windows (segments) per column, from none's cells."""
    return [str(rows_by_k[k]["windows"]) if k in rows_by_k else "" for k in factors]


def ppl_table(study, results):
    """Markdown lines: one study's perplexity table, its notes and its commands."""
    listed = [r for r in results if r["model"] == study.name]
    rows = [r for r in listed if measured(r)]
    if not listed:
        return []
    none = {r["k"]: r for r in rows if r["method"] == "none"}
    tokens = sorted({r["tokens"] for r in rows if not r.get("streaming") and not r.get("same_as")})
    seg_tokens = sorted({r["tokens"] for r in rows if r.get("streaming") and not r.get("same_as")})
    tok_txt = "/".join(str(t) for t in tokens) + " tokens scored per cell" if tokens else "no cell measured"
    if seg_tokens:
        tok_txt += f" ({SINKS} sinks: {seg_tokens[0]}" + (f"-{seg_tokens[-1]}" if len(seg_tokens) > 1 else "") + \
            ", the same text cut at white space)"
    lines = [f"### {study.name}: perplexity (training context L = {study.L}; {study.data}; {tok_txt})", "",
             "| method | " + " | ".join(f"{factor_label(k)} ({study.ctx(k)})" for k in study.factors) + " |",
             "|---|" + "---:|" * len(study.factors)]
    for m in study.rows:
        cells = []
        for k in study.factors:
            hit = [r for r in listed if r["method"] == m and r["k"] == k]
            cells.append(ppl_cell(hit[0]) if hit else "")
        label = f"sinks ({SINKS})" if m == "sinks" else m
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("| windows per cell | " + " | ".join(windows_note(none, study.factors)) + " |")
    half = []
    for k in study.factors:
        ws = [r["nll_se_windows"] for r in rows if r["k"] == k and r.get("nll_se_windows") is not None
              and not r.get("same_as")]
        ran = any(r["k"] == k and measured(r) for r in rows)
        half.append(f"±{Z95 * max(ws):.3f}" if ws else "n/a (1 window)" if ran else "missing")
    lines.append("| windows-based 95% half-width, nats (largest in column) | " + " | ".join(half) + " |")
    few = [factor_label(k) for k in study.factors if k in none and none[k]["windows"] < 4]
    lines += ["", "Cells: perplexity [95% interval with the tokens as independent draws: run's ppl_lo, ppl_hi]. "
              "The windows-based half-width (nats, on the mean NLL) treats the windows (sinks: segments) as "
              "the independent units; exp(±0.1) is ±10.5% on the perplexity."]
    if few:
        lines.append(f"The {', '.join(few)} column{'s rest' if len(few) > 1 else ' rests'} on fewer than 4 "
                     "windows: the windows-based estimate is rough or undefined there.")
    if any(r.get("same_as") for r in rows):
        lines.append("\"= none\": at k <= 1 the method changes nothing (no scaling; Self-Extend G = 1; a cache "
                     "that never fills), so the cell is none's run.")
    if any(r.get("missing") for r in listed):
        lines.append(MISSING_NOTE)
    lines += ["", "Commands (from the repository root, after `make`):", "", "```"]
    lines += study.text_recipe
    for m in study.rows:
        for k in study.factors:
            hit = [r for r in listed if r["method"] == m and r["k"] == k and not r.get("same_as")]
            if hit:
                lines.append(f"# {m}, {factor_label(k)}" + command_mark(hit[0]))
                lines.append(hit[0]["command"])
    seg = [r["segment_command"] for r in rows if r.get("segment_command")]
    if seg:
        lines.append("# a sinks cell scores each segment NNNN.txt (--stream-cell --segments DIR keeps them) with")
        lines.append("# " + seg[0])
    lines += ["```", ""]
    return lines


def passkey_table(study, results):
    """Markdown lines: one passkey study's tables (pooled over depths, then by
    depth) and its commands."""
    rows = [r for r in results if r["model"] == study.name]
    if not rows:
        return []
    trials = sorted({c["trials"] for r in rows for c in r["cells"]})
    head = "| method | " + " | ".join(f"{factor_label(k)} ({study.ctx(k) - study.answer_tokens})"
                                     for k in study.factors) + " |"
    lines = [f"### {study.title}: passkey accuracy ({Where().path(study.ckpt)}, L = {study.L}; filler: "
             f"held-out books; 5-digit keys; prompts of k L - {study.answer_tokens} tokens"
             + (" in the chat template (--chat), the question one user turn" if study.chat else ", plain text")
             + "; "
             f"{'/'.join(map(str, trials))} trial{'s' if trials != [1] else ''} per (length, depth))", ""]
    if study.at:
        def what(d):
            parts = []
            if "trials" in d:
                parts.append(f"{d['trials']} trial{'s' if d['trials'] != 1 else ''}")
            if "depths" in d:
                parts.append("depth" + ("s " if len(d["depths"]) > 1 else " ") + ", ".join(map(num, d["depths"])))
            return " and ".join(parts)
        lines += [f"Depths {', '.join(map(num, study.depths))}, {what(dict(trials=study.trials))} per cell; "
                  + "; ".join(f"at {factor_label(k)} {what(d)}" for k, d in sorted(study.at.items()))
                  + (f" ({study.note})" if study.note else "") + ".", ""]
    lines += ["All depths pooled: correct / prompts [95% Wilson interval].", "", head,
              "|---|" + "---:|" * len(study.factors)]

    def find(m, k):
        hit = [r for r in rows if r["method"] == m and r["k"] == k]
        return hit[0] if hit else None

    def mark(r):
        if r.get("missing"):
            return "missing"
        return f"= {r['same_as']}" if r.get("same_as") else None

    for m in study.rows:
        cells = []
        for k in study.factors:
            r = find(m, k)
            if r is None:
                cells.append("")
            elif mark(r):
                cells.append(mark(r))
            else:
                cells.append(passkey_cell(sum(c["correct"] for c in r["cells"]),
                                          sum(c["trials"] for c in r["cells"]), interval=True))
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    lines += ["", "By depth (0: the key right after the task line, 1: right before the question): correct / trials.",
              "", "| method | depth | " + " | ".join(factor_label(k) for k in study.factors) + " |",
              "|---|---:|" + "---:|" * len(study.factors)]
    for m in study.rows:
        for d in study.depths:
            cells = []
            for k in study.factors:
                r = find(m, k)
                c = [c for c in r["cells"] if c["depth"] == d] if r else []
                cells.append(mark(r) if r and mark(r) else passkey_cell(c[0]["correct"], c[0]["trials"]) if c else "")
            lines.append(f"| {m} | {num(d)} | " + " | ".join(cells) + " |")
    lines.append("")
    if any(r.get("same_as") for r in rows):
        lines.append("\"= none\": up to the training context the method changes nothing, so the cell is none's run.")
    if any(r.get("missing") for r in rows):
        lines.append(MISSING_NOTE)
    few = sorted({c["trials"] for r in rows for c in r["cells"] if c["trials"] < 5})
    if few:
        lines.append(f"Cells of {'/'.join(map(str, few))} trial{'s' if few != [1] else ''} say little alone: "
                     f"the Wilson interval of 1/1 is [{100 * wilson(1, 1)[0]:.0f}%, 100%], of 0/1 "
                     f"[0%, {100 * wilson(0, 1)[1]:.0f}%].")
    lines += ["", "Commands (from the repository root, after `make`):", "", "```"] + study.text_recipe
    for m in study.rows:
        for k in study.factors:
            r = find(m, k)
            if r and not r.get("same_as"):
                lines += [f"# {m}, {factor_label(k)}" + command_mark(r), r["command"]]
    lines += ["```", ""]
    return lines


PREAMBLE = [
    "## What a cell is", "",
    "- Perplexity at k x L (L: the training context): `run -m ppl --ctx E` with E = kL scores the text in "
    "non-overlapping windows of E tokens (BOS and E - 1 text tokens; each token given its in-window prefix), the same "
    "text in every cell of a table. Methods at E = kL: linear, dynamic (hf: keys keep the rotation they arrived "
    "with; exact: every key re-rotated for the current length), YaRN and Llama 3 with factor k; NTK with alpha = 2k; "
    "Self-Extend with W = L/2 and the smallest group G whose reach G(L - W) + G floor(W/G) covers E. "
    "At k <= 1 no method scales.",
    f"- sinks ({SINKS}): StreamingLLM's rolling cache of L tokens, the first {SINKS} kept and the oldest of the rest "
    "evicted, positions by place in the cache, no RoPE scaling. The text is cut at white space into segments of one "
    "window (at most E tokens with BOS), and each segment is streamed through the cache, every token scored (`-m ppl --streaming --sinks "
    f"{SINKS} --ctx L`): the same text, read as documents of E tokens, as in the other rows; past L tokens a token "
    f"sees the {SINKS} sinks and the last L - {SINKS}. At 1x the cache never fills, so the cell differs from none's "
    "only by where its segments start (at white space rather than every L - 1 tokens).",
    "- Perplexity intervals: [lo, hi] is run's 95% interval exp(nll -+ 1.96 nll_se), nll_se counting the tokens "
    "as independent draws. Tokens of one window share their text, so that understates the spread between texts; "
    "the windows-based row gives the half-width with the windows (segments) as the independent units, and it is "
    "itself rough with few windows. Both are for a cell alone: the cells of a column score the same tokens, so "
    "differences between methods are more certain than either interval.",
    "- Passkey at k x L: `run -m passkey` hides a 5-digit key at each depth (0 = right after the task line, "
    "1 = right before the question) of a prompt of kL - 9 tokens (filler: sentences of the held-out books, from a "
    "random start), and the model must write the key greedily within 9 tokens. Keys and starts come from seed 0, so "
    "every method sees the same prompts. Cells: correct / trials and a 95% Wilson interval.",
    "",
]


def made_by(meta):
    """table.md's opening sentence: how the cells were run (one machine) or gathered (--collect)."""
    cpu = f"{meta.get('cpu_s', 0) / 60:.0f} minutes"
    if "collected_files" in meta:
        return (f"Collected by `{meta['command']}` from {meta['collected_files']} cell files in "
                f"{meta['collected_folders']} folder{'s' if meta['collected_folders'] != 1 else ''}, run where and "
                f"when their commands (`tools/extrapolation.py --list`) were; the cells' wall times times their "
                f"threads add up to {meta.get('cpu_s', 0) / 60:.1f} CPU-minutes (by study and factor at the end). "
                "Every cell's command is listed under its table; they run from the repository root.")
    threads = meta.get("threads", 1)
    return (f"Made by `{meta['command']}` in {meta['wall_s'] / 60:.1f} minutes: {meta['jobs']} runs at a time, "
            f"{'one thread' if threads == 1 else f'{threads} threads'} each, on {meta['cpus']} cores (1-minute load "
            f"average {meta.get('load_before', '?')} before the study, so other work shared the cores; the runs' "
            f"wall times{' times their threads' if threads != 1 else ''} add up to {cpu}). Every cell's command is "
            "listed under its table; they run from the repository root.")


def cost_table(meta):
    """Markdown lines: CPU time (wall x threads) by study and factor, from
    meta's cost (written by collect); nothing without it."""
    cost = meta.get("cost")
    if not cost:
        return []
    lines = ["## What the cells cost", "",
             "CPU time of each cell is its wall time times its threads, as the cell's file records them; the cells "
             "shared their machines with whatever else ran there, so these are what the runs took, not a benchmark.",
             "", "| study | factor | cells | missing | CPU-minutes | longest cell, CPU-minutes |",
             "|---|---:|---:|---:|---:|---:|"]
    for g in cost:
        lines.append(f"| {g['study']} | {factor_label(g['k'])} | {g['cells']} | {g['missing']} | "
                     f"{g['cpu_s'] / 60:.2f} | {g['longest_s'] / 60:.2f} |")
    total = sum(g["cpu_s"] for g in cost)
    missing = len(meta.get("missing", []))  # with those of studies of which no cell came
    lines += ["", f"In all {total / 60:.2f} CPU-minutes ({total / 3600:.2f} CPU-hours)"
              + (f", without the {missing} missing cell{'s' if missing != 1 else ''}." if missing else "."), ""]
    kept = meta.get("kept_trials")
    if kept:
        lines += ["Missing cells with finished trials kept (NAME.parts beside the cell files; running the cell goes "
                  "on from them): " + ", ".join(f"{n} ({k} trial{'s' if k != 1 else ''})" for n, k in kept.items())
                  + ".", ""]
    return lines


def absent_studies(meta):
    """Markdown lines for the studies of the plan of which no cell was collected."""
    lines = []
    for name, names in meta.get("absent_studies", {}).items():
        lines += [f"### {name}: no cell collected", "",
                  f"All {len(names)} cells of this study are missing (no file among those collected): "
                  f"{', '.join(names)}. `tools/extrapolation.py --list` gives their commands.", ""]
    return lines


def csv_text(rows):
    """rows as CSV text (the csv module's dialect: quoted where needed, lines ending \\r\\n)."""
    buf = io.StringIO(newline="")
    csv.writer(buf).writerows(rows)
    return buf.getvalue()


def write_csvs(ppl, passkey, out):
    """results.csv (a row per perplexity cell measured) and passkey.csv (a row
    per passkey cell and depth), each through files.write_text."""
    rows = [["model", "method", "k", "ctx", "train_ctx", "flags", "tokens", "windows", "nll", "nll_se",
             "nll_se_windows", "ppl", "ppl_lo", "ppl_hi", "same_as", "command"]]
    for r in (r for r in ppl if measured(r)):  # the cells measured; results.json lists all
        g = lambda key, f: "" if r.get(key) is None else f.format(r[key])  # noqa: E731
        rows.append([r["model"], r["method"], r["k"], r["ctx"], r["train_ctx"], r["flags"], r["tokens"],
                     r["windows"], g("nll", "{:.5f}"), g("nll_se", "{:.5f}"), g("nll_se_windows", "{:.5f}"),
                     g("ppl", "{:.3f}"), g("ppl_lo", "{:.3f}"), g("ppl_hi", "{:.3f}"), r.get("same_as", ""),
                     "" if r.get("same_as") else r["command"]])
    write_text(out / "results.csv", csv_text(rows))
    rows = [["model", "method", "k", "ctx", "length", "depth", "correct", "trials", "same_as", "command"]]
    for r in passkey:
        for c in r["cells"]:
            rows.append([r["model"], r["method"], r["k"], r["ctx"], r["length"], c["depth"], c["correct"],
                         c["trials"], r.get("same_as", ""), "" if r.get("same_as") else r["command"]])
    write_text(out / "passkey.csv", csv_text(rows))
