"""Collecting: from the cell files of one plan to the result rows (collect:
every cell of the plan, those without a file marked missing, the cells a study
runs as none's copied in, the CPU time by study and factor), and from the rows
to the outputs (write_outputs: results.json, results.csv, passkey.csv, table.md
and the plots)."""
from pathlib import Path

from .cells import study_from_record
from .commands import Where
from .config import ROWS, cell_name, factor_label
from .files import make_folder, write_json, write_text
from .plan import all_jobs, config_cells, passkey_jobs, plan_args, plan_config, ppl_jobs
from .plots import add_position_bins, draw_plots
from .tables import PREAMBLE, absent_studies, cost_table, made_by, passkey_table, ppl_table, write_csvs


def missing_row(job):
    """The result row of a cell without a file: missing=True, with its command."""
    s = job["study"]
    r = dict(model=s.name, method=job["method"], k=job["k"], ctx=job["ctx"])
    if s.kind == "passkey":
        r["length"] = job["length"]
    r.update(train_ctx=s.L, flags=job["flags"], command=job["shown"], missing=True)
    if s.kind == "passkey":
        r["cells"] = []
    return r


def fill_same_as_none(results, studies):
    """Add the cells a study runs as none's (k <= 1 on SmolLM2), copied, marked same_as."""
    out = list(results)
    for s in studies:
        for m in s.rows:
            for k in s.factors:
                if not s.same_as_none(m, k):
                    continue
                base = [r for r in results if r["model"] == s.name and r["method"] == "none" and r["k"] == k]
                if base:
                    copy = dict(base[0], method=m, same_as="none")
                    out.append(copy)
    return out


def cost_groups(cells, jobs):
    """CPU time by (study, factor): cells measured and missing, their wall
    time times threads summed, and the longest cell's."""
    groups = {}
    for j in jobs:
        g = groups.setdefault((j["study"].name, j["k"]), dict(study=j["study"].name, k=j["k"], cells=0, missing=0,
                                                              cpu_s=0.0, longest_s=0.0))
        rec = cells.get(j["name"])
        if rec is None:
            g["missing"] += 1
            continue
        cpu = rec["wall_s"] * rec["threads"]
        g["cells"] += 1
        g["cpu_s"] = round(g["cpu_s"] + cpu, 2)
        g["longest_s"] = max(g["longest_s"], round(cpu, 2))
    return list(groups.values())


def collect(cells, meta):
    """(ppl results, passkey results, studies, meta) from the cell records:
    every cell of their plan, those without a file marked missing. meta
    gains the cells' CPU time and its groups, their wall times, and the
    studies of which no cell came."""
    plan = next(iter(cells.values()))["plan"]
    records = {}
    for name in sorted(cells):
        records.setdefault(cells[name]["study"]["name"], cells[name]["study"])
    studies, absent = [], {}
    for name, cfg in plan_config(plan).items():
        if name in records:
            studies.append(study_from_record(records[name]))
        else:
            absent[name] = [cell_name(name, m, k) for m, k in config_cells(name, cfg)]
    jobs = all_jobs(studies, Where())
    expected = {j["name"] for j in jobs}
    stray = sorted(set(cells) - expected)
    if stray:
        shown = " ".join(plan_args(plan)) or "the full study"
        raise ValueError(f"cell {stray[0]}: expected a cell of its plan ({shown}), got one it does not run")
    ppl, passkey = [], []
    for s in studies:
        for j in (ppl_jobs if s.kind == "ppl" else passkey_jobs)(s, Where()):
            rec = cells.get(j["name"])
            (ppl if s.kind == "ppl" else passkey).append(rec["result"] if rec else missing_row(j))
    ppl = fill_same_as_none(ppl, [s for s in studies if s.kind == "ppl"])
    passkey = fill_same_as_none(passkey, [s for s in studies if s.kind == "passkey"])
    key = lambda r: (r["model"], ROWS.index(r["method"]), r["k"])  # noqa: E731
    ppl.sort(key=key)
    passkey.sort(key=key)
    ran = [j for j in jobs if j["name"] in cells]
    meta = dict(meta, cpu_s=round(sum(cells[j["name"]]["wall_s"] * cells[j["name"]]["threads"] for j in ran), 1),
                run_seconds={f"{j['study'].name} {j['method']} {factor_label(j['k'])}": cells[j["name"]]["wall_s"]
                             for j in ran},
                run_threads=sorted({cells[j["name"]]["threads"] for j in ran}),
                missing=sorted(expected - set(cells)) + [n for names in absent.values() for n in names],
                cost=cost_groups(cells, jobs))
    if absent:
        meta["absent_studies"] = absent
    return ppl, passkey, studies, meta


def kept_trials(folders, missing):
    """{name: trials kept} for the missing cells that have finished trials
    in a NAME.parts folder in one of the folders (passkey_by_trials writes
    them for passkey cells; a trial kept in two folders counts twice)."""
    kept = {}
    for name in missing:
        n = sum(len(list((Path(f) / f"{name}.parts").glob("trial-*.json"))) for f in folders)
        if n:
            kept[name] = n
    return kept


def shown_folder(p):
    """A folder as table.md names it: relative to the repository, else its name."""
    return Where().path(Path(p))


def write_outputs(ppl, passkey, studies, out, meta):
    """results.json, results.csv, passkey.csv, table.md and the plots, each
    through files.write_output (whole or not at all; OutputError naming the
    file that could not be written)."""
    make_folder(out)
    add_position_bins(ppl, studies)
    slim_ppl = [{k: v for k, v in r.items() if k != "per_position"} for r in ppl]
    write_json(out / "results.json", dict(meta=meta, ppl=slim_ppl, passkey=passkey), indent=1)
    write_csvs(slim_ppl, passkey, out)
    files = ["results.json", "results.csv", "passkey.csv", "table.md"]
    lines = [f"# Extrapolation study: tables", "", made_by(meta), ""] + PREAMBLE
    for s in studies:
        lines += ppl_table(s, ppl) if s.kind == "ppl" else passkey_table(s, passkey)
    lines += absent_studies(meta) + cost_table(meta)
    write_text(out / "table.md", "\n".join(lines))
    return files + draw_plots(ppl, passkey, studies, out)
