#!/usr/bin/env python3
"""Fine-tune a checkpoint at a longer context with a RoPE scaling method, and export it
so that `run` uses that scaling with no flags.

  .venv/bin/python tools/finetune.py CKPT --seq-len E --rope-scaling METHOD [--rope-factor s]
      [--rope-theta B] [--max-steps N] --out-dir OUT

CKPT is a checkpoint tools/train.py trained at context L (models/model.bin, or the
retrieval model models/retrieval/model.bin; both L = 256). The fine-tune continues its
training on windows of E tokens (--seq-len E, e.g. 1024 = 4L) with RoPE changed to
METHOD, with the formulas of run.c's rope_frequencies (docs/rope.md section 8):

  none    plain RoPE, with a larger base if --rope-theta B is given
  linear  position interpolation: every frequency divided by s (default s = E / L)
  ntk     NTK-aware: base B * s^(d/(d-2)) (default s = 2E / L, the study's alpha = 2k)
  yarn    NTK-by-parts ramp over the pairs, and the attention magnitude
          mscale = 0.1 ln s + 1 on cos and sin, so on q and k and every q.k by mscale^2,
          as run applies it (default s = E / L)

The network, the batches, AdamW and its schedule, the evaluation, the passkey mix and
the export are tools/train.py's, imported: the fine-tune differs from training only in
where it starts (CKPT's weights, fresh AdamW moments), the window length, the rotation
and its defaults (--lr 2e-4, the learning rate training ended at; --warmup 10; cosine to
--lr * 0.1 over --max-steps, default 50). Batches are windows of the TRAINING books
(never the held-out ones), offsets from numpy.random.default_rng([seed, step]) as in
training. For the retrieval model pass its passkey mix (the command below): with
--passkey-mix P a share P of each batch is passkey samples of up to E tokens, and the
passkey evaluation uses prompts of E - 9 tokens, run -m passkey's default length at E.

Output, in --out-dir:
  model.bin        through export.py, the header carrying what the fine-tune trained with:
                   seq_len E, rope_scaling METHOD, rope_factor s, rope_orig_ctx L,
                   rope_theta B (YaRN's magnitude stored as 0: run derives it from s,
                   as here). `./run OUT/model.bin` then runs at --ctx E with that RoPE
                   (see its load line, -m info or -m rope).
  tokenizer.bin, tokenizer.model   the checkpoint's vocabulary, beside it for run
  step-N/          with --save-at N: the same three files after step N
  log.jsonl, loss.png              the loss curve (tools/plot_loss.py)
  summary.json     the settings, the clocks (of the training loop, periodic evaluations
                   included), and the evaluations: --eval-text FILE's
                   NLL in run -m ppl's windows at E (what `./run OUT/model.bin -m ppl
                   -f FILE` prints), the held-out subset and, unless --no-final-eval,
                   all the held-out books at E.
Progress and loss go to stderr. The run is deterministic for a seed and thread count:
the same flags and --threads give the same model.bin, byte for byte.

Examples (docs/long-context.md has the measured run of the first):

  .venv/bin/python tools/finetune.py models/model.bin --seq-len 1024 --rope-scaling yarn \\
      --max-steps 50 --threads 1 --no-final-eval --out-dir /tmp/ft/yarn4x
  ./run /tmp/ft/yarn4x/model.bin -m ppl -f books.txt        # at --ctx 1024, yarn 4x, no flags

  .venv/bin/python tools/finetune.py models/retrieval/model.bin --tokenizer models/tokenizer.model \\
      --passkey-mix 0.5 --passkey-answer-weight 8 --seq-len 1024 --rope-scaling yarn \\
      --max-steps 50 --threads 1 --no-final-eval --out-dir /tmp/ft/retrieval-yarn4x

Cost, measured with the first example on 2 shared cores (load average about 10): a
step of 16 windows of 1,024 tokens took 10.2 s of CPU time on one thread, so 50, 200
and 800 steps cost about 8.5, 34 and 136 CPU-minutes (the 50 took 26 minutes of wall
time). Its perplexity on the study's 4x cell went from 90.53 (training-free YaRN) to
83.34.

The first run with a tokenizer encodes the training books into --cache-dir (139 s on
the loaded machine above, then cached; tools/train.py shares the cache). --books NAME...
trains on those training books only (the tests use one, to start in seconds).
"""
import argparse
import json
import math
import sys
from pathlib import Path

# The package first: importing it sets the BLAS thread count from --threads before
# numpy loads (tools/training/__init__.py). Torch and tools/train.py, which take
# seconds to load, are imported only once the command line and the input files are
# checked (load_trainer), so that a bad one is refused at once.
import training  # noqa: F401
from training import fmt_time, log
from training.options import add_optimization_args, add_passkey_args, check_passkey_args

import numpy as np  # noqa: E402

import prepare_data  # noqa: E402  (tools/prepare_data.py)
from extrapolation_study.files import folder_problem, what_is  # noqa: E402  (what a path is, if not what was expected)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import export  # noqa: E402  (the checkpoint reader and writer)

METHODS = ("none", "linear", "ntk", "yarn")
PI = 3.14159265358979323846  # run.h's PI


def header_float(x: float) -> float:
    """x as the checkpoint stores it (float32), so that training uses the value run reads."""
    return float(np.float32(x))


# --------------------------------------------------------------------------
# RoPE: run.c's rope_frequencies, for the methods a fine-tune offers
# --------------------------------------------------------------------------

def rope_frequencies(cfg: dict):
    """(inv_freq per pair, mscale) for a checkpoint config's RoPE fields, as run.c's
    rope_frequencies computes them, operation for operation in double (docs/rope.md
    section 8): rot_dim d, rope_theta b, rope_scaling, rope_factor s, rope_orig_ctx L (0:
    seq_len), yarn_beta_fast and _slow, rope_attn_factor (0: derived from s). mscale
    multiplies cos and sin (train.rope_rotation), as in run's table."""
    d, b, s = float(cfg["rot_dim"]), cfg["rope_theta"], cfg["rope_factor"]
    L = float(cfg["rope_orig_ctx"] or cfg["seq_len"])
    n_pairs = cfg["rot_dim"] // 2
    inv = [math.pow(b, -2.0 * i / d) for i in range(n_pairs)]  # f_i = b^(-2i/d)
    mscale = 1.0
    method = cfg["rope_scaling"]
    if method == "linear":  # position interpolation: f_i / s
        inv = [f / s for f in inv]
    elif method == "ntk":  # b' = b * s^(d/(d-2)), f'_i = b'^(-2i/d)
        if cfg["rot_dim"] > 2:
            b_new = b * math.pow(s, d / (d - 2.0))
            inv = [math.pow(b_new, -2.0 * i / d) for i in range(n_pairs)]
    elif method == "yarn":
        inv, mscale = yarn_frequencies(inv, d, b, s, L, cfg["yarn_beta_fast"], cfg["yarn_beta_slow"],
                                       cfg["rope_attn_factor"])
    elif method != "none":
        raise ValueError(f"rope_scaling {method!r}: the fine-tune offers {', '.join(METHODS)}")
    return inv, mscale


def yarn_frequencies(inv: list, d: float, b: float, s: float, L: float, beta_fast: float, beta_slow: float,
                     attn_factor: float):
    """YaRN's frequencies and magnitude (run.c's ROPE_YARN case): pairs below the ramp keep
    f_i, pairs above it get f_i / s, a linear blend between; mscale = attn_factor, or
    0.1 ln s + 1 when it is 0."""
    mscale = attn_factor if attn_factor > 0 else 1.0 if s <= 1.0 else 0.1 * math.log(s) + 1.0
    if s == 1.0:
        return list(inv), mscale
    low = float(math.floor(d * math.log(L / (2 * PI * beta_fast)) / (2 * math.log(b))))
    high = float(math.ceil(d * math.log(L / (2 * PI * beta_slow)) / (2 * math.log(b))))
    low = max(low, 0.0)
    high = min(high, d - 1)
    if low == high:
        high += 0.001
    out = []
    for i, f in enumerate(inv):
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)
        keep = 1.0 - ramp  # 1 = keep f_i (extrapolate), 0 = f_i / s (interpolate)
        out.append(f / s * (1.0 - keep) + f * keep)
    return out, mscale


def default_factor(method: str, seq_len: int, orig_ctx: int) -> float:
    """The factor when --rope-factor is not given: the extrapolation study's setting at
    E = kL (k for linear and yarn, alpha = 2k for ntk)."""
    k = seq_len / orig_ctx
    return 2 * k if method == "ntk" else k


def finetuned_config(base: dict, args) -> dict:
    """The base checkpoint's config with the fine-tune's context and RoPE: what is trained
    and what the exported header says. Bad flag values end with a usage error (exit 2)."""
    L = base["rope_orig_ctx"] or base["seq_len"]
    method = args.rope_scaling
    if method == "none":
        if args.rope_factor is not None:
            usage_error(f"--rope-factor {args.rope_factor:g}: --rope-scaling none takes no factor "
                        f"(a larger base is --rope-theta)")
        factor = 1.0
    else:
        factor = args.rope_factor if args.rope_factor is not None else default_factor(method, args.seq_len, L)
        if not factor >= 1.0 or not math.isfinite(factor):
            usage_error(f"--rope-factor {factor:g}: expected a finite value >= 1"
                        + (f" (the default for --seq-len {args.seq_len} and L {L})" if args.rope_factor is None else ""))
    theta = base["rope_theta"] if args.rope_theta is None else args.rope_theta
    if not theta > 1.0 or not math.isfinite(theta):
        usage_error(f"--rope-theta {theta:g}: expected a finite value > 1")
    return dict(base, seq_len=args.seq_len, rope_scaling=method, rope_factor=header_float(factor),
                rope_orig_ctx=L, rope_theta=header_float(theta), rope_attn_factor=0.0)


def rope_method(cfg: dict) -> str:
    """The method and its factor, e.g. "yarn, factor 4" (or "none")."""
    s = cfg["rope_scaling"]
    return s if s == "none" else f"{s}, factor {cfg['rope_factor']:g}"


def rope_summary(cfg: dict) -> str:
    """The RoPE the fine-tune trains with, in a few words: method, factor, base, L."""
    return f"{rope_method(cfg)}, theta {cfg['rope_theta']:g}, orig_ctx {cfg['rope_orig_ctx']}"


# --------------------------------------------------------------------------
# the base checkpoint
# --------------------------------------------------------------------------

def bad_input(msg: str) -> None:
    """One line on stderr, exit 1 (a bad input file; docs/robustness.md)."""
    print(f"finetune.py: {msg}", file=sys.stderr)
    sys.exit(1)


def usage_error(msg: str) -> None:
    """One line on stderr, exit 2 (a bad command line)."""
    print(f"finetune.py: {msg}", file=sys.stderr)
    sys.exit(2)


def load_base(path: str):
    """(config, tensors) of a checkpoint train.Llama can continue training: float32, tied
    classifier, no biases or window, interleaved RoPE on every dim, no scaling yet."""
    try:
        cfg, tensors = export.read_checkpoint(path)
    except OSError as e:
        bad_input(f"{path}: {e.strerror}")
    except (ValueError, export.ExportError) as e:
        bad_input(str(e) if str(e).startswith(path) else f"{path}: {e}")
    head_size = cfg["dim"] // cfg["n_heads"]
    checks = [
        (cfg["weight_type"] == "f32", f"weight_type {cfg['weight_type']} (expected f32)"),
        (cfg["shared_classifier"], "an untied classifier (expected shared_classifier 1)"),
        (not (cfg["qkv_bias"] or cfg["o_bias"] or cfg["mlp_bias"]), "biases (expected none)"),
        (cfg["sliding_window"] == 0, f"sliding_window {cfg['sliding_window']} (expected 0)"),
        (cfg["rope_layout"] == "interleaved", f"rope_layout {cfg['rope_layout']} (expected interleaved)"),
        (cfg["rot_dim"] == head_size, f"rot_dim {cfg['rot_dim']} (expected the head size {head_size})"),
        (cfg["rope_scaling"] == "none", f"rope_scaling {cfg['rope_scaling']} (expected none: "
                                        f"fine-tune the unscaled checkpoint it came from)"),
    ]
    for ok, what in checks:
        if not ok:
            bad_input(f"{path}: {what}; tools/train.py's checkpoints are what the fine-tune continues")
    return cfg, tensors


def default_tokenizer(ckpt: str) -> Path:
    """tokenizer.model beside the checkpoint (as run finds tokenizer.bin there)."""
    return Path(ckpt).resolve().parent / "tokenizer.model"


def load_trainer():
    """tools/train.py's training functions, and with them torch (seconds to load):
    called once the command line and the input files are checked."""
    import train  # tools/train.py
    return train


# --------------------------------------------------------------------------
# evaluation of a given text, in run -m ppl's windows
# --------------------------------------------------------------------------

def eval_text(model, sp, path: str, seq_len: int) -> dict:
    """The mean NLL of the text at path in `run -m ppl --ctx seq_len`'s windows (BOS + seq_len - 1
    tokens, no overlap), the text encoded as run encodes it (one string, no BOS)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        bad_input(f"--eval-text {path}: {e}")
    ids = np.array(sp.encode(text), dtype=np.int32)
    if len(ids) == 0:
        bad_input(f"--eval-text {path}: no tokens (expected a non-empty text)")
    train = load_trainer()
    windows = train.heldout_windows(ids, seq_len)
    nll, n, _ = train.evaluate(model, windows, train.token_bytes(sp))
    res = dict(file=str(path), tokens=n, windows=len(windows), ctx=seq_len, nll=nll / n, ppl=math.exp(nll / n))
    log(f"eval-text {path}: {n:,} tokens in {len(windows)} window(s) of ctx {seq_len}: "
        f"nll {nll / n:.6f}, ppl {math.exp(nll / n):.4f}")
    return res


# --------------------------------------------------------------------------

class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line and exit 2, as run's (usage_error)."""

    def error(self, message):
        usage_error(message)


def check_numbers(ap, args) -> None:
    """The optimization and count flags: a usage error (exit 2) for a value that
    would fail or mislead the training (torch refuses a rate <= 0; a NaN runs
    and trains nothing)."""
    for flag, v, ok, want in (
            ("--lr", args.lr, args.lr > 0, "a finite number > 0"),
            ("--min-lr-ratio", args.min_lr_ratio, args.min_lr_ratio >= 0, "a finite number >= 0"),
            ("--weight-decay", args.weight_decay, args.weight_decay >= 0, "a finite number >= 0"),
            ("--grad-clip", args.grad_clip, args.grad_clip > 0, "a finite number > 0")):
        if not (ok and math.isfinite(v)):
            ap.error(f"{flag} {v:g}: expected {want}")
    if args.threads < 1:
        ap.error(f"--threads {args.threads}: expected >= 1")
    if args.seed < 0:
        ap.error(f"--seed {args.seed}: expected >= 0 (numpy's generators take no negative seed)")


def parse_args(argv=None):
    ap = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", help="the checkpoint to continue (tools/train.py's, e.g. models/model.bin)")
    g = ap.add_argument_group("context and RoPE")
    g.add_argument("--seq-len", type=int, required=True, help="E: the fine-tuning context (windows of E tokens)")
    g.add_argument("--rope-scaling", required=True, choices=METHODS, help="the RoPE method to train with")
    g.add_argument("--rope-factor", type=float, default=None,
                   help="its factor s (default: E / L for linear and yarn, 2E / L for ntk; none takes none)")
    g.add_argument("--rope-theta", type=float, default=None, help="RoPE base (default: the checkpoint's)")
    g = ap.add_argument_group("data")
    g.add_argument("--shared", default=str(prepare_data.default_shared()),
                   help="shared folder holding data/books (default: $SHARED_DIR or ../shared)")
    g.add_argument("--cache-dir", default="/tmp/train/cache", help="token streams cache (train.py's)")
    g.add_argument("--tokenizer", default="",
                   help="the checkpoint's sentencepiece .model (default: tokenizer.model beside it)")
    g.add_argument("--books", nargs="+", default=None, metavar="NAME",
                   help="train on these training books only (names without .txt; default: all of them)")
    add_optimization_args(ap)
    ap.set_defaults(max_steps=50, lr=2e-4, warmup=10)
    add_passkey_args(ap)
    g = ap.add_argument_group("evaluation and output")
    g.add_argument("--eval-every", type=int, default=50,
                   help="held-out subset eval interval in steps (0: none before the end)")
    g.add_argument("--eval-windows", type=int, default=16, help="held-out windows of E tokens per periodic eval")
    g.add_argument("--eval-text", default="", metavar="FILE",
                   help="at the end, also score FILE in run -m ppl's windows at E (summary.json)")
    g.add_argument("--no-final-eval", action="store_true", help="skip the eval of all the held-out books")
    g.add_argument("--log-every", type=int, default=5, help="progress line and loss record interval (steps)")
    g.add_argument("--out-dir", required=True, help="model.bin, tokenizer.bin, log.jsonl, loss.png, summary.json")
    g.add_argument("--save-at", type=int, nargs="+", default=[], metavar="STEP",
                   help="also export the model after these steps, to OUT/step-STEP/ (model.bin, tokenizer.bin, "
                        "tokenizer.model): with --min-lr-ratio 1 (a constant rate after the warmup) the model "
                        "at step N is exactly an N-step fine-tune's, so one run gives several budgets")
    args = ap.parse_args(argv)
    check_passkey_args(ap, args)
    check_numbers(ap, args)
    if args.seq_len < 2 or args.seq_len > 1 << 24:
        ap.error(f"--seq-len {args.seq_len}: expected 2..{1 << 24}")
    for flag, v in (("--max-steps", args.max_steps), ("--batch-size", args.batch_size),
                    ("--log-every", args.log_every), ("--eval-windows", args.eval_windows)):
        if v < 1:
            ap.error(f"{flag} {v}: expected >= 1")
    if args.eval_every < 0 or args.warmup < 0:
        ap.error("--eval-every and --warmup: expected >= 0")
    bad = [n for n in args.save_at if not 1 <= n < args.max_steps]
    if bad:
        ap.error(f"--save-at {bad[0]}: expected a step in 1..{args.max_steps - 1} (below --max-steps; "
                 f"the last step's model is OUT/model.bin)")
    args.extra = []  # train.load_data's --extra: books only
    return args


def check_books(args) -> None:
    """The training books are under --shared, and --books names only training books."""
    try:
        names = {p.stem for p in prepare_data.book_paths(Path(args.shared))[0]}
    except FileNotFoundError as e:
        bad_input(f"--shared {args.shared}: {e}")
    wrong = [b for b in args.books or () if b not in names]
    if wrong:
        usage_error(f"--books {wrong[0]}: not a training book (expected one of {', '.join(sorted(names))})")


def check_files(args, cfg: dict) -> None:
    """The files the run reads late or writes, checked before it starts (exit 1):
    the tokenizer loads and has the checkpoint's vocabulary, --eval-text is a
    UTF-8 text with tokens, --out-dir and --cache-dir are folders or can be."""
    import sentencepiece as spm  # light: no torch
    tok = Path(args.tokenizer)
    if what_is(tok) != "a file":
        bad_input(f"--tokenizer {tok}: expected the checkpoint's sentencepiece .model, got {what_is(tok)} "
                  f"(models/tokenizer.model for both bundled models)")
    try:
        sp = spm.SentencePieceProcessor(model_file=str(tok))
    except (OSError, RuntimeError) as e:
        bad_input(f"--tokenizer {tok}: expected a sentencepiece model, got a file it cannot read "
                  f"({str(e).splitlines()[0] if str(e) else type(e).__name__})")
    if sp.vocab_size() != cfg["vocab_size"]:
        bad_input(f"--tokenizer {tok}: expected the checkpoint's {cfg['vocab_size']} pieces, got {sp.vocab_size()}")
    if args.eval_text:
        check_eval_text(args.eval_text, sp)
    for flag, path in (("--out-dir", args.out_dir), ("--cache-dir", args.cache_dir)):
        if folder_problem(flag, path):
            bad_input(folder_problem(flag, path))
    for flag, path in (("--out-dir", args.out_dir), ("--cache-dir", args.cache_dir)):
        try:
            Path(path).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            bad_input(f"{flag} {path}: expected a folder it can make, got {e.strerror}")


def check_eval_text(path: str, sp) -> None:
    """--eval-text is a regular file of UTF-8 text with tokens (eval_text reads it at the end)."""
    if what_is(path) != "a file":
        bad_input(f"--eval-text {path}: expected a UTF-8 text file, got {what_is(path)}")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        bad_input(f"--eval-text {path}: expected a UTF-8 text file, got "
                  + (f"one it cannot read ({e.strerror})" if isinstance(e, OSError) else f"invalid UTF-8 ({e.reason})"))
    if not sp.encode(text):
        bad_input(f"--eval-text {path}: no tokens (expected a non-empty text)")


def build_model(cfg: dict, tensors: dict):
    """train.Llama with cfg's context and RoPE (frequencies and magnitude as run's), holding tensors."""
    train = load_trainer()
    inv_freq, mscale = rope_frequencies(cfg)
    model = train.Llama(cfg, inv_freq, mscale)
    train.import_tensors(model, tensors)
    return model, mscale


def passkey_too_long(args, e: ValueError) -> None:
    """A passkey sample or prompt that does not fit in --seq-len is a usage error; any other
    ValueError goes on up."""
    if not str(e).startswith("passkey:"):
        raise e
    usage_error(f"--seq-len {args.seq_len}: {e}")


def load_training_data(args):
    """train.py's data for this run: the tokenizer and its model file, the training stream,
    the passkey settings, and the held-out windows (None when no evaluation needs them)."""
    train = load_trainer()
    want_heldout = args.eval_every > 0 or not args.no_final_eval
    sp, tok_model, stream, held = train.load_data(args, heldout=want_heldout)
    log(f"data: {len(stream):,} training tokens ({', '.join(args.books) if args.books else 'all training books'})"
        + (f", {len(held):,} held-out tokens" if held is not None else ""))
    try:
        pk = train.setup_passkey(args, sp)
    except ValueError as e:
        passkey_too_long(args, e)
    heldout = None
    if held is not None:
        heldout = train.HeldOut(held, train.token_bytes(sp), args.seq_len, args.eval_windows)
    return sp, tok_model, stream, pk, heldout


def loop_summary(args, cfg: dict, mscale: float, state) -> dict:
    """summary.json's settings and clocks (the training loop's, periodic evaluations included)."""
    wall, cpu = state.elapsed(), state.cpu()
    tokens = args.max_steps * args.batch_size * args.seq_len
    log(f"fine-tune: {args.max_steps} steps, {tokens:,} tokens in {fmt_time(wall)} wall, "
        f"{fmt_time(cpu)} cpu ({args.threads} thread(s)), {args.max_steps / wall:.3f} steps/s")
    return dict(checkpoint=args.checkpoint, steps=args.max_steps, batch_size=args.batch_size,
                seq_len=args.seq_len, tokens=tokens, threads=args.threads, seed=args.seed,
                train_wall_s=wall, train_cpu_s=cpu, steps_per_s=args.max_steps / wall,
                rope=dict(scaling=cfg["rope_scaling"], factor=cfg["rope_factor"], theta=cfg["rope_theta"],
                          orig_ctx=cfg["rope_orig_ctx"], mscale=mscale))


def write_outputs(model, cfg: dict, tok_model: Path, out: Path, summary: dict, args) -> None:
    """model.bin, tokenizer.bin and tokenizer.model (train.export_model), summary.json, loss.png."""
    load_trainer().export_model(model, cfg, tok_model, out)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    import plot_loss  # tools/plot_loss.py (matplotlib: imported only now)
    plot_loss.main([str(out / "log.jsonl"), str(out / "loss.png"), "--title",
                    f"{args.checkpoint} fine-tuned at {args.seq_len} tokens, {rope_method(cfg)}"])


def main(argv=None):
    args = parse_args(argv)
    base, tensors = load_base(args.checkpoint)
    cfg = finetuned_config(base, args)
    check_books(args)
    args.tokenizer = args.tokenizer or str(default_tokenizer(args.checkpoint))
    check_files(args, cfg)
    args.vocab_size = cfg["vocab_size"]
    out = Path(args.out_dir)
    log("command: " + " ".join([Path(sys.executable).name] + sys.argv))

    import torch  # the command line and the files are checked: now the seconds it takes to load
    train = load_trainer()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model, mscale = build_model(cfg, tensors)
    log(f"base: {args.checkpoint}, context L = {cfg['rope_orig_ctx']}, theta {base['rope_theta']:g}")
    log(f"rope: {rope_summary(cfg)}, context {cfg['seq_len']}"
        + (f", magnitude {mscale:.9g} on cos and sin (q.k x {mscale * mscale:.6g})" if mscale != 1.0 else ""))
    sp, tok_model, stream, pk, heldout = load_training_data(args)
    opt = train.make_optimizer(model, args)
    state = train.RunState.start(out, 0, [])

    def snapshot():
        """OUT/step-N/: the model after step N, for each N of --save-at."""
        if state.step in args.save_at:
            train.export_model(model, cfg, tok_model, out / f"step-{state.step}")

    args.ckpt_every = 1  # training_loop calls snapshot() after every step; it saves at --save-at only
    try:
        train.training_loop(model, opt, stream, sp, pk, heldout, state, args, save=snapshot)
    except ValueError as e:
        passkey_too_long(args, e)

    summary = loop_summary(args, cfg, mscale, state)
    if args.eval_text:
        summary["eval_text"] = eval_text(model, sp, args.eval_text, args.seq_len)
    if heldout is not None:
        summary.update(train.final_evaluation(model, sp, pk, heldout, state, args,
                                              summary["train_wall_s"], summary["train_cpu_s"]))
    elif pk.items:
        train.passkey_eval_log(model, sp, pk, args.seq_len, state)
    state.logf.close()
    write_outputs(model, cfg, tok_model, out, summary, args)
    log(f"done: {out}/model.bin; `./run {out}/model.bin` runs at --ctx {args.seq_len} with this RoPE")
    return 0


if __name__ == "__main__":
    sys.exit(main())
