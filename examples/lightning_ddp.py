"""PyTorch Lightning DDP under `launch` (recipe: docs/FRAMEWORKS.md).

    launch local --nodes 2 --gpus-per-node 2 -- examples/lightning_ddp.py --max-steps 8

A BoringModel-like job (a Linear layer on generated data, nothing downloaded). The launcher starts
every process with torchrun, so Lightning must not spawn any: `devices` and `num_nodes` come from
torchrun's LOCAL_WORLD_SIZE and the launcher's NNODES, and Lightning's TorchElasticEnvironment takes
RANK/WORLD_SIZE/ MASTER_ADDR from the environment. Everything it writes goes into the run directory:
  default_root_dir = $LAUNCH_RUN_DIR        -> lightning_logs/version_<N>/ there, never ./lightning_logs
  checkpoints      = $LAUNCH_CHECKPOINT_DIR  -> step-<N>.ckpt, and `latest` naming the newest complete one
  metrics.jsonl    = rank 0, one {step, loss} line per step (what `launch status` reads as the last
                   step)
  progress         = every rank's step and total (launchers.integrations' callback: `launch top`,
                   status --ranks)
A resumed attempt (LAUNCH_ATTEMPT > 0) continues from `checkpoints/latest`.

Stops: Ctrl-C's SIGINT becomes Lightning's graceful shutdown ("attempting graceful shutdown", exit
1) on every rank at the same step: during training the handler only notes it, and at each batch end
the ranks agree (AgreedStop: one all-reduce of the flag) and raise KeyboardInterrupt together.
Raised straight from the handler, a rank that got the signal between two collectives left while its
peer, already inside the next all-reduce, waited there for it (a C++ wait no Python handler
interrupts) until the stop grace ran out -- with SSH's delivery skew, on a loaded machine, most
times. `launch cancel`'s SIGTERM sets `trainer.received_sigterm` and the loop ends at the next step.
This example prints each signal it gets ("SIGNAL SIGTERM rank R"; Lightning chains its SIGTERM
handler to this one) and runs a `finally:` cleanup of --cleanup-seconds after `trainer.fit` (a
tracker's flush, an upload), writing $LAUNCH_RUN_DIR/cleanup/rank<R>.done.
"""  # noqa: E501

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader, TensorDataset

from launchers import integrations
from launchers.ckptptr import read_latest, write_latest

STOPPED: list[str] = []
PHASE = ["setup"]  # setup -> training -> done, or -> stopping once the ranks agreed on a Ctrl-C


def on_signal(signum, _frame):
    name = signal.Signals(signum).name
    print(f"SIGNAL {name} rank {os.environ.get('RANK')} at {time.time():.3f}", flush=True)
    STOPPED.append(name)
    if signum == signal.SIGINT:
        if PHASE[-1] in ("setup", "done"):
            raise KeyboardInterrupt  # outside training: Python's own behaviour
        return  # training: AgreedStop raises it on every rank together
    if signal.getsignal(signal.SIGTERM) is on_signal:
        raise SystemExit(128 + signum)  # outside trainer.fit: nobody else will stop this process


def cleanup(rank: int, seconds: float, run_dir: str) -> None:
    if not STOPPED and PHASE[-1] == "stopping":  # a peer's Ctrl-C stopped us; ours is on its way
        STOPPED.append("SIGINT")
    PHASE.append("cleanup")  # a SIGINT now is only noted: the cleanup runs to its end
    signal.signal(signal.SIGINT, on_signal)  # (Lightning's shutdown swapped the handler out)
    print(f"CLEANUP start rank {rank} ({STOPPED[0] if STOPPED else 'normal end'})", flush=True)
    time.sleep(seconds)
    os.makedirs(os.path.join(run_dir, "cleanup"), exist_ok=True)
    with open(os.path.join(run_dir, "cleanup", f"rank{rank}.done"), "w", encoding="utf-8") as f:
        f.write(f"done {STOPPED[0] if STOPPED else 'normal'}\n")
    print(f"CLEANUP done rank {rank} after {seconds:g} s", flush=True)


class BoringModel(L.LightningModule):
    def __init__(self, lr: float, step_sleep: float):
        super().__init__()
        self.layer = torch.nn.Linear(32, 2)
        self.lr, self.step_sleep = lr, step_sleep

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("loss", loss)
        if self.step_sleep:
            time.sleep(self.step_sleep)  # lets a test stop the job mid-training
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class LatestCheckpoint(ModelCheckpoint):
    """ModelCheckpoint that moves `checkpoints/latest` once a step's file is complete (Lightning
    writes it on global rank 0 and then holds every rank at a barrier, so after super() the file is
    whole)."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        name = f"step-{trainer.global_step:08d}.ckpt"
        if (
            trainer.is_global_zero
            and os.path.exists(os.path.join(self.dirpath, name))
            and read_latest(self.dirpath) != name
        ):
            write_latest(self.dirpath, name)


class AgreedStop(Callback):
    """A Ctrl-C seen by any rank stops every rank at the same batch end (KeyboardInterrupt:
    Lightning's graceful shutdown), never one rank between collectives while the others wait for it
    inside one."""

    def on_train_start(self, trainer, pl_module):
        PHASE.append("training")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.strategy.reduce_boolean_decision("SIGINT" in STOPPED, all=False):
            PHASE.append("stopping")  # a later SIGINT (this rank's own) is only noted
            raise KeyboardInterrupt

    def on_exception(self, trainer, pl_module, exception):
        # Lightning set SIGINT to SIG_IGN for its shutdown: this
        if isinstance(exception, KeyboardInterrupt):
            # rank's own SIGINT, still on its way, is noted, not lost
            signal.signal(signal.SIGINT, on_signal)

    def on_train_end(self, trainer, pl_module):
        if PHASE[-1] == "training":
            PHASE.append("done")


class Report(Callback):
    """One REPORT line per rank (what the world looks like from inside) and rank 0's
    metrics.jsonl."""

    def __init__(self, run_dir: str):
        self.metrics = os.path.join(run_dir, "metrics.jsonl")

    def on_train_start(self, trainer, pl_module):
        total = trainer.strategy.reduce(
            torch.tensor(float(trainer.global_rank + 1)), reduce_op="sum"
        )
        rec = {
            "framework": "lightning",
            "rank": trainer.global_rank,
            "world": trainer.world_size,
            "dist_world": torch.distributed.get_world_size(),
            "node_rank": trainer.node_rank,
            "local_rank": trainer.local_rank,
            "sum": float(total),
            "start_step": trainer.global_step,
            "root_dir": trainer.default_root_dir,
            "cwd": os.getcwd(),
        }
        print("REPORT " + json.dumps(rec), flush=True)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.is_global_zero:
            with open(self.metrics, "a", encoding="utf-8") as f:
                f.write(
                    json.dumps({"step": trainer.global_step, "loss": float(outputs["loss"])}) + "\n"
                )


def main() -> None:
    ap = argparse.ArgumentParser(prog="lightning_ddp")
    ap.add_argument("--max-steps", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--checkpoint-every", type=int, default=4)
    ap.add_argument("--step-sleep", type=float, default=0.0)
    ap.add_argument(
        "--cleanup-seconds", type=float, default=0.0, help="a `finally` cleanup after fit (0: none)"
    )
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # outside launch: ./lightning_run
    run_dir = os.environ.get("LAUNCH_RUN_DIR", os.path.abspath("lightning_run"))
    ckpt_dir = os.environ.get("LAUNCH_CHECKPOINT_DIR", os.path.join(run_dir, "checkpoints"))
    cuda = torch.cuda.is_available()
    backend = os.environ.get("LAUNCH_DIST_BACKEND", "nccl" if cuda else "gloo")

    L.seed_everything(0, verbose=False)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(256, 32, generator=g), torch.randn(256, 2, generator=g))
    trainer = L.Trainer(
        accelerator="gpu" if cuda else "cpu",
        devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),  # processes on this node (torchrun's)
        num_nodes=int(os.environ.get("NNODES", "1")),  # nodes (the launcher's)
        strategy=DDPStrategy(process_group_backend=backend),
        default_root_dir=run_dir,  # lightning_logs/ here, not in the cwd
        max_steps=args.max_steps,
        log_every_n_steps=1,
        # steps, total: `launch top`
        callbacks=[
            AgreedStop(),
            Report(run_dir),
            integrations.lightning_callback(),
            LatestCheckpoint(
                dirpath=ckpt_dir,
                filename="step-{step:08d}",
                auto_insert_metric_name=False,
                save_top_k=-1,
                every_n_train_steps=args.checkpoint_every,
            ),
        ],
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    latest = read_latest(ckpt_dir)
    resume = (
        os.path.join(ckpt_dir, latest)
        if latest and int(os.environ.get("LAUNCH_ATTEMPT", "0")) > 0
        else None
    )
    code = None
    try:
        trainer.fit(
            BoringModel(args.lr, args.step_sleep),
            DataLoader(data, batch_size=args.batch_size),
            ckpt_path=resume,
        )
    except SystemExit as e:  # Lightning's graceful shutdown after a Ctrl-C ends with exit(1)
        code = e.code if isinstance(e.code, int) else 1
    finally:
        if args.cleanup_seconds:
            cleanup(trainer.global_rank, args.cleanup_seconds, run_dir)
        ended = end_group()
    print(
        f"DONE rank {trainer.global_rank} step {trainer.global_step}"
        + (f" exit {code}" if code else ""),
        flush=True,
    )
    # the interpreter's exit would wait on (or abort on) the threads Lightning
    if code is not None or not ended:
        sys.stdout.flush()  # and gloo leave behind: once past 26 s after a Ctrl-C on SSH
        sys.stderr.flush()
        os._exit(code or 0)


def end_group(timeout: float = 10.0) -> bool:
    """Lightning leaves the process group up, also after its graceful shutdown: ended here, not by
    the interpreter's exit (gloo's threads torn down at exit aborted a rank after DONE with SIGABRT,
    "terminate called without an active exception"). After a stop, destroy_process_group once never
    returned on either rank (gloo, both ranks past the same batch): bounded here, as a careful
    program bounds its shutdown. True: the group is gone."""
    if not torch.distributed.is_initialized():
        return True
    t = threading.Thread(target=torch.distributed.destroy_process_group, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        print(
            f"destroy_process_group did not return within {timeout:g} s; leaving without it",
            flush=True,
        )
    return not t.is_alive()


if __name__ == "__main__":
    main()
