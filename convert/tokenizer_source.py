"""Finds and reads a tokenizer source by its content (tokenizer.json, GGUF,
tiktoken or sentencepiece), alone or beside a model."""

import os

from convert.common import ExportError, _read_json
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
    if head.lstrip()[:1] == b"{":
        tok, notes = read_tokenizer_json(path, vocab_size)
    elif head[:4] == b"GGUF":
        tok, notes = read_gguf_tokenizer(path)
    elif is_tiktoken_file(path):
        tok, notes = read_tiktoken_tokenizer(path)
    else:
        pieces, scores = sentencepiece_vocab(path)
        if vocab_size is not None and len(pieces) != vocab_size:
            raise ExportError(f"{path}: {len(pieces)} pieces, but the model has vocab_size "
                              f"{vocab_size}")
        return "v1", (pieces, scores), []
    if vocab_size is not None and len(tok["pieces"]) != vocab_size:
        raise ExportError(f"{path}: {len(tok['pieces'])} pieces, but the model has vocab_size "
                          f"{vocab_size}")
    return "ltok", tok, notes


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
