"""The study's configuration: the factors, methods and studies it measures
(FULL, and QUICK for --quick), each method's flags at a factor (method_flags),
and the cells' names (study_method_kx).

tools/extrapolation.py's docstring says what each study and method is."""

FACTORS = (1, 2, 4, 8, 16)
SMOL_FACTORS = (0.25, 0.5, 1, 2, 4)
SMOL_PASSKEY_FACTORS = (0.25, 0.5, 1, 2)
METHODS = ("none", "linear", "ntk", "dynamic-hf", "dynamic-exact", "yarn", "llama3", "self-extend")
ROWS = METHODS + ("sinks",)
SINKS = 4
DEPTHS = (0, 0.25, 0.5, 0.75, 1)
ANSWER_TOKENS = 5 + 4  # run -m passkey's default: 5-digit keys, answered in digits + 4 tokens
CHAT_ANSWER_TOKENS = 5 + 16  # the chat form's (docs/passkey.md section 4): the reply may restate the question
Z95 = 1.96

# The studies: what each measures and how much. "tokens": the evaluation text's
# size (at most; a prefix cut at white space); "trials": passkey keys per
# (length, depth) cell, or a dict k -> trials.
FULL = {
    "bundled": dict(kind="ppl", factors=FACTORS, rows=ROWS, tokens=16384),
    "stories260K": dict(kind="ppl", factors=FACTORS, rows=ROWS, tokens=16384),
    "retrieval": dict(kind="passkey", factors=FACTORS, rows=ROWS, depths=DEPTHS, trials=5),
    # SmolLM2 (L = 8192): every method; 98,304 tokens of the held-out books, so
    # that 4x has 3 windows of 32,768 tokens (2x: 6, 1x: 12). At k <= 1 the
    # methods change nothing and only none runs.
    "smollm2": dict(kind="ppl", factors=SMOL_FACTORS, rows=ROWS, tokens=3 * 4 * 8192),
    # Passkey in both prompt forms (docs/passkey.md): plain text, and the
    # chat form (--chat: the checkpoint's template, the question as one user
    # turn). 10 keys per (length, depth) up to 1x; at 2x, every method with 5
    # keys (a 16k-token prompt costs SmolLM2 about 3.5 CPU-minutes, so each
    # such cell is about 50 CPU-minutes, exact dynamic NTK's about three times that).
    "smollm2-passkey": dict(kind="passkey", factors=SMOL_PASSKEY_FACTORS, rows=ROWS, depths=(0, 0.5, 1), trials=10,
                            at={2: dict(trials=5)},
                            note="a 16k-token prompt costs SmolLM2 about 3.5 CPU-minutes"),
    "smollm2-chat": dict(kind="passkey", factors=SMOL_PASSKEY_FACTORS, rows=ROWS, depths=(0, 0.5, 1), trials=10,
                         at={2: dict(trials=5)}, chat=True,
                         note="a 16k-token prompt costs SmolLM2 about 3.5 CPU-minutes"),
}
# --quick: every kind of cell (every method, sinks, a passkey heatmap, SmolLM2's
# "= none" cells) on little text, a few minutes on 2 cores.
QUICK = {
    "bundled": dict(kind="ppl", factors=(1, 4), rows=ROWS, tokens=2048),
    "retrieval": dict(kind="passkey", factors=(1, 4), rows=ROWS, depths=(0, 0.5, 1), trials=1),
    "smollm2": dict(kind="ppl", factors=(0.25,), rows=ROWS, tokens=2048),
    "smollm2-passkey": dict(kind="passkey", factors=(0.25,), rows=ROWS, depths=(0.5,), trials=1),
    "smollm2-chat": dict(kind="passkey", factors=(0.25,), rows=ROWS, depths=(0.5,), trials=1, chat=True),
}


def self_extend_reach(G, L, W):
    """Tokens Self-Extend with group size G and window W covers for a model
    trained on L: a query at position m sees a far key at n at relative
    position floor(m/G) - floor(n/G) + W - floor(W/G), largest for n = 0, and
    that stays below L exactly while m < G (L - W) + G floor(W/G). When G
    divides W this is the familiar (L - W) G + W; otherwise it is less."""
    return G * (L - W) + G * (W // G)


def self_extend_group(E, L, W):
    """The smallest group size G >= 1 whose reach covers a context of E tokens."""
    if W >= L:
        raise ValueError(f"Self-Extend window W = {W} must be below the training length L = {L}")
    G = 1
    while self_extend_reach(G, L, W) < E:
        G += 1
    return G


def num(k):
    """A factor as the command line writes it: 2, not 2.0."""
    return str(int(k)) if float(k).is_integer() else str(k)


def method_flags(method, k, L):
    """Command-line flags for one method at context k * L (no scaling at k <= 1;
    Self-Extend then has G = 1, which moves no position). sinks: the rolling
    cache only; its --ctx (L) and --streaming are the caller's."""
    if method == "sinks":
        return ["--sinks", str(SINKS)]
    if method == "none" or (k <= 1 and method != "self-extend"):
        return []
    if method == "linear":
        return ["--rope-scaling", "linear", "--rope-factor", num(k)]
    if method == "ntk":
        return ["--rope-scaling", "ntk", "--rope-factor", num(2 * k)]
    if method == "dynamic-hf":
        return ["--rope-scaling", "dynamic", "--rope-factor", num(k), "--rope-dynamic", "hf"]
    if method == "dynamic-exact":
        return ["--rope-scaling", "dynamic", "--rope-factor", num(k), "--rope-dynamic", "exact"]
    if method == "yarn":
        return ["--rope-scaling", "yarn", "--rope-factor", num(k)]
    if method == "llama3":
        return ["--rope-scaling", "llama3", "--rope-factor", num(k)]
    if method == "self-extend":
        W = L // 2
        G = self_extend_group(round(k * L), L, W)
        return ["--self-extend", str(G), str(W)]
    raise ValueError(f"unknown method {method!r}")


def factor_label(k):
    """1x, 2x, 1/4x."""
    if float(k).is_integer():
        return f"{int(k)}x"
    return f"1/{round(1 / k)}x"


def cell_name(study, method, k):
    """A cell's name, which is also its file's: study_method_kx, e.g.
    bundled_yarn_4x, smollm2_none_0.25x (no study or method has a '_')."""
    return f"{study}_{method}_{num(k)}x"


def parse_cell_name(name):
    """(study, method, k) of a cell name; ValueError if it is not one."""
    parts = name.split("_")
    if len(parts) != 3 or not parts[2].endswith("x"):
        raise ValueError(f"cell {name!r}: expected STUDY_METHOD_Kx, e.g. bundled_yarn_4x")
    try:
        k = float(parts[2][:-1])
    except ValueError:
        raise ValueError(f"cell {name!r}: the factor {parts[2]!r} is not a number followed by x") from None
    return parts[0], parts[1], int(k) if k.is_integer() else k
