"""Inspecting a checkpoint: -m info (info.c) and -m tokenize --pieces.

-m info is checked against what the test wrote (a random checkpoint and a
version-3 tokenizer made here, every header field and tokenizer field known)
and, for the bundled model, against the files read back by an independent
reader (export.read_header, export.read_tokenizer). --pieces is checked
against the tokenizer file's own pieces, escaped by the rule docs/command-line.md
states, written again here from that description.
"""

import json
import math
import os
import re

import pytest

from conftest import ROOT, SYN_PIECES, TEXT, make_model, run, run_ok, tokenize

import export

BUNDLED = ROOT / "models" / "model.bin"
BUNDLED_TOK = ROOT / "models" / "tokenizer.bin"


def escape_piece(raw):
    """A piece as --pieces and -m info print it: in double quotes; \\ and "
    backslashed; \\n \\t \\r; other control bytes, DEL and every byte that is not
    part of a well-formed UTF-8 character as \\xHH; the rest as it is."""
    out, i = [], 0
    while i < len(raw):
        char = None
        for n in (1, 2, 3, 4):  # the well-formed character at i, if any (Python's strict decoder: RFC 3629)
            try:
                decoded = raw[i:i + n].decode("utf-8")
            except UnicodeDecodeError:
                continue
            if len(decoded) == 1:
                char, size = decoded, n
                break
        c = raw[i]
        if c in b'"\\':
            out.append("\\" + chr(c))
        elif c in b"\n\t\r":
            out.append({10: "\\n", 9: "\\t", 13: "\\r"}[c])
        elif c < 0x20 or c == 0x7F or char is None:
            out.append("\\x%02X" % c)
        else:
            out.append(char)
            i += size
            continue
        i += 1
    return '"' + "".join(out) + '"'


LINE = re.compile(r'(\d+) ("(?:[^"\\]|\\.)*")(?: (special|byte|unused))?')


def pieces_output(*args):
    """--pieces' lines as (id, escaped piece, kind)."""
    lines = run_ok(*args, "-m", "tokenize", "--pieces").stdout.decode("utf-8").splitlines()
    out = []
    for line in lines:
        m = LINE.fullmatch(line)
        assert m, f"not an 'id \"piece\" [kind]' line: {line!r}"
        out.append((int(m.group(1)), m.group(2), m.group(3) or "normal"))
    return out


# --------------------------------------------------------------------------
# A version-3 byte-level tokenizer with every field set, and a checkpoint for it

def byte_tokenizer():
    pieces = [bytes([b]) for b in range(256)]
    merges = []
    for a, b in [(b"t", b"h"), (b"th", b"e"), (b" ", b"the"), (b"\xc3", b"\xa9"), (b"\xe2", b"\x80")]:
        merges.append((pieces.index(a), pieces.index(b)))
        pieces.append(a + b)
    kinds = [export.PIECE_NORMAL] * len(pieces)
    for s in (b"<|endoftext|>", b"<|im_start|>", b"<|im_end|>"):
        pieces.append(s)
        kinds.append(export.PIECE_SPECIAL)
    pieces.append(b"")
    kinds.append(export.PIECE_UNUSED)
    return dict(type="byte_bpe", pre="gpt2", pieces=pieces, kinds=kinds, scores=None, merges=merges,
                bos_id=261, eos_id=261, eot_id=263, pad_id=262, add_bos=False, chat="chatml",
                stop_ids=[263, 261], system_default="You are\ta \"helper\".", system_prefix="")


HEADER = dict(dim=64, hidden_dim=96, n_layers=3, n_heads=4, n_kv_heads=2, seq_len=48, bos_id=261, eos_id=261,
              norm_eps=1e-6, rope_theta=50000.0, rope_layout="neox", rot_dim=8, rope_scaling="yarn",
              rope_factor=4.0, rope_orig_ctx=16, yarn_beta_fast=16.0, yarn_beta_slow=2.0,
              weight_type="q8_0", group_size=16, qkv_bias=True, mlp_bias=True, sliding_window=8,
              window_first_layer=1, shared_classifier=False)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    d = tmp_path_factory.mktemp("info")
    tok = byte_tokenizer()
    export.write_tokenizer_ltok(d / "tokenizer.bin", tok)
    path, cfg, _ = make_model(d, seed=7, vocab_size=len(tok["pieces"]), **HEADER)
    return path, cfg, tok


def test_info_json_holds_what_the_test_wrote(written):
    path, cfg, tok = written
    r = json.loads(run_ok(path, "-m", "info", "--json").stdout)
    assert r["file"] == str(path) and r["file_size"] == os.path.getsize(path)
    assert r["format_version"] == 2  # biases and a window need version 2
    for key in ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "bos_id", "eos_id",
                "group_size", "sliding_window", "window_first_layer", "shared_classifier"):
        assert r[key] == cfg[key], (key, r[key], cfg[key])
    assert r["train_ctx"] == cfg["seq_len"] and r["head_size"] == cfg["dim"] // cfg["n_heads"]
    assert r["norm_eps"] == pytest.approx(1e-6, rel=1e-6) and r["weights"] == "q8_0"
    assert r["biases"] == ["qkv", "mlp"]
    rope = r["rope"]
    assert (rope["layout"], rope["theta"], rope["rot_dim"], rope["scaling"], rope["factor"], rope["orig_ctx"]) == \
        ("neox", 50000, 8, "yarn", 4, 16)
    assert (rope["beta_fast"], rope["beta_slow"], rope["attn_factor"]) == (16, 2, 0)  # 0: derived from s
    # the setup of a run without position flags: the stored window from layer 1, YaRN's derived magnitude
    pos = r["position"]
    assert pos["ctx"] == 48 and pos["keys"] == "rotated-once"
    assert pos["sliding_window"] == {"size": 8, "first_layer": 1}
    assert pos["attn_factor"] == pytest.approx(0.1 * math.log(4) + 1, rel=1e-8)
    t = r["tokenizer"]
    assert t["kind"] == "byte-level BPE (gpt2)" and t["version"] == 3 and t["vocab_size"] == len(tok["pieces"])
    assert t["pieces"] == {"normal": 261, "special": 3, "byte": 0, "unused": 1}
    assert t["merges"] == 5 and t["max_piece_bytes"] == len(b"<|endoftext|>")
    assert (t["add_bos"], t["bos_id"], t["eos_id"], t["eot_id"], t["pad_id"]) == (False, 261, 261, 263, 262)
    assert t["stop_ids"] == [263, 261] and t["chat_template"] == "chatml"
    assert t["system_default"] == tok["system_default"] and t["system_prefix"] == ""
    assert t["special"] == [{"id": 261, "piece": "<|endoftext|>"}, {"id": 262, "piece": "<|im_start|>"},
                            {"id": 263, "piece": "<|im_end|>"}]


def info_lines(*args):
    """-m info's text as {name: value}."""
    out = {}
    for line in run_ok(*args, "-m", "info").stdout.decode().splitlines():
        name, _, value = line.partition(" ")
        assert name not in out, f"{name} twice"
        out[name] = value.strip()
    return out


def test_info_text_holds_what_the_test_wrote(written):
    path, cfg, tok = written
    r = info_lines(path)
    for key in ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size"):
        assert r[key] == str(cfg[key]), (key, r[key])
    assert r["train_ctx"] == "48" and r["head_size"] == "16" and r["format"] == "LRPE version 2"
    assert r["file_size"].startswith(f"{os.path.getsize(path)} bytes")
    assert r["weights"] == "q8_0, groups of 16" and r["biases"] == "qkv mlp"
    assert r["classifier"] == "its own (wcls)" and r["sliding_window"] == "8 (layers 1..2)"
    assert r["rope_layout"] == "neox" and r["rope_theta"] == "50000" and r["rot_dim"] == "8 of 16"
    assert r["rope_scaling"] == ("yarn (factor 4, orig_ctx 16, beta_fast 16, beta_slow 2, attn_factor "
                                 f"{0.1 * math.log(4) + 1:.10g})")
    assert r["position"].startswith("ctx 48; rope neox, base 50000, rot 8; scaling yarn") and \
        "window 8 (layers 1..2)" in r["position"]
    assert r["tokenizer_kind"] == "byte-level BPE (gpt2), version 3"
    assert r["pieces"] == f"{len(tok['pieces'])}: 261 normal, 3 special, 0 byte, 1 unused"
    assert r["bos"] == '261 "<|endoftext|>"' and r["add_bos"].startswith("no")
    assert r["eot"] == '263 "<|im_end|>"' and r["pad"] == '262 "<|im_start|>"'
    assert r["stop_ids"] == '263 "<|im_end|>", 261 "<|endoftext|>"'
    assert r["chat_template"] == "chatml" and r["system_default"] == escape_piece(tok["system_default"].encode())
    assert r["system_prefix"] == "none"
    assert r["special"] == '3: 261 "<|endoftext|>", 262 "<|im_start|>", 263 "<|im_end|>"'


def test_info_on_the_bundled_model():
    """models/model.bin and its tokenizer, against the files read back by
    export's readers."""
    h = export.read_header(BUNDLED)
    _max_len, pieces, _scores = export.read_tokenizer(BUNDLED_TOK)
    r = json.loads(run_ok(BUNDLED, "-z", BUNDLED_TOK, "-m", "info", "--json").stdout)
    for key in ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "bos_id", "eos_id"):
        assert r[key] == h[key], key
    assert r["train_ctx"] == h["seq_len"] and r["format_version"] == h["version"]
    assert r["rope"]["theta"] == h["rope_theta"] and r["rope"]["rot_dim"] == h["rot_dim"]
    assert r["file_size"] == os.path.getsize(BUNDLED)
    t = r["tokenizer"]
    assert t["kind"] == "sentencepiece" and t["version"] == 1 and t["vocab_size"] == len(pieces)
    n_bytes = sum(1 for p in pieces if re.fullmatch(rb"<0x[0-9A-F]{2}>", p))
    assert t["pieces"]["byte"] == n_bytes == 256
    assert [s["id"] for s in t["special"]] == [pieces.index(b"<unk>"), h["bos_id"], h["eos_id"]]
    assert t["add_bos"] is True and t["stop_ids"] == [h["eos_id"]] and t["chat_template"] == "unstated"
    text = info_lines(BUNDLED, "-z", BUNDLED_TOK)
    assert text["bos"] == f"{h['bos_id']} {escape_piece(pieces[h['bos_id']])}"
    assert text["chat_template"].startswith("unstated")


def test_pieces_lists_the_vocabulary():
    """--pieces without a text: every id with its piece, as the file holds it,
    and the byte pieces and the special ones marked."""
    _max_len, pieces, _scores = export.read_tokenizer(BUNDLED_TOK)
    got = pieces_output(BUNDLED, "-z", BUNDLED_TOK)
    assert [i for i, _p, _k in got] == list(range(len(pieces)))
    assert [p for _i, p, _k in got] == [escape_piece(p) for p in pieces]
    for i, _p, kind in got:
        if re.fullmatch(rb"<0x[0-9A-F]{2}>", pieces[i]):
            assert kind == "byte", i
        elif i in (0, 1, 2):  # <unk>, BOS, EOS
            assert kind == "special", i
        else:
            assert kind == "normal", i


def test_pieces_escape_bytes_that_are_not_text(written):
    """The byte-level tokenizer: raw control bytes, bytes of half a character
    and an empty unused piece, each readable and on its own line."""
    path, _cfg, tok = written
    got = pieces_output(path)
    assert [p for _i, p, _k in got] == [escape_piece(p) for p in tok["pieces"]]
    assert got[0][1] == '"\\x00"' and got[10][1] == '"\\n"' and got[0x7F][1] == '"\\x7F"'
    assert got[0xC3][1] == '"\\xC3"' and got[259][1] == '"é"' and got[260][1] == '"\\xE2\\x80"'
    assert got[264][2] == "unused" and got[264][1] == '""' and got[263][2] == "special"


def test_pieces_of_a_text(syn_tokenizer, tmp_path):
    """With -i: the text's ids, BOS first, each with its piece: the same ids
    as -m tokenize prints, and the pieces joined give the text back."""
    path, _cfg, _ = make_model(tmp_path)
    text = TEXT[:120]
    ids = tokenize(path, syn_tokenizer, text)
    got = pieces_output(path, "-z", syn_tokenizer, "-i", text)
    assert [i for i, _p, _k in got] == ids
    assert [p for _i, p, _k in got] == [escape_piece(SYN_PIECES[i]) for i in ids]
    assert got[0][2] == "special"  # BOS


def test_info_and_pieces_flags():
    """--pieces belongs to tokenize and info reads no model flags: each
    refused elsewhere in one line."""
    p = run(BUNDLED, "-z", BUNDLED_TOK, "-m", "info", "--pieces")
    assert p.returncode == 2 and "--pieces" in p.stderr.decode() and "-m info" in p.stderr.decode()
    p = run(BUNDLED, "-z", BUNDLED_TOK, "-m", "info", "--ctx", "64")
    assert p.returncode == 2 and "--ctx" in p.stderr.decode()
    assert "info" in run_ok("--help").stdout.decode()
    assert "--json" in run_ok("--help", "info").stdout.decode()
