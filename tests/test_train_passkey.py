"""tools/train.py's passkey samples (--passkey-mix) against docs/passkey.md,
written out again here: the sentence rule of a filler file, the prompt text,
the length rule, the training sample and window, the evaluation's scoring.
Nothing here trains a model.

The token counts use the bundled sentencepiece model (models/tokenizer.model),
the vocabulary a retrieval model trained with `--tokenizer
models/tokenizer.model` shares. One test reads the held-out book from
../shared (or $SHARED_DIR) and is skipped with a message without it.
"""

import re
import sys

import numpy as np
import pytest
import torch

from conftest import ROOT, SHARED

sys.path.insert(0, str(ROOT / "tools"))
import train  # noqa: E402  (tools/train.py)

SP_MODEL = ROOT / "models" / "tokenizer.model"
BOS = 1
EOS = 2

TASK = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize "
        "them. I will quiz you about the important information there.")
QUESTION = "What is the pass key? The pass key is"

BOOK = ("  CHAPTER I.\n\nIt was a dark and stormy night;  the rain fell in torrents, except at "
        "occasional intervals!\tThen it was checked by a violent gust of wind? Yes. Mr. Smith\r\n"
        "swept up the streets (for it is in London that our scene lies), rattling along the "
        "housetops, and fiercely agitating the scanty flame of the lamps that struggled against "
        "the darkness. \u201cWho is there?\u201d she asked. Nobody answered her. The old clock on the "
        "landing struck eleven, and the house was still. A\u00a0door opened somewhere below, and "
        "closed again. She waited a long time before she moved. At last she rose, took up the "
        "candle and went down the stairs, one step at a time, listening. The hall was empty. "
        "Outside, the wind had dropped and the street lay silent under the rain\n")


def spec_sentences(text):
    """docs/passkey.md section 1, one character at a time."""
    norm = []
    for ch in text:
        if ch in " \t\n\r\x0b\x0c":
            if norm and norm[-1] != " ":
                norm.append(" ")
        else:
            norm.append(ch)
    if norm and norm[-1] == " ":
        norm.pop()
    t = "".join(norm)
    out, cur, j = [], "", 0
    while j < len(t):
        cur += t[j]
        if t[j] in ".!?" and j + 1 < len(t) and t[j + 1] == " ":
            out.append(cur)
            cur, j = "", j + 2
            continue
        j += 1
    if cur:
        out.append(cur)
    return out


def spec_prompt(filler, start, k, i, key):
    key_line = f"The pass key is {key}. Remember it. {key} is the pass key."
    if k == 0:
        return TASK + " " + key_line + " " + QUESTION
    picked = [filler[(start + j) % len(filler)] for j in range(k)]
    return TASK + " " + " ".join(picked[:i] + [key_line] + picked[i:]) + " " + QUESTION


def spec_round(x):
    """round half away from zero, for x >= 0, with exact arithmetic."""
    from fractions import Fraction
    f = Fraction(x)
    return int(f + Fraction(1, 2))


FILLER = spec_sentences(BOOK)


@pytest.fixture(scope="module")
def sp():
    spm = pytest.importorskip("sentencepiece")
    return spm.SentencePieceProcessor(model_file=str(SP_MODEL))


def n_tokens(sp, text):
    return len(sp.encode(text)) + 1  # BOS, as run adds it


# ---------------------------------------------------------------------------

def test_sentences_of_a_filler_text():
    s = train.split_sentences(BOOK)
    assert s == spec_sentences(BOOK)
    assert s[:6] == ["CHAPTER I.", "It was a dark and stormy night; the rain fell in torrents, except at "
                     "occasional intervals!", "Then it was checked by a violent gust of wind?", "Yes.", "Mr.",
                     "Smith swept up the streets (for it is in London that our scene lies), rattling along the "
                     "housetops, and fiercely agitating the scanty flame of the lamps that struggled against "
                     "the darkness."]
    assert "\u201cWho is there?\u201d she asked." in s  # ? followed by a quote, not a space: no cut
    assert any("A\u00a0door" in x for x in s)  # a no-break space is not ASCII white space
    assert s[-1] == "Outside, the wind had dropped and the street lay silent under the rain"
    assert all(x and x == x.strip(" ") and "  " not in x for x in s)
    for text, want in [("", []), (" \n\t ", []), ("One.", ["One."]), ("A. B", ["A.", "B"]),
                       ("Wait...  what?!  Yes", ["Wait...", "what?!", "Yes"]), ("x .y. z", ["x .y.", "z"]),
                       ("end. ", ["end."]), ("a.\x0bb!\x0cc", ["a.", "b!", "c"])]:
        assert train.split_sentences(text) == want == spec_sentences(text), text


def test_prompt_text_follows_the_specification():
    key = "40719"
    for start, k, i in [(0, 0, 0), (0, 3, 0), (0, 3, 3), (2, 5, 2), (len(FILLER) - 2, 6, 4), (1, 40, 20)]:
        text = train.passkey_prompt(FILLER, start, k, i, key)
        assert text == spec_prompt(FILLER, start, k, i, key), (start, k, i)
    assert train.passkey_prompt(FILLER, 5, 0, 0, "7") == (
        TASK + " The pass key is 7. Remember it. 7 is the pass key. " + QUESTION)
    text = train.passkey_prompt(["A b.", "C d!"], 1, 3, 1, "123")
    assert text == (TASK + " C d! The pass key is 123. Remember it. 123 is the pass key. A b. C d! " + QUESTION)


def test_depth_rounds_half_away_from_zero():
    for depth in (0, 0.1, 0.25, 0.3, 0.5, 0.75, 0.9, 1):
        for k in range(0, 41):
            assert train.round_half_away(depth * k) == spec_round(depth * k), (depth, k)
    assert [train.round_half_away(x) for x in (0.5, 1.5, 2.5, 0.49999999999999994)] == [1, 2, 3, 0]


@pytest.mark.parametrize("start", [0, 7])
def test_prompt_length_rule(sp, start):
    """At most `length` tokens (BOS included); one more sentence would not fit, so
    the prompt is within one sentence of the length; the key after round(depth k)."""
    key = "90210"
    bare = n_tokens(sp, spec_prompt(FILLER, start, 0, 0, key))
    for length in (bare, bare + 1, 90, 130, 200, 247, 256):
        for depth in (0, 0.25, 0.5, 0.77, 1):
            ids, k, i = train.passkey_prompt_ids(sp, FILLER, start, depth, key, length)
            assert i == spec_round(depth * k)
            text = spec_prompt(FILLER, start, k, i, key)
            assert ids == [BOS] + sp.encode(text)
            assert len(ids) <= length
            longer = spec_prompt(FILLER, start, k + 1, spec_round(depth * (k + 1)), key)
            assert n_tokens(sp, longer) > length, (length, depth, k)
            next_sentence = FILLER[(start + k) % len(FILLER)]
            assert length - len(ids) < len(sp.encode(next_sentence)), (length, depth, k)
    with pytest.raises(ValueError, match=f"length {bare - 1} .*{bare} tokens"):
        train.passkey_prompt_ids(sp, FILLER, start, 0.5, key, bare - 1)


def test_training_sample(sp):
    rng = np.random.default_rng(5)
    digits_seen = set()
    for _ in range(120):
        ids, a, info = train.passkey_sample(sp, FILLER, rng, 256, (3, 7))
        key = info["key"]
        assert re.fullmatch(r"[1-9][0-9]{2,6}", key), key
        digits_seen.add(len(key))
        assert 0 <= info["start"] < len(FILLER) and 0 <= info["depth"] < 1
        assert info["i"] == spec_round(info["depth"] * info["k"])
        prompt = spec_prompt(FILLER, info["start"], info["k"], info["i"], key)
        assert ids[:a] == [BOS] + sp.encode(prompt)  # the prompt exactly as run encodes it
        assert ids == [BOS] + sp.encode(prompt + f" {key}.")  # then the answer " {key}."
        assert a <= info["length"] and len(ids) <= 256  # room for at least one more token
        bare = n_tokens(sp, spec_prompt(FILLER, info["start"], 0, 0, key))
        assert bare <= info["length"] <= 256 - (len(ids) - a)
        longer = spec_prompt(FILLER, info["start"], info["k"] + 1,
                             spec_round(info["depth"] * (info["k"] + 1)), key)
        assert n_tokens(sp, longer) > info["length"]
    assert digits_seen == {3, 4, 5, 6, 7}
    # the same generator state, the same samples; another seed, others
    a1 = [train.passkey_sample(sp, FILLER, np.random.default_rng(9), 256)[0] for _ in range(3)]
    a2 = [train.passkey_sample(sp, FILLER, np.random.default_rng(9), 256)[0] for _ in range(3)]
    b = train.passkey_sample(sp, FILLER, np.random.default_rng(10), 256)[0]
    assert a1 == a2 and a1[0] != b


def spec_get_batch(stream, seed, step, batch, seq_len):
    """The documented book windows: BOS + seq_len - 1 tokens at offsets from rng([seed, step])."""
    offs = np.random.default_rng([seed, step]).integers(0, len(stream) - seq_len, size=batch)
    seqs = np.stack([np.concatenate([[BOS], stream[o:o + seq_len]]) for o in offs]).astype(np.int64)
    return torch.from_numpy(seqs[:, :-1]), torch.from_numpy(seqs[:, 1:])


STREAM = (np.arange(200_000) % 3000 + 500).astype(np.int32)  # consecutive ids: a slice is recognizable


def test_passkey_mix_zero_leaves_the_batch_unchanged(sp):
    assert train.parse_args([]).passkey_mix == 0.0
    for step in (0, 1, 17):
        x, y = train.get_batch(STREAM, 1337, step, 16, 256)
        sx, sy = spec_get_batch(STREAM, 1337, step, 16, 256)
        assert torch.equal(x, sx) and torch.equal(y, sy)
        mx, my, mask = train.get_mixed_batch(STREAM, 1337, step, 16, 256, 0.0, sp, FILLER)
        assert mask is None and torch.equal(mx, x) and torch.equal(my, y)
        assert mx.dtype == x.dtype == torch.int64
    assert train.passkey_mix_count(0.01, 16) == 0  # rounds to no passkey window at all


def test_mixed_batch(sp):
    seed, step, batch, seq_len = 1337, 3, 16, 256
    x0, y0 = train.get_batch(STREAM, seed, step, batch, seq_len)
    x, y, mask = train.get_mixed_batch(STREAM, seed, step, batch, seq_len, 0.25, sp, FILLER, (3, 7))
    assert x.shape == y.shape == mask.shape == (batch, seq_len) and x.dtype == torch.int64
    n_pk = train.passkey_mix_count(0.25, batch)
    assert n_pk == 4
    assert torch.equal(x[:batch - n_pk], x0[:batch - n_pk]) and torch.equal(y[:batch - n_pk], y0[:batch - n_pk])
    assert not mask[:batch - n_pk].any()
    q = sp.encode(QUESTION)
    for b in range(batch - n_pk, batch):
        seq = [int(x[b, 0])] + y[b].tolist()
        assert torch.equal(x[b, 1:], y[b, :-1]) and seq[0] == BOS
        m = mask[b].nonzero().flatten().tolist()
        assert m == list(range(m[0], m[-1] + 1))  # one run of targets
        answer = y[b, m[0]:m[-1] + 1].tolist()
        text = sp.decode(answer)
        assert re.fullmatch(r"[1-9][0-9]{2,6}\.", text), text
        assert sp.encode(f"{QUESTION} {text}")[len(q):] == answer  # " {key}." after the question
        prompt = sp.decode(seq[1:m[0] + 1])
        assert prompt.startswith(TASK + " ") and prompt.endswith(" " + QUESTION)
        assert f"The pass key is {text[:-1]}. Remember it. {text[:-1]} is the pass key." in prompt
        rest = seq[m[-1] + 2:]  # after the answer: BOS, then a slice of the stream
        assert rest[0] == BOS
        book = np.array(rest[1:])
        assert len(book) == 0 or (np.diff(book) % 3000 == 1).all()
    again = train.get_mixed_batch(STREAM, seed, step, batch, seq_len, 0.25, sp, FILLER, (3, 7))
    assert all(torch.equal(a, b) for a, b in zip(again, (x, y, mask)))
    other = train.get_mixed_batch(STREAM, seed, step + 1, batch, seq_len, 0.25, sp, FILLER, (3, 7))
    assert not torch.equal(other[0][-n_pk:], x[-n_pk:])
    five = train.get_mixed_batch(STREAM, seed, step, batch, seq_len, 0.25, sp, FILLER, (5, 5))
    assert (five[2].sum(1)[-n_pk:] == 5 + 2).all()  # "▁", five digits, "."


def test_training_filler_leaves_the_heldout_books_out(tmp_path):
    books = tmp_path / "data" / "books"
    books.mkdir(parents=True)

    def book(name, body):
        (books / name).write_text(f"header\n*** START OF THE BOOK ***\n{body}\n*** END OF THE BOOK ***\nlicence\n")

    book("a_train.txt", "First line of a\nwrapped paragraph. Second one!\n\nNew paragraph here.")
    book("b_train.txt", "Bee book. Ends")
    book("moby_dick.txt", "Call me Ishmael. Held out.")
    book("pride_and_prejudice.txt", "It is a truth. Held out too.")
    assert train.passkey_train_filler(tmp_path) == [
        "First line of a wrapped paragraph.", "Second one!", "New paragraph here.", "Bee book.", "Ends"]
    assert train.passkey_eval_filler(tmp_path) == ["Call me Ishmael.", "Held out."]


class ScriptedModel(torch.nn.Module):
    """Stands in for the model: after prompt j it 'predicts' continuation j, token by token."""

    def __init__(self, items, continuations, vocab):
        super().__init__()
        self.items, self.conts, self.vocab = items, continuations, vocab

    def forward(self, x):
        out = torch.zeros(x.shape[0], x.shape[1], self.vocab)
        for r in range(x.shape[0]):
            row = x[r].tolist()
            j = next(j for j, it in enumerate(self.items) if row[:len(it["ids"])] == it["ids"])
            n, cont = len(self.items[j]["ids"]), self.conts[j]
            for p in range(n - 1, x.shape[1]):
                out[r, p, cont[min(p - n + 1, len(cont) - 1)]] = 1.0
        return out


def test_evaluation_scores_like_run(sp):
    items = train.passkey_eval_set(sp, FILLER, 256, 10, 5)
    assert len(items) == 10 and [it["depth"] for it in items[:5]] == [0, 0.25, 0.5, 0.75, 1]
    assert items == train.passkey_eval_set(sp, FILLER, 256, 10, 5)  # fixed prompts
    q = sp.encode(QUESTION)

    def after_question(text):
        return sp.encode(f"{QUESTION}{text}")[len(q):]

    conts, want = [], []
    for j, it in enumerate(items):
        key = it["key"]
        assert re.fullmatch(r"[1-9][0-9]{4}", key)
        assert len(it["ids"]) <= 256 - 9
        assert it["ids"] == [BOS] + sp.encode(spec_prompt(FILLER, it["start"], it["k"], it["i"], key))
        case = j % 5
        if case == 0:  # the answer, then more text
            conts.append(after_question(f" {key}. Remember it.")), want.append(key)
        elif case == 1:  # a wrong digit
            wrong = key[:-1] + str((int(key[-1]) + 1) % 10)
            conts.append(after_question(f" {wrong}.")), want.append(wrong)
        elif case == 2:  # one digit too many
            conts.append(after_question(f" {key}7 and")), want.append(key + "7")
        elif case == 3:  # words first, then the key: the first digit run counts
            conts.append(after_question(f" the {key}.")), want.append(key)
        else:  # EOS at once: no answer
            conts.append([EOS]), want.append("")
    model = ScriptedModel(items, conts, sp.vocab_size())
    acc, by_depth, answers = train.passkey_accuracy(model, sp, items, 5 + 4, batch=4)
    assert answers == want
    assert acc == pytest.approx(4 / 10)
    assert by_depth == {0: 1.0, 0.25: 0.0, 0.5: 0.0, 0.75: 1.0, 1: 0.0}


def test_evaluation_prompts_on_the_heldout_book(sp):
    book = SHARED / "data" / "books" / train.PASSKEY_EVAL_BOOK
    if not book.is_file():
        pytest.skip(f"{book} not found: the held-out filler check needs the shared folder "
                    "(set SHARED_DIR)")
    filler = train.passkey_eval_filler(SHARED)
    assert filler == spec_sentences(train.prepare_data.clean_book(book))
    items = train.passkey_eval_set(sp, filler, 256, 50, 5)
    assert len(items) == 50
    for t, it in enumerate(items):
        assert it["depth"] == (0, 0.25, 0.5, 0.75, 1)[t % 5]
        assert it["ids"] == [BOS] + sp.encode(spec_prompt(filler, it["start"], it["k"], it["i"], it["key"]))
        assert len(it["ids"]) <= 247 < len(it["ids"]) + len(sp.encode(filler[(it["start"] + it["k"]) % len(filler)]))
    assert len({it["key"] for it in items}) == 50
