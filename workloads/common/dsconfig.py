"""DeepSpeed config: load + validate a ds_config JSON (torch-free), then resolve it for one run.

Validation runs before the process group exists, on every rank, from the same file, so all ranks
reach the same verdict. Every error is one line naming the file and the key.
"""

from __future__ import annotations

import copy
import json
import os

DEFAULT_CONFIG = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "ds_zero.json"
)
STAGES = (1, 2, 3)
PRECISIONS = ("auto", "fp16", "bf16", "fp32")
ADAMS = ("auto", "torch", "deepspeed")


class ConfigError(ValueError):
    pass


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _get(cfg: dict, dotted: str):
    cur = cfg
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return KeyError
        cur = cur[part]
    return cur


# key -> (predicate, what is accepted); required keys first
REQUIRED = {
    "optimizer.type": (
        lambda v: isinstance(v, str) and v.lower() in ("adam", "adamw"),
        '"Adam" or "AdamW"',
    ),
    "optimizer.params.lr": (lambda v: _num(v) and v > 0, "a positive number"),
    "zero_optimization": (lambda v: isinstance(v, dict), "an object"),
}
OPTIONAL = {
    "optimizer.params.betas": (
        lambda v: isinstance(v, list) and len(v) == 2 and all(_num(b) and 0 <= b < 1 for b in v),
        "two numbers in [0, 1)",
    ),
    "optimizer.params.eps": (lambda v: _num(v) and v > 0, "a positive number"),
    "optimizer.params.weight_decay": (lambda v: _num(v) and v >= 0, "a non-negative number"),
    "gradient_accumulation_steps": (
        lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
        "an integer >= 1",
    ),
    "zero_optimization.stage": (
        lambda v: v in (0, 1, 2, 3) and not isinstance(v, bool),
        "0, 1, 2 or 3",
    ),
    "zero_optimization.allgather_bucket_size": (
        lambda v: _num(v) and v >= 1,
        "a positive number of elements",
    ),
    "zero_optimization.reduce_bucket_size": (
        lambda v: _num(v) and v >= 1,
        "a positive number of elements",
    ),
    "fp16.enabled": (lambda v: isinstance(v, bool) or v == "auto", "true or false"),
    "bf16.enabled": (lambda v: isinstance(v, bool) or v == "auto", "true or false"),
}
for _k in ("overlap_comm", "contiguous_gradients", "allgather_partitions", "reduce_scatter"):
    OPTIONAL[f"zero_optimization.{_k}"] = (lambda v: isinstance(v, bool), "true or false")


def load(path: str) -> dict:
    """The parsed and checked config, or ConfigError with a one-line message."""
    if not os.path.isfile(path):
        raise ConfigError(
            f"--ds-config {path!r} is not a file (expected a DeepSpeed JSON config such as "
            f"{DEFAULT_CONFIG})"
        )
    try:
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
    except json.JSONDecodeError as e:
        raise ConfigError(
            f"--ds-config {path}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})"
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"--ds-config {path}: cannot be read ({e})") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"--ds-config {path}: the top level must be a JSON object")
    for key, (ok, what) in REQUIRED.items():
        v = _get(cfg, key)
        if v is KeyError:
            raise ConfigError(
                f"--ds-config {path}: required key {key!r} is missing (accepted: {what})"
            )
        if not ok(v):
            raise ConfigError(f"--ds-config {path}: key {key!r} is {v!r} (accepted: {what})")
    for key, (ok, what) in OPTIONAL.items():
        v = _get(cfg, key)
        if v is not KeyError and not ok(v):
            raise ConfigError(f"--ds-config {path}: key {key!r} is {v!r} (accepted: {what})")
    return cfg


def cpu_has_native_bf16() -> bool:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def choose_precision(requested: str, cuda: bool) -> tuple[str, str]:
    """(precision, reason). fp16 on GPU; on CPU bf16 where the CPU computes it natively, else
    fp32."""
    if requested != "auto":
        if requested == "fp16" and not cuda:
            raise ConfigError(
                "--precision fp16 is not supported on CPU by DeepSpeed (accepted here: auto, "
                "bf16, fp32)"
            )
        return requested, "requested with --precision"
    if cuda:
        return "fp16", "auto: CUDA device"
    if cpu_has_native_bf16():
        return "bf16", "auto: CPU without fp16 support, with native bf16 (avx512_bf16/amx_bf16)"
    return (
        "fp32",
        "auto: CPU without fp16 support and without native bf16 (no avx512_bf16/amx_bf16 flag)",
    )


def resolve(
    cfg: dict,
    *,
    stage: int,
    micro_batch: int,
    world_size: int,
    precision: str,
    adam: str,
    lr: float | None,
) -> dict:
    """A copy of cfg for this run: stage, batch sizes for this world size, precision, optimizer
    impl."""
    out = copy.deepcopy(cfg)
    out["zero_optimization"]["stage"] = stage
    gas = out.get("gradient_accumulation_steps", 1)
    out["train_micro_batch_size_per_gpu"] = micro_batch
    out["train_batch_size"] = micro_batch * world_size * gas
    # a disabled section must not keep options such as fp16.auto_cast (DeepSpeed would still cast
    # inputs)
    out["fp16"] = (
        dict(out.get("fp16") or {}, enabled=True) if precision == "fp16" else {"enabled": False}
    )
    out["bf16"] = (
        dict(out.get("bf16") or {}, enabled=True) if precision == "bf16" else {"enabled": False}
    )
    params = out["optimizer"].setdefault("params", {})
    if lr is not None:
        params["lr"] = lr
    if adam == "torch":
        params["torch_adam"] = True
    else:
        params.pop("torch_adam", None)
    return out
