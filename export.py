#!/usr/bin/env python3
"""export.py: the command that writes checkpoints and tokenizers for `run`.

The readers and writers live in the package convert/ (convert/__init__.py maps
its modules: one per source, one per file format written); this file is the
command line on top of them. The names tests and tools use as export.X are
re-exported below.

Command line (docs/convert.md is the user's guide to the conversions):
    python3 export.py OUT --hf DIR                Hugging Face directory (config.json +
                                                  safetensors): Llama, Mistral, Qwen2, Phi-3
    python3 export.py OUT --meta-llama DIR        Meta params.json + consolidated.*.pth
        [--rope-layout neox|interleaved]          q/k layout to write (default: the
                                                  source's: neox for HF, interleaved for Meta)
        [--seq-len N]                             training context to record
    python3 export.py OUT --gguf FILE.gguf        llama.cpp GGUF (llama, qwen2, phi3), any
                                                  tensor type gguf dequantizes; writes its
                                                  tokenizer too (default: tokenizer.bin beside OUT)
        [--rope-layout neox|interleaved]          (default: as the file stores q/k: interleaved
                                                  for llama, neox for qwen2 and phi3)
        [--tokenizer-out PATH]                    --gguf: the tokenizer's path; --hf/--meta-llama:
                                                  also convert DIR's tokenizer to PATH
    python3 export.py OUT --llama2c IN.bin        convert a llama2.c checkpoint
    python3 export.py OUT --checkpoint IN.bin     re-export one of ours (e.g. --dtype q8_0)
    python3 export.py OUT --tokenizer FILE        sentencepiece .model -> tokenizer.bin;
                                                  tokenizer.json, tiktoken, .gguf -> version 3
    python3 export.py OUT --random D,H,L,NH,NKV,V,S [--seed N] [--unshared] ...
                                                   random weights (tests, benchmarks)
    Any checkpoint source also takes
        [--dtype f32|q8_0] [--group-size N]       q8_0: int8 weights, a float32 scale
                                                  per N values (default 32, or the largest
                                                  power of two dividing dim and hidden_dim)

Conversions stream: each output tensor is read, converted to float32 and
written a block of rows at a time (see convert/lazy.py), so memory stays at a
few tens of MB whatever the model's size (Meta .pth files: as torch.load
allows, see convert/meta.py). Progress goes to stderr when a job takes more than
2 seconds.

Every file is written atomically: into a temporary file beside OUT, renamed
over OUT only when complete. On any error the temporary file is removed, OUT is
left as it was, one line naming the file and the problem goes to stderr, and
the exit status is 1 (2 for bad usage).
"""

import argparse
import math
import os
import sys

from convert.checkpoint import (  # noqa: F401  (re-exported: the checkpoint API)
    CONFIG_REQUIRED, HEADER_FIELDS, Q8_DEFAULT_GROUP, ROPE_LAYOUTS, ROPE_SCALINGS, WEIGHT_TYPES,
    is_quantized, normalize_config, random_tensors, read_checkpoint, read_header, tensor_layout,
    tensor_names, write_checkpoint)
from convert.chat_templates import recognize_chat_template  # noqa: F401
from convert.common import INT32_MAX, ExportError, _write_bytes
from convert.gguf import read_gguf
from convert.gguf_rope import fit_llama3_rope_freqs, llama3_rope_factors  # noqa: F401
from convert.gguf_tokenizer import read_gguf_tokenizer  # noqa: F401
from convert.hf import hf_config, read_hf  # noqa: F401
from convert.lazy import head_permutation, permute_heads  # noqa: F401
from convert.llama2c import read_llama2c
from convert.ltok import (  # noqa: F401  (re-exported: the tokenizer API)
    CHAT_TEMPLATES, GPT2_BYTE_CHARS, PIECE_BYTE, PIECE_NORMAL, PIECE_SPECIAL, PIECE_UNUSED,
    TOK_VERSION, _same_tokenizer, bytes_to_gpt2, default_stop_ids, describe_tokenizer,
    gpt2_to_bytes, pack_tokenizer_ltok, write_tokenizer_ltok)
from convert.meta import read_meta
from convert.safetensors import read_safetensors_header  # noqa: F401
from convert.tiktoken_bpe import read_tiktoken_tokenizer, tiktoken_merges  # noqa: F401
from convert.tokenizer_bin import (  # noqa: F401
    pack_tokenizer_v1, read_tokenizer, sentencepiece_vocab, write_tokenizer)
from convert.tokenizer_json import (  # noqa: F401
    LLAMA3_SPLIT_REGEX, QWEN2_SPLIT_REGEX, read_tokenizer_json)
from convert.tokenizer_source import model_dir_tokenizer, read_tokenizer_source


# ---------------------------------------------------------------------------
# Command line

def _parse_random_spec(spec):
    names = CONFIG_REQUIRED
    try:
        values = [int(v) for v in spec.split(",")]
    except ValueError:
        values = []
    if len(values) != len(names):
        raise ExportError(f"--random {spec}: expected {len(names)} comma-separated integers "
                          f"({','.join(names)})")
    return dict(zip(names, values))


def _describe(cfg):
    """A checkpoint's parameter count, weight type and header, for the success line."""
    c = normalize_config(cfg)
    scaling = c["rope_scaling"]
    if scaling != "none":
        scaling += f" x{c['rope_factor']:g}"
        if c["rope_scaling"] in ("yarn", "llama3", "dynamic"):
            scaling += f" (orig ctx {c['rope_orig_ctx'] or c['seq_len']})"
    n_params = sum(math.prod(shape) for name, shape, _, _ in tensor_layout(c)[0]
                   if not name.startswith("rope_"))  # the LongRoPE factor tables are not weights
    weights = c["weight_type"] + (f" (group size {c['group_size']})" if c["weight_type"] == "q8_0" else "")
    return (f"{_count(n_params)} parameters, weights {weights}, dim {c['dim']}, hidden "
            f"{c['hidden_dim']}, {c['n_layers']} layers, {c['n_heads']} heads ({c['n_kv_heads']} kv), "
            f"vocab {c['vocab_size']}, seq_len {c['seq_len']}, "
            f"{'tied' if c['shared_classifier'] else 'untied'} classifier, rope {c['rope_layout']} "
            f"theta {c['rope_theta']:g} rot_dim {c['rot_dim']} scaling {scaling}, eps {c['norm_eps']:g}, "
            f"bos {c['bos_id']} eos {c['eos_id']}")


def _count(n):
    """n as people write parameter counts: 1.7K, 134.5M, 6.7B."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def _size(path):
    """The size of the file at path, in the unit that suits it."""
    n = os.path.getsize(path)
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} bytes"


def _report(written):
    """The one line a successful run prints, on stdout: each file written
    [(path, description)], its size, and what it holds. Notes and progress go
    to stderr."""
    print("export.py: wrote " + "; and ".join(f"{path} ({_size(path)}): {what}" for path, what in written),
          flush=True)


def _default_tokenizer_path(out):
    return os.path.join(os.path.dirname(out), "tokenizer.bin")


def main(argv=None):
    p = _parser()
    args = p.parse_args(argv)
    _check_args(p, args)
    weights = dict(weight_type=args.dtype, group_size=args.group_size)
    source = (args.hf or args.meta_llama or args.gguf or args.llama2c or args.checkpoint
              or args.tokenizer)
    culprit = source or args.out
    try:
        if args.hf or args.meta_llama or args.gguf:
            _convert_model(args, weights)
        elif args.llama2c or args.checkpoint:
            _convert_checkpoint(args, weights)
        elif args.tokenizer:
            _convert_tokenizer(args)
        else:
            _write_random(args, weights)
    except ExportError as e:
        msg = str(e)
        # name the file every message is about: the source, else the output
        if not msg.startswith(args.out) and not (source and msg.startswith(source)):
            msg = f"{culprit}: {msg}"
        print(f"export.py: {msg}", file=sys.stderr)
        return 1
    except OSError as e:
        name = e.filename if e.filename else culprit
        print(f"export.py: {name}: {e.strerror or e}", file=sys.stderr)
        return 1
    except MemoryError:
        print(f"export.py: {culprit}: out of memory", file=sys.stderr)
        return 1
    except RecursionError:  # a structure nested deeper than Python's stack allows
        print(f"export.py: {culprit}: nested too deeply to read", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"export.py: {args.out}: interrupted; nothing written", file=sys.stderr)
        return 130
    return 0


def _parser():
    p = argparse.ArgumentParser(
        prog="export.py",
        description="Write checkpoints (version 1, see model.h) and tokenizers for run. "
                    "docs/convert.md explains the conversions.")
    p.add_argument("out", help="output file")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--hf", metavar="DIR",
                     help="convert a Hugging Face Llama model directory (config.json and "
                          "model.safetensors, or sharded model-*.safetensors with "
                          "model.safetensors.index.json)")
    src.add_argument("--meta-llama", metavar="DIR",
                     help="convert a Meta Llama checkpoint directory (params.json and "
                          "consolidated.*.pth; needs torch)")
    src.add_argument("--gguf", metavar="FILE.gguf",
                     help="convert a llama.cpp GGUF file of the Llama architecture (any tensor "
                          "type the gguf package dequantizes), and write its tokenizer too")
    src.add_argument("--llama2c", metavar="IN.bin", help="convert a llama2.c (version 0) checkpoint")
    src.add_argument("--checkpoint", metavar="IN.bin",
                     help="re-export a checkpoint of ours (version 1), e.g. with --dtype q8_0")
    src.add_argument("--tokenizer", metavar="FILE",
                     help="convert a tokenizer: a sentencepiece model (-> llama2.c's "
                          "tokenizer.bin), or a tokenizer.json, a tiktoken file (Llama 3's "
                          "tokenizer.model) or a GGUF file's vocabulary (-> version 3)")
    src.add_argument("--random", metavar="D,H,L,NH,NKV,V,S",
                     help="random weights: dim,hidden_dim,n_layers,n_heads,n_kv_heads,"
                          "vocab_size,seq_len")
    m = p.add_argument_group("options for --hf, --meta-llama, --gguf and --random")
    m.add_argument("--rope-layout", choices=ROPE_LAYOUTS, default=None,
                   help="q/k layout to write. --hf: neox (default; the weights as Hugging Face "
                        "stores them) or interleaved (rows un-permuted per head). --meta-llama: "
                        "interleaved (default; the layout it stores) or neox. --gguf: the "
                        "layout the file stores (default; interleaved for llama, neox for "
                        "qwen2 and phi3) or the other. "
                        "--random: default interleaved. Both give the same logits")
    m.add_argument("--seq-len", type=int, default=None, metavar="N",
                   help="--hf/--meta-llama/--gguf: training context to record (default: "
                        "max_position_embeddings, params.json max_seq_len, <arch>.context_length)")
    m.add_argument("--tokenizer-out", metavar="PATH", default=None,
                   help="--gguf: where its tokenizer goes (default: tokenizer.bin beside OUT, "
                        "which run finds on its own). --hf/--meta-llama: also convert the "
                        "directory's tokenizer (tokenizer.json, or tokenizer.model) to PATH")
    q = p.add_argument_group("weights (every checkpoint source)")
    q.add_argument("--dtype", choices=WEIGHT_TYPES, default="f32",
                   help="f32 (default) or q8_0: int8 matrices with a float32 scale per group of "
                        "values along a row; norm weights stay float32")
    q.add_argument("--group-size", type=int, default=0, metavar="N",
                   help=f"q8_0: values per scale, dividing dim and hidden_dim (default "
                        f"{Q8_DEFAULT_GROUP}, or the largest power of two below it that divides both)")
    r = p.add_argument_group("options for --random")
    r.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    r.add_argument("--unshared", action="store_true", help="separate classifier (wcls)")
    r.add_argument("--rot-dim", type=int, default=None, help="rotated dims per head (default: all)")
    r.add_argument("--rope-theta", type=float, default=10000.0)
    r.add_argument("--norm-eps", type=float, default=1e-5)
    return p


def _check_args(p, args):
    """The usage errors argparse cannot see (p.error exits with status 2)."""
    if args.rope_layout and (args.llama2c or args.checkpoint or args.tokenizer):
        p.error("--rope-layout applies to --hf, --meta-llama, --gguf and --random only")
    if args.seq_len is not None and not (args.hf or args.meta_llama or args.gguf):
        p.error("--seq-len applies to --hf, --meta-llama and --gguf only")
    if args.seq_len is not None and not 0 < args.seq_len <= INT32_MAX:
        p.error(f"--seq-len {args.seq_len}: expected a positive integer")
    if args.tokenizer_out is not None and not (args.hf or args.meta_llama or args.gguf):
        p.error("--tokenizer-out applies to --hf, --meta-llama and --gguf only")
    if args.tokenizer_out is not None and os.path.abspath(args.tokenizer_out) == \
            os.path.abspath(args.out):
        p.error("--tokenizer-out must differ from OUT")
    if args.tokenizer and (args.dtype != "f32" or args.group_size):
        p.error("--dtype and --group-size apply to checkpoints, not --tokenizer")
    if args.group_size and args.dtype != "q8_0":
        p.error("--group-size applies to --dtype q8_0 only")
    if args.group_size < 0:
        p.error(f"--group-size {args.group_size}: expected a positive integer")


def _convert_model(args, weights):
    """--hf, --meta-llama, --gguf: the checkpoint, and the tokenizer when there
    is one to write (checked before anything is written; no checkpoint is left
    without its tokenizer)."""
    if args.hf:
        src = read_hf(args.hf, args.rope_layout or "neox")
    elif args.meta_llama:
        src = read_meta(args.meta_llama, args.rope_layout or "interleaved", args.seq_len)
    else:
        src = read_gguf(args.gguf, args.rope_layout)
    cfg, tensors, notes = src.config, src.tensors, src.notes
    tokenizer = _tokenizer_to_write(args, src)  # (path, bytes, description) or None
    if args.seq_len is not None and not args.meta_llama:
        cfg["seq_len"] = args.seq_len
    if cfg["seq_len"] > 32768:
        notes.append(f"seq_len {cfg['seq_len']}: run sizes its KV cache for the training "
                     "context unless told otherwise; pass run --ctx N to use less memory")
    cfg.update(weights)
    if tokenizer:  # a folder that cannot take the tokenizer fails before the checkpoint exists
        tok_dir = os.path.dirname(os.path.abspath(tokenizer[0]))
        if not os.path.isdir(tok_dir) or not os.access(tok_dir, os.W_OK):
            raise ExportError(f"{tokenizer[0]}: cannot write the tokenizer there "
                              f"({tok_dir} is not a writable folder)")
    write_checkpoint(args.out, cfg, tensors)
    if tokenizer:
        try:
            _write_bytes(tokenizer[0], tokenizer[1])
        except BaseException:  # no checkpoint without its tokenizer
            os.remove(args.out)
            raise
    for note in notes:
        print(f"export.py: note: {note}", file=sys.stderr)
    _report([(args.out, _describe(cfg))] + ([(tokenizer[0], tokenizer[2])] if tokenizer else []))


# What the success line says of a tokenizer written in llama2.c's format.
_V1_TOKENIZER = "sentencepiece, {} pieces (llama2.c's format)"


def _tokenizer_to_write(args, src):
    """(path, bytes, description) of the tokenizer a model conversion writes:
    a GGUF file's own (beside OUT unless --tokenizer-out says where; an
    existing file there must hold the same one), or with --tokenizer-out the
    model directory's; None when there is none to write. src.notes gains the
    tokenizer's notes."""
    if args.gguf:
        path = args.tokenizer_out or _default_tokenizer_path(args.out)
        data = pack_tokenizer_ltok(src.tokenizer)
        if args.tokenizer_out is None and os.path.isfile(path):
            with open(path, "rb") as f:
                if not _same_tokenizer(f.read(), data):
                    raise ExportError(f"{path} exists and holds another tokenizer; pass "
                                      "--tokenizer-out PATH, or remove it")
        return path, data, describe_tokenizer(src.tokenizer)
    if args.tokenizer_out is None:
        return None
    kind, value, tok_notes = model_dir_tokenizer(args.hf or args.meta_llama,
                                                 src.config["vocab_size"])
    src.notes.extend(tok_notes)
    if kind == "v1":
        return args.tokenizer_out, pack_tokenizer_v1(*value), _V1_TOKENIZER.format(len(value[0]))
    return args.tokenizer_out, pack_tokenizer_ltok(value), describe_tokenizer(value)


def _convert_checkpoint(args, weights):
    """--llama2c, --checkpoint: the same weights written again (e.g. as q8_0)."""
    if args.llama2c:
        src = read_llama2c(args.llama2c)
        cfg, tensors = src.config, src.tensors
    else:
        cfg, tensors = read_checkpoint(args.checkpoint)
        if os.path.exists(args.out) and os.path.samefile(args.checkpoint, args.out):
            raise ExportError("OUT is the input file; write to another path")
    cfg.update(weights)
    write_checkpoint(args.out, cfg, tensors)
    _report([(args.out, _describe(cfg))])


def _convert_tokenizer(args):
    kind, value, notes = read_tokenizer_source(args.tokenizer)
    if kind == "v1":
        write_tokenizer(args.out, *value)
        what = _V1_TOKENIZER.format(len(value[0]))
    else:
        write_tokenizer_ltok(args.out, value)
        for note in notes:
            print(f"export.py: note: {note}", file=sys.stderr)
        what = describe_tokenizer(value)
    _report([(args.out, what)])


def _write_random(args, weights):
    cfg = _parse_random_spec(args.random)
    cfg.update(shared_classifier=not args.unshared,
               rope_layout=args.rope_layout or "interleaved",
               rot_dim=args.rot_dim, rope_theta=args.rope_theta, norm_eps=args.norm_eps,
               **weights)
    cfg = normalize_config(cfg)
    write_checkpoint(args.out, cfg, random_tensors(cfg, args.seed))
    _report([(args.out, _describe(cfg))])


if __name__ == "__main__":
    sys.exit(main())
