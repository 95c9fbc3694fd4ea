"""llama2.c's tokenizer.bin: written from a sentencepiece .model (its pieces
and scores), and read back for tests."""

import math
import os
import struct

from convert.common import ExportError, _write_bytes


def pack_tokenizer_v1(pieces, scores):
    """The bytes of llama2.c's tokenizer.bin: i32 max_token_length, then per
    token f32 score, i32 length, the piece's bytes. Raises ExportError."""
    pieces = [bytes(p) for p in pieces]
    scores = [float(s) for s in scores]
    if len(pieces) != len(scores):
        raise ExportError(f"{len(pieces)} pieces but {len(scores)} scores")
    if not pieces:
        raise ExportError("empty vocabulary")
    for i, s in enumerate(scores):
        if not math.isfinite(s):
            raise ExportError(f"score of token {i} is {s}")
    out = [struct.pack("<i", max(len(p) for p in pieces))]
    for piece, score in zip(pieces, scores):
        out.append(struct.pack("<fi", score, len(piece)))
        out.append(piece)
    return b"".join(out)


def write_tokenizer(path, pieces, scores):
    """Write llama2.c's tokenizer.bin (pack_tokenizer_v1). Atomic; raises
    ExportError."""
    _write_bytes(path, pack_tokenizer_v1(pieces, scores))


def read_tokenizer(path):
    """Read a tokenizer.bin back: (max_token_length, pieces, scores). The whole
    file must be consumed."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 4:
        raise ExportError(f"{path}: too short for a tokenizer")
    (max_len,), off = struct.unpack_from("<i", data), 4
    pieces, scores = [], []
    while off < len(data):
        if off + 8 > len(data):
            raise ExportError(f"{path}: truncated at byte {off}")
        score, n = struct.unpack_from("<fi", data, off)
        off += 8
        if n < 0 or off + n > len(data):
            raise ExportError(f"{path}: bad piece length {n} at byte {off - 4}")
        pieces.append(data[off:off + n])
        scores.append(score)
        off += n
    return max_len, pieces, scores


def sentencepiece_vocab(model_path):
    """(pieces, scores) from a sentencepiece .model, exactly as llama2.c's
    tokenizer.py exports them: "▁" becomes " ", BOS is "\\n<s>\\n", EOS is
    "\\n</s>\\n", scores from get_score."""
    model_path = os.fspath(model_path)
    if os.path.isdir(model_path):
        raise ExportError(f"{model_path}: is a directory, expected a sentencepiece model")
    if not os.path.exists(model_path):
        raise ExportError(f"{model_path}: no such file")
    try:
        import sentencepiece  # only this path needs it
    except ImportError:
        raise ExportError("--tokenizer needs the sentencepiece package "
                          "(pip install sentencepiece, or apt install python3-sentencepiece)") \
            from None
    sp = sentencepiece.SentencePieceProcessor()
    try:
        sp.Load(model_path)
    except Exception as e:  # sentencepiece raises OSError/RuntimeError with a multi-line text
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ExportError(f"{model_path}: not a sentencepiece model ({first})") from None
    pieces, scores = [], []
    for i in range(sp.GetPieceSize()):
        t = sp.IdToPiece(i)
        if i == sp.bos_id():
            t = "\n<s>\n"
        elif i == sp.eos_id():
            t = "\n</s>\n"
        pieces.append(t.replace("\u2581", " ").encode("utf-8"))
        scores.append(sp.GetScore(i))
    return pieces, scores
