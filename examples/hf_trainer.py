"""HF Transformers' Trainer under `launch` (recipe: docs/FRAMEWORKS.md).

    launch local --nodes 2 --gpus-per-node 1 -- examples/hf_trainer.py --max-steps 8

A tiny BERT classifier built from a config (2 layers, hidden 32, vocab 100: nothing is downloaded)
trained on generated token sequences by `Trainer`, started by torchrun (not `accelerate launch`, not
`python -m torch.distributed.run` inside): TrainingArguments reads RANK, WORLD_SIZE, LOCAL_RANK and
MASTER_* from the environment and joins torchrun's world. On CPU `use_cpu=True` and
`ddp_backend=$LAUNCH_DIST_BACKEND` (gloo). Files: the Trainer's checkpoints `checkpoint-<N>/`
directly in $LAUNCH_CHECKPOINT_DIR (output_dir), which launchers.integrations.hf_callback() names in
`checkpoints/latest` (and reports every rank's step and the total); no tracker (report_to="none"). A
resumed attempt (LAUNCH_ATTEMPT > 0) continues from `latest`
(trainer.train(resume_from_checkpoint=...)). Each rank prints one REPORT line: the world the Trainer
sees.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

from launchers import integrations
from launchers.ckptptr import read_latest


class Tokens(torch.utils.data.Dataset):
    """n generated sequences of token ids; the label: whether the first token is in the upper
    half."""

    def __init__(self, n: int, length: int, vocab: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(1, vocab, (n, length), generator=g)
        self.labels = (self.ids[:, 0] >= vocab // 2).long()

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {
            "input_ids": self.ids[i],
            "attention_mask": torch.ones_like(self.ids[i]),
            "labels": self.labels[i],
        }


def report(args: TrainingArguments) -> None:
    """One line per rank: the world the Trainer joined (its process group: an all-reduce of rank +
    1)."""
    world = args.world_size
    total = torch.tensor([float(args.process_index + 1)])
    if dist.is_initialized():
        dist.all_reduce(total)
    rec = {
        "framework": "transformers",
        "rank": args.process_index,
        "world": world,
        "node_rank": int(os.environ.get("NODE_RANK", "0")),
        "local_rank": args.local_process_index,
        "sum": float(total.item()),
        "container": os.path.exists("/run/.containerenv"),
        "cwd": os.getcwd(),
    }
    print("REPORT " + json.dumps(rec), flush=True)
    if world != int(os.environ.get("WORLD_SIZE", "1")):
        sys.exit(
            f"hf_trainer: error: torchrun started WORLD_SIZE={os.environ['WORLD_SIZE']} "
            f"processes but the Trainer sees {world}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(prog="hf_trainer")
    ap.add_argument("--max-steps", type=int, default=8)
    ap.add_argument("--checkpoint-every", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=4)
    args = ap.parse_args()
    ckpt_dir = os.environ.get("LAUNCH_CHECKPOINT_DIR", os.path.abspath("hf_trainer_checkpoints"))
    targs = TrainingArguments(
        output_dir=ckpt_dir,  # checkpoint-<N>/ directly here: `latest` can name them
        max_steps=args.max_steps,
        save_strategy="steps",
        save_steps=args.checkpoint_every,
        per_device_train_batch_size=args.batch_size,
        learning_rate=1e-3,
        logging_steps=1,
        use_cpu=not torch.cuda.is_available(),  # CPU: gloo; GPUs: nccl
        ddp_backend=os.environ.get("LAUNCH_DIST_BACKEND") or None,
        ddp_find_unused_parameters=False,
        # else a mean loss (this one) is scaled by the world size
        average_tokens_across_devices=False,
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
    )
    report(targs)
    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        num_labels=2,
    )
    trainer = Trainer(
        model=BertForSequenceClassification(cfg),
        args=targs,
        train_dataset=Tokens(256, 16, 100),
        callbacks=[integrations.hf_callback()],
    )
    latest = read_latest(ckpt_dir)
    resume = (
        os.path.join(ckpt_dir, latest)
        if latest and int(os.environ.get("LAUNCH_ATTEMPT", "0")) > 0
        else None
    )
    out = trainer.train(resume_from_checkpoint=resume)
    print(f"DONE rank {targs.process_index} step {out.global_step}", flush=True)


if __name__ == "__main__":
    main()
