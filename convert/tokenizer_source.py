"""Finds and reads a tokenizer source by its content (tokenizer.json, GGUF,
tiktoken or sentencepiece), alone or beside a model."""

import codecs
import os

from convert.common import ExportError, _read_json, _text_encoding_problem
from convert.gguf_tokenizer import read_gguf_tokenizer
from convert.tiktoken_bpe import is_tiktoken_file, read_tiktoken_tokenizer
from convert.tokenizer_bin import sentencepiece_vocab
from convert.tokenizer_json import _has_byte_level, read_tokenizer_json


def _is_gguf_file(path):
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"


def read_tokenizer_source(path, vocab_size=None):
    """Any tokenizer file export.py converts, by its content: a tokenizer.json
    (JSON), a GGUF file, a tiktoken file or a sentencepiece model. Returns
    ("v1", (pieces, scores), notes) for sentencepiece (llama2.c's format, as
    before) or ("ltok", tok, notes) (version 3). vocab_size: the model's, when known (checked
    against, and tokenizer.json padded to it)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise ExportError(f"{path}: is a directory, expected a tokenizer file")
    if not os.path.exists(path):
        raise ExportError(f"{path}: no such file")
    with open(path, "rb") as f:
        head = f.read(64)
    if head.lstrip()[:1] in (b"{", b"[") or (head and not head.strip()):
        tok, notes = read_tokenizer_json(path, vocab_size)
    elif head[:4] == b"GGUF":
        tok, notes = read_gguf_tokenizer(path)
    elif is_tiktoken_file(path):
        tok, notes = read_tiktoken_tokenizer(path)
    else:
        _refuse_no_sentencepiece(path, head)
        pieces, scores = sentencepiece_vocab(path)
        if vocab_size is not None and len(pieces) != vocab_size:
            raise ExportError(f"{path}: {len(pieces)} pieces, but the model has vocab_size "
                              f"{vocab_size}")
        return "v1", (pieces, scores), []
    if vocab_size is not None and len(tok["pieces"]) != vocab_size:
        raise ExportError(f"{path}: {len(tok['pieces'])} pieces, but the model has vocab_size "
                          f"{vocab_size}")
    return "ltok", tok, notes


_KINDS = ("a tokenizer.json (JSON text, UTF-8), a GGUF file, a tiktoken file or a "
          "sentencepiece model")


def _printable_text(head):
    """head (a file's first bytes) as text when it is printable UTF-8 (a
    character cut at the end allowed), else None: a sentencepiece model is
    binary protobuf, whose first bytes are not."""
    try:
        text = codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError:
        return None
    return text if all(c.isprintable() or c in "\t\n\r" for c in text) else None


def _refuse_no_sentencepiece(path, head):
    """Raise ExportError for a file that is evidently not a sentencepiece model
    (nor any other tokenizer read here): empty, UTF-16 text, other text that is
    not JSON, or a .json name. The message says what was expected."""
    if not head:
        want = "a tokenizer.json (JSON text, UTF-8)" if path.lower().endswith(".json") else _KINDS
        raise ExportError(f"{path}: is empty; expected {want}")
    problem = _text_encoding_problem(head)
    if problem:
        raise ExportError(f"{path}: {problem}; expected a tokenizer.json (JSON text, UTF-8)")
    text = _printable_text(head)
    found = f"text starting {text[:24]!r}" if text is not None else \
        f"binary data starting {head[:8]!r}"
    if path.lower().endswith(".json"):
        raise ExportError(f"{path}: {found}, not JSON; expected a tokenizer.json (JSON text, "
                          "UTF-8)")
    if text is not None:
        raise ExportError(f"{path}: {found}, neither JSON nor tiktoken lines; expected {_KINDS}")


def model_dir_tokenizer(directory, vocab_size):
    """The tokenizer of a Hugging Face or Meta model directory: tokenizer.json
    when it is byte-level BPE, else tokenizer.model (sentencepiece, or
    tiktoken for Llama 3). Returns what read_tokenizer_source returns."""
    tj = os.path.join(directory, "tokenizer.json")
    tm = os.path.join(directory, "tokenizer.model")
    if os.path.isfile(tj):
        try:
            j = _read_json(tj, "a tokenizer.json")
        except ExportError:
            if not os.path.isfile(tm):
                raise
            j = None
        if j is not None and _has_byte_level(j.get("pre_tokenizer")):
            return read_tokenizer_source(tj, vocab_size)
        if not os.path.isfile(tm):
            raise ExportError(f"{tj}: not a byte-level BPE tokenizer, and {directory} has no "
                              "tokenizer.model")
    if os.path.isfile(tm):
        return read_tokenizer_source(tm, vocab_size)
    raise ExportError(f"{directory}: no tokenizer.json or tokenizer.model")
