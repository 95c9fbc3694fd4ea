"""The position setup every report states (info.c's position_setup_text and
print_position_json): the load line, -m ppl, -m passkey and -m rope, as text
and as the JSON object "position".

For each way keys get their positions (rotated once, per length with
--rope-dynamic exact, Self-Extend, attention sinks) and for the sliding
window, the object holds what the command line and the checkpoint asked for,
checked against the flags the test gave (and, for YaRN's magnitude, its
formula 0.1 ln s + 1); the text line says the same, and the load line, the
ppl text, the passkey text and -m rope print one and the same line for one
setup, so they cannot drift apart.
"""

import json
import math

import pytest

from conftest import TEXT, make_model, run_ok

# Every key of the "position" object, in the order run prints them.
POSITION_KEYS = ["ctx", "layout", "base", "rot_dim", "scaling", "factor", "orig_ctx", "beta_fast", "beta_slow",
                 "attn_factor", "low_freq", "high_freq", "dynamic", "keys", "self_extend", "sinks",
                 "sliding_window", "kv", "kv_bytes_per_position"]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path, _cfg, _ = make_model(tmp_path_factory.mktemp("setup"), seed=5, n_kv_heads=2, seq_len=64)
    return path


@pytest.fixture(scope="module")
def windowed(tmp_path_factory):
    """A checkpoint that stores a sliding window of 16 in layers 1 and up."""
    path, _cfg, _ = make_model(tmp_path_factory.mktemp("setup-window"), seed=6, seq_len=64, sliding_window=16,
                               window_first_layer=1)
    return path


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    path = tmp_path_factory.mktemp("setup-text") / "text.txt"
    path.write_text(TEXT * 2)
    return path


PLAIN = dict(ctx=64, layout="interleaved", base=10000, rot_dim=16, scaling="none", factor=None, orig_ctx=None,
             beta_fast=None, beta_slow=None, attn_factor=None, low_freq=None, high_freq=None, dynamic=None,
             keys="rotated-once", self_extend=None, sinks=None, sliding_window=None, kv="f32")

# (flags, what the position object must hold besides PLAIN's values)
STRATEGIES = {
    "rotated-once": ([], {}),
    "yarn": (["--rope-scaling", "yarn", "--rope-factor", "4", "--ctx", "128"],
             dict(ctx=128, scaling="yarn", factor=4, orig_ctx=64, beta_fast=32, beta_slow=1,
                  attn_factor=0.1 * math.log(4) + 1)),
    "llama3": (["--rope-scaling", "llama3", "--rope-factor", "2", "--rope-orig-ctx", "32"],
               dict(scaling="llama3", factor=2, orig_ctx=32, low_freq=1, high_freq=4)),
    "dynamic-hf": (["--rope-scaling", "dynamic", "--rope-factor", "2"],
                   dict(scaling="dynamic", factor=2, orig_ctx=64, dynamic="hf")),
    "dynamic-exact": (["--rope-scaling", "dynamic", "--rope-factor", "2", "--rope-dynamic", "exact", "--ctx", "96"],
                      dict(ctx=96, scaling="dynamic", factor=2, orig_ctx=64, dynamic="exact", keys="per-length")),
    "self-extend": (["--self-extend", "4", "8", "--ctx", "128"],
                    dict(ctx=128, keys="self-extend", self_extend={"group": 4, "window": 8})),
    "window": (["--window", "12", "--kv", "f16"],
               dict(sliding_window={"size": 12, "first_layer": 0}, kv="f16")),
}


def check_position(got, flags, expected):
    want = dict(PLAIN, **expected)
    assert list(got) == POSITION_KEYS, list(got)
    for key, value in want.items():
        if isinstance(value, float):
            assert got[key] == pytest.approx(value, rel=1e-8), (key, got[key], value, flags)
        else:
            assert got[key] == value, (key, got[key], value, flags)


def ppl_json(model, tok, text, *flags):
    return json.loads(run_ok(model, "-z", tok, "-m", "ppl", "-f", text, "--json", *flags).stdout)


def passkey_json(model, tok, *flags):
    return json.loads(run_ok(model, "-z", tok, "-m", "passkey", "--lengths", "240", "--depths", "0.5",
                             "--trials", "1", "--json", *flags).stdout)


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_ppl_json_states_the_position_setup(model, syn_tokenizer, text, name):
    flags, expected = STRATEGIES[name]
    r = ppl_json(model, syn_tokenizer, text, *flags)
    check_position(r["position"], flags, expected)
    # the keys the tools read stay as they were
    assert r["scaling"] == r["position"]["scaling"] and r["ctx"] == r["position"]["ctx"]


@pytest.mark.parametrize("name", ["rotated-once", "yarn", "dynamic-exact", "self-extend", "window"])
def test_passkey_json_states_the_position_setup(model, syn_tokenizer, name):
    flags, expected = STRATEGIES[name]
    flags = list(flags)
    if "--ctx" in flags:  # passkey sizes its context from --lengths: give the one the case expects
        i = flags.index("--ctx")
        flags[i + 1] = "256"
    expected = dict(expected, ctx=256 if "--ctx" in flags else 249)  # 240 + 5 key digits + 4
    r = passkey_json(model, syn_tokenizer, *flags)
    check_position(r["position"], flags, expected)
    assert r["scaling"] == r["position"]["scaling"]


def test_sinks_in_ppl_and_passkey(model, syn_tokenizer, text):
    """A rolling cache: keys "sinks" and the number of sinks, in ppl
    --streaming and in passkey (the old top-level "sinks" key stays)."""
    expected = dict(ctx=32, keys="sinks", sinks=2)
    r = ppl_json(model, syn_tokenizer, text, "--sinks", "2", "--streaming", "--ctx", "32")
    check_position(r["position"], ["--sinks"], expected)
    assert r["sinks"] == 2
    r = passkey_json(model, syn_tokenizer, "--sinks", "0", "--ctx", "48")
    check_position(r["position"], ["--sinks"], dict(ctx=48, keys="sinks", sinks=0))


def test_stored_window_and_window_off(windowed, syn_tokenizer, text):
    """The checkpoint's window and its first layer; --window 0 turns it off."""
    r = ppl_json(windowed, syn_tokenizer, text)
    check_position(r["position"], [], dict(sliding_window={"size": 16, "first_layer": 1}))
    r = ppl_json(windowed, syn_tokenizer, text, "--window", "0")
    check_position(r["position"], ["--window", "0"], {})


def test_rope_json_states_the_position_setup(model):
    """-m rope reads the position flags too, to show a setup without a tokenizer."""
    for name in ("yarn", "self-extend", "window", "dynamic-exact"):
        flags, expected = STRATEGIES[name]
        r = json.loads(run_ok(model, "-m", "rope", "--json", *flags).stdout)
        check_position(r["position"], flags, expected)
        if expected.get("attn_factor"):
            assert r["position"]["attn_factor"] == pytest.approx(r["attn_factor"], rel=1e-8)
    r = json.loads(run_ok(model, "-m", "rope", "--json", "--sinks", "4").stdout)
    check_position(r["position"], ["--sinks"], dict(keys="sinks", sinks=4))


def position_line(stdout):
    lines = [line for line in stdout.decode().splitlines() if line.startswith("position: ")]
    assert len(lines) == 1, stdout[:500]
    return lines[0][len("position: "):]


@pytest.mark.parametrize("name", ["yarn", "dynamic-exact", "self-extend", "window"])
def test_every_report_prints_the_same_setup_line(model, syn_tokenizer, text, name):
    """ppl's text, passkey's text, -m rope's text and their load lines carry
    one and the same position line."""
    flags, _expected = STRATEGIES[name]
    if "--ctx" in flags:
        flags = flags[:flags.index("--ctx")] + flags[flags.index("--ctx") + 2:]
    flags = [*flags, "--ctx", "256"]  # room for passkey's shortest prompt under the synthetic tokenizer
    ppl = run_ok(model, "-z", syn_tokenizer, "-m", "ppl", "-f", text, *flags)
    line = position_line(ppl.stdout)
    rope = run_ok(model, "-m", "rope", *flags)
    assert position_line(rope.stdout) == line
    assert line in ppl.stderr.decode() and line in rope.stderr.decode()  # the load lines
    passkey = run_ok(model, "-z", syn_tokenizer, "-m", "passkey", "--lengths", "240", "--depths", "0.5",
                     "--trials", "1", *flags)
    assert position_line(passkey.stdout) == line
    # what the line says, in words
    words = {"yarn": ["scaling yarn (factor 4, orig_ctx 64, beta_fast 32, beta_slow 1, attn_factor 1.138629436)",
                      "keys rotated-once"],
             "dynamic-exact": ["scaling dynamic (factor 2, orig_ctx 64, dynamic exact)", "keys per-length"],
             "self-extend": ["keys self-extend", "self-extend G 4 W 8", "sinks off", "window off"],
             "window": ["window 12 (layers 0..1)", "KV cache f16", "self-extend off"]}[name]
    for w in words:
        assert w in line, (w, line)
