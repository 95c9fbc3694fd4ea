"""Stages 1-3 of the pipeline: the cleaned training books (training_documents),
the sentencepiece tokenizer trained on them (train_tokenizer), and the token
streams, cached under --cache-dir (load_data); then the windows that training
and evaluation read: a batch of training windows (get_batch) and the held-out
windows as `run -m ppl` scores them (heldout_windows)."""
import time
from pathlib import Path

import numpy as np
import torch

import prepare_data  # tools/prepare_data.py

from . import log

BOS_ID, EOS_ID, UNK_ID = 1, 2, 0


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
