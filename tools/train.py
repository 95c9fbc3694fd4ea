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

Pipeline (each stage is a function below, in this order):

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
scaling method, through this file's functions (data, network, batches, optimizer and
schedule, training loop, evaluation, passkey mix, export).
"""
import argparse
import json
import math
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, TextIO


def _threads_from_argv(argv, default=2):
    """--threads, read before torch loads: OpenBLAS sizes its own thread pool at load
    time from OPENBLAS_NUM_THREADS and ignores torch.set_num_threads afterwards."""
    for i, a in enumerate(argv):
        if a == "--threads" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--threads="):
            return a.split("=", 1)[1]
    return str(default)


for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = _threads_from_argv(sys.argv[1:])

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import prepare_data  # noqa: E402  (tools/prepare_data.py)

BOS_ID, EOS_ID, UNK_ID = 1, 2, 0


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def fmt_time(s: float) -> str:
    s = int(max(s, 0))
    return f"{s // 3600}h{s // 60 % 60:02d}m{s % 60:02d}s" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


# --------------------------------------------------------------------------
# 1-3. data, tokenizer, token stream
# --------------------------------------------------------------------------

def training_documents(shared: Path, extra: list, books=()) -> list:
    """The cleaned training books (sorted by name; only those named in books when it is not
    empty, tools/finetune.py's --books), then any --extra corpora."""
    train_paths, _ = prepare_data.book_paths(shared)
    if books:
        train_paths = [p for p in train_paths if p.stem in books]
    docs = [prepare_data.clean_book(p) for p in train_paths]
    for name in extra:
        if name == "tinyshakespeare":
            docs.append((shared / "data" / "tinyshakespeare.txt").read_text(encoding="utf-8"))
        elif name == "tinystories":
            raw = (shared / "data" / "tinystories").glob("*train*")
            for p in sorted(raw):
                stories = p.read_text(encoding="utf-8").split("<|endoftext|>")[:-1]  # last is cut
                docs.extend(s.strip() + "\n" for s in stories if s.strip())
        else:
            raise SystemExit(f"unknown --extra corpus {name!r}")
    return docs


def train_tokenizer(docs: list, vocab_size: int, prefix: Path, threads: int) -> Path:
    """sentencepiece BPE on the training text; returns the .model path (cached)."""
    import sentencepiece as spm
    model = prefix.with_suffix(".model")
    if model.exists():
        return model
    log(f"tokenizer: training BPE, vocab {vocab_size} -> {model}")
    t0 = time.time()
    # One "sentence" per paragraph (sentencepiece reads lines; no line holds a newline).
    sentences = [p for d in docs for p in d.split("\n") if p.strip()]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_prefix=str(prefix),
        model_type="bpe",
        vocab_size=vocab_size,
        byte_fallback=True,                 # any byte encodes; pieces <0x00>..<0xFF> at ids 3..258
        normalization_rule_name="identity",  # the text is kept as it is
        add_dummy_prefix=True,
        remove_extra_whitespaces=False,
        split_digits=True,
        character_coverage=0.9995,
        max_sentence_length=1 << 16,         # reflowed paragraphs can be long
        input_sentence_size=0,               # use every sentence: no sampling, deterministic
        unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID, pad_id=-1,
        num_threads=threads,
        minloglevel=2,
    )
    log(f"tokenizer: done in {time.time() - t0:.0f}s")
    return model


def encode_stream(sp, docs: list) -> np.ndarray:
    """Each document encoded as one string, documents preceded by BOS, as one int32 stream."""
    out = []
    for d in docs:
        out.append(BOS_ID)
        out.extend(sp.encode(d))
    return np.array(out, dtype=np.int32)


def load_data(args, heldout: bool = True):
    """Tokenizer, its model path, train stream, held-out stream (all cached under --cache-dir;
    the held-out stream is None when not asked for). args.books (tools/finetune.py's --books)
    keeps only those training books, cached apart."""
    import sentencepiece as spm
    cache = Path(args.cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    books = sorted(getattr(args, "books", None) or ())
    extra = "".join(f"+{e}" for e in args.extra) + "".join(f"+{b}" for b in books)
    if getattr(args, "tokenizer", ""):
        # A given sentencepiece model (e.g. models/tokenizer.model, so that a second model
        # shares the bundled one's vocabulary whatever sentencepiece version is installed:
        # training a tokenizer is deterministic only for one version). Its streams are
        # cached under the hash of its bytes, apart from those of a trained tokenizer.
        import hashlib
        tok_path = Path(args.tokenizer)
        if not tok_path.is_file():
            raise SystemExit(f"--tokenizer {tok_path}: no such file")
        tag = "sp" + hashlib.sha256(tok_path.read_bytes()).hexdigest()[:12] + extra
    else:
        tag = f"v{args.vocab_size}" + extra
        tok_path = cache / f"tok_{tag}.model"
    train_npy, held_npy = cache / f"train_{tag}.npy", cache / f"heldout_{tag}.npy"
    docs = None
    if not tok_path.exists() or not train_npy.exists():
        docs = training_documents(Path(args.shared), args.extra, books)
        train_tokenizer(docs, args.vocab_size, tok_path.with_suffix(""), args.threads)
    sp = spm.SentencePieceProcessor(model_file=str(tok_path))
    if sp.vocab_size() != args.vocab_size:
        raise SystemExit(f"tokenizer {tok_path}: {sp.vocab_size()} pieces, but --vocab-size {args.vocab_size}")
    if not train_npy.exists():
        t0 = time.time()
        np.save(train_npy, encode_stream(sp, docs))
        log(f"tokens: training stream encoded in {time.time() - t0:.0f}s")
    if heldout and not held_npy.exists():
        # Exactly the text of `prepare_data.py --heldout`, encoded as one string like `run -m ppl`.
        held = prepare_data.heldout_text(Path(args.shared))
        np.save(held_npy, np.array(sp.encode(held), dtype=np.int32))
    return sp, tok_path, np.load(train_npy), np.load(held_npy) if heldout else None


def token_bytes(sp) -> np.ndarray:
    """UTF-8 bytes each token stands for (the dummy-prefix space counts as one)."""
    n = np.zeros(sp.vocab_size(), dtype=np.int64)
    for i in range(sp.vocab_size()):
        if sp.is_byte(i):
            n[i] = 1
        elif not (sp.is_control(i) or sp.is_unknown(i)):
            n[i] = len(sp.id_to_piece(i).replace("\u2581", " ").encode("utf-8"))
    return n


# --------------------------------------------------------------------------
# the model (run.c's architecture)
# --------------------------------------------------------------------------

class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def theta_frequencies(head_size, theta):
    """Plain RoPE's inverse frequencies theta^(-2i/head_size), i < head_size/2, in double."""
    return theta ** (-torch.arange(0, head_size, 2, dtype=torch.float64) / head_size)


def rope_rotation(seq_len, inv_freq, mscale=1.0):
    """The complex rotations (seq_len, n_pairs) mscale * (cos + i sin) of angle pos * inv_freq[i],
    as run's rope_fill_table builds its table: angle and product in double, then float.
    mscale (YaRN's magnitude) scales both q and k, so every q.k by mscale^2, as in run."""
    inv = torch.as_tensor(inv_freq, dtype=torch.float64)
    ang = torch.outer(torch.arange(seq_len, dtype=torch.float64), inv)
    return torch.complex((mscale * ang.cos()).float(), (mscale * ang.sin()).float())


def apply_rope(x, rot):
    """x: (B, T, heads, head_size); rotate interleaved pairs (2i, 2i+1) by the angles of rot.

    Pair (x0, x1) read as the complex number x0 + i x1 and multiplied by
    rot = cos + i sin gives (x0 cos - x1 sin, x0 sin + x1 cos): run.c's rotation.
    """
    B, T, H, D = x.shape
    xc = torch.view_as_complex(x.reshape(B, T, H, D // 2, 2))
    return torch.view_as_real(xc * rot[:T].view(1, T, 1, D // 2)).view(B, T, H, D)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.n_heads, self.n_kv = c["n_heads"], c["n_kv_heads"]
        self.hs = c["dim"] // c["n_heads"]
        kv_dim = self.n_kv * self.hs
        self.attention_norm = RMSNorm(c["dim"], c["norm_eps"])
        self.wq = nn.Linear(c["dim"], c["dim"], bias=False)
        self.wk = nn.Linear(c["dim"], kv_dim, bias=False)
        self.wv = nn.Linear(c["dim"], kv_dim, bias=False)
        self.wo = nn.Linear(c["dim"], c["dim"], bias=False)
        self.ffn_norm = RMSNorm(c["dim"], c["norm_eps"])
        self.w1 = nn.Linear(c["dim"], c["hidden_dim"], bias=False)
        self.w2 = nn.Linear(c["hidden_dim"], c["dim"], bias=False)
        self.w3 = nn.Linear(c["dim"], c["hidden_dim"], bias=False)

    def forward(self, x, rot, mask):
        B, T, _ = x.shape
        h = self.attention_norm(x)
        q = apply_rope(self.wq(h).view(B, T, self.n_heads, self.hs), rot)
        k = apply_rope(self.wk(h).view(B, T, self.n_kv, self.hs), rot)
        v = self.wv(h).view(B, T, self.n_kv, self.hs)
        if self.n_kv != self.n_heads:  # GQA: query head h uses kv head h // group
            g = self.n_heads // self.n_kv
            k, v = k.repeat_interleave(g, dim=2), v.repeat_interleave(g, dim=2)
        # (B*H, T, hs); scores = mask + q k^T / sqrt(hs) in one baddbmm (mask: 0 or -inf)
        q, k, v = (t.transpose(1, 2).reshape(B * self.n_heads, T, self.hs) for t in (q, k, v))
        att = torch.baddbmm(mask[:T, :T], q, k.transpose(1, 2), alpha=1.0 / math.sqrt(self.hs))
        y = torch.bmm(att.softmax(-1), v).view(B, self.n_heads, T, self.hs)
        y = y.transpose(1, 2).reshape(B, T, -1)
        x = x + self.wo(y)
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Llama(nn.Module):
    """run.c's network for config c (make_config's keys). RoPE rotates pair i by pos * inv_freq[i]
    with magnitude mscale: by default plain RoPE of base c["rope_theta"]; tools/finetune.py passes
    a scaling method's frequencies and magnitude, computed as run computes them."""

    def __init__(self, c, inv_freq=None, mscale=1.0):
        super().__init__()
        self.c = c
        self.tok_embeddings = nn.Embedding(c["vocab_size"], c["dim"])
        self.layers = nn.ModuleList(Block(c) for _ in range(c["n_layers"]))
        self.norm = RMSNorm(c["dim"], c["norm_eps"])
        if inv_freq is None:
            inv_freq = theta_frequencies(c["dim"] // c["n_heads"], c["rope_theta"])
        self.register_buffer("rot", rope_rotation(c["seq_len"], inv_freq, mscale), persistent=False)
        mask = torch.full((c["seq_len"], c["seq_len"]), float("-inf")).triu(1)  # causal, additive
        self.register_buffer("mask", mask, persistent=False)
        # llama2.c's init: N(0, 0.02); residual projections scaled by 1/sqrt(2 L).
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * c["n_layers"]) if name.endswith(("wo.weight", "w2.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, tokens):
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x, self.rot, self.mask)
        return F.linear(self.norm(x), self.tok_embeddings.weight)  # tied classifier


def default_hidden(dim: int) -> int:
    """llama's SwiGLU width: 2/3 of 4*dim, rounded up to a multiple of 16."""
    h = int(2 * 4 * dim / 3)
    return 16 * ((h + 15) // 16)


# --------------------------------------------------------------------------
# 4-5. training and evaluation
# --------------------------------------------------------------------------

def get_batch(stream: np.ndarray, seed: int, step: int, batch: int, seq_len: int):
    """Windows of BOS + seq_len-1 stream tokens at offsets drawn from rng([seed, step])."""
    rng = np.random.default_rng([seed, step])
    offs = rng.integers(0, len(stream) - seq_len, size=batch)
    x = np.empty((batch, seq_len), dtype=np.int64)
    y = np.empty((batch, seq_len), dtype=np.int64)
    for b, o in enumerate(offs):
        x[b, 0] = BOS_ID
        x[b, 1:] = stream[o:o + seq_len - 1]
        y[b] = stream[o:o + seq_len]
    return torch.from_numpy(x), torch.from_numpy(y)


def heldout_windows(stream: np.ndarray, ctx: int):
    """`run -m ppl` windows: consecutive chunks of ctx-1 tokens, each scored after a BOS."""
    n = ctx - 1
    return [stream[i:i + n] for i in range(0, len(stream), n)]


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


# --------------------------------------------------------------------------
# passkey retrieval: training samples and their evaluation (docs/passkey.md)
# --------------------------------------------------------------------------

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


def lr_at(step, args):
    """Linear warmup for --warmup steps, then cosine from --lr to --lr * --min-lr-ratio."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    t = (step - args.warmup) / max(1, args.max_steps - args.warmup)
    return args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def make_config(args):
    return dict(
        dim=args.dim, hidden_dim=args.hidden_dim or default_hidden(args.dim), n_layers=args.n_layers,
        n_heads=args.n_heads, n_kv_heads=args.n_kv_heads or args.n_heads, vocab_size=args.vocab_size,
        seq_len=args.seq_len, shared_classifier=True, bos_id=BOS_ID, eos_id=EOS_ID, norm_eps=1e-5,
        rope_theta=args.rope_theta, rope_layout="interleaved", rot_dim=args.dim // args.n_heads,
    )


def save_pt(path, model, opt, step, args, cfg, history):
    tmp = Path(str(path) + ".tmp")
    torch.save(dict(model=model.state_dict(), optim=opt.state_dict(), step=step,
                    args=vars(args), cfg=cfg, history=history), tmp)
    os.replace(tmp, path)


# --------------------------------------------------------------------------
# 6. export through export.py
# --------------------------------------------------------------------------

def export_tensors(model) -> dict:
    """Our state dict -> export.py's tensor names, float32 numpy, stacked over layers."""
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    L = model.c["n_layers"]
    stack = lambda name: np.stack([sd[f"layers.{i}.{name}"] for i in range(L)])  # noqa: E731
    return dict(
        token_embedding=sd["tok_embeddings.weight"],
        rms_att_weight=stack("attention_norm.weight"),
        wq=stack("wq.weight"), wk=stack("wk.weight"), wv=stack("wv.weight"), wo=stack("wo.weight"),
        rms_ffn_weight=stack("ffn_norm.weight"),
        w1=stack("w1.weight"), w2=stack("w2.weight"), w3=stack("w3.weight"),
        rms_final_weight=sd["norm.weight"],
    )


def import_tensors(model, tensors: dict) -> None:
    """export_tensors the other way: a checkpoint's tensors (export.read_checkpoint) into model."""
    L = model.c["n_layers"]
    sd = {"tok_embeddings.weight": tensors["token_embedding"], "norm.weight": tensors["rms_final_weight"]}
    per_layer = dict(attention_norm="rms_att_weight", wq="wq", wk="wk", wv="wv", wo="wo",
                     ffn_norm="rms_ffn_weight", w1="w1", w2="w2", w3="w3")
    for ours, theirs in per_layer.items():
        for i in range(L):
            sd[f"layers.{i}.{ours}.weight"] = tensors[theirs][i]
    model.load_state_dict({k: torch.tensor(np.array(v, dtype=np.float32)) for k, v in sd.items()})


def export_model(model, cfg, tok_model: Path, out_dir: Path):
    """Write out_dir/model.bin and tokenizer.bin through export.py, and copy tokenizer.model."""
    import shutil
    sys.path.insert(0, str(ROOT))
    import export  # the one writer of our checkpoint and tokenizer formats
    out_dir.mkdir(parents=True, exist_ok=True)
    export.write_checkpoint(str(out_dir / "model.bin"), cfg, export_tensors(model))
    export.write_tokenizer(str(out_dir / "tokenizer.bin"), *export.sentencepiece_vocab(str(tok_model)))
    if Path(tok_model).resolve() != (out_dir / "tokenizer.model").resolve():
        shutil.copyfile(tok_model, out_dir / "tokenizer.model")
    log(f"export: wrote {out_dir}/model.bin, tokenizer.bin, tokenizer.model")


# --------------------------------------------------------------------------

def add_optimization_args(ap) -> None:
    """The "optimization" flags (tools/finetune.py shares them, with its own defaults)."""
    g = ap.add_argument_group("optimization")
    g.add_argument("--batch-size", type=int, default=16, help="windows of --seq-len tokens per step")
    g.add_argument("--max-steps", type=int, default=1700)
    g.add_argument("--lr", type=float, default=2e-3, help="peak learning rate")
    g.add_argument("--min-lr-ratio", type=float, default=0.1, help="final lr = lr * this")
    g.add_argument("--warmup", type=int, default=100, help="linear warmup steps")
    g.add_argument("--weight-decay", type=float, default=0.1, help="AdamW, on 2-D weights only")
    g.add_argument("--grad-clip", type=float, default=1.0, help="max global gradient norm")
    g.add_argument("--seed", type=int, default=1337)
    g.add_argument("--threads", type=int, default=2, help="torch threads (CPU cores to use)")


def add_passkey_args(ap) -> None:
    """The --passkey-* flags (tools/finetune.py shares them); check_passkey_args checks them."""
    g = ap.add_argument_group("passkey retrieval (docs/passkey.md)")
    g.add_argument("--passkey-mix", type=float, default=0.0,
                   help="fraction of each batch's windows that are passkey samples, round(P * batch) of "
                        "them (default 0: book windows only, the bundled model's training)")
    g.add_argument("--passkey-digits", type=int, nargs=2, default=[3, 7], metavar=("MIN", "MAX"),
                   help="digits of a training key, drawn uniformly in MIN..MAX (default 3 7)")
    g.add_argument("--passkey-answer-weight", type=float, default=1.0,
                   help="loss weight of the answer's tokens against 1 for every other token "
                        "(default 1: the plain mean over all positions)")
    g.add_argument("--passkey-eval", type=int, default=50,
                   help="held-out passkey prompts per evaluation, with --passkey-mix > 0 (0: none)")
    g.add_argument("--passkey-eval-digits", type=int, default=5, help="digits of an evaluation key")
    g.add_argument("--passkey-eval-every", type=int, default=0,
                   help="passkey evaluation interval in steps (default 0: --eval-every)")


def check_passkey_args(ap, args) -> None:
    """Bad --passkey-* values end the program with a usage error."""
    if not 0.0 <= args.passkey_mix <= 1.0:
        ap.error(f"--passkey-mix {args.passkey_mix}: expected a fraction in [0, 1]")
    lo, hi = args.passkey_digits
    if not 1 <= lo <= hi <= 18 or not 1 <= args.passkey_eval_digits <= 18:
        ap.error("--passkey-digits MIN MAX and --passkey-eval-digits: 1 <= MIN <= MAX <= 18")
    if args.passkey_answer_weight <= 0 or args.passkey_eval < 0 or args.passkey_eval_every < 0:
        ap.error("--passkey-answer-weight must be > 0, --passkey-eval and --passkey-eval-every >= 0")


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


def export_only(args, out: Path) -> int:
    """--export-only: the model and its tokenizer as the checkpoint's own run made them."""
    if not args.export_dir:
        raise SystemExit("--export-only needs --export-dir")
    st = torch.load(out / "ckpt.pt")
    for k in ("vocab_size", "extra", "shared", "tokenizer"):
        setattr(args, k, st["args"].get(k, ""))
    model = Llama(st["cfg"])
    model.load_state_dict(st["model"])
    log(f"export-only: {out / 'ckpt.pt'} at step {st['step']}")
    export_model(model, st["cfg"], load_data(args)[1], Path(args.export_dir))
    return 0


def make_optimizer(model, args):
    """AdamW with weight decay on the 2-D weights only."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=args.lr, betas=(0.9, 0.95), eps=1e-8)


def resume_checkpoint(args, ckpt: Path, model, opt):
    """(step, history): from ckpt into model and opt with --resume and a checkpoint, else (0, [])."""
    if not (args.resume and ckpt.exists()):
        return 0, []
    st = torch.load(ckpt)
    model.load_state_dict(st["model"])
    opt.load_state_dict(st["optim"])
    log(f"resume: from step {st['step']}")
    return st["step"], st["history"]


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
