"""Reads the tokenizer in a GGUF file's metadata (tokenizer.ggml.*)."""

import re

import numpy as np

from convert.chat_templates import set_chat_and_stops
from convert.common import ExportError
from convert.gguf_file import _open_gguf
from convert.ltok import (
    PIECE_BYTE, PIECE_NORMAL, PIECE_SPECIAL, PIECE_UNUSED, _eot_id, _show, gpt2_to_bytes)


# tokenizer.ggml.token_type values (gguf.TokenType)
GGUF_TOKEN_NORMAL, GGUF_TOKEN_UNKNOWN, GGUF_TOKEN_CONTROL, GGUF_TOKEN_USER_DEFINED, \
    GGUF_TOKEN_UNUSED, GGUF_TOKEN_BYTE = range(1, 7)
GGUF_PRE_NAMES = {"gpt-2": "gpt2", "llama-bpe": "llama3", "llama3": "llama3",
                  "qwen2": "qwen2", "smollm": "smollm"}


def read_gguf_tokenizer(path):
    """The tokenizer of a GGUF file as (tok, notes) (see gguf_tokenizer)."""
    _, _, _, meta = _open_gguf(path)
    return gguf_tokenizer(meta)


def gguf_tokenizer(meta):
    """The tokenizer in a GGUF file's metadata as (tok, notes).

    tokenizer.ggml.model "gpt2" -> byte_bpe: pieces of normal and unused tokens
    are GPT-2 characters, turned back into bytes; control, user-defined and
    unknown tokens are special, stored as their literal text; merges "a b"
    become the ids of a and b; tokenizer.ggml.pre names the pre-tokenizer.
    "llama" -> sentencepiece: "▁" becomes a space (as llama2.c's export does),
    byte tokens <0xHH> stay as they are, with their kind; scores are required.
    Ids: tokenizer.ggml.{bos,eos,eot,padding}_token_id (EOT, when absent, is
    guessed from the special pieces' text as llama.cpp does); add_bos_token
    (default true for "llama", false for "gpt2"). tokenizer.chat_template ->
    chat, system_default, system_prefix (recognize_chat_template); stop ids
    as default_stop_ids, with tokenizer.ggml.eom_token_id."""
    path, notes = meta.path, []
    model = meta.get("tokenizer.ggml.model", "str")
    if model not in ("gpt2", "llama"):
        raise ExportError(f"{path}: tokenizer.ggml.model is {model!r}; supported: \"gpt2\" "
                          "(byte-level BPE) and \"llama\" (sentencepiece)")
    texts, types = _gguf_tokens(meta, notes)
    if model == "gpt2":
        tok = _gguf_byte_bpe(meta, texts, types)
    else:
        tok = _gguf_sentencepiece(meta, texts, types, notes)
    n, pieces, kinds = len(texts), tok["pieces"], tok["kinds"]

    def token_id(key):  # absent, negative or 0xFFFFFFFF (llama.cpp's -1 stored as a u32): none
        v = meta.get(key, "int", None)
        if v is None or v < 0 or v == 0xFFFFFFFF:
            return -1
        if v >= n:
            raise ExportError(f"{path}: {key}={v} is outside the vocabulary ({n} tokens)")
        return v
    tok.update(bos_id=token_id("tokenizer.ggml.bos_token_id"),
               eos_id=token_id("tokenizer.ggml.eos_token_id"),
               eot_id=token_id("tokenizer.ggml.eot_token_id"),
               pad_id=token_id("tokenizer.ggml.padding_token_id"))
    eom = token_id("tokenizer.ggml.eom_token_id")
    if tok["eot_id"] < 0:
        tok["eot_id"] = _eot_id(pieces, kinds)
        if tok["eot_id"] >= 0:
            notes.append(f"no tokenizer.ggml.eot_token_id: end of turn is "
                         f"{_show(pieces[tok['eot_id']])} ({tok['eot_id']})")
    tok["add_bos"] = _gguf_add_bos(meta, model, tok["bos_id"], notes)
    tok["chat_template"] = meta.get("tokenizer.chat_template", "str", None)
    set_chat_and_stops(tok, notes, [eom] if eom >= 0 else [])
    return tok, notes


def _gguf_tokens(meta, notes):
    """(texts, types): tokenizer.ggml.tokens and token_type (absent: all normal)."""
    path = meta.path
    texts = meta.get("tokenizer.ggml.tokens", "bytes[]")
    n = len(texts)
    if n == 0:
        raise ExportError(f"{path}: tokenizer.ggml.tokens is empty")
    types = meta.get("tokenizer.ggml.token_type", "int[]", None)
    if types is None:
        types = np.full(n, GGUF_TOKEN_NORMAL, dtype=np.int64)
        notes.append("no tokenizer.ggml.token_type: every token is taken as normal")
    if len(types) != n:
        raise ExportError(f"{path}: tokenizer.ggml.token_type has {len(types)} entries but "
                          f"tokenizer.ggml.tokens has {n}")
    bad = [int(t) for t in types if not 1 <= int(t) <= 6]
    if bad:
        raise ExportError(f"{path}: tokenizer.ggml.token_type has the unknown type {bad[0]} "
                          "(1..6: normal, unknown, control, user defined, unused, byte)")
    return texts, types


def _gguf_byte_bpe(meta, texts, types):
    """The byte_bpe tokenizer of a "gpt2" vocabulary: pre-tokenizer, pieces,
    kinds and merges."""
    path = meta.path
    pre_name = meta.get("tokenizer.ggml.pre", "str", None)
    if pre_name in (None, "default"):  # llama.cpp's fallback rules are not GPT-2's split
        raise ExportError(f"{path}: tokenizer.ggml.pre is {pre_name or 'absent'} (llama.cpp's "
                          "fallback pre-tokenizer), which this program does not implement; supported: "
                          f"{', '.join(sorted(GGUF_PRE_NAMES))}")
    if pre_name not in GGUF_PRE_NAMES:
        raise ExportError(f"{path}: tokenizer.ggml.pre is {pre_name!r}; supported: "
                          f"{', '.join(sorted(GGUF_PRE_NAMES))}")
    if meta.get("tokenizer.ggml.add_space_prefix", "bool", False):
        raise ExportError(f"{path}: tokenizer.ggml.add_space_prefix is true: a space before "
                          "the text is not supported for byte-level BPE")
    pieces, kinds, by_text = [], [], {}
    for i, (text, t) in enumerate(zip(texts, types)):
        if t in (GGUF_TOKEN_NORMAL, GGUF_TOKEN_UNUSED):
            try:
                b = gpt2_to_bytes(text.decode("utf-8"))
            except UnicodeDecodeError:
                b = None
            if b is None and t == GGUF_TOKEN_NORMAL:
                raise ExportError(f"{path}: token {i} {_show(text)} is normal but not written "
                                  "in GPT-2's byte alphabet: not a byte-level BPE vocabulary")
            pieces.append(text if b is None else b)
            kinds.append(PIECE_NORMAL if t == GGUF_TOKEN_NORMAL else PIECE_UNUSED)
            if t == GGUF_TOKEN_NORMAL:
                by_text.setdefault(text, i)
        elif t == GGUF_TOKEN_BYTE:
            raise ExportError(f"{path}: token {i} {_show(text)} has type byte (6), which a "
                              "gpt2 vocabulary does not use")
        else:  # control, user defined, unknown: literal text
            pieces.append(text)
            kinds.append(PIECE_SPECIAL)
    return dict(type="byte_bpe", pre=GGUF_PRE_NAMES[pre_name], scores=None,
                merges=_gguf_merges(meta, by_text), pieces=pieces, kinds=kinds)


def _gguf_merges(meta, by_text):
    """tokenizer.ggml.merges ("a b", in rank order) as pairs of the normal
    tokens' ids (by_text: a normal token's text -> its id)."""
    path = meta.path
    raw_merges = meta.get("tokenizer.ggml.merges", "bytes[]")
    if not raw_merges:
        raise ExportError(f"{path}: tokenizer.ggml.merges is empty")
    merges = []
    for rank, m in enumerate(raw_merges):
        parts = m.split(b" ")
        if len(parts) != 2 or not parts[0] or not parts[1]:
            raise ExportError(f"{path}: merge {rank} {_show(m)} is not two pieces "
                              "separated by one space")
        for side in parts:
            if side not in by_text:
                raise ExportError(f"{path}: merge {rank} {_show(m)} names {_show(side)}, "
                                  "which is not a normal token")
        if parts[0] + parts[1] not in by_text:
            raise ExportError(f"{path}: merge {rank} {_show(m)}: the result "
                              f"{_show(parts[0] + parts[1])} is not a normal token")
        merges.append((by_text[parts[0]], by_text[parts[1]]))
    return merges


def _gguf_sentencepiece(meta, texts, types, notes):
    """The sentencepiece tokenizer of a "llama" vocabulary: pieces ("▁" as a
    space, <0xHH> byte pieces kept), kinds and scores."""
    path, n = meta.path, len(texts)
    scores = meta.get("tokenizer.ggml.scores", "float[]")
    if len(scores) != n:
        raise ExportError(f"{path}: tokenizer.ggml.scores has {len(scores)} entries but "
                          f"tokenizer.ggml.tokens has {n}")
    pre_name = meta.get("tokenizer.ggml.pre", "str", None)
    if pre_name not in (None, "default"):
        notes.append(f"tokenizer.ggml.pre {pre_name!r} ignored: a sentencepiece vocabulary "
                     "has no pre-tokenizer")
    if not meta.get("tokenizer.ggml.add_space_prefix", "bool", True):
        raise ExportError(f"{path}: tokenizer.ggml.add_space_prefix is false: run's "
                          "sentencepiece tokenizer always puts a space before the text")
    pieces, kinds = [], []
    for i, (text, t) in enumerate(zip(texts, types)):
        if t == GGUF_TOKEN_BYTE:
            if not re.fullmatch(rb"<0x[0-9A-Fa-f]{2}>", text):
                raise ExportError(f"{path}: token {i} {_show(text)} has type byte but is not "
                                  "<0xHH>")
            pieces.append(text)
            kinds.append(PIECE_BYTE)
            continue
        text = text.replace("\u2581".encode("utf-8"), b" ")
        pieces.append(text)
        kinds.append({GGUF_TOKEN_NORMAL: PIECE_NORMAL,
                      GGUF_TOKEN_UNUSED: PIECE_UNUSED}.get(int(t), PIECE_SPECIAL))
    return dict(type="sentencepiece", pre="none", scores=[float(s) for s in scores], merges=[],
                pieces=pieces, kinds=kinds)


def _gguf_add_bos(meta, model, bos_id, notes):
    """tokenizer.ggml.add_bos_token, else llama.cpp's default for the model
    (true for "llama", false for "gpt2"; never without a BOS)."""
    add_bos = meta.get("tokenizer.ggml.add_bos_token", "bool", None)
    if add_bos is None:
        add_bos = model == "llama" and bos_id >= 0
        notes.append(f"no tokenizer.ggml.add_bos_token: {'' if add_bos else 'no '}BOS before "
                     f"prompts (llama.cpp's default for {model})")
    elif add_bos and bos_id < 0:
        raise ExportError(f"{meta.path}: tokenizer.ggml.add_bos_token is true but there is no "
                          "tokenizer.ggml.bos_token_id")
    return add_bos
