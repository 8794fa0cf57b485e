"""What a run reports: metrics.jsonl and final.json (rank 0), per-rank TensorBoard, param_sha256; a
step's global loss and accuracy, the evaluation on the test set (collectives).

metrics.jsonl  one JSON object per logged step, appended across attempts ({"step", "loss", "epoch",
               ...})
final.json     {"step", "loss", "accuracy", "param_sha256", "world_size", ...}, replaced atomically
tensorboard/rank<R>/  event files from every rank (SummaryWriter imported lazily, ~0.2 s)
"""

from __future__ import annotations

import hashlib
import json
import os
import time


def param_sha256(module) -> str:
    """sha256 over (name, raw bytes) of every parameter in named_parameters() order."""
    import torch

    h = hashlib.sha256()
    for name, p in module.named_parameters():
        h.update(name.encode())
        t = p.detach().to("cpu").contiguous().reshape(-1)
        h.update(t.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def write_json_atomic(path: str, obj) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class Metrics:
    def __init__(self, env, *, tensorboard: bool = True) -> None:
        self.env = env
        self.t0 = time.time()
        self._jsonl = None
        self._tb = None
        os.makedirs(env.run_dir, exist_ok=True)
        if env.rank == 0:
            self._jsonl = open(os.path.join(env.run_dir, "metrics.jsonl"), "a", encoding="utf-8")
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(
                log_dir=os.path.join(env.run_dir, "tensorboard", f"rank{env.rank}")
            )

    def record(self, **fields) -> None:
        """Rank 0: append one line to metrics.jsonl (other ranks: no-op)."""
        if self._jsonl is not None:
            fields.setdefault("attempt", self.env.attempt)
            fields.setdefault("time", round(time.time(), 3))
            self._jsonl.write(json.dumps(fields, sort_keys=True) + "\n")
            self._jsonl.flush()

    def scalars(self, step: int, values: dict) -> None:
        """Every rank: TensorBoard scalars under tensorboard/rank<R>/."""
        if self._tb is not None:
            for k, v in values.items():
                self._tb.add_scalar(k, v, step)

    def final(self, **fields) -> None:
        if self.env.rank == 0:
            fields.setdefault("world_size", self.env.world_size)
            fields.setdefault("attempt", self.env.attempt)
            write_json_atomic(os.path.join(self.env.run_dir, "final.json"), fields)

    def close(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def global_batch_stats(loss, logits, yb, device) -> tuple[float, float]:
    """(mean loss, accuracy) of this step's batch over all ranks (collective)."""
    import torch
    import torch.distributed as dist

    stats = torch.tensor(
        [loss.item() * len(yb), (logits.argmax(1) == yb).sum().item(), len(yb)],
        dtype=torch.float64,
        device=device,
    )
    dist.all_reduce(stats)
    return stats[0].item() / stats[2].item(), stats[1].item() / stats[2].item()


def evaluate(model, dataset, env, device, batch: int = 512) -> tuple[float, float]:
    """(accuracy, mean loss) over `dataset`, each rank taking indices rank::W, summed over ranks."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    with torch.no_grad():
        was_training = model.training
        model.eval()
        loss_sum, correct = 0.0, 0.0
        idx = list(range(env.rank, len(dataset), env.world_size))
        for i in range(0, len(idx), batch):
            xb, yb = dataset.__getitems__(idx[i : i + batch])
            logits = model(xb.to(device))
            yb = yb.to(device)
            loss_sum += F.cross_entropy(logits, yb, reduction="sum").item()
            correct += (logits.argmax(1) == yb).sum().item()
        t = torch.tensor([loss_sum, correct, float(len(idx))], dtype=torch.float64, device=device)
        dist.all_reduce(t)
        model.train(was_training)
        return t[1].item() / t[2].item(), t[0].item() / t[2].item()
