"""Stages 4-5 of the pipeline: the optimizer and its learning-rate schedule,
one training step (train_step) and the loop of them (training_loop); the
held-out evaluation (evaluate, HeldOut) and the passkey one (passkey_eval_log),
during training and at its end (final_evaluation); and what a run records as
it goes: OUT/log.jsonl and the progress lines (RunState, log_progress)."""
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, TextIO

import numpy as np
import torch
import torch.nn.functional as F

from . import fmt_time, log
from .data import BOS_ID, get_batch, heldout_windows
from .passkey import Passkey, get_mixed_batch, passkey_accuracy


def lr_at(step, args):
    """Linear warmup for --warmup steps, then cosine from --lr to --lr * --min-lr-ratio."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    t = (step - args.warmup) / max(1, args.max_steps - args.warmup)
    return args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def make_optimizer(model, args):
    """AdamW with weight decay on the 2-D weights only."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=args.lr, betas=(0.9, 0.95), eps=1e-8)


@torch.no_grad()
def evaluate(model, windows, tok_bytes, batch=32):
    """Sum NLL (nats), scored tokens, their UTF-8 bytes over the given windows."""
    model.eval()
    nll, ntok, nbytes = 0.0, 0, 0
    for L in sorted({len(w) for w in windows}):  # full windows batched; a short last one alone
        group = [w for w in windows if len(w) == L]
        for i in range(0, len(group), batch):
            ys = np.stack(group[i:i + batch]).astype(np.int64)
            xs = np.concatenate([np.full((len(ys), 1), BOS_ID), ys[:, :-1]], axis=1)
            logits = model(torch.from_numpy(xs))
            y = torch.from_numpy(ys)
            nll += F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1), reduction="sum").item()
            ntok += ys.size
            nbytes += int(tok_bytes[ys].sum())
    model.train()
    return nll, ntok, nbytes


class HeldOut:
    """The held-out windows: all of them for the final eval, and a fixed, evenly spaced
    subset of --eval-windows full-length ones for the periodic eval."""

    def __init__(self, held: np.ndarray, tok_bytes: np.ndarray, seq_len: int, n_subset: int):
        self.tok_bytes = tok_bytes
        self.windows = heldout_windows(held, seq_len)
        full = [w for w in self.windows if len(w) == seq_len - 1]
        idx = np.linspace(0, len(full) - 1, min(n_subset, len(full))).round().astype(int)
        self.subset = [full[i] for i in idx]

    def subset_eval(self, model):
        """(nats/token, bits/byte) on the subset."""
        nll, n, nb = evaluate(model, self.subset, self.tok_bytes)
        return nll / n, nll / nb / math.log(2)

    def full_eval(self, model, seq_len: int) -> dict:
        """The summary's numbers on all the held-out windows (what `run -m ppl` reproduces)."""
        t0 = time.time()
        nll, n, nb = evaluate(model, self.windows, self.tok_bytes)
        res = dict(heldout_tokens=n, heldout_nll=nll / n, heldout_ppl=math.exp(nll / n),
                   heldout_bpb=nll / nb / math.log(2), full_eval_s=time.time() - t0)
        log(f"final held-out (all {n:,} tokens, ctx {seq_len}): nll {nll / n:.4f}, "
            f"ppl {math.exp(nll / n):.3f}, {nll / nb / math.log(2):.4f} bits/byte")
        return res


@dataclass
class RunState:
    """What the training loop carries: the step, the history (saved in ckpt.pt), OUT/log.jsonl,
    the clocks and the loss EMAs."""
    step: int
    history: list
    logf: TextIO
    # Wall time and this process's CPU time (the machine may be shared: CPU time
    # divided by --threads is what the run would take on idle cores).
    t_start: float
    cpu_start: float
    steps_timed: int = 0  # steps and their seconds since the last progress line
    t_timed: float = 0.0
    ema: Optional[float] = None  # of the loss, from the first step on
    ans_ema: Optional[float] = None  # of the answer's NLL, with --passkey-mix

    @classmethod
    def start(cls, out: Path, step: int, history: list) -> "RunState":
        logf = open(out / "log.jsonl", "a" if step else "w")  # a resumed run appends
        st = cls(step, history, logf, time.time(), time.process_time())
        if history:  # resumed: keep counting from the saved totals
            st.t_start -= history[-1]["elapsed"]
            st.cpu_start -= history[-1].get("cpu", 0.0)
        return st

    def elapsed(self) -> float:
        return time.time() - self.t_start

    def cpu(self) -> float:
        return time.process_time() - self.cpu_start

    def record(self, rec: dict, flush: bool = True) -> None:
        self.history.append(rec)
        self.logf.write(json.dumps(rec) + "\n")
        if flush:
            self.logf.flush()

    def update_emas(self, loss: float, answer_nll) -> None:
        self.ema = loss if self.ema is None else 0.95 * self.ema + 0.05 * loss
        if answer_nll is not None:
            self.ans_ema = answer_nll if self.ans_ema is None else 0.95 * self.ans_ema + 0.05 * answer_nll


def log_heldout(state: RunState, hl: float, hb: float, elapsed: float, cpu: float, flush: bool = True):
    state.record(dict(step=state.step, heldout_loss=hl, heldout_bpb=hb, elapsed=elapsed, cpu=cpu), flush)
    log(f"eval  step {state.step:5d} | held-out loss {hl:.4f} nats/token, {hb:.4f} bits/byte")


def passkey_eval_log(model, sp, pk: Passkey, seq_len: int, state: RunState):
    """Passkey accuracy on pk.items, recorded and logged: (accuracy, {depth: accuracy})."""
    t0 = time.time()
    acc, by_depth, _ = passkey_accuracy(model, sp, pk.items, pk.new)
    rec = dict(step=state.step, passkey_acc=acc,
               passkey_acc_by_depth={f"{d:g}": a for d, a in by_depth.items()},
               passkey_trials=len(pk.items), passkey_length=seq_len - pk.new,
               passkey_eval_s=time.time() - t0, elapsed=state.elapsed(), cpu=state.cpu())
    state.record(rec)
    log(f"eval  step {state.step:5d} | passkey {acc:.0%} of {len(pk.items)} at length {seq_len - pk.new} ("
        + ", ".join(f"d={d:g} {a:.0%}" for d, a in by_depth.items()) + f") in {time.time() - t0:.0f}s")
    return acc, by_depth


def train_step(model, opt, train: np.ndarray, sp, pk: Passkey, args, step: int):
    """One optimizer step at `step`: (lr, loss, answer_nll or None, gradient norm). The loss
    is the plain mean over all positions, whatever --passkey-answer-weight."""
    lr = lr_at(step, args)
    for group in opt.param_groups:
        group["lr"] = lr
    if args.passkey_mix > 0:
        x, y, amask = get_mixed_batch(train, args.seed, step, args.batch_size, args.seq_len,
                                      args.passkey_mix, sp, pk.filler, pk.digits)
    else:
        x, y = get_batch(train, args.seed, step, args.batch_size, args.seq_len)
        amask = None
    logits = model(x)
    if amask is None:
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        shown, answer_nll = loss, None
    else:  # per-token NLL: the answer's share is logged, and weighted if asked
        nll = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1), reduction="none").view(y.shape)
        shown = nll.mean()
        if args.passkey_answer_weight == 1.0:
            loss = shown
        else:
            w = 1.0 + (args.passkey_answer_weight - 1.0) * amask.float()
            loss = (nll * w).sum() / w.sum()
        answer_nll = nll.detach()[amask].mean().item()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip).item()
    opt.step()
    return lr, shown.item(), answer_nll, gnorm


def log_progress(state: RunState, args, lr: float, loss: float, answer_nll, gnorm: float):
    """The progress record and line of state.step; restarts the tok/s clock."""
    tps = state.steps_timed * args.batch_size * args.seq_len / state.t_timed
    left = (args.max_steps - state.step) * state.t_timed / state.steps_timed
    rec = dict(step=state.step, loss=loss, loss_ema=state.ema, lr=lr, grad_norm=gnorm, tok_per_s=tps,
               elapsed=state.elapsed(), cpu=state.cpu())
    if answer_nll is not None:
        rec.update(answer_nll=answer_nll, answer_nll_ema=state.ans_ema)
    state.record(rec)
    log(f"step {state.step:5d}/{args.max_steps} | loss {loss:.4f} (ema {state.ema:.4f}) | "
        + (f"answer nll {state.ans_ema:.3f} | " if answer_nll is not None else "")
        + f"lr {lr:.2e} | "
        f"gnorm {gnorm:.2f} | {tps:,.0f} tok/s | elapsed {fmt_time(state.elapsed())} "
        f"(cpu {fmt_time(state.cpu())}) | "
        f"left {fmt_time(left)}")
    state.steps_timed, state.t_timed = 0, 0.0


def training_loop(model, opt, train: np.ndarray, sp, pk: Passkey, heldout: Optional[HeldOut], state: RunState,
                  args, save=None) -> None:
    """The steps from state.step up to --max-steps: before a step the held-out eval every
    --eval-every steps (none when 0 or without heldout) and the passkey eval every pk.every;
    after it the progress line every --log-every steps and at the end, and save() every
    --ckpt-every steps and at the end (when save is given)."""
    model.train()
    while state.step < args.max_steps:
        if heldout and args.eval_every and state.step % args.eval_every == 0:
            log_heldout(state, *heldout.subset_eval(model), state.elapsed(), state.cpu())
        if pk.items and pk.every and state.step % pk.every == 0:
            passkey_eval_log(model, sp, pk, args.seq_len, state)
        t0 = time.time()
        lr, loss, answer_nll, gnorm = train_step(model, opt, train, sp, pk, args, state.step)
        state.step += 1
        state.steps_timed, state.t_timed = state.steps_timed + 1, state.t_timed + time.time() - t0
        state.update_emas(loss, answer_nll)
        if state.step % args.log_every == 0 or state.step == args.max_steps:
            log_progress(state, args, lr, loss, answer_nll, gnorm)
        if save and (state.step % args.ckpt_every == 0 or state.step == args.max_steps):
            save()


def final_evaluation(model, sp, pk: Passkey, heldout: HeldOut, state: RunState, args,
                     train_wall: float, train_cpu: float) -> dict:
    """The end-of-training evals (subset, passkey, all held-out windows): summary.json's
    entries after the training's own."""
    hl, hb = heldout.subset_eval(model)
    log_heldout(state, hl, hb, train_wall, train_cpu, flush=False)
    summary = dict(final_train_loss_ema=state.ema, subset_heldout_loss=hl, subset_heldout_bpb=hb)
    if pk.items:
        acc, by_depth = passkey_eval_log(model, sp, pk, args.seq_len, state)
        summary.update(passkey_acc=acc, passkey_acc_by_depth={f"{d:g}": a for d, a in by_depth.items()},
                       passkey_trials=len(pk.items), final_answer_nll_ema=state.ans_ema)
    if not args.no_final_eval:
        summary.update(heldout.full_eval(model, args.seq_len))
    return summary
