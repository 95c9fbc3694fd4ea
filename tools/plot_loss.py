#!/usr/bin/env python3
"""Plot the loss curve of a tools/train.py run: training loss and held-out loss per step.

Usage:
  .venv/bin/python tools/plot_loss.py /tmp/train/final/log.jsonl models/loss.png

log.jsonl holds one JSON object per line: training records (step, loss,
loss_ema, ...) and evaluation records (step, heldout_loss, heldout_bpb, ...).
A run with --passkey-mix also logs the answer tokens' NLL and passkey
accuracy: the plot then shows the answer NLL with the losses and the accuracy
on a second axis.
"""
import argparse
import json
import sys

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("log", help="log.jsonl written by tools/train.py")
    ap.add_argument("png", help="output image")
    ap.add_argument("--title", default="bundled model: loss (nats/token)")
    args = ap.parse_args(argv)

    recs = [json.loads(l) for l in open(args.log) if l.strip()]
    train = [r for r in recs if "loss" in r]
    held = [r for r in recs if "heldout_loss" in r]
    passkey = [r for r in recs if "passkey_acc" in r]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=100)
    ax.plot([r["step"] for r in train], [r["loss"] for r in train], lw=0.6, alpha=0.35,
            color="tab:blue", label="train (batch)")
    ax.plot([r["step"] for r in train], [r["loss_ema"] for r in train], lw=1.5,
            color="tab:blue", label="train (EMA 0.95)")
    ax.plot([r["step"] for r in held], [r["heldout_loss"] for r in held], "o-", ms=3, lw=1.5,
            color="tab:red", label="held-out (Moby Dick + Pride and Prejudice)")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy, nats/token")
    lows = [r["loss_ema"] for r in train] + [r["heldout_loss"] for r in held]
    if passkey:  # the answer tokens' NLL goes to 0 as the model learns to copy the key
        ax.plot([r["step"] for r in train], [r["answer_nll_ema"] for r in train], lw=1.5,
                color="tab:green", label="passkey answer tokens (EMA 0.95)")
        lows = [0.3] + lows
    ax.set_ylim(min(lows) - 0.3, min(8.0, max(lows) + 0.2))
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if passkey:
        acc = ax.twinx()
        acc.plot([r["step"] for r in passkey], [100 * r["passkey_acc"] for r in passkey], "s--", ms=3,
                 color="tab:purple", label=f"passkey accuracy, {passkey[0]['passkey_trials']} held-out "
                 f"prompts of {passkey[0]['passkey_length']} tokens")
        acc.set_ylabel("passkey accuracy, %")
        acc.set_ylim(-2, 102)
        h2, l2 = acc.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    if passkey:  # five entries: below the axes, where no curve runs
        fig.set_size_inches(7, 5.2)
        ax.legend(handles, labels, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
    else:
        ax.legend(handles, labels)
    ax.set_title(args.title)
    fig.tight_layout()
    fig.savefig(args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
