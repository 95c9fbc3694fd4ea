"""Our version-3 tokenizer file ("LTOK"; model.h, "Tokenizer files"): what a
tokenizer dict holds, its default stop ids, checking and packing it
(pack_tokenizer_ltok) and writing it; GPT-2's byte characters, which the
byte-level BPE readers undo.

A tokenizer is handled as a dict:
  type      "sentencepiece" (merge by score, <0xHH> byte fallback) or
            "byte_bpe" (GPT-2 byte-level BPE, merge by rank)
  pre       "none" (sentencepiece) or the pre-tokenizer of a byte_bpe one:
            "gpt2", "llama3", "qwen2", "smollm"
  pieces    [bytes], in id order: raw bytes (GPT-2's character mapping undone)
  kinds     [PIECE_*] per piece
  scores    [float] per piece (sentencepiece; None or zeros for byte_bpe)
  merges    [(left id, right id)], rank 0 first (byte_bpe)
  bos_id, eos_id, eot_id, pad_id   ids, -1 = none
  add_bos   whether a prompt starts with BOS
  chat      the chat template run renders, one of CHAT_TEMPLATES (absent:
            "unstated"); recognize_chat_template names it from the source's
  system_default   the system prompt the template puts in when a conversation
                   has none ("" = none)
  system_prefix    text the template puts before every system prompt ("" = none)
  stop_ids  [int], each once: tokens that end a reply (absent: default_stop_ids)
  chat_template   the source's chat template (str) or None: kept for the
                  caller, not stored in the file (chat and the two texts are)

Version 2 files (written before) are version 3 without the chat template,
the stop ids and the system texts: header bytes 44..63 zero, nothing after
the merges.
"""

import math
import struct

import numpy as np

from convert.common import ExportError, INT32_MAX, _write_bytes


TOK_MAGIC = 0x4B4F544C  # the bytes "LTOK" read as a little-endian u32
TOK_VERSION = 3
TOK_HEADER_BYTES = 64
TOK_TYPES = ("sentencepiece", "byte_bpe")                # index = type in the header
PRE_TYPES = ("none", "gpt2", "llama3", "qwen2", "smollm")  # index = pre in the header
PIECE_KINDS = ("normal", "special", "byte", "unused")    # index = a piece's kind
PIECE_NORMAL, PIECE_SPECIAL, PIECE_BYTE, PIECE_UNUSED = range(4)
CHAT_TEMPLATES = ("unstated", "plain", "llama2", "chatml", "llama3")  # index = chat_template
MAX_PIECE_BYTES = 65536
TOK_MAX_STOP = 256
TOK_MAX_SYSTEM = 65536
# magic, version, type, pre, vocab_size, n_merges, bos, eos, eot, pad, add_bos,
# chat_template, n_stop, system_default_len, system_prefix_len; then 4 zero bytes
TOK_HEADER_STRUCT = struct.Struct("<Iiiiiiiiiiiiiii")
assert TOK_HEADER_STRUCT.size == 60
# Texts of end-of-turn pieces, for sources that do not name one (as llama.cpp guesses it)
EOT_TEXTS = (b"<|eot_id|>", b"<|im_end|>", b"<|end|>", b"<end_of_turn>")
# Special pieces that end a generated text wherever they appear (llama.cpp
# marks tokens with these texts end-of-generation the same way)
STOP_TEXTS = (b"<|endoftext|>", b"<|im_end|>", b"<|end_of_text|>", b"<|eot_id|>", b"<|eom_id|>",
              b"<end_of_turn>", b"<|end|>")
# The piece that ends a turn in each template run renders
CHAT_END_OF_TURN = {"chatml": b"<|im_end|>", "llama3": b"<|eot_id|>"}


def _show(piece, limit=40):
    """A piece for a message: its repr, shortened."""
    r = repr(bytes(piece)) if isinstance(piece, (bytes, bytearray)) else repr(piece)
    return r if len(r) <= limit else r[:limit - 3] + "..."


def _system_text(tok, key):
    """The UTF-8 bytes of tok[key] (a str; absent or None: empty), checked:
    at most TOK_MAX_SYSTEM bytes, no NUL. Raises ExportError."""
    text = tok.get(key)
    if text is None:
        return b""
    if not isinstance(text, str):
        raise ExportError(f"{key} {_show(text)} is not a string")
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:
        raise ExportError(f"{key} {_show(text)} is not valid Unicode (a lone surrogate)") from None
    if len(data) > TOK_MAX_SYSTEM:
        raise ExportError(f"{key} {_show(text)} is {len(data)} bytes of UTF-8 (at most "
                          f"{TOK_MAX_SYSTEM})")
    if b"\0" in data:
        raise ExportError(f"{key} {_show(text)} contains a NUL character")
    return data


def pack_tokenizer_ltok(tok):
    """The bytes of a version-3 tokenizer file for tok (the dict above), after
    checking everything model.h asks of one: known type/pre/kinds, piece
    lengths, unique normal pieces, finite float32 scores (zero for byte_bpe),
    merges that name two pieces whose bytes join into a normal piece, each
    merge once, special ids inside the vocabulary (or -1), add_bos only with a
    BOS, a known chat template, at most TOK_MAX_STOP stop ids inside the
    vocabulary, each once, system texts of at most TOK_MAX_SYSTEM bytes
    without NUL. Raises ExportError."""
    t, pre = _check_type(tok)
    pieces = [bytes(p) for p in tok["pieces"]]
    n = len(pieces)
    if n == 0:
        raise ExportError("empty vocabulary")
    if n > INT32_MAX:
        raise ExportError(f"{n} pieces do not fit in int32")
    kinds = list(tok.get("kinds") or [PIECE_NORMAL] * n)
    scores = tok.get("scores")
    scores = [0.0] * n if scores is None else [float(s) for s in scores]
    merges = list(tok.get("merges") or [])
    if len(kinds) != n or len(scores) != n:
        raise ExportError(f"{n} pieces but {len(kinds)} kinds and {len(scores)} scores")
    _check_pieces(t, pieces, kinds, scores)
    normal = _normal_pieces(pieces, kinds)
    _check_merges(t, pieces, merges, normal)
    ids, add_bos = _check_ids(tok, n)
    chat, stops = _check_chat_and_stops(tok, n)
    system_default = _system_text(tok, "system_default")
    system_prefix = _system_text(tok, "system_prefix")

    header = TOK_HEADER_STRUCT.pack(TOK_MAGIC, TOK_VERSION, TOK_TYPES.index(t),
                                    PRE_TYPES.index(pre), n, len(merges), ids["bos_id"],
                                    ids["eos_id"], ids["eot_id"], ids["pad_id"], int(add_bos),
                                    CHAT_TEMPLATES.index(chat), len(stops), len(system_default),
                                    len(system_prefix))
    out = [header, bytes(TOK_HEADER_BYTES - len(header))]
    record = struct.Struct("<fii")
    for p, k, s in zip(pieces, kinds, scores):
        out.append(record.pack(s, k, len(p)))
        out.append(p)
    if merges:
        out.append(np.asarray(merges, dtype="<i4").reshape(-1, 2).tobytes())
    if stops:
        out.append(np.asarray([int(v) for v in stops], dtype="<i4").tobytes())
    out += [system_default, system_prefix]
    return b"".join(out)


def _check_type(tok):
    """(type, pre): known, and a pre-tokenizer exactly for byte-level BPE."""
    t, pre = tok.get("type"), tok.get("pre", "none")
    if t not in TOK_TYPES:
        raise ExportError(f"tokenizer type {t!r} must be one of {', '.join(TOK_TYPES)}")
    if pre not in PRE_TYPES:
        raise ExportError(f"pre-tokenizer {pre!r} must be one of {', '.join(PRE_TYPES)}")
    if t == "sentencepiece" and pre != "none":
        raise ExportError(f"a sentencepiece tokenizer has no pre-tokenizer (got {pre!r})")
    if t == "byte_bpe" and pre == "none":
        raise ExportError("a byte-level BPE tokenizer needs a pre-tokenizer "
                          f"({', '.join(PRE_TYPES[1:])})")
    return t, pre


def _check_pieces(t, pieces, kinds, scores):
    """Each piece: length, kind (byte pieces only for sentencepiece), a finite
    float32 score (zero for byte-level BPE)."""
    for i, (p, k, s) in enumerate(zip(pieces, kinds, scores)):
        if len(p) > MAX_PIECE_BYTES:
            raise ExportError(f"piece {i} is {len(p)} bytes long (at most {MAX_PIECE_BYTES})")
        if k not in range(len(PIECE_KINDS)):
            raise ExportError(f"piece {i} {_show(p)} has kind {k!r}; expected "
                              f"0..{len(PIECE_KINDS) - 1}")
        if k == PIECE_BYTE and t != "sentencepiece":
            raise ExportError(f"piece {i} {_show(p)} is a byte piece, which only sentencepiece "
                              "vocabularies have")
        if not math.isfinite(s) or abs(s) > 3.4e38:
            raise ExportError(f"piece {i} {_show(p)} has score {s}, not a finite float32")
        if t == "byte_bpe" and s != 0.0:
            raise ExportError(f"piece {i} {_show(p)} has score {s}; byte-level BPE pieces score 0 "
                              "(merges are ranked by their order)")


def _normal_pieces(pieces, kinds):
    """{bytes: id} of the normal pieces, which must be unique."""
    normal = {}
    for i, (p, k) in enumerate(zip(pieces, kinds)):
        if k == PIECE_NORMAL:
            j = normal.setdefault(p, i)
            if j != i:
                raise ExportError(f"pieces {j} and {i} are both the normal piece {_show(p)}; "
                                  "normal pieces must be unique")
    return normal


def _check_merges(t, pieces, merges, normal):
    """Each merge: two ids whose pieces join into a normal piece, listed once;
    none for sentencepiece."""
    n = len(pieces)
    if t == "sentencepiece" and merges:
        raise ExportError("a sentencepiece tokenizer has no merges (it merges by score)")
    seen = {}
    for rank, m in enumerate(merges):
        try:
            left, right = (int(v) for v in m)
        except (TypeError, ValueError):
            raise ExportError(f"merge {rank} is {m!r}, not a pair of ids") from None
        if not (0 <= left < n and 0 <= right < n):
            raise ExportError(f"merge {rank} ({left} {right}) names an id outside the vocabulary "
                              f"(0..{n - 1})")
        if pieces[left] + pieces[right] not in normal:
            raise ExportError(f"merge {rank} ({left} {right}): {_show(pieces[left])} + "
                              f"{_show(pieces[right])} = {_show(pieces[left] + pieces[right])} "
                              "is not a normal piece of the vocabulary")
        first = seen.setdefault((left, right), rank)
        if first != rank:
            raise ExportError(f"merge {rank} ({left} {right}) repeats merge {first}")


def _check_ids(tok, n):
    """({bos_id, eos_id, eot_id, pad_id}, add_bos): ids inside the vocabulary
    or -1, add_bos only with a BOS."""
    ids = {}
    for key in ("bos_id", "eos_id", "eot_id", "pad_id"):
        v = tok.get(key, -1)
        v = -1 if v is None else v
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not -1 <= v < n:
            raise ExportError(f"{key} {v!r} is outside the vocabulary (0..{n - 1}, or -1 for none)")
        ids[key] = int(v)
    add_bos = tok.get("add_bos", False)
    if add_bos not in (0, 1):  # True, False, 0 or 1
        raise ExportError(f"add_bos {add_bos!r} must be true or false")
    if add_bos and ids["bos_id"] < 0:
        raise ExportError("add_bos is set but the vocabulary has no BOS")
    return ids, add_bos


def _check_chat_and_stops(tok, n):
    """(chat, stops): a known chat template; at most TOK_MAX_STOP stop ids
    (absent: default_stop_ids) inside the vocabulary, each once."""
    chat = tok.get("chat") or "unstated"
    if chat not in CHAT_TEMPLATES:
        raise ExportError(f"chat template {chat!r} must be one of {', '.join(CHAT_TEMPLATES)}")
    stops = tok.get("stop_ids")
    stops = default_stop_ids(tok) if stops is None else list(stops)
    if len(stops) > TOK_MAX_STOP:
        raise ExportError(f"{len(stops)} stop ids (at most {TOK_MAX_STOP})")
    seen_stops = set()
    for v in stops:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= v < n:
            raise ExportError(f"stop id {v!r} is outside the vocabulary (0..{n - 1})")
        if int(v) in seen_stops:
            raise ExportError(f"stop id {int(v)} is listed twice")
        seen_stops.add(int(v))
    return chat, stops


def _same_tokenizer(old, new):
    """Whether old (a file's bytes) holds the tokenizer of new (a version-3
    file's bytes): the same bytes, or the version-2 file written before of
    the same vocabulary (new without its version-3 fields and what follows
    the merges), which converting again may replace."""
    if old == new:
        return True
    if len(new) < TOK_HEADER_BYTES or new[:4] != old[:4] or old[4:8] != struct.pack("<i", 2):
        return False
    n_stop, default_len, prefix_len = struct.unpack_from("<3i", new, 48)
    tail = 4 * n_stop + default_len + prefix_len
    v2 = new[:4] + struct.pack("<i", 2) + new[8:44] + bytes(20) + new[64:len(new) - tail]
    return old == v2


def write_tokenizer_ltok(path, tok):
    """Write tok (see above) as a version-3 tokenizer file, atomically.
    Raises ExportError (nothing written) when tok breaks the format."""
    _write_bytes(path, pack_tokenizer_ltok(tok))


def describe_tokenizer(tok):
    """One line about tok for the user."""
    n = len(tok["pieces"])
    kinds = [sum(1 for k in tok["kinds"] if k == i) for i in range(len(PIECE_KINDS))]
    kind = ("sentencepiece" if tok["type"] == "sentencepiece"
            else f"byte-level BPE (pre-tokenizer {tok['pre']}), {len(tok['merges'])} merges")
    extra = ", ".join(f"{c} {name}" for c, name in zip(kinds[1:], PIECE_KINDS[1:]) if c)
    ids = " ".join(f"{k[:-3]} {tok.get(k, -1)}" for k in ("bos_id", "eos_id", "eot_id", "pad_id")
                   if tok.get(k, -1) not in (-1, None))
    chat = tok.get("chat") or "unstated"
    texts = [f"{key.replace('_', ' ')} {len(tok[key].encode('utf-8'))} bytes"
             for key in ("system_default", "system_prefix") if tok.get(key)]
    stops = tok.get("stop_ids")
    stops = sorted(default_stop_ids(tok) if stops is None else stops)
    shown = ",".join(str(v) for v in stops[:8]) + (",..." if len(stops) > 8 else "")
    return (f"{kind}, {n} pieces" + (f" ({extra})" if extra else "") + (f", {ids}" if ids else "")
            + f", add_bos {int(bool(tok.get('add_bos')))}, chat template {chat}"
            + (f" ({', '.join(texts)})" if texts else "")
            + (f", stop ids {shown}" if stops else ", no stop ids"))


# GPT-2's bytes_to_unicode: byte-level BPE vocabularies (tokenizer.json, GGUF
# "gpt2") write each byte as one printable character: the printable Latin-1
# bytes as themselves, the other 68 as U+0100.. in byte order (space -> "Ġ").

def _gpt2_byte_chars():
    direct = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in direct:
            table[b] = chr(b)
        else:
            table[b] = chr(0x100 + extra)
            extra += 1
    return table


GPT2_BYTE_CHARS = _gpt2_byte_chars()                      # byte -> character
GPT2_CHAR_BYTES = {c: b for b, c in GPT2_BYTE_CHARS.items()}  # character -> byte


def gpt2_to_bytes(text):
    """The raw bytes of a piece written in GPT-2's characters ("Ġthe" ->
    b" the"), or None when text has a character outside that alphabet."""
    try:
        return bytes(GPT2_CHAR_BYTES[c] for c in text)
    except KeyError:
        return None


def bytes_to_gpt2(data):
    """The inverse of gpt2_to_bytes: b" the" -> "Ġthe"."""
    return "".join(GPT2_BYTE_CHARS[b] for b in data)


def _eot_id(pieces, kinds):
    """The id of a special piece that ends a turn (EOT_TEXTS, in that order), or -1."""
    special = {p: i for i, (p, k) in enumerate(zip(pieces, kinds)) if k == PIECE_SPECIAL}
    for text in EOT_TEXTS:
        if text in special:
            return special[text]
    return -1


def _find_piece(pieces, kinds, text):
    """The id of the special piece text, else of a piece text of any kind, else -1."""
    found = -1
    for i, (p, k) in enumerate(zip(pieces, kinds)):
        if bytes(p) == text:
            if k == PIECE_SPECIAL:
                return i
            found = i if found < 0 else found
    return found


def default_stop_ids(tok, extra=()):
    """tok's stop ids, sorted, each once: eos_id, eot_id, the ids in extra,
    the end-of-turn piece of tok's chat template (<|im_end|> for chatml,
    <|eot_id|> for llama3) when the vocabulary has it, and every special
    piece whose text is one of STOP_TEXTS."""
    pieces = tok["pieces"]
    kinds = tok.get("kinds") or [PIECE_NORMAL] * len(pieces)
    ids = {int(v) for v in (tok.get("eos_id"), tok.get("eot_id")) if v is not None and v >= 0}
    ids.update(int(v) for v in extra)
    end = CHAT_END_OF_TURN.get(tok.get("chat"))
    if end is not None and _find_piece(pieces, kinds, end) >= 0:
        ids.add(_find_piece(pieces, kinds, end))
    ids.update(i for i, (p, k) in enumerate(zip(pieces, kinds))
               if k == PIECE_SPECIAL and bytes(p) in STOP_TEXTS)
    return sorted(ids)
