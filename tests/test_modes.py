"""The command line's contract (docs/command-line.md; docs/rope.md §12
for -m rope and -m ppl), mode by mode.

generate: stdout is the prompt, the continuation and one final newline;
chat: multi-turn over stdin; tokenize; ppl windows and stride; rope; the
golden stories260K text. `make sanitize` runs this file against the
ASan+UBSan build as well (RUN=./run-san).
"""

import json
import math

import numpy as np
import pytest

from conftest import (MODELS, SYN_VOCAB, TEXT, check_error, make_model, need_shared, run,
                      run_ok, tokenize)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path, cfg, _ = make_model(tmp_path_factory.mktemp("modes"), seed=3, n_kv_heads=2, seq_len=64)
    return path


def test_help_lists_every_flag():
    """--help is an overview that fits a screen; --help MODE lists the flags
    MODE reads, and every flag is listed under some mode."""
    overview = run_ok("--help").stdout.decode()
    assert len(overview.splitlines()) <= 30, overview
    for mode in ("generate", "chat", "ppl", "tokenize", "rope", "passkey"):
        assert mode in overview, f"--help does not list mode {mode}"
    out = "".join(run_ok("--help", mode).stdout.decode()
                  for mode in ("generate", "chat", "ppl", "tokenize", "rope", "passkey"))
    for flag in ("-t", "-p", "--top-k", "--min-p", "--repeat-penalty", "--repeat-last-n", "-s", "-n",
                 "-i", "-f", "-z", "-m", "-y", "--ctx", "--rope-scaling", "--rope-factor",
                 "--rope-base", "--rope-orig-ctx", "--yarn-beta-fast", "--yarn-beta-slow",
                 "--rope-attn-factor", "--yarn-attn-factor", "--llama3-low-freq", "--llama3-high-freq",
                 "--json", "--stride", "--rope-dynamic", "--self-extend", "--window", "--sinks", "--streaming",
                 "--save-logits", "--kl-base", "--lengths", "--depths", "--trials", "--key-digits",
                 "--skip-draws", "--prompts-only", "--chat", "--chat-template", "--kv", "--q8-activations", "--threads",
                 "--ignore-eos", "--per-position", "--attn-stats"):
        assert flag in out, f"no --help MODE mentions {flag}"


@pytest.mark.parametrize("args,flag", [
    (["-m", "ppl", "-f", TEXT, "-t", "0"], "-t"),
    (["-m", "tokenize", "-i", "hi", "--stride", "3"], "--stride"),
    (["-m", "rope", "--lengths", "64"], "--lengths"),
    (["-i", "hi", "-y", "be brief"], "-y"),
])
def test_flag_the_mode_does_not_read_is_bad_usage(model, syn_tokenizer, args, flag):
    """A flag the chosen mode does not read is refused: one line naming the
    flag and the mode, exit 2."""
    p = run(model, *([] if "rope" in args else ["-z", syn_tokenizer]), *args)
    check_error(p, 2, [flag])
    first = p.stderr.decode().splitlines()[0]
    mode = args[args.index("-m") + 1] if "-m" in args else "generate"
    assert f"-m {mode}" in first, first


def test_generate_prints_prompt_then_continuation(model, syn_tokenizer):
    prompt = "the cat sat"
    p = run_ok(model, "-z", syn_tokenizer, "-t", "0", "-n", "12", "-i", prompt)
    out = p.stdout.decode()
    assert out.startswith(prompt), out
    assert out.endswith("\n")
    assert len(out) > len(prompt) + 1, "no continuation"
    # -n 0: the prompt alone
    p0 = run_ok(model, "-z", syn_tokenizer, "-t", "0", "-n", "0", "-i", prompt)
    assert p0.stdout.decode() == prompt + "\n"
    # greedy is a prefix chain: 12 new tokens extend 5 new tokens
    p5 = run_ok(model, "-z", syn_tokenizer, "-t", "0", "-n", "5", "-i", prompt)
    assert out.startswith(p5.stdout.decode()[:-1])
    assert b"tok/s" in p.stderr and b"tok/s" not in p.stdout


def test_generate_counts_new_tokens_and_stops_at_full_context(model, syn_tokenizer):
    prompt = "the dog ran"
    n_prompt = len(tokenize(model, syn_tokenizer, prompt))
    # -n counts only new tokens (stderr reports them)
    p = run_ok(model, "-z", syn_tokenizer, "-t", "0", "-n", "7", "-i", prompt)
    assert f"{n_prompt} prompt + 7 new tokens" in p.stderr.decode() or b"new tokens" in p.stderr
    # context 16: at most 16 - n_prompt + 1 new tokens, then a clean stop
    p = run_ok(model, "-z", syn_tokenizer, "-t", "0", "-n", "500", "--ctx", "16", "-i", prompt)
    new = int(p.stderr.decode().split(" prompt + ")[1].split(" new")[0])
    assert 1 <= new <= 16 - n_prompt + 1


def test_prompt_longer_than_context_is_bad_input(model, syn_tokenizer):
    p = run(model, "-z", syn_tokenizer, "--ctx", "8", "-i", TEXT)
    check_error(p, 1, ["prompt", "--ctx"])


def test_same_seed_same_text_at_any_thread_count(model, syn_tokenizer, monkeypatch):
    args = (model, "-z", syn_tokenizer, "-t", "1.0", "-p", "0.95", "-s", "7", "-n", "40", "-i", "the")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    a = run_ok(*args).stdout
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    b = run_ok(*args).stdout
    c = run_ok(*args[:-4], "-s", "8", "-n", "40", "-i", "the").stdout
    assert a == b
    assert a != c, "a different seed should give a different sample"


def test_sampling_flags_run(model, syn_tokenizer):
    for extra in (["-k", "5"], ["--min-p", "0.1"], ["--repeat-penalty", "1.3", "--repeat-last-n", "8"],
                  ["-t", "0.7", "-p", "0.5"]):
        run_ok(model, "-z", syn_tokenizer, "-s", "1", "-n", "10", "-i", "a", *extra)


def test_tokenize_includes_bos(model, syn_tokenizer):
    ids = tokenize(model, syn_tokenizer, "the end")
    assert ids[0] == 1 and len(ids) > 1 and all(0 <= i < SYN_VOCAB for i in ids)


def test_chat_is_multi_turn(model, syn_tokenizer):
    p = run_ok(model, "-z", syn_tokenizer, "-m", "chat", "-t", "0", "-n", "5", "-y", "be kind",
               "-i", "hi there")
    assert p.stdout.count(b"Assistant: ") == 1
    # turns from stdin, one per line, any length
    long_turn = b"the cat " * 3
    p = run(model, "-z", syn_tokenizer, "-m", "chat", "-t", "0", "-n", "4", "--ctx", "256",
            input=b"hello\n" + long_turn + b"\nbye\n")
    assert p.returncode == 0, p.stderr
    assert p.stdout.count(b"Assistant: ") == 3
    assert p.stdout.count(b"User: ") == 4  # the fourth finds end of input


def test_ppl_windows_and_stride(model, syn_tokenizer, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text(TEXT * 3)
    n = len(tokenize(model, syn_tokenizer, TEXT * 3)) - 1  # without BOS
    ctx = 32
    r = json.loads(run_ok(model, "-z", syn_tokenizer, "-m", "ppl", "-f", text, "--ctx", str(ctx),
                          "--json").stdout)
    assert r["tokens"] == n, "every text token is scored exactly once"
    assert r["windows"] == math.ceil(n / (ctx - 1))
    assert abs(r["ppl"] - math.exp(r["nll"])) < 1e-3 * r["ppl"]
    assert sum(b["tokens"] for b in r["buckets"]) == n
    assert [b["start"] for b in r["buckets"]] == [0, 32][:len(r["buckets"])]
    # stride 8: every token still scored once, with more context on average
    s = json.loads(run_ok(model, "-z", syn_tokenizer, "-m", "ppl", "-f", text, "--ctx", str(ctx),
                          "--stride", "8", "--json").stdout)
    assert s["tokens"] == n
    assert s["windows"] == 1 + math.ceil((n - (ctx - 1)) / 8)
    # text output carries the same numbers
    t = run_ok(model, "-z", syn_tokenizer, "-m", "ppl", "-f", text, "--ctx", str(ctx)).stdout.decode()
    assert f"nll {r['nll']:.4f}" in t


def test_ppl_buckets_follow_training_length(model, syn_tokenizer, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text(TEXT * 4)
    r = json.loads(run_ok(model, "-z", syn_tokenizer, "-m", "ppl", "-f", text, "--ctx", "256",
                          "--json").stdout)
    edges = [(b["start"], b["end"]) for b in r["buckets"]]
    assert edges[:3] == [(0, 32), (32, 64), (64, 128)], edges  # L = seq_len = 64


def test_rope_mode_json_matches_formula(model):
    r = json.loads(run_ok(model, "-m", "rope", "--json").stdout)
    d = r["rot_dim"]
    expect = 10000.0 ** (-np.arange(0, d, 2) / d)
    assert r["scaling"] == "none" and r["attn_factor"] == 1
    np.testing.assert_allclose(r["inv_freq"], expect, rtol=1e-12)
    y = json.loads(run_ok(model, "-m", "rope", "--json", "--rope-scaling", "yarn",
                          "--rope-factor", "4").stdout)
    assert abs(y["attn_factor"] - (0.1 * math.log(4) + 1)) < 1e-12
    # fast pairs kept (extrapolated), slow pairs divided by the factor (interpolated)
    assert y["status"][0] == "extrapolated" and y["status"][-1] == "interpolated"
    assert y["ratio"][0] == 1 and abs(y["ratio"][-1] - 0.25) < 1e-12
    assert set(r["status"]) == {"extrapolated"}
    lines = run_ok(model, "-m", "rope").stdout.decode().splitlines()
    assert len(lines) == 2 + d // 2


def test_stories260k_golden_greedy():
    ckpt, tok, golden = need_shared("stories260K.bin", "tok512.bin", "stories260K.greedy.txt")
    p = run_ok(ckpt, "-z", tok, "-t", "0", "-n", "512")
    assert p.stdout == golden.read_bytes()


def test_stories260k_default_tokenizer_lookup(tmp_path):
    """-z defaults to tokenizer.bin beside the checkpoint."""
    ckpt, tok = need_shared("stories260K.bin", "tok512.bin")
    (tmp_path / "m.bin").symlink_to(ckpt)
    (tmp_path / "tokenizer.bin").symlink_to(tok)
    p = run_ok(tmp_path / "m.bin", "-t", "0", "-n", "8", "-i", "Once")
    assert p.stdout.startswith(b"Once")


@pytest.mark.parametrize("args, flag", [
    (["--self-extend", "4"], "--self-extend"),
    (["--self-extend", "0", "8"], "--self-extend"),
    (["--self-extend", "4", "x"], "--self-extend"),
    (["--rope-dynamic", "sometimes"], "--rope-dynamic"),
    (["--rope-scaling", "dynamic", "--rope-factor", "2", "--self-extend", "4", "8"], "--self-extend"),
])
def test_extrapolation_flags_are_checked(model, syn_tokenizer, args, flag):
    p = run(model, "-z", syn_tokenizer, "-n", "1", *args)
    check_error(p, 2, [flag])


@pytest.mark.parametrize("args, given", [
    (["--self-extend", "32", "--ctx", "256"], "--self-extend 32"),
    (["--ctx", "256", "--self-extend", "32"], "--self-extend 32"),
    (["--self-extend", "--ctx", "256"], "--self-extend"),
])
def test_self_extend_without_w_says_it_needs_g_and_w(model, syn_tokenizer, args, given):
    """--self-extend G W takes two numbers: with one, or none, before the next
    flag or the end, the message says it needs G and W (it used to read the
    next flag as W: "--self-extend W --ctx: expected an integer")."""
    p = run(model, "-z", syn_tokenizer, "-n", "1", *args)
    check_error(p, 2, [f"{given}: needs two values, G and W"])


def self_extend_reach(G, L, W):
    """docs/rope.md §10.2: the context Self-Extend covers, G (L - W) + G floor(W/G)."""
    return G * (L - W) + G * (W // G)


@pytest.mark.parametrize("G, W, ctx", [(4, 8, 256), (2, 30, 4000), (5, 8, 256), (8, 8, 64), (4, 64, 256)])
def test_self_extend_past_the_training_length_is_a_warning(model, syn_tokenizer, G, W, ctx):
    """A G and W that leave relative positions past the training length L = 64
    (ctx > G (L - W) + G floor(W/G), docs/rope.md §10.2) get one notice line
    that states the rule, its value and the smallest G that fits; the run goes
    on (exit 0). A G that covers the context, or a context within L, gets
    none; a window W >= L cannot fit at any G, and the notice says W < L."""
    p = run(model, "-z", syn_tokenizer, "-n", "1", "-i", "the", "--ctx", str(ctx), "--self-extend", str(G), str(W))
    assert p.returncode == 0, p.stderr
    notes = [line for line in p.stderr.decode().splitlines() if line.startswith(f"--self-extend {G} {W}: ")]
    L = 64
    if W >= L and ctx > L:
        assert len(notes) == 1 and "W < L" in notes[0], p.stderr
    elif ctx > L and self_extend_reach(G, L, W) < ctx:
        fits = next(g for g in range(1, ctx + 1) if self_extend_reach(g, L, W) >= ctx)
        assert notes == [f"--self-extend {G} {W}: --ctx {ctx} reaches positions past the training length L = {L}: "
                         f"Self-Extend covers ctx <= G (L - W) + G floor(W/G) = {self_extend_reach(G, L, W)} "
                         f"(docs/rope.md §10.2); G = {fits} fits"], p.stderr
    else:
        assert notes == [], p.stderr


def test_ppl_per_position_agrees_with_buckets(model, syn_tokenizer, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text(TEXT * 2)
    r = json.loads(run_ok(model, "-z", syn_tokenizer, "-m", "ppl", "-f", text, "--ctx", "48", "--json",
                          "--per-position").stdout)
    pp = r["per_position"]
    assert len(pp) == 48 and pp[0] is None and all(v is not None for v in pp[1:])
    ids = len(tokenize(model, syn_tokenizer, TEXT * 2)) - 1
    # tokens per in-window position: every full window scores positions 1..47
    counts = [0] * 48
    for start in range(0, ids, 47):
        for p in range(1, min(47, ids - start) + 1):
            counts[p] += 1
    for b in r["buckets"]:
        total = sum(pp[p] * counts[p] for p in range(max(b["start"], 1), b["end"]))
        assert abs(total / b["tokens"] - b["nll"]) < 1e-4
    check_error(run(model, "-z", syn_tokenizer, "-m", "ppl", "-f", text, "--per-position"), 2, ["--per-position"])


def test_tiny_temperature_and_nan_logits_do_not_crash(model, syn_tokenizer):
    """logits / 1e-40 overflow to inf and softmax gives NaN: the sampler must
    fall back to the most likely token instead of drawing from nothing."""
    greedy = run_ok(model, "-z", syn_tokenizer, "-t", "0", "-n", "6", "-i", "the").stdout
    tiny = run_ok(model, "-z", syn_tokenizer, "-t", "1e-40", "-n", "6", "-s", "1", "-i", "the").stdout
    assert tiny == greedy


def test_first_chat_turn_longer_than_context_is_bad_input(model, syn_tokenizer):
    check_error(run(model, "-z", syn_tokenizer, "-m", "chat", "-c", "12", "-i", "hello there"), 1,
                ["prompt", "--ctx"])


def test_conflicting_rope_flags_are_bad_usage(model, syn_tokenizer):
    p = run(model, "-z", syn_tokenizer, "--rope-scaling", "yarn", "--rope-factor", "2", "--yarn-beta-fast", "1",
            "--yarn-beta-slow", "2", "-i", "a")
    check_error(p, 2, ["--yarn-beta-fast"])


def test_rope_factor_without_a_scaling_method_is_bad_usage(model, syn_tokenizer):
    """An unscaled checkpoint with --rope-factor alone would run unscaled:
    refused, naming the flag; with --rope-scaling it runs."""
    check_error(run(model, "-z", syn_tokenizer, "-n", "1", "--rope-factor", "2"), 2, ["--rope-factor"])
    run_ok(model, "-z", syn_tokenizer, "-n", "1", "--rope-factor", "2", "--rope-scaling", "linear")


@pytest.mark.parametrize("method", ["linear", "ntk", "dynamic", "yarn", "llama3"])
@pytest.mark.parametrize("mode", ["generate", "chat", "ppl", "passkey", "rope"])
def test_scaling_method_without_a_factor_is_bad_usage(model, syn_tokenizer, tmp_path, method, mode):
    """--rope-scaling METHOD with no --rope-factor on a checkpoint that stores
    no factor would run at s = 1 (plain RoPE for all but dynamic): refused in
    every mode that reads it, naming both flags and the factor that reaches
    --ctx; with the factor it runs."""
    text_file = tmp_path / "text.txt"
    text_file.write_text(TEXT)
    mode_args = {"generate": ["-n", "1", "-i", "a"], "chat": ["-m", "chat", "-n", "1", "-i", "a"],
                 "ppl": ["-m", "ppl", "-f", text_file], "passkey": ["-m", "passkey", "--prompts-only"],
                 "rope": ["-m", "rope"]}[mode]
    tok = [] if mode == "rope" else ["-z", syn_tokenizer]
    p = run(model, *tok, *mode_args, "--ctx", "256", "--rope-scaling", method)
    check_error(p, 2, ["--rope-scaling"])
    assert p.stderr.decode().splitlines()[0] == (
        f"--rope-scaling {method}: needs --rope-factor s ({model} stores no factor); to stretch its "
        "train_ctx 64 to --ctx 256, s = 4"), p.stderr
    if mode in ("ppl", "rope"):  # the others do not run the model on these texts
        run_ok(model, *tok, *mode_args, "--ctx", "256", "--rope-scaling", method, "--rope-factor", "4")


def test_scaling_method_without_a_factor_within_the_training_context(model):
    p = run(model, "-m", "rope", "--rope-scaling", "yarn")
    check_error(p, 2, ["--rope-scaling"])
    assert p.stderr.decode().splitlines()[0] == (
        f"--rope-scaling yarn: needs --rope-factor s ({model} stores no factor), e.g. s = ctx / 64 for a "
        "--ctx past its train_ctx 64"), p.stderr
    none = json.loads(run_ok(model, "-m", "rope", "--json", "--rope-scaling", "none").stdout)
    assert none["scaling"] == "none" and none["factor"] == 1


def test_scaling_method_uses_the_stored_factor(tmp_path):
    """A checkpoint that stores a factor lends it to another method given
    without one; LongRoPE without its arrays is refused for those, not for
    the factor."""
    path, _, _ = make_model(tmp_path, seed=4, rope_scaling="yarn", rope_factor=2.0)
    r = json.loads(run_ok(path, "-m", "rope", "--json", "--rope-scaling", "linear").stdout)
    assert (r["scaling"], r["factor"]) == ("linear", 2)
    check_error(run(path, "-m", "rope", "--rope-scaling", "longrope"), 2, ["LongRoPE factor arrays"])
    plain, _, _ = make_model(tmp_path, "plain.bin", seed=4)
    check_error(run(plain, "-m", "rope", "--rope-scaling", "longrope"), 2, ["LongRoPE factor arrays"])


def test_stored_yarn_attention_factor_is_kept_with_a_note(tmp_path, syn_tokenizer):
    """A YaRN checkpoint with a stored magnitude keeps it when --rope-factor
    changes the factor (as Hugging Face keeps a given attention_factor), and
    says so on stderr; --rope-attn-factor (or its old name --yarn-attn-factor)
    replaces it and silences the note."""
    path, _, _ = make_model(tmp_path, seed=4, rope_scaling="yarn", rope_factor=2.0, rope_attn_factor=1.25)

    def rope_json(*flags):
        p = run_ok(path, "-m", "rope", "--json", *flags)
        return json.loads(p.stdout), p.stderr.decode()

    stored, err = rope_json()
    assert stored["attn_factor"] == pytest.approx(1.25) and "keeps the checkpoint's" not in err
    changed, err = rope_json("--rope-factor", "4")
    assert changed["factor"] == 4 and changed["attn_factor"] == pytest.approx(1.25)
    assert "keeps the checkpoint's attention factor" in err, err
    for flag in ("--rope-attn-factor", "--yarn-attn-factor"):
        given, err = rope_json("--rope-factor", "4", flag, "1.5")
        assert given["attn_factor"] == pytest.approx(1.5) and "keeps the checkpoint's" not in err
