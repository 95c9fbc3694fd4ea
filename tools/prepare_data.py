#!/usr/bin/env python3
"""Clean the Project Gutenberg books in ../shared/data/books for training and evaluation.

What "clean" means here (every step is a pure function of the file's bytes):

1. Decode UTF-8 and drop the byte-order mark (U+FEFF).
2. Turn CRLF (and any stray CR) into LF.
3. Keep only the text strictly between the "*** START OF ..." line and the
   "*** END OF ..." line: the Gutenberg header and licence footer go.
4. Reflow (default on; --no-reflow turns it off): Gutenberg wraps prose at about
   70 characters. Lines within a paragraph are joined with one space, paragraphs
   stay separated by one blank line, trailing spaces are dropped. A hard line
   break would otherwise cost a token every ~15 tokens and cut the next word
   off its usual "space + word" token, which a small model pays for in
   capacity. The model therefore writes paragraphs as single lines.

The split is fixed: HELDOUT_BOOKS are never used for training (not even for the
tokenizer); they are the evaluation set.

Usage:
  .venv/bin/python tools/prepare_data.py --heldout /tmp/heldout.txt
      write the two held-out books, cleaned, joined by a blank line: the file
      the model card's `run -m ppl` command scores.
  .venv/bin/python tools/prepare_data.py --excerpt /tmp/excerpt.txt
      write the fixed held-out excerpt the bundled-model test scores.
  .venv/bin/python tools/prepare_data.py --train /tmp/train.txt
      write the cleaned training books (for inspection; train.py cleans in memory).
  --shared DIR   the shared folder (default: $SHARED_DIR or <repo>/../shared)
"""
import argparse
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HELDOUT_BOOKS = ("moby_dick.txt", "pride_and_prejudice.txt")

# The fixed excerpt used by tests/test_bundled_model.py: characters
# [EXCERPT_START, EXCERPT_START + EXCERPT_CHARS) of the cleaned Pride and
# Prejudice (a plain character slice; it may start and end mid-word).
EXCERPT_BOOK = "pride_and_prejudice.txt"
EXCERPT_START = 100_000
EXCERPT_CHARS = 6_000


def default_shared() -> Path:
    return Path(os.environ.get("SHARED_DIR", ROOT.parent / "shared"))


def strip_gutenberg(raw: bytes) -> str:
    """Bytes of a Gutenberg file -> the book's text (no BOM, LF only, no header/footer)."""
    text = raw.decode("utf-8")
    text = text.lstrip("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    lines = text.split("\n")
    start = next(i for i, l in enumerate(lines) if l.startswith("*** START OF"))
    end = next(i for i, l in enumerate(lines) if l.startswith("*** END OF"))
    return "\n".join(lines[start + 1:end]).strip("\n") + "\n"


def reflow(text: str) -> str:
    """Join the lines of each paragraph with one space; paragraphs split by one blank line."""
    paragraphs = re.split(r"\n[ \t]*\n", text)
    out = []
    for p in paragraphs:
        joined = " ".join(l.strip() for l in p.split("\n") if l.strip())
        if joined:
            out.append(joined)
    return "\n\n".join(out) + "\n"


def clean_book(path: Path, do_reflow: bool = True) -> str:
    text = strip_gutenberg(path.read_bytes())
    return reflow(text) if do_reflow else text


def book_paths(shared: Path):
    """(train, heldout) lists of book paths, sorted by name (a fixed order)."""
    books = sorted((shared / "data" / "books").glob("*.txt"))
    if not books:
        raise FileNotFoundError(f"no books under {shared / 'data' / 'books'}")
    train = [p for p in books if p.name not in HELDOUT_BOOKS]
    held = [shared / "data" / "books" / n for n in HELDOUT_BOOKS]
    return train, held


def heldout_text(shared: Path, do_reflow: bool = True) -> str:
    _, held = book_paths(shared)
    return "\n".join(clean_book(p, do_reflow) for p in held)


def excerpt_text(shared: Path) -> str:
    text = clean_book(shared / "data" / "books" / EXCERPT_BOOK)
    return text[EXCERPT_START:EXCERPT_START + EXCERPT_CHARS]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shared", type=Path, default=default_shared(), help="the shared folder")
    ap.add_argument("--heldout", type=Path, help="write the cleaned held-out books here")
    ap.add_argument("--excerpt", type=Path, help="write the test's fixed held-out excerpt here")
    ap.add_argument("--train", type=Path, help="write the cleaned training books here")
    ap.add_argument("--no-reflow", action="store_true", help="keep Gutenberg's hard line wraps")
    args = ap.parse_args(argv)
    if not (args.heldout or args.excerpt or args.train):
        ap.error("nothing to do: give --heldout, --excerpt and/or --train")
    rf = not args.no_reflow
    if args.heldout:
        write_text(args.heldout, heldout_text(args.shared, rf))
    if args.excerpt:
        write_text(args.excerpt, excerpt_text(args.shared))
    if args.train:
        train, _ = book_paths(args.shared)
        write_text(args.train, "\n".join(clean_book(p, rf) for p in train))
    return 0


def write_text(path: Path, text: str):
    """Write text to path as UTF-8, making its folder first (the README's
    texts/, which .gitignore keeps out of git)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
