"""Recognizes a source's chat template (a Jinja program) as one of the
templates run renders, and fills in a tokenizer's chat fields and stop ids.

A source's chat template is a Jinja program. run renders a few fixed
templates (chat.c, render_chat), so this module names the one a source's
template is by markers in its text, without evaluating any Jinja, and keeps
the two texts a template may add on its own: a default system prompt
(SmolLM2, Qwen2.5) and a fixed text before every system prompt (Llama 3.1's
knowledge dates). The stop ids are every token that ends a reply: EOS, end
of turn, the ids Hugging Face's generation config names, and the special
pieces llama.cpp treats as end of generation by their text.
"""

import re

from convert.ltok import CHAT_TEMPLATES, default_stop_ids


def _jinja_unescape(raw):
    """A Jinja (Python-style) string literal's source text with the escapes
    \\n \\t \\r \\\\ \\' \\" undone; other backslashes stay as they are."""
    table = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "'": "'", '"': '"'}
    return re.sub(r"\\(.)", lambda m: table.get(m.group(1), m.group(0)), raw, flags=re.S)


def _jinja_string_literals(text):
    """The values of the string literals inside text's Jinja tags ({{ }} and
    {% %}; comments {# #} skipped), in order, escapes undone. A literal may
    hold real newlines; quotes inside it do not end the tag."""
    out, i, n = [], 0, len(text)
    while i < n:
        j = text.find("{", i)
        if j < 0 or j + 1 >= n:
            break
        c = text[j + 1]
        if c == "#":
            k = text.find("#}", j + 2)
            i = n if k < 0 else k + 2
            continue
        if c not in "{%":
            i = j + 1
            continue
        close = "}}" if c == "{" else "%}"
        k = j + 2
        while k < n:
            if text[k] in "'\"":
                quote, m = text[k], k + 1
                while m < n and text[m] != quote:
                    m += 2 if text[m] == "\\" else 1
                if m < n:
                    out.append(_jinja_unescape(text[k + 1:m]))
                k = m + 1
            elif text.startswith(close, k):
                k += 2
                break
            else:
                k += 1
        i = k
    return out


def _chatml_default_system(literals):
    """The default system prompt of a ChatML template: the text of a literal
    "<|im_start|>system\n...<|im_end|>" (newline real or escaped), or ""."""
    for value in literals:
        m = re.match(r"<\|im_start\|>system\n(.+?)<\|im_end\|>", value, re.S)
        if m:
            return m.group(1)
    return ""


def _llama3_system_prefix(text, literals):
    """The text Llama 3.1-style templates put before every system prompt,
    "Cutting Knowledge Date: CUTOFF\nToday Date: DATE\n\n", with the cutoff of
    the template's "Cutting Knowledge Date: ...\n" literal and DATE its default
    date_string (set date_string = "26 Jul 2024"). None when a part is missing."""
    marker = "Cutting Knowledge Date:"
    cutoff = None
    for value in literals:
        at = value.find(marker)
        if at >= 0:
            rest = value[at + len(marker):].lstrip(" ")
            end = rest.find("\n")
            if end > 0:
                cutoff = rest[:end].strip()
            break
    m = re.search(r"""set\s+date_string\s*=\s*(["'])((?:\\.|(?!\1)[^\\])*)\1""", text, re.S)
    if not cutoff or m is None or not any("Today Date:" in v for v in literals):
        return None
    date = _jinja_unescape(m.group(2))
    if "\n" in date or "\n" in cutoff:
        return None
    return f"Cutting Knowledge Date: {cutoff}\nToday Date: {date}\n\n"


CHAT_TEMPLATE_CHOICES = "|".join(CHAT_TEMPLATES[1:])


def recognize_chat_template(text):
    """(name, system_default, system_prefix, notes) for a source's chat
    template text (None or "" for none), by markers, evaluating no Jinja:
      no template                              -> unstated
      <|im_start|> and <|im_end|>              -> chatml; with <think> (Qwen3's
                                                  reasoning templates) unstated
      <|start_header_id|> and <|eot_id|>       -> llama3; with "Cutting Knowledge
                                                  Date" (Llama 3.1 style) the
                                                  system prefix of knowledge dates
      [INST] and <<SYS>>                       -> llama2
      anything else                            -> unstated, with a note
    system_default: the prompt a ChatML literal "<|im_start|>system\n...<|im_end|>"
    puts in when there is no system message."""
    if not text:
        return "unstated", "", "", []
    flat = text.replace("\n", "\\n")
    head = flat[:60] + ("..." if len(flat) > 60 else "")
    need = f"run -m chat will need --chat-template {CHAT_TEMPLATE_CHOICES}"
    if "<|im_start|>" in text and "<|im_end|>" in text:
        if "<think>" in text:
            return "unstated", "", "", [
                "chat template is ChatML with <think> (a reasoning template, as Qwen3's), whose "
                f"thinking sections run does not reproduce: stored as unstated; {need}"]
        return "chatml", _chatml_default_system(_jinja_string_literals(text)), "", []
    if "<|start_header_id|>" in text and "<|eot_id|>" in text:
        if "Cutting Knowledge Date" not in text:
            return "llama3", "", "", []
        prefix = _llama3_system_prefix(text, _jinja_string_literals(text))
        if prefix is None:
            return "unstated", "", "", [
                "chat template is Llama 3's with a knowledge date, but its cutoff "
                "(\"Cutting Knowledge Date: ...\\n\") or default date (set date_string = "
                f"\"...\") was not found: stored as unstated; {need}"]
        date = prefix.split("Today Date: ", 1)[1].rstrip("\n")
        return "llama3", "", prefix, [
            f"chat template llama3 with Llama 3.1's system text (knowledge dates); its date is "
            f"the template's fixed default {date!r} (Llama 3.2's template puts today's date "
            "there under Hugging Face), and its tool sections are not reproduced"]
    if "[INST]" in text and "<<SYS>>" in text:
        return "llama2", "", "", []
    return "unstated", "", "", [f"chat template not recognized ({head}): {need}"]


def set_chat_and_stops(tok, notes, extra_stops=()):
    """Fill in tok's chat, system_default and system_prefix from its
    chat_template (recognize_chat_template; its notes go to notes) unless tok
    names chat already, then its stop_ids (default_stop_ids with extra_stops)."""
    if tok.get("chat") is None:
        name, default, prefix, chat_notes = recognize_chat_template(tok.get("chat_template"))
        tok.update(chat=name, system_default=default, system_prefix=prefix)
        notes += chat_notes
    tok.setdefault("system_default", "")
    tok.setdefault("system_prefix", "")
    tok["stop_ids"] = default_stop_ids(tok, extra_stops)
    return tok
