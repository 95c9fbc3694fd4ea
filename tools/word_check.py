#!/usr/bin/env python3
"""How much of the bundled model's output is real words?

Runs `run` on a prompt (greedy, and sampled over several seeds) and reports the
fraction of words (maximal runs of ASCII letters, case folded) found in the
dictionary. The dictionary is /usr/share/dict/words when it exists and
--dict-books is not given; otherwise the set of words of the training books
(the held-out books excluded), cleaned by tools/prepare_data.py.

Usage:
  .venv/bin/python tools/word_check.py [--run ./run] [--model models/model.bin]
      [--prompt "It was"] [-n 256] [--seeds 1 2 3 4 5] [--dict-books]
"""
import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import prepare_data  # noqa: E402

WORD = re.compile(r"[A-Za-z]+")


def dictionary(shared: Path, books: bool):
    dict_file = Path("/usr/share/dict/words")
    if dict_file.is_file() and not books:
        return "/usr/share/dict/words", {w.strip().lower() for w in dict_file.open()}
    train, _ = prepare_data.book_paths(shared)
    words = set()
    for p in train:
        words.update(w.lower() for w in WORD.findall(prepare_data.clean_book(p)))
    return f"the words of the {len(train)} training books", words


def word_fraction(text: str, words: set):
    found = [w.lower() for w in WORD.findall(text)]
    return (sum(w in words for w in found) / len(found) if found else 0.0), len(found)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", default=str(ROOT / "run"))
    ap.add_argument("--model", default=str(ROOT / "models" / "model.bin"))
    ap.add_argument("--prompt", default="It was")
    ap.add_argument("-n", type=int, default=256, help="new tokens per sample")
    ap.add_argument("--seeds", type=int, nargs="*", default=[1, 2, 3, 4, 5])
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--top-p", type=float, default=0.9)
    ap.add_argument("--shared", type=Path, default=prepare_data.default_shared())
    ap.add_argument("--dict-books", action="store_true", help="use the training books' words")
    ap.add_argument("--show", action="store_true", help="print the samples")
    args = ap.parse_args(argv)

    name, words = dictionary(args.shared, args.dict_books)
    print(f"dictionary: {name} ({len(words):,} words)")
    runs = [("greedy", ["-t", "0"])]
    runs += [(f"t={args.temperature} p={args.top_p} seed={s}",
              ["-t", str(args.temperature), "-p", str(args.top_p), "-s", str(s)]) for s in args.seeds]
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    total_in, total = 0, 0
    for label, flags in runs:
        out = subprocess.run([args.run, args.model, "-n", str(args.n), "-i", args.prompt] + flags,
                             capture_output=True, text=True, check=True, env=env).stdout
        frac, n = word_fraction(out, words)
        total_in, total = total_in + frac * n, total + n
        print(f"{label:28s} {len(out):5d} chars {n:4d} words {frac:6.1%} in dictionary")
        if args.show:
            print(out.strip() + "\n")
    print(f"{'all':28s} {'':11s} {total:4d} words {total_in / max(total, 1):6.1%} in dictionary")
    return 0


if __name__ == "__main__":
    sys.exit(main())
