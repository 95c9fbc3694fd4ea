"""Stage 6 of the pipeline, and resuming: the torch checkpoint ckpt.pt (save_pt,
resume_checkpoint), and the export through export.py, the one writer of run's
checkpoint and tokenizer formats (export_model, export_only); import_tensors
reads such a checkpoint's tensors back into the network."""
import os
import sys
from pathlib import Path

import numpy as np
import torch

from . import log
from .data import load_data
from .model import Llama

ROOT = Path(__file__).resolve().parents[2]  # the repository (this file is tools/training/checkpoints.py)


def save_pt(path, model, opt, step, args, cfg, history):
    tmp = Path(str(path) + ".tmp")
    torch.save(dict(model=model.state_dict(), optim=opt.state_dict(), step=step,
                    args=vars(args), cfg=cfg, history=history), tmp)
    os.replace(tmp, path)


def resume_checkpoint(args, ckpt: Path, model, opt):
    """(step, history): from ckpt into model and opt with --resume and a checkpoint, else (0, [])."""
    if not (args.resume and ckpt.exists()):
        return 0, []
    st = torch.load(ckpt)
    model.load_state_dict(st["model"])
    opt.load_state_dict(st["optim"])
    log(f"resume: from step {st['step']}")
    return st["step"], st["history"]


def export_tensors(model) -> dict:
    """Our state dict -> export.py's tensor names, float32 numpy, stacked over layers."""
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    L = model.c["n_layers"]
    stack = lambda name: np.stack([sd[f"layers.{i}.{name}"] for i in range(L)])  # noqa: E731
    return dict(
        token_embedding=sd["tok_embeddings.weight"],
        rms_att_weight=stack("attention_norm.weight"),
        wq=stack("wq.weight"), wk=stack("wk.weight"), wv=stack("wv.weight"), wo=stack("wo.weight"),
        rms_ffn_weight=stack("ffn_norm.weight"),
        w1=stack("w1.weight"), w2=stack("w2.weight"), w3=stack("w3.weight"),
        rms_final_weight=sd["norm.weight"],
    )


def import_tensors(model, tensors: dict) -> None:
    """export_tensors the other way: a checkpoint's tensors (export.read_checkpoint) into model."""
    L = model.c["n_layers"]
    sd = {"tok_embeddings.weight": tensors["token_embedding"], "norm.weight": tensors["rms_final_weight"]}
    per_layer = dict(attention_norm="rms_att_weight", wq="wq", wk="wk", wv="wv", wo="wo",
                     ffn_norm="rms_ffn_weight", w1="w1", w2="w2", w3="w3")
    for ours, theirs in per_layer.items():
        for i in range(L):
            sd[f"layers.{i}.{ours}.weight"] = tensors[theirs][i]
    model.load_state_dict({k: torch.tensor(np.array(v, dtype=np.float32)) for k, v in sd.items()})


def export_model(model, cfg, tok_model: Path, out_dir: Path):
    """Write out_dir/model.bin and tokenizer.bin through export.py, and copy tokenizer.model."""
    import shutil
    sys.path.insert(0, str(ROOT))
    import export  # the one writer of our checkpoint and tokenizer formats
    out_dir.mkdir(parents=True, exist_ok=True)
    export.write_checkpoint(str(out_dir / "model.bin"), cfg, export_tensors(model))
    export.write_tokenizer(str(out_dir / "tokenizer.bin"), *export.sentencepiece_vocab(str(tok_model)))
    if Path(tok_model).resolve() != (out_dir / "tokenizer.model").resolve():
        shutil.copyfile(tok_model, out_dir / "tokenizer.model")
    log(f"export: wrote {out_dir}/model.bin, tokenizer.bin, tokenizer.model")


def export_only(args, out: Path) -> int:
    """--export-only: the model and its tokenizer as the checkpoint's own run made them."""
    if not args.export_dir:
        raise SystemExit("--export-only needs --export-dir")
    st = torch.load(out / "ckpt.pt")
    for k in ("vocab_size", "extra", "shared", "tokenizer"):
        setattr(args, k, st["args"].get(k, ""))
    model = Llama(st["cfg"])
    model.load_state_dict(st["model"])
    log(f"export-only: {out / 'ckpt.pt'} at step {st['step']}")
    export_model(model, st["cfg"], load_data(args)[1], Path(args.export_dir))
    return 0
