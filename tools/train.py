#!/usr/bin/env python3
"""Train the bundled default model: a small Llama on public-domain books.

The network is exactly the one run.c evaluates (see model.h):

    x = token_embedding[tok]
    per layer:  h = rmsnorm(x) * rms_att_weight
                q, k, v = wq h, wk h, wv h                (no biases)
                RoPE on every q and k head, INTERLEAVED pairs (2i, 2i+1),
                    angle = pos * rope_theta ** (-2i / head_size)
                causal softmax attention, scale 1/sqrt(head_size),
                    query head h reads kv head h // (n_heads // n_kv_heads)
                x += wo attn
                h = rmsnorm(x) * rms_ffn_weight
                x += w2(silu(w1 h) * w3 h)
    logits = token_embedding @ (rmsnorm(x) * rms_final_weight)   (tied classifier)

Pipeline (each stage is a function of the tools/training/ package, in this order):

 1. data       tools/prepare_data.py cleans the Gutenberg books (header/footer,
               BOM, CRLF, line wraps). moby_dick and pride_and_prejudice are held
               out entirely: neither the tokenizer nor the model ever sees them.
 2. tokenizer  sentencepiece BPE trained on the training books (byte fallback,
               identity normalization, dummy prefix; unk 0, bos 1, eos 2), cached
               under --cache-dir.
 3. tokens     each book is encoded as one string (as `run` encodes a file) and
               the books are joined into one stream with BOS between documents.
 4. train      AdamW, linear warmup then cosine decay, gradient clipping. A
               batch holds --batch-size windows of --seq-len tokens; each window
               is BOS followed by seq_len-1 tokens from a random offset, the same
               shape `run -m ppl` scores. The offsets of step s come from
               numpy.random.default_rng([seed, s]), so a run (and a resumed run)
               is a pure function of its flags (and of --threads, which changes
               float summation order: the same seed and thread count give the
               same weights).
    passkey   --passkey-mix P (default 0: off, the training above bit for bit) makes
               round(P * batch) windows of each batch passkey samples, the text
               `run -m passkey` builds (docs/passkey.md) with its answer: BOS, TASK,
               filler sentences of the TRAINING books (each book split by the
               specification's sentence rule) with the KEY line at a uniformly random
               depth, QUESTION, then " {key}.". The prompt has at most L tokens, L
               uniform from the prompt without filler up to what leaves room for the
               answer, and k filler sentences as run chooses them (the most that fit).
               Keys have --passkey-digits (default 3..7, uniform) digits, the first
               not 0: varied so that the model learns to copy a digit run up to its
               "." rather than to count to 5, and sees every `run --key-digits` from 3
               to 7. The rest of the window is BOS and book text from a random offset:
               a new document, as between the books of the stream, so no position is
               padding and the rest still trains the language model. Every position
               is scored, as in a book window (--passkey-answer-weight W weights the
               answer's tokens W times as much as the others). Samples come from
               rng([seed, step, PASSKEY_TAG]), so a batch is still a pure function of
               (seed, step).
 5. evaluate   held-out NLL every --eval-every steps on a fixed, evenly spaced
               subset of the held-out windows; at the end on all of them (the
               number `run -m ppl --ctx 256` reproduces). Also reported per
               UTF-8 byte, so runs with different vocabularies compare. With
               --passkey-mix, also passkey accuracy (every --passkey-eval-every steps,
               default --eval-every, and at the end) on --passkey-eval (50) fixed
               prompts of seq_len - (5 + 4) tokens, `run -m passkey`'s default length
               at this context, spread over depths 0, 0.25, 0.5, 0.75, 1, with
               sentences of the HELD-OUT moby_dick as filler: greedy decoding of
               key digits + 4 tokens, correct when the first digit run is the key.
 6. export     the torch checkpoint (.pt, written every --ckpt-every steps and at
               the end, enough to --resume) and, through export.py (the only
               writer of our format), model.bin and tokenizer.bin.

Progress (step, loss, learning rate, tokens/s, elapsed wall and CPU time, time
left) goes to stderr; the same numbers go to OUT/log.jsonl for
tools/plot_loss.py. --threads N sets torch's and OpenBLAS's thread counts (it
is read before torch is imported, since OpenBLAS fixes its pool at load time).

Example (the command that trained models/model.bin is in models/README.md):

  .venv/bin/python tools/train.py --threads 1 --out-dir /tmp/train/final --export-dir models

The retrieval-trained model of models/retrieval/ (its card, models/retrieval/README.md,
has the details), with the bundled model's vocabulary (--tokenizer reuses its
sentencepiece model: a tokenizer trained by another sentencepiece version would differ):

  .venv/bin/python tools/train.py --threads 1 --tokenizer models/tokenizer.model \
      --passkey-mix 0.5 --passkey-answer-weight 8 --max-steps 4000 --passkey-eval-every 250 \
      --out-dir /tmp/train/retrieval --export-dir models/retrieval

The defaults are the bundled model's settings; --help lists every flag.
tools/finetune.py continues a checkpoint's training at a longer context with a RoPE
scaling method, through the tools/training/ package's functions (data, network, batches, optimizer and
schedule, training loop, evaluation, passkey mix, export).
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tools/: the training package, prepare_data

# The package first: importing it sets the BLAS thread count from --threads before
# numpy and torch load (tools/training/__init__.py).
import training  # noqa: E402,F401
import torch  # noqa: E402

import prepare_data  # noqa: E402  (tools/prepare_data.py)

# Every name of the training, from the module that holds it (tools/training/):
# tools/finetune.py and the tests use them as train.NAME.
from training import fmt_time, log  # noqa: E402
from training.checkpoints import (ROOT, export_model, export_only, export_tensors,  # noqa: E402,F401
                                  import_tensors, resume_checkpoint, save_pt)
from training.data import (BOS_ID, EOS_ID, UNK_ID, encode_stream, get_batch,  # noqa: E402,F401
                           heldout_windows, load_data, token_bytes, train_tokenizer, training_documents)
from training.loop import (HeldOut, RunState, evaluate, final_evaluation, log_heldout,  # noqa: E402,F401
                           log_progress, lr_at, make_optimizer, passkey_eval_log, train_step, training_loop)
from training.model import (Block, Llama, RMSNorm, apply_rope, default_hidden,  # noqa: E402,F401
                            make_config, rope_rotation, theta_frequencies)
from training.options import add_optimization_args, add_passkey_args, check_passkey_args  # noqa: E402
from training.passkey import (PASSKEY_EVAL_BOOK, PASSKEY_EVAL_DEPTHS, PASSKEY_KEY,  # noqa: E402,F401
                              PASSKEY_QUESTION, PASSKEY_TAG, PASSKEY_TASK, Passkey, get_mixed_batch,
                              passkey_accuracy, passkey_answer_ids, passkey_eval_filler, passkey_eval_set,
                              passkey_key, passkey_mix_count, passkey_prompt, passkey_prompt_ids,
                              passkey_sample, passkey_train_filler, prompt_ids, round_half_away,
                              setup_passkey, split_sentences)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_argument_group("data")
    g.add_argument("--shared", default=str(prepare_data.default_shared()),
                   help="shared folder holding data/books (default: $SHARED_DIR or ../shared)")
    g.add_argument("--extra", nargs="*", default=[], choices=["tinyshakespeare", "tinystories"],
                   help="extra corpora mixed into training (default: none, books only)")
    g.add_argument("--cache-dir", default="/tmp/train/cache", help="tokenizer and token streams cache")
    g.add_argument("--vocab-size", type=int, default=4096, help="sentencepiece BPE vocabulary")
    g.add_argument("--tokenizer", default="",
                   help="use this sentencepiece .model (e.g. models/tokenizer.model) instead of training "
                        "one; its token streams are cached under the hash of the file")
    g = ap.add_argument_group("model")
    g.add_argument("--dim", type=int, default=128)
    g.add_argument("--n-layers", type=int, default=6)
    g.add_argument("--n-heads", type=int, default=4)
    g.add_argument("--n-kv-heads", type=int, default=0, help="0: same as --n-heads (no GQA)")
    g.add_argument("--hidden-dim", type=int, default=0, help="0: 8/3 dim rounded up to 16")
    g.add_argument("--seq-len", type=int, default=256, help="training context")
    g.add_argument("--rope-theta", type=float, default=10000.0)
    add_optimization_args(ap)
    add_passkey_args(ap)
    g = ap.add_argument_group("evaluation and output")
    g.add_argument("--eval-every", type=int, default=100, help="held-out eval interval (steps)")
    g.add_argument("--eval-windows", type=int, default=64, help="held-out windows per periodic eval")
    g.add_argument("--log-every", type=int, default=20)
    g.add_argument("--ckpt-every", type=int, default=100, help=".pt save interval (steps)")
    g.add_argument("--out-dir", default="/tmp/train/run", help="ckpt.pt and log.jsonl go here")
    g.add_argument("--resume", action="store_true", help="continue from OUT/ckpt.pt")
    g.add_argument("--no-final-eval", action="store_true", help="skip the full held-out eval")
    g.add_argument("--export-dir", default="",
                   help="write model.bin, tokenizer.bin and tokenizer.model here at the end "
                        "(e.g. models/retrieval)")
    g.add_argument("--export-only", action="store_true",
                   help="no training: export OUT/ckpt.pt to --export-dir and stop")
    args = ap.parse_args(argv)
    check_passkey_args(ap, args)
    return args


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    log("command: " + " ".join([Path(sys.executable).name] + sys.argv))
    if args.export_only:
        return export_only(args, out)

    sp, tok_model, train, held = load_data(args)
    tok_bytes = token_bytes(sp)
    log(f"data: {len(train):,} training tokens, {len(held):,} held-out tokens "
        f"({tok_bytes[held].sum() / len(held):.2f} bytes/token)")
    cfg = make_config(args)
    model = Llama(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {json.dumps(cfg)}\nmodel: {n_params:,} parameters ({n_params * 4 / 2**20:.2f} MiB float32)")
    opt = make_optimizer(model, args)
    ckpt = out / "ckpt.pt"
    step, history = resume_checkpoint(args, ckpt, model, opt)
    pk = setup_passkey(args, sp)
    heldout = HeldOut(held, tok_bytes, args.seq_len, args.eval_windows)
    state = RunState.start(out, step, history)

    training_loop(model, opt, train, sp, pk, heldout, state, args,
                  save=lambda: save_pt(ckpt, model, opt, state.step, args, cfg, state.history))

    train_wall, train_cpu = state.elapsed(), state.cpu()
    summary = dict(train_wall_s=train_wall, train_cpu_s=train_cpu, threads=args.threads,
                   n_params=n_params, cfg=cfg)
    summary.update(final_evaluation(model, sp, pk, heldout, state, args, train_wall, train_cpu))
    save_pt(ckpt, model, opt, state.step, args, cfg, state.history)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    log(f"done: {state.step} steps in {fmt_time(train_wall)} wall, {fmt_time(train_cpu)} cpu "
        f"({args.threads} thread(s)); {json.dumps(summary)}")
    if args.export_dir:
        export_model(model, cfg, tok_model, Path(args.export_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
