"""Training the bundled model: the pipeline of tools/train.py (its docstring
describes each stage), which tools/finetune.py reuses to continue a checkpoint's
training at a longer context.

Its modules, in the pipeline's order:

    data         stages 1-3: the training books, the tokenizer, the token streams;
                 the batches of training windows and the held-out windows
    model        the network run.c evaluates (Llama), with its RoPE, and its config
    passkey      --passkey-mix: passkey samples in the batches, and their evaluation
    loop         stages 4-5: optimizer and schedule, the training step and loop, the
                 held-out and passkey evaluations, the run's log (RunState)
    checkpoints  stage 6: ckpt.pt (save_pt, resume_checkpoint) and the export to
                 run's format through export.py (export_model, export_only)
    options      the option groups tools/finetune.py shares with tools/train.py

Importing the package sets the BLAS thread count from --threads (below), so it
comes before numpy and torch load. Here too: log and fmt_time, which every module
uses for its progress lines.
"""
import os
import sys


def _threads_from_argv(argv, default=2):
    """--threads, read before torch loads: OpenBLAS sizes its own thread pool at load
    time from OPENBLAS_NUM_THREADS and ignores torch.set_num_threads afterwards."""
    for i, a in enumerate(argv):
        if a == "--threads" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--threads="):
            return a.split("=", 1)[1]
    return str(default)


for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = _threads_from_argv(sys.argv[1:])


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def fmt_time(s: float) -> str:
    s = int(max(s, 0))
    return f"{s // 3600}h{s // 60 % 60:02d}m{s % 60:02d}s" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"
