"""A Transformers Trainer program with memory checkpoints
(launchers.integrations.hf_memory_callback; tests/test_memckpt_user.py): a Linear layer, 8 steps an
epoch (a restore mid-epoch: the Trainer skips the batches done), each step's noise from the rank's
global RNG (a restore must bring it back), the Trainer's own checkpoints every --checkpoint-every
steps in $LAUNCH_CHECKPOINT_DIR, resumed from the newest one -- or from memory when it holds a newer
whole step; rank 0 writes final.json (the weights' sha256) into the run dir."""

import glob
import hashlib
import json
import os
import time

import torch
from memckpt_user import options  # (beside it: tests/data)
from transformers import Trainer, TrainerCallback, TrainingArguments

from launchers import integrations


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def forward(self, x, y):
        noise = torch.randn(x.shape[0], 1)
        return {"loss": ((self.layer(x) - y - 0.1 * noise) ** 2).mean()}


class Rows(torch.utils.data.Dataset):
    def __init__(self) -> None:
        self.x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {"x": self.x[i], "y": self.x[i].sum(0, keepdim=True)}


class Delay(TrainerCallback):
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_step_end(self, *args, **kwargs) -> None:
        time.sleep(self.seconds)


def main() -> None:
    a = options()
    ckpt, run_dir = os.environ["LAUNCH_CHECKPOINT_DIR"], os.environ["LAUNCH_RUN_DIR"]
    targs = TrainingArguments(
        output_dir=ckpt,
        max_steps=a.steps,
        save_strategy="steps",
        save_steps=a.checkpoint_every,
        per_device_train_batch_size=4,
        learning_rate=0.05,
        use_cpu=True,
        ddp_find_unused_parameters=False,
        average_tokens_across_devices=False,
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
    )
    torch.manual_seed(0)
    model = Net()
    mem = integrations.hf_memory_callback()  # first in the list: its step end runs first
    trainer = Trainer(
        model=model,
        args=targs,
        train_dataset=Rows(),
        callbacks=[mem, integrations.hf_callback(), Delay(a.step_delay)],
    )
    torch.manual_seed(1 + targs.process_index)  # each rank its own noise
    saved = sorted(
        glob.glob(os.path.join(ckpt, "checkpoint-*")), key=lambda p: int(p.rsplit("-", 1)[1])
    )
    resume = mem.resume_from(saved[-1] if saved else None)
    print(f"rank {targs.process_index}: resuming from {resume}", flush=True)
    trainer.train(resume_from_checkpoint=resume)
    sha = hashlib.sha256(
        b"".join(p.detach().numpy().tobytes() for p in model.parameters())
    ).hexdigest()
    if targs.process_index == 0:
        with open(os.path.join(run_dir, "final.json"), "w") as f:
            json.dump({"step": trainer.state.global_step, "param_sha256": sha}, f)


if __name__ == "__main__":
    main()
