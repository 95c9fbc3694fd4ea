"""Passkey retrieval (docs/passkey.md): the training samples --passkey-mix puts
into the batches (passkey_sample, get_mixed_batch), built as `run -m passkey`
builds its prompts, and their evaluation on fixed prompts with held-out filler
(passkey_eval_set, passkey_accuracy). setup_passkey loads what a run needs of them (Passkey)."""
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch

import prepare_data  # tools/prepare_data.py

from . import log
from .data import BOS_ID, EOS_ID, get_batch

PASSKEY_TASK = ("There is an important info hidden inside a lot of irrelevant text. Find it and "
                "memorize them. I will quiz you about the important information there.")
PASSKEY_KEY = "The pass key is {key}. Remember it. {key} is the pass key."
PASSKEY_QUESTION = "What is the pass key? The pass key is"
PASSKEY_EVAL_BOOK = "moby_dick.txt"  # held out (prepare_data.HELDOUT_BOOKS): the evaluation's filler
PASSKEY_EVAL_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
PASSKEY_TAG = 0x9A55  # a seed word that keeps the passkey generators apart from get_batch's

_SPACE_RUN = re.compile("[ \t\n\r\x0b\x0c]+")  # ASCII white space only (not NBSP etc.)
_SENTENCE_END = re.compile("(?<=[.!?]) ")
_DIGIT_RUN = re.compile("[0-9]+")


def split_sentences(text: str) -> list:
    """A filler file's sentences (docs/passkey.md section 1): every run of ASCII white space
    becomes one space, none at the ends; a sentence ends after ".", "!" or "?" followed by a
    space, which belongs to neither sentence. No sentence is empty."""
    text = _SPACE_RUN.sub(" ", text).strip(" ")
    return _SENTENCE_END.split(text) if text else []


def round_half_away(x: float) -> int:
    """C's lround for x >= 0 (halves round up; Python's round() would go to even)."""
    f = math.floor(x)
    return int(f) + (1 if x - f >= 0.5 else 0)


def passkey_prompt(filler: list, start: int, k: int, i: int, key: str) -> str:
    """TASK, k filler sentences from index start (wrapping around) with the KEY line after the
    first i of them, and the QUESTION, joined by single spaces (docs/passkey.md section 1)."""
    picked = [filler[(start + j) % len(filler)] for j in range(k)]
    return " ".join([PASSKEY_TASK] + picked[:i] + [PASSKEY_KEY.format(key=key)] + picked[i:]
                    + [PASSKEY_QUESTION])


def prompt_ids(sp, text: str) -> list:
    """A prompt's ids as `run` encodes it with this tokenizer: BOS, then the text's pieces."""
    return [BOS_ID] + sp.encode(text)


def passkey_prompt_ids(sp, filler: list, start: int, depth: float, key: str, length: int):
    """The prompt with the most filler sentences k that has at most `length` tokens (BOS
    included), the key after i = round(depth * k) of them: (ids, k, i). The search is run's:
    k = 0, 1, 2, 4, ... until a prompt is too long, then bisection. ValueError when even the
    prompt without filler is longer than `length`."""
    if not filler:
        raise ValueError("passkey: no filler sentences")

    def ids_for(k):
        return prompt_ids(sp, passkey_prompt(filler, start, k, round_half_away(depth * k), key))

    best = ids_for(0)
    if len(best) > length:
        raise ValueError(f"passkey: length {length} is below the prompt without filler ({len(best)} tokens)")
    lo, hi = 0, 1  # lo fits; hi is the next to try, then the first known not to fit
    while True:
        ids = ids_for(hi)
        if len(ids) > length:
            break
        best, lo, hi = ids, hi, 2 * hi
    while hi - lo > 1:
        k = lo + (hi - lo) // 2
        ids = ids_for(k)
        if len(ids) <= length:
            best, lo = ids, k
        else:
            hi = k
    return best, lo, round_half_away(depth * lo)


def passkey_key(rng, digits: int) -> str:
    """A decimal key of `digits` digits whose first digit is not 0 (docs/passkey.md section 2)."""
    return str(int(rng.integers(1, 10))) + "".join(str(int(d)) for d in rng.integers(0, 10, size=digits - 1))


def passkey_answer_ids(sp, key: str) -> list:
    """The ids of the answer " {key}." after the QUESTION. No piece spans a space, so they are
    the tail of the whole sample's ids (passkey_sample checks it on every sample)."""
    q = sp.encode(PASSKEY_QUESTION)
    full = sp.encode(f"{PASSKEY_QUESTION} {key}.")
    assert full[:len(q)] == q, "the QUESTION's pieces change when the answer follows"
    return full[len(q):]


def passkey_sample(sp, filler: list, rng, seq_len: int, digits=(3, 7)):
    """One training sample: the ids of BOS + prompt + " {key}." (the prompt as `run -m passkey`
    builds it, at most L tokens with BOS) and the index where the answer starts, and the drawn
    values. Drawn from rng in this order: the key's digit count (uniform in digits[0]..digits[1]),
    the key, start (uniform over the filler), depth (uniform in [0, 1)), and L (uniform from the
    prompt without filler to seq_len - answer tokens, so the sample leaves at least one position
    of a seq_len + 1 token window free)."""
    n_digits = int(rng.integers(digits[0], digits[1] + 1))
    key = passkey_key(rng, n_digits)
    start = int(rng.integers(len(filler)))
    depth = float(rng.random())
    answer = passkey_answer_ids(sp, key)
    n_bare = len(prompt_ids(sp, passkey_prompt(filler, start, 0, 0, key)))
    if n_bare + len(answer) > seq_len:
        raise ValueError(f"passkey: --seq-len {seq_len} is too short for a {n_digits}-digit sample "
                         f"({n_bare} + {len(answer)} tokens without filler)")
    length = int(rng.integers(n_bare, seq_len - len(answer) + 1))
    ids, k, i = passkey_prompt_ids(sp, filler, start, depth, key, length)
    full = prompt_ids(sp, passkey_prompt(filler, start, k, i, key) + f" {key}.")
    if full != ids + answer:  # the prompt's ids are a prefix of the sample's: what run sees
        raise AssertionError(f"passkey: key {key}: the answer changes the prompt's pieces")
    return full, len(ids), dict(key=key, start=start, depth=depth, length=length, k=k, i=i)


def passkey_train_filler(shared: Path) -> list:
    """The training samples' filler: the sentences of each cleaned TRAINING book in turn (the
    held-out books never appear), each book split as a filler file (docs/passkey.md section 1)."""
    train_paths, _ = prepare_data.book_paths(shared)
    return [s for p in train_paths for s in split_sentences(prepare_data.clean_book(p))]


def passkey_eval_filler(shared: Path) -> list:
    """The evaluation's filler: the sentences of the cleaned held-out PASSKEY_EVAL_BOOK."""
    assert PASSKEY_EVAL_BOOK in prepare_data.HELDOUT_BOOKS
    return split_sentences(prepare_data.clean_book(shared / "data" / "books" / PASSKEY_EVAL_BOOK))


def passkey_mix_count(mix: float, batch: int) -> int:
    """Passkey windows per batch: round(mix * batch), halves up."""
    return round_half_away(mix * batch)


def get_mixed_batch(stream: np.ndarray, seed: int, step: int, batch: int, seq_len: int, mix: float,
                    sp=None, filler=None, digits=(3, 7)):
    """get_batch's windows with the last passkey_mix_count(mix, batch) of them replaced by
    passkey windows: BOS + prompt + " {key}." (passkey_sample), then BOS and book text from a
    random offset of the stream to the end of the window (a new document, as the stream's BOS
    between books). Samples and offsets come from rng([seed, step, PASSKEY_TAG]), so the batch is
    a pure function of (seed, step). Returns x, y and a bool mask of the answer's targets in y
    (None, with get_batch's x and y bit for bit, when no window is a passkey one)."""
    x, y = get_batch(stream, seed, step, batch, seq_len)
    n_pk = passkey_mix_count(mix, batch)
    if n_pk == 0:
        return x, y, None
    rng = np.random.default_rng([seed, step, PASSKEY_TAG])
    mask = torch.zeros((batch, seq_len), dtype=torch.bool)
    for b in range(batch - n_pk, batch):
        ids, a, _ = passkey_sample(sp, filler, rng, seq_len, digits)
        rest = seq_len + 1 - len(ids)  # >= 1: BOS, then rest - 1 book tokens
        o = int(rng.integers(0, len(stream) - rest + 2))
        seq = np.concatenate([np.array(ids, dtype=np.int64), [BOS_ID], stream[o:o + rest - 1]]).astype(np.int64)
        assert len(seq) == seq_len + 1
        x[b] = torch.from_numpy(seq[:-1])
        y[b] = torch.from_numpy(seq[1:])
        mask[b, a - 1:len(ids) - 1] = True  # y[j] is seq[j + 1]: the answer is seq[a:len(ids)]
    return x, y, mask


def passkey_eval_set(sp, filler: list, seq_len: int, trials: int, digits: int = 5,
                     depths=PASSKEY_EVAL_DEPTHS, seed: int = 0) -> list:
    """`trials` fixed prompts for passkey_accuracy, depth by depth in turn (trial t has
    depths[t % len(depths)]), each of at most seq_len - (digits + 4) tokens: `run -m passkey`'s
    default length, where the prompt and its answer fill the training context. Key and start of
    each trial come from rng([PASSKEY_TAG, PASSKEY_TAG, seed]), not from the training seed, so
    that runs compare on the same prompts."""
    length = seq_len - (digits + 4)
    rng = np.random.default_rng([PASSKEY_TAG, PASSKEY_TAG, seed])
    items = []
    for t in range(trials):
        depth = depths[t % len(depths)]
        key = passkey_key(rng, digits)
        start = int(rng.integers(len(filler)))
        ids, k, i = passkey_prompt_ids(sp, filler, start, depth, key, length)
        items.append(dict(ids=ids, key=key, depth=depth, start=start, k=k, i=i))
    return items


@torch.no_grad()
def passkey_accuracy(model, sp, items: list, n_new: int, batch: int = 64):
    """Greedy answers to the prompts of passkey_eval_set, scored as `run -m passkey` scores them:
    at most n_new new tokens (stopping at EOS), and the first run of ASCII digits of their text
    must equal the key. A row stops early once a character follows its first digit run (the
    answer cannot change after that). Returns (accuracy, {depth: accuracy}, answers)."""
    model.eval()
    answers = []
    for b0 in range(0, len(items), batch):
        group = items[b0:b0 + batch]
        lens = np.array([len(it["ids"]) for it in group])
        x = torch.full((len(group), int(lens.max()) + n_new), BOS_ID, dtype=torch.long)
        for r, it in enumerate(group):
            x[r, :lens[r]] = torch.tensor(it["ids"])
        gen = [[] for _ in group]
        live = list(range(len(group)))  # rows still decoding; each has s new tokens at step s
        for s in range(n_new):
            if not live:
                break
            pos = lens[live] + s - 1  # the last token of each live row
            logits = model(x[live, :int(pos.max()) + 1])
            nxt = logits[torch.arange(len(live)), torch.from_numpy(pos)].argmax(-1).tolist()
            still = []
            for r, t in zip(live, nxt):
                if t == EOS_ID:
                    continue
                x[r, lens[r] + s] = t
                gen[r].append(t)
                text = sp.decode(gen[r])
                m = _DIGIT_RUN.search(text)
                if not (m and m.end() < len(text)):
                    still.append(r)
            live = still
        for g in gen:
            m = _DIGIT_RUN.search(sp.decode(g))
            answers.append(m.group(0) if m else "")
    model.train()
    ok = [a == it["key"] for a, it in zip(answers, items)]
    by_depth = {}
    for d in sorted({it["depth"] for it in items}):
        hits = [o for o, it in zip(ok, items) if it["depth"] == d]
        by_depth[d] = sum(hits) / len(hits)
    return sum(ok) / max(1, len(ok)), by_depth, answers


@dataclass
class Passkey:
    """--passkey-mix's training filler and digits, and the evaluation prompts (None when off)."""
    filler: Optional[list]
    items: Optional[list]
    digits: tuple
    new: int    # answer tokens decoded, as run -m passkey
    every: int  # evaluation interval in steps


def setup_passkey(args, sp) -> Passkey:
    """The passkey settings, loading the training filler and the evaluation prompts with --passkey-mix."""
    pk = Passkey(filler=None, items=None, digits=tuple(args.passkey_digits),
                 new=args.passkey_eval_digits + 4, every=args.passkey_eval_every or args.eval_every)
    if args.passkey_mix > 0:
        pk.filler = passkey_train_filler(Path(args.shared))
        log(f"passkey: {passkey_mix_count(args.passkey_mix, args.batch_size)} of {args.batch_size} windows "
            f"per batch, {pk.digits[0]}-{pk.digits[1]} digit keys, filler {len(pk.filler):,} sentences "
            f"of the training books")
        if args.passkey_eval > 0:
            pk.items = passkey_eval_set(sp, passkey_eval_filler(Path(args.shared)), args.seq_len,
                                        args.passkey_eval, args.passkey_eval_digits)
            log(f"passkey: evaluation of {len(pk.items)} prompts of at most {args.seq_len - pk.new} tokens, "
                f"{args.passkey_eval_digits}-digit keys, depths {list(PASSKEY_EVAL_DEPTHS)}, "
                f"filler {PASSKEY_EVAL_BOOK} (held out)")
    return pk
