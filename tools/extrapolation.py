#!/usr/bin/env python3
"""The extrapolation study: how each RoPE method behaves past the training length.

Two measurements, each a set of `run` commands whose JSON this script collects:

  perplexity  run MODEL -m ppl -f TEXT --ctx E --json --per-position [method flags]
              on the same text for every method and every context E = k L
              (L = the model's training context), in non-overlapping windows of
              E tokens (docs/rope.md §12.2);
  passkey     run MODEL -m passkey -f heldout.txt --ctx E --lengths E-9
              --depths 0,...,1 --trials T --json [method flags]
              (docs/passkey.md): a 5-digit key hidden at each depth of a prompt of
              E - 9 tokens (room for the 9-token answer), T keys per cell; with
              --chat (smollm2-chat) the prompt in the chat template, E - 21 tokens.

Studies (each skipped with a message when its files are absent):
  bundled      perplexity, models/model.bin (L = 256) on the held-out books, k = 1..16
  stories260K  perplexity, ../shared/models/stories260K.bin (L = 512) on TinyStories
               validation text, k = 1..16
  retrieval    passkey, models/retrieval/model.bin (the bundled model's recipe trained
               with passkey samples, L = 256), k = 1..16, every method
  smollm2      perplexity, models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf (`make
               smollm2`; SmolLM2-135M-Instruct, L = 8192; run reads it as q8_0
               under --gguf-convert q8_0, which the study passes: the weights of
               model-q8_0.bin, which the cells of 2026-12 name) on
               98,304 tokens of the held-out
               books, k = 1/4, 1/2, 1, 2, 4, every method (4x: 3 windows of 32,768)
  smollm2-passkey, smollm2-chat
               passkey on SmolLM2 in both prompt forms: plain text, and the chat
               form (-m passkey --chat, the checkpoint's template; prompts of
               E - 21 tokens, room for a reply that restates the question);
               k = 1/4 .. 1 with 10 keys per (length, depth), 2x with 5 keys,
               every method

Methods at context E = k L (the literature's choices; at k <= 1 no scaling):
    none          plain RoPE
    linear        position interpolation, factor s = k
    ntk           static NTK-aware, alpha = 2k for k >= 2 (alpha must exceed the
                  extension ratio: bloc97 ran 2k-trained LLaMA past 8k with alpha 8)
    dynamic-hf    dynamic NTK, factor k, Hugging Face semantics (keys keep their rotation)
    dynamic-exact dynamic NTK, factor k, every key re-rotated for the current length
    yarn          YaRN, factor k, beta_fast 32, beta_slow 1, attention factor 0.1 ln k + 1
    llama3        Llama 3.1 rule, factor k, low/high frequency factors 1 and 4
    self-extend   Self-Extend, neighbour window W = L/2 and the smallest group size G
                  whose reach G (L - W) + G floor(W/G) covers E (docs/rope.md §10.2), so
                  that no relative position reaches L
    sinks         attention sinks (StreamingLLM): a rolling cache of L tokens, the
                  first 4 kept (--sinks 4); no RoPE scaling. Perplexity: the text is cut
                  into segments of one window each (E tokens with BOS, at white space),
                  and each segment is streamed through the cache, every token scored
                  (run -m ppl --streaming --ctx L --sinks 4); so the column compares the
                  same text, read as documents of E tokens, with every other method's
                  window; past L tokens each token sees the 4 sinks and the last L - 4.
                  `--stream-cell` below runs one such cell. Passkey: --ctx L --sinks 4,
                  the prompt rolls through the cache.
For SmolLM2 the methods are identical at k <= 1 (no scaling, G = 1, a cache that
never fills), so only none runs there and the other rows say "= none".

Error bars: `run -m ppl --json` reports nll_se (the tokens as independent draws),
nll_se_windows (the windows, or segments, as the independent units) and the 95%
interval [ppl_lo, ppl_hi] = exp(nll -+ 1.96 nll_se). Tables and plots show that
interval; each table adds the windows-based half-width per column, which is wider
(tokens of one window share their text). Both are for one cell alone: the methods of
a column score the same tokens, so their differences are more certain than either.
Passkey cells show correct / trials and a 95% Wilson interval.

Outputs (in --out, default docs/extrapolation/):
    results.json          every cell: its command, scores, passkey trials; the cells' times and threads,
                          the CPU time by study and factor, the cells missing
    results.csv           one row per perplexity cell
    passkey.csv           one row per passkey cell (study, method, k, depth)
    table.md              the tables, with the command that reproduces every cell; the CPU time
    ppl_vs_ctx.png        perplexity against context, one panel per study, 95% bars
    nll_vs_position.png   NLL by in-window position at the largest k, with a 95% bootstrap
                          band (position_bins() says why a bootstrap); results.json keeps
                          the bins it draws
    passkey_<study>.png   passkey accuracy heatmaps (length x depth), one panel per method
Log axes are labelled with plain numbers (256, 90). --replot draws the plots again
from the results.json in --out, running nothing.

Texts (made here, in a temporary folder; table.md states the same commands):
    heldout.txt   .venv/bin/python tools/prepare_data.py --heldout heldout.txt
    books.txt     head -c N heldout.txt > books.txt  (N: the longest prefix, cut at
                  white space, with at most --tokens tokens)
    smollm2-books.txt, stories.txt likewise (stories.txt from TinyStories validation)

Cells and their files (the study fans out): every cell (study, method, k) has
a name, study_method_kx (bundled_yarn_4x, smollm2_none_0.25x), and a command of
its own that makes its text, runs it and writes RESULTS/NAME.json: the plan
(--quick, --studies, --tokens, --passkey-model), the study's settings, the
cell's result and command, its wall time and threads. A passkey cell runs
a trial at a time and keeps its finished trials in RESULTS/NAME.parts until
its file is written, so a cell stopped partway resumes from there when run
again (passkey_by_trials; the study's own, docs/extrapolation/cells, are kept
in git, and a NAME.parts left beside a finished cell's file is removed).
--list prints those commands, the costliest first; they run anywhere with
the same checkout, models and ../shared, in any order. --collect reads the files of one plan from
any number of folders and writes the outputs below; a cell without a file is
"missing" in every table (a gap in the plots), and table.md ends with the CPU
time (wall x threads) by study and factor. Without --list, --cell or
--collect, the script does all three here: it runs the cells --jobs at a time
(default one per core) with --threads each (default cores / jobs, so jobs x
threads <= cores), printing cells done / total, elapsed and the time left, and
collects them (the files go to a temporary folder, or to --results DIR, where
cells already there are not run again).

Usage:
    .venv/bin/python tools/extrapolation.py [--out DIR] [--jobs J] [--threads T] [--studies a,b] [--tokens N]
                                            [--results DIR]
    .venv/bin/python tools/extrapolation.py --quick        # a small subset, a few minutes
    .venv/bin/python tools/extrapolation.py --list [--quick ...] [--threads T] [--results DIR] > cells.txt
    .venv/bin/python tools/extrapolation.py --cell NAME [--quick ...] [--threads T] [--results DIR]
    .venv/bin/python tools/extrapolation.py --collect DIR [DIR ...] [--out DIR]
    .venv/bin/python tools/extrapolation.py --stream-cell CKPT TEXT --window E --ctx L [-z TOK]
    .venv/bin/python tools/extrapolation.py --replot [--out DIR]   # the plots from DIR/results.json
(`make extrapolation` runs it with the defaults and --results docs/extrapolation/cells,
so only the cells without a committed file; from scratch the cells take about 0.9
CPU-hours without SmolLM2 and 36 with it (docs/extrapolation/README.md, "What it
costs"). `make extrapolation EXTRAPOLATION_ARGS=--quick` runs the subset. --quick, and
--collect of a --quick plan, write to a new temporary folder unless --out is
given, so they never replace the study.)
"""
import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tools/: the study's package, prepare_data

# Every name of the study, from the module that holds it (tools/extrapolation_study/):
# tools/finetune_study.py, tools/attention_study.py and the tests use them as
# extrapolation.NAME.
from extrapolation_study.cells import (CELL_FORMAT, cell_problem, outcome, passkey_result,  # noqa: E402,F401
                                       ppl_result, read_cells, result_problem, run_cell, run_cells,
                                       study_from_record, study_record)
from extrapolation_study.collect import (collect, cost_groups, fill_same_as_none, kept_trials,  # noqa: E402,F401
                                         missing_row, shown_folder, write_outputs)
from extrapolation_study.commands import (ROOT, RUN, SHARED, Where, model_args,  # noqa: E402,F401
                                          passkey_by_trials, passkey_command, ppl_command, run_json,
                                          stream_cell_command, stream_command)
from extrapolation_study.config import (ANSWER_TOKENS, CHAT_ANSWER_TOKENS, DEPTHS, FACTORS,  # noqa: E402,F401
                                        FULL, METHODS, QUICK, ROWS, SINKS, SMOL_FACTORS,
                                        SMOL_PASSKEY_FACTORS, Z95, cell_name, factor_label, method_flags,
                                        num, parse_cell_name, self_extend_group, self_extend_reach)
from extrapolation_study.fanout import (check_fanout_args, collect_folders, fanout_parser,  # noqa: E402,F401
                                        read_cell_files, report_written, run_pool, write_cell_file)
from extrapolation_study.files import (OutputError, fits, folder_problem, list_problem, make_folder,  # noqa: E402,F401
                                       read_json, save_figure, shape_problem, write_json, write_output,
                                       write_text)
from extrapolation_study.modes import (cell_main, collect_main, default_out, list_main,  # noqa: E402,F401
                                       prepare, stream_cell_main, study_main)
from extrapolation_study.plan import (SMOLLM2, SMOLLM2_BEFORE, Study, all_jobs, cell_command,  # noqa: E402,F401
                                      config_cells, job_cost, make_plan, make_studies, passkey_jobs, plan_args,
                                      plan_config, plan_of_studies, ppl_jobs, same_study, train_ctx)
from extrapolation_study.plots import (GAP, add_position_bins, draw_plots, finish_axes,  # noqa: E402,F401
                                       nice_log_ticks, plain_ticks, plot_passkey, plot_ppl, plotted_factor,
                                       replot)
from extrapolation_study.stats import (BOOTSTRAP, clock, fmt, log_bins, measured, passkey_cell,  # noqa: E402,F401
                                       position_bins, ppl_cell, wilson)
from extrapolation_study.tables import (MISSING_NOTE, PREAMBLE, absent_studies, command_mark,  # noqa: E402,F401
                                        cost_table, made_by, passkey_table, ppl_table, windows_note,
                                        write_csvs)
from extrapolation_study.texts import (TokenCounter, combine_scores, cut_points, longest_piece,  # noqa: E402,F401
                                       prefix_bytes, split_segments, stream_cell)


def build_parser():
    """The command line's options (main reads them; the tests parse --list's commands with them)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="output folder (default docs/extrapolation; --quick: a new temporary one)")
    ap.add_argument("--quick", action="store_true", help="a small subset (every kind of cell), a few minutes")
    ap.add_argument("--studies", help="comma-separated subset of: " + ", ".join(FULL))
    ap.add_argument("--tokens", type=int, help="evaluation text per perplexity study, tokens (default per study)")
    ap.add_argument("--jobs", type=int, help="cells at a time (default: one per core)")
    ap.add_argument("--threads", type=int, help="threads per cell (default: cores / jobs, at least 1; "
                    "--list, --cell and --stream-cell: 1)")
    ap.add_argument("--passkey-model", type=Path, help="checkpoint for the retrieval study "
                    "(default models/retrieval/model.bin)")
    ap.add_argument("--list", action="store_true", help="print every cell's command (one line each, the costliest "
                    "first), which writes RESULTS/CELL.json")
    ap.add_argument("--cell", metavar="NAME", help="run one cell (a name from --list) and write RESULTS/NAME.json")
    ap.add_argument("--results", type=Path, help="the cell files' folder (--list, --cell: default results; the "
                    "whole study: a temporary one, else cells already there are not run again)")
    ap.add_argument("--collect", nargs="+", action="extend", type=Path, metavar="DIR",
                    help="make the tables and plots from the cell files in these folders (repeatable)")
    ap.add_argument("--stream-cell", nargs=2, metavar=("CKPT", "TEXT"),
                    help="score one sinks cell: TEXT in segments of --window tokens, each streamed through a "
                         "rolling cache of --ctx tokens with 4 sinks; prints the combined JSON")
    ap.add_argument("--window", type=int, help="--stream-cell: tokens per segment, BOS included")
    ap.add_argument("--ctx", type=int, help="--stream-cell: the rolling cache's size (the training context)")
    ap.add_argument("-z", dest="tok", type=Path, help="--stream-cell: tokenizer, if not tokenizer.bin beside CKPT")
    ap.add_argument("--segments", type=Path, help="--stream-cell: keep the segment files in this folder")
    ap.add_argument("--replot", action="store_true",
                    help="run nothing: draw the plots again from the results.json in --out (default docs/extrapolation)")
    return ap


def plan_from_args(args):
    """The plan the options choose; exits with a one-line message on a bad option."""
    names = args.studies.split(",") if args.studies else None
    bad = [n for n in names or [] if n not in FULL]
    if bad:
        sys.exit(f"extrapolation: unknown stud{'ies' if len(bad) > 1 else 'y'} {', '.join(bad)} "
                 f"(expected some of {', '.join(FULL)})")
    if args.tokens is not None and args.tokens < 16:
        sys.exit(f"extrapolation: --tokens {args.tokens}: expected at least 16")
    model = args.passkey_model
    if model is not None:  # relative to the repository root, as the listed commands run there
        model = model.resolve()
        model = str(model.relative_to(ROOT)) if model.is_relative_to(ROOT) else str(model)
    return make_plan(args.quick, names, args.tokens, model)


def check_folders(args):
    """Exits with one line for an empty --cell, or an --out or --results that is
    there but not a folder (a file, a device), before anything runs."""
    if args.cell is not None and not args.cell.strip():
        sys.exit(f"extrapolation: --cell {args.cell!r}: expected a cell's name (--list names them), got an empty one")
    for flag, v in (("--out", args.out), ("--results", args.results)):
        problem = folder_problem(flag, v) if v is not None else None
        if problem:
            sys.exit(f"extrapolation: {problem}")


def main(argv=None):
    args = build_parser().parse_args(argv)
    modes = [m for m, on in (("--list", args.list), ("--cell", args.cell is not None), ("--collect", args.collect),
                             ("--stream-cell", args.stream_cell), ("--replot", args.replot)) if on]
    if len(modes) > 1:
        sys.exit(f"extrapolation: expected at most one of --list, --cell, --collect, --stream-cell, --replot, got "
                 f"{' and '.join(modes)}")
    check_folders(args)
    if args.replot:
        out = args.out or ROOT / "docs" / "extrapolation"
        try:
            files, messages = replot(out)
        except RuntimeError as e:
            sys.exit(f"extrapolation: {e}")
        for m in messages:
            print(f"extrapolation: {m}", file=sys.stderr)
        print(f"extrapolation: drew {', '.join(files)} in {out} from results.json", file=sys.stderr)
        return
    for flag, v in (("--jobs", args.jobs), ("--threads", args.threads)):
        if v is not None and v < 1:
            sys.exit(f"extrapolation: {flag} {v}: expected at least 1")
    if args.collect:
        given = [f for f, v in (("--quick", args.quick), ("--studies", args.studies), ("--tokens", args.tokens),
                                ("--passkey-model", args.passkey_model)) if v]
        if given:
            sys.exit(f"extrapolation: --collect takes its plan from the cell files; expected no {', '.join(given)}")
        collect_main(args.collect, args.out)
        return
    if not RUN.is_file():
        sys.exit(f"extrapolation: {RUN.name} not found; build it with `make`")
    if args.stream_cell:
        stream_cell_main(args)
        return
    plan = plan_from_args(args)
    if args.list:
        list_main(plan, args.threads or 1, args.results or Path("results"))
    elif args.cell is not None:
        cell_main(args.cell, plan, args.threads or 1, args.results or Path("results"))
    else:
        cpus = os.cpu_count() or 1
        n_jobs = args.jobs or cpus
        threads = args.threads or max(1, cpus // n_jobs)
        if n_jobs * threads > cpus:
            print(f"extrapolation: --jobs {n_jobs} x --threads {threads} = {n_jobs * threads} threads on {cpus} "
                  "cores: the cells' times (and CPU-hours) will include the waiting", file=sys.stderr)
        study_main(plan, args.out, n_jobs, threads, args.results)


if __name__ == "__main__":
    main()
