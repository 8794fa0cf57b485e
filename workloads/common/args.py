"""Command-line flags shared by every workload, with one-line errors that name the bad value.

Everything here runs before the process group exists, on every rank, from the same argv and the
same files, so every rank reaches the same verdict and exits on its own (nothing can hang).
"""

from __future__ import annotations

import argparse
import sys

from . import data, faults

DEFAULT_LR = {"digits": 1e-2, "synthetic": 3e-3, "cifar10": 1e-3}


class Parser(argparse.ArgumentParser):
    """argparse, but an error is one line: `<prog>: error: <message>` and exit status 2."""

    def error(self, message: str):  # noqa: D401 - argparse API
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.stderr.flush()
        sys.exit(2)


def _number(kind, minimum, what):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if value < minimum or value != value:  # also rejects nan
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
        return value

    return parse


positive_int = _number(int, 1, "a positive integer (>= 1)")
nonneg_int = _number(int, 0, "a non-negative integer (>= 0)")
positive_float = _number(float, 1e-300, "a positive number (> 0)")
nonneg_float = _number(float, 0.0, "a non-negative number (>= 0)")


def common_parser(
    prog: str,
    description: str,
    *,
    epochs: int = 2,
    batch_size: int = 32,
    lr: float | None = None,
    checkpoint_every: int = 50,
    log_every: int = 10,
    async_checkpoint: bool = True,
) -> Parser:
    p = Parser(prog=prog, description=description)
    data_args(p.add_argument_group("data"))
    training_args(p.add_argument_group("training"), epochs, batch_size, lr)
    output_args(
        p.add_argument_group("run directory, checkpoints, logging"),
        checkpoint_every,
        log_every,
        async_checkpoint,
    )
    fault_args(p.add_argument_group("fault injection (tests)"))
    return p


def data_args(g) -> None:
    g.add_argument(
        "--dataset",
        default="digits",
        choices=data.DATASETS,
        help=(
            "digits (scikit-learn's bundled 8x8 digits), synthetic (generated), "
            "cifar10 (python batches in --data-dir); default: digits"
        ),
    )
    g.add_argument(
        "--data-dir",
        default=None,
        help="directory holding the CIFAR-10 python batches (data_batch_1..5, test_batch)",
    )


def training_args(g, epochs: int, batch_size: int, lr: float | None) -> None:
    g.add_argument("--epochs", type=positive_int, default=epochs)
    g.add_argument(
        "--max-steps",
        type=positive_int,
        default=None,
        help="train exactly this many steps (overrides --epochs)",
    )
    g.add_argument("--batch-size", type=positive_int, default=batch_size, help="per rank")
    g.add_argument(
        "--lr",
        type=positive_float,
        default=lr,
        help="peak learning rate (default: "
        + ", ".join(f"{k} {v:g}" for k, v in DEFAULT_LR.items())
        + ")",
    )
    g.add_argument("--weight-decay", type=nonneg_float, default=1e-2)
    g.add_argument(
        "--warmup-steps",
        type=nonneg_int,
        default=None,
        help="linear lr warm-up steps (default: min(10, total/10))",
    )
    g.add_argument("--seed", type=nonneg_int, default=1234)
    g.add_argument(
        "--deterministic",
        action="store_true",
        help="torch.use_deterministic_algorithms(True) (+ CUBLAS_WORKSPACE_CONFIG on CUDA)",
    )


def output_args(g, checkpoint_every: int, log_every: int, async_checkpoint: bool) -> None:
    g.add_argument(
        "--run-dir",
        default=None,
        help="where outputs go when LAUNCH_RUN_DIR is not set (default: ./run-local)",
    )
    g.add_argument(
        "--checkpoint-every",
        type=nonneg_int,
        default=checkpoint_every,
        help="save a DCP checkpoint every N steps and at the end (0: never)",
    )
    if async_checkpoint:
        g.add_argument(
            "--async-checkpoint",
            action="store_true",
            help=(
                "write the periodic checkpoints in the background (DCP async_save): training "
                "waits only for the copy of the state; `latest` moves once the write is complete. "
                "The final and preemption checkpoints are written synchronously."
            ),
        )
    g.add_argument("--log-every", type=positive_int, default=log_every)
    g.add_argument(
        "--no-tensorboard",
        dest="tensorboard",
        action="store_false",
        help="do not write tensorboard/rank<R>/ event files",
    )
    g.add_argument(
        "--pg-timeout",
        type=positive_float,
        default=300.0,
        help="process-group timeout in seconds (how long a collective waits for a hung rank)",
    )


def fault_args(g) -> None:
    g.add_argument(
        "--crash-at-step",
        type=positive_int,
        default=None,
        help="rank --crash-rank exits with code 1 at this step (only in attempt --crash-attempt)",
    )
    g.add_argument("--crash-rank", type=nonneg_int, default=0)
    g.add_argument(
        "--crash-phase",
        default="mid",
        choices=faults.PHASES,
        help=(
            "mid: after backward, before the optimizer step; pre_save/save/after_save: "
            "around the checkpoint of that step; hang: stuck for good at mid (no exit)"
        ),
    )
    g.add_argument(
        "--crash-attempt",
        type=nonneg_int,
        default=0,
        help="LAUNCH_ATTEMPT in which the crash fires (so a resumed run does not crash again)",
    )
    g.add_argument(
        "--crash-slot",
        type=nonneg_int,
        default=None,
        help=(
            "instead of --crash-rank: local rank 0 on node slot S (LAUNCH_NODE_SLOT) crashes at "
            "--crash-at-step in every attempt (a lemon node; launch local --spares)"
        ),
    )
    g.add_argument(
        "--step-delay",
        type=nonneg_float,
        default=0.0,
        help=(
            "sleep this many seconds in every training step (a slow job to inject faults into; "
            "does not change the result)"
        ),
    )


def check(parser: Parser, args, world_size: int) -> None:
    """Cross-flag and input checks that need no process group; exits with a one-line error.

    Also fills dataset-dependent defaults (--lr).
    """
    if getattr(args, "lr", 0) is None:
        args.lr = DEFAULT_LR[args.dataset]
    err = data.check(args.dataset, args.data_dir)
    if err:
        parser.error(err)
    if args.crash_at_step is not None:
        if args.crash_rank >= world_size:
            parser.error(
                f"--crash-rank {args.crash_rank} is out of range: the world size is {world_size} "
                f"(accepted: 0..{world_size - 1})"
            )
        if args.crash_phase not in ("mid", "hang"):
            if args.checkpoint_every == 0 or args.crash_at_step % args.checkpoint_every:
                parser.error(
                    f"--crash-phase {args.crash_phase} at --crash-at-step {args.crash_at_step} "
                    "never fires: that step has no checkpoint (--checkpoint-every "
                    f"{args.checkpoint_every})"
                )
