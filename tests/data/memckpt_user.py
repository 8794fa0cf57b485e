"""A user's plain PyTorch program with memory checkpoints through the one call,
launchers.integrations .memory_checkpoints (tests/test_memckpt_user.py): a linear model trained with
Adam, gradients averaged over the ranks by hand (gloo), each rank's batches drawn from its global
torch RNG (a restore must bring the RNG back too), a storage checkpoint every --checkpoint-every
steps (each rank its file, then rank 0's `latest`); rank 0 writes final.json (the weights' sha256)
into the run dir."""

import argparse
import hashlib
import json
import os
import time

import torch
import torch.distributed as dist

from launchers import heartbeat, integrations


def options() -> argparse.Namespace:
    """This program's options (memckpt_lightning.py's too)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--checkpoint-every", type=int, default=4)
    ap.add_argument("--step-delay", type=float, default=0.0)
    return ap.parse_args()


def main() -> None:
    a = options()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    torch.manual_seed(1 + rank)  # each rank its own batches
    ckpt = os.environ.get("LAUNCH_CHECKPOINT_DIR", "checkpoints")
    latest = (
        int(open(os.path.join(ckpt, "latest")).read())
        if os.path.exists(os.path.join(ckpt, "latest"))
        else None
    )

    mem = integrations.memory_checkpoints({"model": model, "optim": opt})
    start = mem.restore(latest)
    if start is None and latest is not None:  # memory held no newer whole step: storage
        blob = torch.load(
            os.path.join(ckpt, f"step-{latest}", f"rank{rank}.pt"), weights_only=False
        )
        model.load_state_dict(blob["model"])
        opt.load_state_dict(blob["optim"])
        torch.set_rng_state(blob["rng"])
        start = latest
    print(f"rank {rank}: starting at step {start or 0}", flush=True)
    for step in range(start or 0, a.steps):
        x = torch.randn(8, 4)
        loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        opt.step()
        mem.save(step + 1)
        if (step + 1) % a.checkpoint_every == 0:
            save_storage(ckpt, step + 1, rank, model, opt)
        heartbeat.step(step + 1)
        time.sleep(a.step_delay)
    mem.close()
    sha = hashlib.sha256(
        b"".join(p.detach().numpy().tobytes() for p in model.parameters())
    ).hexdigest()
    if rank == 0:
        with open(os.path.join(os.environ.get("LAUNCH_RUN_DIR", "."), "final.json"), "w") as f:
            json.dump({"step": a.steps, "param_sha256": sha}, f)
    dist.barrier()
    dist.destroy_process_group()


def save_storage(ckpt: str, step: int, rank: int, model, opt) -> None:
    d = os.path.join(ckpt, f"step-{step}")
    os.makedirs(d, exist_ok=True)
    torch.save(
        {"model": model.state_dict(), "optim": opt.state_dict(), "rng": torch.get_rng_state()},
        os.path.join(d, f"rank{rank}.pt"),
    )
    dist.barrier()
    if rank == 0:
        with open(os.path.join(ckpt, "latest.tmp"), "w") as f:
            f.write(str(step))
        os.replace(os.path.join(ckpt, "latest.tmp"), os.path.join(ckpt, "latest"))


if __name__ == "__main__":
    main()
