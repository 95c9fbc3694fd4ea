"""The plan of cells. A Study is one model, its training context L and the
cells it measures; make_studies makes the plan's studies whose files are here
(their texts made in a work folder); ppl_jobs and passkey_jobs give every cell
of a study as a job (its name, the command shown, a runner, a rough cost). The
plan itself is the options that choose the studies (make_plan: --quick,
--studies, --tokens, --passkey-model), which every cell file records."""
import json
import shlex
import subprocess
import sys
from pathlib import Path

from .commands import (ROOT, RUN, SHARED, Where, passkey_by_trials, passkey_command, ppl_command, run_json,
                       stream_cell_command)
from .config import ANSWER_TOKENS, CHAT_ANSWER_TOKENS, FULL, QUICK, cell_name, method_flags
from .texts import TokenCounter, prefix_bytes, stream_cell

# SmolLM2-135M-Instruct as `make smollm2` fetches it. run reads its Q4_1
# weights as q8_0, the same weights and logits as the model-q8_0.bin that
# make smollm2 converted them to before (and make smollm2-export still
# writes), which the study's SmolLM2 cells of 2026-12 record.
SMOLLM2 = ROOT / "models" / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_BEFORE = "models/smollm2/model-q8_0.bin"


class Study:
    """One study: a model, its training context L, and the cells to measure."""

    def __init__(self, name, kind, ckpt, tok, L, factors, rows, data="", text=None, text_recipe=(),
                 tokens=None, depths=(), trials=None, filler=None, at=None, note="", chat=False):
        self.name, self.kind, self.ckpt, self.tok, self.L = name, kind, Path(ckpt), tok, L
        self.factors, self.rows, self.data = tuple(factors), tuple(rows), data
        self.text, self.text_recipe, self.tokens = text, list(text_recipe), tokens
        self.depths, self.trials, self.filler = tuple(depths), trials, filler
        self.at = at or {}  # k -> {"depths", "trials"}: what differs at that factor
        self.note = note  # why the plan differs by length, for the table
        self.title = name.replace("-passkey", "")  # smollm2-passkey is smollm2's passkey study
        self.chat = chat  # passkey: the prompts in the checkpoint's chat template (run -m passkey --chat)
        self.answer_tokens = CHAT_ANSWER_TOKENS if chat else ANSWER_TOKENS  # a prompt is k L - this
        # Up to the training context the methods change nothing; a study with
        # factors below 1 (SmolLM2) runs none alone at k <= 1.
        self.reuse_below_1 = min(self.factors) < 1

    def trials_at(self, k):
        return self.at.get(k, {}).get("trials", self.trials)

    def depths_at(self, k):
        return tuple(self.at.get(k, {}).get("depths", self.depths))

    def ctx(self, k):
        return round(k * self.L)

    def cells(self):
        """(method, k) of the cells to run: every method at every factor, but
        at k <= 1 (reuse_below_1) only none."""
        return [(m, k) for m in self.rows for k in self.factors if not self.same_as_none(m, k)]

    def same_as_none(self, method, k):
        return self.reuse_below_1 and k <= 1 and method != "none"


def job_cost(study, method, tokens, E):
    """A rough relative cost, only to start the longest runs first: tokens fed,
    times the attention span (sinks: the cache of L), times the model's size
    (SmolLM2 ~100x the small models), times ~4 for exact dynamic NTK, whose
    keys are rotated per query inside attention (kernels.h's QueryFrames);
    sinks cost what none does (SmolLM2 at 2x: 22 and 20 min on one thread)."""
    size = 100 if "smollm2" in study.name else 1
    span = study.L if method == "sinks" else E
    return tokens * (1 + span / 2048) * size * (4 if method == "dynamic-exact" else 1)


def ppl_jobs(study, where):
    """[(study, method, k, name, command-to-show, runner)] for a perplexity
    study, the runner a function of the threads per run and a folder for a
    cell's parts (passkey_by_trials; unused here)."""
    jobs = []
    for m, k in study.cells():
        E = study.ctx(k)
        if m == "sinks":
            shown = stream_cell_command(study.ckpt, study.tok, study.text, E, study.L)
            run = (lambda threads, parts, s=study, E=E: stream_cell(s.ckpt, s.tok, s.text, E, s.L, where.work,
                                                                    where, threads))
        else:
            cmd = ppl_command(study.ckpt, study.tok, study.text, E, method_flags(m, k, study.L))
            shown, run = cmd, (lambda threads, parts, c=cmd: run_json(c, threads))
        jobs.append(dict(study=study, method=m, k=k, name=cell_name(study.name, m, k), ctx=E,
                         shown=where.command(shown), run=run,
                         flags=" ".join(method_flags(m, k, study.L)),
                         cost=job_cost(study, m, study.tokens or E, E)))
    return jobs


def passkey_jobs(study, where):
    """[(study, method, k, name, command-to-show, runner)] for a passkey study,
    each at its factor's depths and trials."""
    jobs = []
    for m, k in study.cells():
        E = study.ctx(k)
        ctx = study.L if m == "sinks" else E
        flags = method_flags(m, k, study.L)
        T, depths = study.trials_at(k), study.depths_at(k)
        length = E - study.answer_tokens
        cmd = passkey_command(study.ckpt, study.tok, study.filler, ctx, length, depths, T, flags, study.chat)
        jobs.append(dict(study=study, method=m, k=k, name=cell_name(study.name, m, k), ctx=ctx,
                         length=length, shown=where.command(cmd),
                         run=(lambda threads, parts, c=cmd, d=depths, T=T: passkey_by_trials(c, d, T, threads, parts,
                                                                                            where)),
                         flags=" ".join(flags),
                         cost=job_cost(study, m, E * T * len(depths), E)))
    return jobs


def all_jobs(studies, where):
    """Every cell the studies run."""
    return [j for s in studies for j in (ppl_jobs(s, where) if s.kind == "ppl" else passkey_jobs(s, where))]


def config_cells(name, cfg):
    """(method, k) of the cells a study of the configuration runs; no files needed."""
    return Study(name, cfg["kind"], "", None, None, cfg["factors"], cfg["rows"], at=cfg.get("at")).cells()


def make_studies(config, work, tokens_override=None, passkey_ckpt=None):
    """Study objects for the names in config whose files exist; a message for each missing one."""
    work = Path(work)
    studies, heldout = [], None
    heldout_recipe = ".venv/bin/python tools/prepare_data.py --heldout heldout.txt"

    def need_heldout():
        nonlocal heldout
        if heldout is None:
            if not (SHARED / "data" / "books").is_dir():
                return None
            import prepare_data
            heldout = prepare_data.heldout_text(SHARED)
            (work / "heldout.txt").write_text(heldout, encoding="utf-8")
        return heldout

    def skip(name, why):
        print(f"extrapolation: skipping {name} ({why})", file=sys.stderr)

    def ppl_study(name, ckpt, tok, text, fname, source, data, cfg):
        """A perplexity study on the longest prefix of text (the file source,
        as a user names it) with at most the study's tokens."""
        count = TokenCounter(ckpt, tok, work)
        n = tokens_override or cfg["tokens"]
        prefix, nbytes = prefix_bytes(text, n, count)
        (work / fname).write_bytes(prefix.encode("utf-8"))
        recipe = ([heldout_recipe] if source == "heldout.txt" else []) + [f"head -c {nbytes} {source} > {fname}"]
        return Study(name, "ppl", ckpt, tok, train_ctx(ckpt), cfg["factors"], cfg["rows"], data=data,
                     text=work / fname, text_recipe=recipe, tokens=n, at=cfg.get("at"), note=cfg.get("note", ""))

    books_desc = "held-out books (Moby Dick, Pride and Prejudice) from their start"
    for name, cfg in config.items():
        if name == "bundled":
            ckpt = ROOT / "models" / "model.bin"
            if not ckpt.is_file() or need_heldout() is None:
                skip(name, "models/model.bin or ../shared/data/books absent")
                continue
            studies.append(ppl_study(name, ckpt, None, heldout, "books.txt", "heldout.txt", books_desc, cfg))
        elif name == "stories260K":
            ckpt, tok = SHARED / "models" / "stories260K.bin", SHARED / "models" / "tok512.bin"
            src = SHARED / "data" / "tinystories" / "tinystories_valid_head.txt"
            if not (ckpt.is_file() and tok.is_file() and src.is_file()):
                skip(name, "../shared/models or ../shared/data/tinystories absent")
                continue
            studies.append(ppl_study(name, ckpt, tok, src.read_text(encoding="utf-8"), "stories.txt", Where().path(src),
                                     "TinyStories validation stream", cfg))
        elif name == "smollm2":
            ckpt = SMOLLM2
            if not ckpt.is_file() or need_heldout() is None:
                skip(name, f"{Where().path(ckpt)} (make smollm2) or ../shared/data/books absent")
                continue
            studies.append(ppl_study(name, ckpt, None, heldout, "smollm2-books.txt", "heldout.txt", books_desc,
                                     cfg))
        elif name in ("retrieval", "smollm2-passkey", "smollm2-chat"):
            if name == "retrieval":
                ckpt = Path(passkey_ckpt) if passkey_ckpt else ROOT / "models" / "retrieval" / "model.bin"
            else:
                ckpt = SMOLLM2
            if not ckpt.is_file() or need_heldout() is None:
                skip(name, f"{Where().path(ckpt)} or ../shared/data/books absent")
                continue
            studies.append(Study(name, "passkey", ckpt, None, train_ctx(ckpt), cfg["factors"], cfg["rows"],
                                 depths=cfg["depths"], trials=cfg["trials"], at=cfg.get("at"), note=cfg.get("note", ""),
                                 chat=cfg.get("chat", False),
                                 filler=work / "heldout.txt",
                                 text_recipe=[heldout_recipe], data="held-out books"))
        else:
            raise ValueError(f"unknown study {name!r}")
    return studies


def same_study(a, b):
    """Whether two study records (cells.study_record) describe one study: equal,
    or equal but for SmolLM2's checkpoint named as the converted q8_0 file
    (SMOLLM2_BEFORE) in one and as the GGUF in the other, which run reads as
    the same weights."""
    def key(rec):
        return dict(rec, ckpt=Where().path(SMOLLM2)) if rec.get("ckpt") == SMOLLM2_BEFORE else rec
    return key(a) == key(b)


def train_ctx(path):
    """Training context of a checkpoint (any format run reads), as run reports it."""
    p = subprocess.run([str(RUN), str(path), "-m", "rope", "--json"], capture_output=True)
    if p.returncode != 0:
        raise RuntimeError(f"{path}: {p.stderr.decode(errors='replace').strip()}")
    return json.loads(p.stdout)["orig_ctx"]


def make_plan(quick=False, studies=None, tokens=None, passkey_model=None):
    """What a study measures, as the options that choose it: --quick,
    --studies (None: every study of the configuration), --tokens and
    --passkey-model (relative to the repository root). Every cell file records
    its plan; --collect expects the plan's cells."""
    plan = dict(quick=bool(quick), studies=list(studies) if studies else None, tokens=tokens,
                passkey_model=passkey_model)
    if plan["studies"] == list(QUICK if quick else FULL):
        plan["studies"] = None  # the same plan, however it was typed
    return plan


def plan_config(plan):
    """The plan's studies: name -> settings (QUICK's where --quick has them)."""
    if plan["studies"] is None:
        return dict(QUICK if plan["quick"] else FULL)
    return {n: (QUICK.get(n) or FULL[n]) if plan["quick"] else FULL[n] for n in plan["studies"]}


def plan_args(plan):
    """The options that make the plan, for a command line."""
    args = ["--quick"] if plan["quick"] else []
    if plan["studies"] is not None:
        args += ["--studies", ",".join(plan["studies"])]
    if plan["tokens"]:
        args += ["--tokens", str(plan["tokens"])]
    if plan["passkey_model"]:
        args += ["--passkey-model", plan["passkey_model"]]
    return args


def plan_of_studies(plan, studies):
    """The plan narrowed to the studies made (those whose files are here), so
    that --collect expects no cell of a study skipped for its absent files."""
    return make_plan(plan["quick"], [s.name for s in studies], plan["tokens"], plan["passkey_model"])


def cell_command(plan, name, threads, results):
    """The shell command, run from the repository root, that runs one cell
    with `threads` threads and writes RESULTS/NAME.json."""
    args = [".venv/bin/python", "tools/extrapolation.py", "--cell", name] + plan_args(plan) + \
        ["--threads", str(threads), "--results", str(results)]
    return " ".join(shlex.quote(a) for a in args)
