"""Reads tiktoken BPE files (Meta's Llama 3 tokenizer.model) and derives our
merges from their ranks.

One line per token: the token's bytes in base64, a space, its rank. Encoding
starts from single bytes and repeatedly joins the adjacent pair whose joined
bytes have the lowest rank. The merges of our format (rank = order) are
derived from the ranks: for each token, run that procedure on the token's own
bytes; if it ends in the token, the last join is the token's merge (left,
right). Why this reproduces tiktoken exactly: inside any stretch of text
that ends up as one token t, the joins are those of t's bytes alone (a join
across the stretch's edge would have prevented t), so the last join of t is
always that pair; a pair of other pieces that also spells t never gets
joined, so listing it changes nothing. Merges are ordered by the rank of
their result, so "lowest merge rank" and "lowest result rank" pick the same
pair. Tokens the procedure does not reach from their bytes get no merge
(tiktoken produces them only when a whole pre-tokenized chunk is that token,
which run implies for the llama3 pre-tokenizer).
"""

import os
import re

from convert.chat_templates import set_chat_and_stops
from convert.common import ExportError
from convert.ltok import PIECE_NORMAL, PIECE_SPECIAL
from convert.tokenizer_json import _hf_eos_ids


# Llama 3's 256 special tokens, ids 128000..128255, named as in Hugging Face's
# Llama 3.1 tokenizer.json (Llama 3.0 names 128004, 128005, 128008 and 128010
# <|reserved_special_token_2..5|>; the ids that matter, 128000/1/6/7/9, agree)
LLAMA3_SPECIAL_TOKENS = (
    ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
     "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>",
     "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]
    + [f"<|reserved_special_token_{i}|>" for i in range(3, 248)])
assert len(LLAMA3_SPECIAL_TOKENS) == 256
LLAMA3_RANKS = 128000


def is_tiktoken_file(path):
    """Whether path starts like a tiktoken BPE file (`base64 rank` lines)."""
    with open(path, "rb") as f:
        head = f.read(256)
    first = head.split(b"\n", 1)[0].rstrip(b"\r")
    return re.fullmatch(rb"[A-Za-z0-9+/]+={0,2} [0-9]+", first) is not None


def read_tiktoken(path):
    """The tokens (bytes) of a tiktoken BPE file, in rank order. Ranks must be
    0..N-1, each once; tokens unique; every single byte a token."""
    import base64
    import binascii
    path = os.fspath(path)
    with open(path, "rb") as f:
        data = f.read()
    by_rank = {}
    seen = set()
    for lineno, line in enumerate(data.split(b"\n"), 1):
        line = line.strip()
        if not line:
            continue
        parts = line.split(b" ")
        try:
            if len(parts) != 2:
                raise ValueError
            token, rank = base64.b64decode(parts[0], validate=True), int(parts[1])
        except (binascii.Error, ValueError):
            raise ExportError(f"{path}: line {lineno} is not `base64-token rank`; not a "
                              "tiktoken file") from None
        if rank in by_rank or token in seen or not token:
            what = "rank" if rank in by_rank else "token"
            raise ExportError(f"{path}: line {lineno}: {what} repeated (or an empty token)")
        by_rank[rank] = token
        seen.add(token)
    if not by_rank:
        raise ExportError(f"{path}: no tokens")
    if sorted(by_rank) != list(range(len(by_rank))):
        raise ExportError(f"{path}: ranks are not 0..{len(by_rank) - 1}")
    tokens = [by_rank[r] for r in range(len(by_rank))]
    missing = [b for b in range(256) if bytes([b]) not in seen]
    if missing:
        raise ExportError(f"{path}: {len(missing)} single bytes are not tokens "
                          f"(e.g. 0x{missing[0]:02x}); byte-level BPE needs all 256")
    return tokens


def tiktoken_merges(tokens):
    """(merges, unreachable) for tiktoken tokens in rank order: merges as
    (left id, right id) in the order of their result's rank (see the section
    comment for why this encodes exactly as tiktoken does), unreachable the
    number of multi-byte tokens that merging their own bytes does not produce."""
    rank = {t: i for i, t in enumerate(tokens)}
    merges, unreachable = [], 0
    for t in tokens:
        if len(t) < 2:
            continue
        parts, last = [t[i:i + 1] for i in range(len(t))], None
        while len(parts) > 1:
            best, at = None, -1
            for i in range(len(parts) - 1):
                r = rank.get(parts[i] + parts[i + 1])
                if r is not None and (best is None or r < best):
                    best, at = r, i
            if best is None:
                break
            last = (parts[at], parts[at + 1])
            parts[at:at + 2] = [parts[at] + parts[at + 1]]
        if len(parts) == 1:
            merges.append((rank[last[0]], rank[last[1]]))
        else:
            unreachable += 1
    return merges, unreachable


def read_tiktoken_tokenizer(path, specials=None):
    """A tiktoken file as (tok, notes): byte-level BPE with the llama3
    pre-tokenizer, merges from tiktoken_merges, then the special tokens
    (default: Llama 3's 256 when the file has Llama 3's 128000 ranks, else
    none) with BOS <|begin_of_text|>, EOS <|end_of_text|>, EOT <|eot_id|>
    when present; add_bos when there is a BOS; chat template llama3 when
    Llama 3's header and end-of-turn tokens are among the special ones; stop
    ids as default_stop_ids, with the eos_token_id of generation_config.json
    and config.json beside the file when they exist."""
    tokens = read_tiktoken(path)
    notes = []
    if specials is None:
        specials = LLAMA3_SPECIAL_TOKENS if len(tokens) == LLAMA3_RANKS else []
        if not specials:
            notes.append(f"{len(tokens)} ranks is not Llama 3's {LLAMA3_RANKS}: "
                         "no special tokens added")
    merges, unreachable = tiktoken_merges(tokens)
    pieces = tokens + [s.encode("utf-8") for s in specials]
    kinds = [PIECE_NORMAL] * len(tokens) + [PIECE_SPECIAL] * len(specials)
    index = {s: len(tokens) + i for i, s in enumerate(specials)}
    bos = index.get("<|begin_of_text|>", -1)
    notes.append(f"tiktoken: {len(merges)} merges derived from {len(tokens)} ranks"
                 + (f" ({unreachable} tokens are made only as whole pre-tokenized chunks)"
                    if unreachable else ""))
    tok = dict(type="byte_bpe", pre="llama3", pieces=pieces, kinds=kinds, scores=None,
               merges=merges, bos_id=bos, eos_id=index.get("<|end_of_text|>", -1),
               eot_id=index.get("<|eot_id|>", -1), pad_id=-1, add_bos=bos >= 0,
               chat_template=None)
    if "<|start_header_id|>" in index and "<|eot_id|>" in index:
        tok["chat"] = "llama3"
        notes.append("chat template llama3: a tiktoken file names none, and Llama 3's special "
                     "tokens are its; without Llama 3.1's knowledge-date system text")
    set_chat_and_stops(tok, notes, _hf_eos_ids(os.path.dirname(os.fspath(path)), len(pieces),
                                               notes))
    return tok, notes
