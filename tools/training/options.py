"""The option groups tools/finetune.py shares with tools/train.py: optimization
and passkey retrieval (tools/train.py's parse_args adds the others)."""


def add_optimization_args(ap) -> None:
    """The "optimization" flags (tools/finetune.py shares them, with its own defaults)."""
    g = ap.add_argument_group("optimization")
    g.add_argument("--batch-size", type=int, default=16, help="windows of --seq-len tokens per step")
    g.add_argument("--max-steps", type=int, default=1700)
    g.add_argument("--lr", type=float, default=2e-3, help="peak learning rate")
    g.add_argument("--min-lr-ratio", type=float, default=0.1, help="final lr = lr * this")
    g.add_argument("--warmup", type=int, default=100, help="linear warmup steps")
    g.add_argument("--weight-decay", type=float, default=0.1, help="AdamW, on 2-D weights only")
    g.add_argument("--grad-clip", type=float, default=1.0, help="max global gradient norm")
    g.add_argument("--seed", type=int, default=1337)
    g.add_argument("--threads", type=int, default=2, help="torch threads (CPU cores to use)")


def add_passkey_args(ap) -> None:
    """The --passkey-* flags (tools/finetune.py shares them); check_passkey_args checks them."""
    g = ap.add_argument_group("passkey retrieval (docs/passkey.md)")
    g.add_argument("--passkey-mix", type=float, default=0.0,
                   help="fraction of each batch's windows that are passkey samples, round(P * batch) of "
                        "them (default 0: book windows only, the bundled model's training)")
    g.add_argument("--passkey-digits", type=int, nargs=2, default=[3, 7], metavar=("MIN", "MAX"),
                   help="digits of a training key, drawn uniformly in MIN..MAX (default 3 7)")
    g.add_argument("--passkey-answer-weight", type=float, default=1.0,
                   help="loss weight of the answer's tokens against 1 for every other token "
                        "(default 1: the plain mean over all positions)")
    g.add_argument("--passkey-eval", type=int, default=50,
                   help="held-out passkey prompts per evaluation, with --passkey-mix > 0 (0: none)")
    g.add_argument("--passkey-eval-digits", type=int, default=5, help="digits of an evaluation key")
    g.add_argument("--passkey-eval-every", type=int, default=0,
                   help="passkey evaluation interval in steps (default 0: --eval-every)")


def check_passkey_args(ap, args) -> None:
    """Bad --passkey-* values end the program with a usage error."""
    if not 0.0 <= args.passkey_mix <= 1.0:
        ap.error(f"--passkey-mix {args.passkey_mix}: expected a fraction in [0, 1]")
    lo, hi = args.passkey_digits
    if not 1 <= lo <= hi <= 18 or not 1 <= args.passkey_eval_digits <= 18:
        ap.error("--passkey-digits MIN MAX and --passkey-eval-digits: 1 <= MIN <= MAX <= 18")
    if args.passkey_answer_weight <= 0 or args.passkey_eval < 0 or args.passkey_eval_every < 0:
        ap.error("--passkey-answer-weight must be > 0, --passkey-eval and --passkey-eval-every >= 0")
