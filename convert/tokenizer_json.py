"""Reads Hugging Face tokenizer.json files (byte-level BPE), with
tokenizer_config.json, chat_template.jinja, generation_config.json and
config.json beside them.

What is read: model (type BPE: vocab, merges), added_tokens (special pieces,
stored as their literal text), pre_tokenizer (which of the four splitting
rules run implements), normalizer (none, or NFC with a note), post_processor
(whether a template puts BOS first); and from tokenizer_config.json beside it
bos_token, eos_token, pad_token and add_bos_token.
"""

import os

from convert.chat_templates import set_chat_and_stops
from convert.common import ExportError, INT32_MAX, _js, _read_json
from convert.ltok import PIECE_NORMAL, PIECE_SPECIAL, PIECE_UNUSED, _eot_id, gpt2_to_bytes


# The Split regexes of Llama 3 and Qwen2 tokenizer.json files (the two differ in
# digits: runs of up to three, or one at a time)
LLAMA3_SPLIT_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                      r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_SPLIT_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                     r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def _describe_pre(node):
    """A short text for a tokenizer.json pre_tokenizer (for messages)."""
    if not isinstance(node, dict):
        return _js(node)
    kind = node.get("type")
    if kind == "Sequence":
        steps = node.get("pretokenizers") or []
        return "Sequence[" + ", ".join(_describe_pre(s) for s in steps) + "]"
    if kind == "Split":
        pat = node.get("pattern") or {}
        pat = pat.get("Regex", pat.get("String")) if isinstance(pat, dict) else pat
        pat = pat if not isinstance(pat, str) or len(pat) <= 50 else pat[:47] + "..."
        return f"Split({pat!r}, {node.get('behavior')})"
    if kind == "ByteLevel":
        return (f"ByteLevel(use_regex={_js(node.get('use_regex', True))}, "
                f"add_prefix_space={_js(node.get('add_prefix_space', False))})")
    if kind == "Digits":
        return f"Digits(individual_digits={_js(node.get('individual_digits', False))})"
    return str(kind)


def _is_byte_level(node, use_regex):
    return (isinstance(node, dict) and node.get("type") == "ByteLevel"
            and node.get("use_regex", True) is use_regex
            and node.get("add_prefix_space", False) is False)


def _is_split(node, regex):
    return (isinstance(node, dict) and node.get("type") == "Split"
            and node.get("pattern") == {"Regex": regex}
            and node.get("behavior") == "Isolated" and node.get("invert", False) is False)


def hf_pre_tokenizer(where, pre, normalizer, notes):
    """The PRE_TYPES name of a tokenizer.json pre_tokenizer (and normalizer):
        ByteLevel (its own GPT-2 regex)                         -> gpt2
        Sequence[Digits(individual), ByteLevel(GPT-2 regex)]    -> smollm
        Sequence[Split(Llama 3 regex), ByteLevel(no regex)]     -> llama3
        Sequence[Split(Qwen2 regex), ByteLevel(no regex)]       -> qwen2
    Anything else raises ExportError naming what was found."""
    if normalizer is not None:
        if isinstance(normalizer, dict) and normalizer.get("type") == "NFC":
            notes.append("tokenizer.json normalizes text to NFC; run does not: give it NFC text "
                         "(most text already is)")
        else:
            kind = normalizer.get("type") if isinstance(normalizer, dict) else _js(normalizer)
            raise ExportError(f"{where}: normalizer {kind} is not supported (run applies none)")
    steps = pre.get("pretokenizers") if isinstance(pre, dict) and pre.get("type") == "Sequence" \
        else [pre]
    steps = steps if isinstance(steps, list) else [steps]
    if len(steps) == 1 and _is_byte_level(steps[0], True):
        return "gpt2"
    if len(steps) == 2 and _is_byte_level(steps[1], True) and steps[0] == \
            {"type": "Digits", "individual_digits": True}:
        return "smollm"
    if len(steps) == 2 and _is_byte_level(steps[1], False):
        if _is_split(steps[0], LLAMA3_SPLIT_REGEX):
            return "llama3"
        if _is_split(steps[0], QWEN2_SPLIT_REGEX):
            return "qwen2"
    raise ExportError(f"{where}: pre_tokenizer {_describe_pre(pre)} is not one run implements "
                      "(ByteLevel: gpt2; Digits + ByteLevel: smollm; Split with the Llama 3 or "
                      "Qwen2 regex + ByteLevel: llama3, qwen2)")


def _has_byte_level(node):
    if isinstance(node, dict):
        return node.get("type") == "ByteLevel" or any(_has_byte_level(v) for v in node.values())
    if isinstance(node, list):
        return any(_has_byte_level(v) for v in node)
    return False


def _template_bos(pp):
    """What a tokenizer.json post_processor says about BOS: the content of the
    special token a TemplateProcessing puts first, False when its template
    starts with the text, None when it has no template."""
    if not isinstance(pp, dict):
        return None
    if pp.get("type") == "Sequence":
        for sub in pp.get("processors") or []:
            r = _template_bos(sub)
            if r is not None:
                return r
        return None
    if pp.get("type") == "TemplateProcessing":
        single = pp.get("single") or []
        first = single[0] if single and isinstance(single[0], dict) else {}
        if "SpecialToken" in first and isinstance(first["SpecialToken"], dict):
            return first["SpecialToken"].get("id")
        return False
    return None


def _token_text(v):
    """tokenizer_config.json's bos_token etc.: a string, {"content": ...} or null."""
    if isinstance(v, dict):
        v = v.get("content")
    return v if isinstance(v, str) else None


def _hf_chat_template(directory, config, notes):
    """The chat template of a Hugging Face tokenizer: tokenizer_config.json's
    chat_template (a string, or a list of {"name", "template"}: the one named
    "default"), else the file chat_template.jinja in directory, else None."""
    where = os.path.join(directory, "tokenizer_config.json")
    v = config.get("chat_template")
    if isinstance(v, str):
        return v
    if isinstance(v, list):
        for entry in v:
            if isinstance(entry, dict) and entry.get("name") == "default" \
                    and isinstance(entry.get("template"), str):
                return entry["template"]
        names = [e.get("name") for e in v if isinstance(e, dict)]
        notes.append(f"{where}: chat_template lists no template named \"default\" "
                     f"({', '.join(_js(x) for x in names)}): none used")
    elif v is not None:
        notes.append(f"{where}: chat_template is {_js(v)[:40]}, neither a string nor a list: "
                     "not used")
    jinja = os.path.join(directory, "chat_template.jinja")
    if os.path.isfile(jinja):
        try:
            with open(jinja, "rb") as f:
                return f.read().decode("utf-8")
        except UnicodeDecodeError:
            raise ExportError(f"{jinja}: not UTF-8 text") from None
    return None


def read_tokenizer_json(path, vocab_size=None):
    """A Hugging Face tokenizer.json of a byte-level BPE model (GPT-2, Llama 3,
    SmolLM, Qwen2 style), with tokenizer_config.json from the same directory
    when it exists, as (tok, notes). The chat template comes from
    tokenizer_config.json or chat_template.jinja beside it, stop ids also from
    the eos_token_id of generation_config.json and config.json there.
    vocab_size: the model's; ids the tokenizer does not use up to it become
    unused pieces (a note says how many), more ids than it is an error.
    Raises ExportError naming the file."""
    path = os.fspath(path)
    j = _read_json(path, "a tokenizer.json")
    notes = []
    model, pre = _tj_model(path, j, notes)
    vocab, raw_merges = model.get("vocab"), model.get("merges")
    if not isinstance(vocab, dict) or not vocab:
        raise ExportError(f"{path}: model.vocab is not a non-empty object")
    if not isinstance(raw_merges, list):
        raise ExportError(f"{path}: model.merges is not a list")
    added = j.get("added_tokens") or []
    if not isinstance(added, list):
        raise ExportError(f"{path}: added_tokens is not a list")
    ids, pieces, kinds = _tj_pieces(path, vocab, added, vocab_size, notes)
    merges = _tj_merges(path, raw_merges, ids)
    n = len(pieces)
    by_text = {}
    for i, (p, k) in enumerate(zip(pieces, kinds)):
        if k == PIECE_SPECIAL:
            by_text.setdefault(p.decode("utf-8"), i)
    for text, i in ids.items():
        by_text.setdefault(text, i)
    directory = os.path.dirname(path)
    config_path = os.path.join(directory, "tokenizer_config.json")
    config = _read_json(config_path, "a tokenizer config") if os.path.isfile(config_path) else {}
    tok = dict(type="byte_bpe", pre=pre, pieces=pieces, kinds=kinds, scores=None, merges=merges,
               bos_id=-1, eos_id=-1, eot_id=_eot_id(pieces, kinds), pad_id=-1,
               chat_template=_hf_chat_template(directory, config, notes))
    _tj_special_ids(path, j, config, config_path, tok, by_text, notes)
    set_chat_and_stops(tok, notes, _hf_eos_ids(directory, n, notes))
    return tok, notes


def _tj_model(path, j, notes):
    """(model, pre): the BPE model of a tokenizer.json, checked to be
    byte-level BPE run can reproduce, and its PRE_TYPES name."""
    model = j.get("model")
    if not isinstance(model, dict) or model.get("type") != "BPE":
        kind = model.get("type") if isinstance(model, dict) else _js(model)
        raise ExportError(f"{path}: model type {kind} is not supported (only BPE)")
    if not _has_byte_level(j.get("pre_tokenizer")):
        raise ExportError(f"{path}: not a byte-level BPE tokenizer (pre_tokenizer "
                          f"{_describe_pre(j.get('pre_tokenizer'))}); for a sentencepiece model "
                          "convert its tokenizer.model")
    pre = hf_pre_tokenizer(path, j.get("pre_tokenizer"), j.get("normalizer"), notes)
    for key in ("continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key):
            raise ExportError(f"{path}: model.{key}={_js(model[key])} is not supported")
    if model.get("byte_fallback"):
        raise ExportError(f"{path}: model.byte_fallback is set: not a byte-level BPE vocabulary")
    if model.get("ignore_merges") and pre != "llama3":
        notes.append(f"tokenizer.json sets ignore_merges (a pre-tokenized chunk that is a piece "
                     f"is that piece); run implies it for llama3 only, not {pre}")
    return model, pre


def _tj_pieces(path, vocab, added, vocab_size, notes):
    """(ids, pieces, kinds): ids maps each vocabulary text (GPT-2 characters)
    to its id; pieces are raw bytes in id order, added tokens special (their
    literal text), ids without a piece unused. Every id must lie below the
    model's vocab_size, or (without a model) below the number of entries the
    file declares (model.vocab plus added_tokens): no list grows past that."""
    if vocab_size is not None:
        bound, what = vocab_size, f"the model's vocab_size {vocab_size}"
    else:
        bound = len(vocab) + len(added)
        what = (f"the {bound} entries the file declares ({len(vocab)} in model.vocab, "
                f"{len(added)} in added_tokens)")
    ids, raw = {}, {}
    for text, i in vocab.items():
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i <= INT32_MAX:
            raise ExportError(f"{path}: model.vocab[{text!r}] = {_js(i)} is not an id")
        raw[text] = gpt2_to_bytes(text)
        if raw[text] is None:
            raise ExportError(f"{path}: vocabulary piece {text!r} (id {i}) has characters outside "
                              "GPT-2's byte alphabet: not a byte-level BPE vocabulary")
        if i >= bound:
            raise ExportError(f"{path}: model.vocab[{text!r}] has id {i}, expected an id below "
                              f"{what}")
        ids[text] = i
    specials = {}
    for a in added:
        if not isinstance(a, dict) or not isinstance(a.get("content"), str) \
                or isinstance(a.get("id"), bool) or not isinstance(a.get("id"), int) \
                or not 0 <= a["id"] <= INT32_MAX:
            raise ExportError(f"{path}: malformed added_tokens entry {_js(a)[:80]}")
        if a["id"] >= bound:
            raise ExportError(f"{path}: added token {a['content'][:40]!r} has id {a['id']}, "
                              f"expected an id below {what}")
        specials[a["id"]] = a["content"]
    n = bound if vocab_size is not None else max(max(ids.values()), max(specials, default=-1)) + 1
    pieces, kinds = [None] * n, [PIECE_UNUSED] * n
    for text, i in ids.items():
        if pieces[i] is not None:
            raise ExportError(f"{path}: model.vocab gives id {i} to two pieces")
        pieces[i], kinds[i] = raw[text], PIECE_NORMAL
    for i, content in specials.items():  # literal text, not byte-mapped; overrides the vocab entry
        pieces[i], kinds[i] = content.encode("utf-8"), PIECE_SPECIAL
    unused = sum(1 for p in pieces if p is None)
    if unused:
        notes.append(f"{unused} ids have no piece in tokenizer.json (the model's vocabulary is "
                     "larger): stored as unused pieces")
    return ids, [b"" if p is None else p for p in pieces], kinds


def _tj_merges(path, raw_merges, ids):
    """model.merges ("a b" strings or [a, b] lists, in rank order) as pairs of ids."""
    merges = []
    for rank, m in enumerate(raw_merges):
        if isinstance(m, str):
            parts = m.split(" ")
        elif isinstance(m, list):
            parts = m
        else:
            parts = None
        if not parts or len(parts) != 2 or not all(isinstance(s, str) for s in parts):
            raise ExportError(f"{path}: merge {rank} is {_js(m)[:60]}, not two pieces")
        a, b = parts
        for side in (a, b):
            if side not in ids:
                raise ExportError(f"{path}: merge {rank} ({a!r} {b!r}) names {side!r}, "
                                  "which is not in the vocabulary")
        if a + b not in ids:
            raise ExportError(f"{path}: merge {rank} ({a!r} {b!r}): the result {a + b!r} is not "
                              "in the vocabulary")
        merges.append((ids[a], ids[b]))
    return merges


def _tj_special_ids(path, j, config, config_path, tok, by_text, notes):
    """tok's bos_id, eos_id, pad_id and add_bos from tokenizer_config.json
    (bos_token, eos_token, pad_token, add_bos_token) and the post_processor's
    template (by_text: a piece's text -> its id)."""
    for key in ("bos", "eos", "pad"):
        text = _token_text(config.get(f"{key}_token"))
        if text is None:
            continue
        if text not in by_text:
            raise ExportError(f"{config_path}: {key}_token {text!r} is not in the vocabulary")
        tok[f"{key}_id"] = by_text[text]
    template = _template_bos(j.get("post_processor"))
    if template and tok["bos_id"] < 0 and template in by_text:
        tok["bos_id"] = by_text[template]
    add_bos = config.get("add_bos_token")
    if isinstance(add_bos, bool):
        tok["add_bos"] = add_bos
        if template is not None and bool(template) != add_bos:
            notes.append(f"add_bos_token is {_js(add_bos)} in tokenizer_config.json but the "
                         "post_processor template says otherwise: using add_bos_token")
    else:
        tok["add_bos"] = bool(template)
    if tok["add_bos"] and tok["bos_id"] < 0:
        raise ExportError(f"{path}: prompts start with BOS, but no BOS token is named")


def _hf_eos_ids(directory, n, notes):
    """Every id of Hugging Face's eos_token_id (an int or a list) in
    generation_config.json and config.json in directory, when they exist.
    Ids outside 0..n-1 and values of another type are left out with a note."""
    ids = []
    for name in ("generation_config.json", "config.json"):
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            continue
        v = _read_json(path, "a model config").get("eos_token_id")
        if v is None:
            continue
        values = v if isinstance(v, list) else [v]
        for x in values:
            if isinstance(x, bool) or not isinstance(x, int):
                notes.append(f"{path}: eos_token_id {_js(v)} is not an id or a list of ids: "
                             "not used as stop ids")
                break
            if not 0 <= x < n:
                notes.append(f"{path}: eos_token_id {x} is outside the vocabulary (0..{n - 1}): "
                             "not a stop id")
                continue
            ids.append(x)
    return ids
