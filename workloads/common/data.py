"""Datasets (digits | synthetic | cifar10) as in-memory tensors, and a resumable distributed
sampler.

digits    scikit-learn's bundled 8x8 digits (1797 samples, no download); fixed 80/20 train/test
          split
synthetic learnable 3x32x32 images: per-class low-resolution prototypes plus noise (fixed seed)
cifar10   the standard python batches (data_batch_1..5, test_batch) from --data-dir; no download
`check()` is torch-free and runs before the process group exists. Samples are normalised per batch
(`__getitems__`), so CIFAR-10 stays uint8 in memory.
"""

from __future__ import annotations

import gzip
import importlib.util
import math
import os
import pickle
from dataclasses import dataclass

DATASETS = ("digits", "synthetic", "cifar10")
CIFAR_FILES = tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch",)


def _cifar_root(data_dir: str) -> str:
    nested = os.path.join(data_dir, "cifar-10-batches-py")
    return nested if os.path.isdir(nested) else data_dir


def check(dataset: str, data_dir: str | None) -> str | None:
    """An error message for unusable data flags, or None."""
    if dataset not in DATASETS:
        return f"--dataset {dataset!r} is not accepted (accepted: {', '.join(DATASETS)})"
    if dataset != "cifar10":
        return None
    if not data_dir:
        return (
            "--dataset cifar10 needs --data-dir DIR holding the CIFAR-10 python batches "
            f"({', '.join(CIFAR_FILES)}); nothing is downloaded"
        )
    if not os.path.isdir(data_dir):
        return f"--data-dir {data_dir!r} is not a directory (expected the CIFAR-10 python batches)"
    root = _cifar_root(data_dir)
    missing = [f for f in CIFAR_FILES if not os.path.isfile(os.path.join(root, f))]
    if missing:
        return (
            f"--data-dir {data_dir!r} lacks CIFAR-10 file(s) {', '.join(missing)} (expected "
            f"{', '.join(CIFAR_FILES)})"
        )
    return None


@dataclass
class Data:
    name: str
    train: "ArrayDataset"
    test: "ArrayDataset"
    in_shape: tuple  # (C, H, W)
    num_classes: int


class ArrayDataset:
    """x (any dtype) and integer labels; a sample is (x * scale + shift as float32, label)."""

    def __init__(self, x, y, scale: float = 1.0, shift: float = 0.0) -> None:
        assert len(x) == len(y)
        self.x, self.y, self.scale, self.shift = x, y, scale, shift

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i].float() * self.scale + self.shift, self.y[i]

    def __getitems__(self, idx):  # DataLoader hands a whole batch of indices here
        import torch

        idx = torch.as_tensor(idx, dtype=torch.long)
        return self.x[idx].float() * self.scale + self.shift, self.y[idx]


def batch_collate(batch):
    """collate_fn for ArrayDataset: __getitems__ already returns a stacked (x, y) batch."""
    return batch


def load(dataset: str, data_dir: str | None = None) -> Data:
    err = check(dataset, data_dir)
    if err:
        raise ValueError(err)
    return {"digits": _digits, "synthetic": _synthetic, "cifar10": _cifar10}[dataset](data_dir)


def digits_array():
    """load_digits() values without importing sklearn (1+ s per rank): read its bundled csv
    directly."""
    import numpy as np

    spec = importlib.util.find_spec("sklearn")
    path = (
        os.path.join(os.path.dirname(spec.origin), "datasets", "data", "digits.csv.gz")
        if spec
        else ""
    )
    if os.path.isfile(path):
        with gzip.open(path, "rt") as f:
            raw = np.loadtxt(f, delimiter=",")
        return raw[:, :-1], raw[:, -1].astype(int)
    from sklearn.datasets import load_digits

    d = load_digits()
    return d.data, d.target


def _digits(_data_dir) -> Data:
    import numpy as np
    import torch

    x, y = digits_array()
    order = np.random.default_rng(0).permutation(len(y))  # fixed split, independent of --seed
    n_test = len(y) // 5
    x = torch.tensor(x[order], dtype=torch.float32).reshape(-1, 1, 8, 8)
    y = torch.tensor(y[order], dtype=torch.long)
    scale, shift = 2.0 / 16.0, -1.0  # pixels 0..16 -> [-1, 1]
    return Data(
        "digits",
        ArrayDataset(x[n_test:], y[n_test:], scale, shift),
        ArrayDataset(x[:n_test], y[:n_test], scale, shift),
        (1, 8, 8),
        10,
    )


def _synthetic(_data_dir, n_train: int = 2048, n_test: int = 512) -> Data:
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(20240601)  # fixed data, independent of --seed
    protos = F.interpolate(torch.randn(10, 3, 4, 4, generator=g), scale_factor=8, mode="nearest")
    y = torch.randint(0, 10, (n_train + n_test,), generator=g)
    # hard enough to take epochs
    x = 0.08 * protos[y] + torch.randn(n_train + n_test, 3, 32, 32, generator=g)
    return Data(
        "synthetic",
        ArrayDataset(x[:n_train], y[:n_train]),
        ArrayDataset(x[n_train:], y[n_train:]),
        (3, 32, 32),
        10,
    )


def _read_cifar_batch(path: str):
    import numpy as np

    with open(path, "rb") as f:
        d = pickle.load(f, encoding="bytes")
    x = np.asarray(d[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
    return x, np.asarray(d[b"labels"], dtype=np.int64)


def _cifar10(data_dir) -> Data:
    import numpy as np
    import torch

    root = _cifar_root(data_dir)
    parts = [_read_cifar_batch(os.path.join(root, f)) for f in CIFAR_FILES[:-1]]
    xt, yt = _read_cifar_batch(os.path.join(root, "test_batch"))
    x = torch.from_numpy(np.concatenate([p[0] for p in parts]))
    y = torch.from_numpy(np.concatenate([p[1] for p in parts]))
    scale, shift = 2.0 / 255.0, -1.0  # Normalize((0.5,)*3, (0.5,)*3)
    return Data(
        "cifar10",
        ArrayDataset(x, y, scale, shift),
        ArrayDataset(torch.from_numpy(xt), torch.from_numpy(yt), scale, shift),
        (3, 32, 32),
        10,
    )


def resumable_sampler(dataset, world_size: int, rank: int, seed: int):
    """A DistributedSampler (shuffle, drop_last=False) that can start mid-epoch at a global offset.

    Position is stored as a *global* sample offset within the epoch (a multiple of the world size):
    rank r then takes padded_perm[offset + r :: W]. The permutation depends only on (seed, epoch),
    so resuming slices the index list instead of replaying batches (which would consume RNG twice).
    """
    from torch.utils.data.distributed import DistributedSampler

    class ResumableSampler(DistributedSampler):
        offset = 0

        def set_position(self, epoch: int, offset: int) -> None:
            self.set_epoch(epoch)
            self.offset = offset

        def __iter__(self):
            return iter(list(super().__iter__())[self.offset // self.num_replicas :])

        def __len__(self) -> int:
            return max(0, self.num_samples - self.offset // self.num_replicas)

    return ResumableSampler(
        dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=False
    )


def steps_per_epoch(n: int, world_size: int, batch_size: int) -> int:
    return math.ceil(math.ceil(n / world_size) / batch_size)


def resumable_loader(dataset, env, args):
    """(sampler, generator, loader) for a resumable epoch: the sampler is positioned by global
    sample offset, and the DataLoader has its own generator so iter() never draws from the global
    torch RNG."""
    import torch
    from torch.utils.data import DataLoader

    sampler = resumable_sampler(dataset, env.world_size, env.rank, args.seed)
    gen = torch.Generator()
    loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        sampler=sampler,
        generator=gen,
        collate_fn=batch_collate,
        num_workers=0,
    )
    return sampler, gen, loader
