"""A Lightning program with memory checkpoints (launchers.integrations.lightning_memory_callback;
tests/test_memckpt_user.py): a Linear layer trained with Adam, one step an epoch (Lightning restarts
an epoch's plain DataLoader from its first batch: only a copy at an epoch's end resumes its data
exactly), each step's noise from the rank's global RNG (a restore must bring it back), Lightning's
own checkpoints every --checkpoint-every steps in $LAUNCH_CHECKPOINT_DIR (step-<N>.ckpt), resumed
from the newest one -- or from memory when it holds a newer whole step; rank 0 writes final.json
(the weights' sha256) into the run dir."""

import glob
import hashlib
import json
import os
import re
import time

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy
from memckpt_user import options  # (beside it: tests/data)
from torch.utils.data import DataLoader, TensorDataset

from launchers import integrations


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        (x,) = batch
        noise = torch.randn(x.shape[0], 1)
        return ((self.layer(x) - x.sum(1, keepdim=True) - 0.1 * noise) ** 2).mean()

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.05)


class Delay(Callback):
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_train_batch_end(self, *args) -> None:
        time.sleep(self.seconds)


def main() -> None:
    a = options()
    ckpt, run_dir = os.environ["LAUNCH_CHECKPOINT_DIR"], os.environ["LAUNCH_RUN_DIR"]
    L.seed_everything(0, verbose=False)
    model = Model()
    torch.manual_seed(1 + int(os.environ.get("RANK", "0")))  # each rank its own noise
    data = TensorDataset(torch.randn(8, 4, generator=torch.Generator().manual_seed(0)))
    mem = integrations.lightning_memory_callback()  # first in the list: its batch start runs first
    trainer = L.Trainer(
        accelerator="cpu",
        devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        num_nodes=int(os.environ.get("NNODES", "1")),
        strategy=DDPStrategy(process_group_backend="gloo"),
        default_root_dir=run_dir,
        max_steps=a.steps,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[
            mem,
            integrations.lightning_callback(),
            Delay(a.step_delay),
            ModelCheckpoint(
                dirpath=ckpt,
                filename="step-{step}",
                auto_insert_metric_name=False,
                every_n_train_steps=a.checkpoint_every,
                save_top_k=-1,
            ),
        ],
    )
    saved = sorted(
        glob.glob(os.path.join(ckpt, "step-*.ckpt")), key=lambda p: int(re.findall(r"\d+", p)[-1])
    )
    resume = mem.resume_from(saved[-1] if saved else None)
    print(f"rank {trainer.global_rank}: resuming from {resume}", flush=True)
    trainer.fit(model, DataLoader(data, batch_size=4, shuffle=True), ckpt_path=resume)
    sha = hashlib.sha256(
        b"".join(p.detach().numpy().tobytes() for p in model.parameters())
    ).hexdigest()
    if trainer.global_rank == 0:
        with open(os.path.join(run_dir, "final.json"), "w") as f:
            json.dump({"step": trainer.global_step, "param_sha256": sha}, f)


if __name__ == "__main__":
    main()
