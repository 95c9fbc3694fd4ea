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
"""

import json
import re

import pytest

from conftest import ROOT, check_error, run, run_ok

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
            assert t["prompt"] == text
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


def test_run_scores_answers():
    """The bundled model (not trained to retrieve) answers with words: each
    trial's answer is the first digit run of its text, correct exactly when
    it equals the key, and the cell's accuracy is correct / trials."""
    p = run_ok(MODEL, "-m", "passkey", "--lengths", "120,240", "--depths", "0,1", "--trials", "2",
               "--json")
    r = json.loads(p.stdout)
    assert r["ctx"] == 240 + 5 + 4  # the longest prompt and its answer
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
    (["-i", "hello"], 2, ["-i", "-m passkey"]),
    (["-f", "/nonexistent/book.txt"], 1, ["/nonexistent/book.txt"]),
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


def test_prompts_longer_than_the_cache_with_sinks():
    """With a rolling cache (--sinks) a prompt may be longer than --ctx: it
    streams through the cache and the answer still comes."""
    r = json.loads(run_ok(MODEL, "-m", "passkey", "--lengths", "150", "--depths", "0.5", "--trials", "1",
                          "--ctx", "64", "--sinks", "4", "--json").stdout)
    assert r["ctx"] == 64 and r["sinks"] == 4
    t = r["cells"][0]["trials"][0]
    assert 140 <= t["prompt_tokens"] <= 150 and t["text"]
