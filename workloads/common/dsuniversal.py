"""Resharding a DeepSpeed ZeRO checkpoint: DeepSpeed's universal format, made once, next to the
original.

A ZeRO checkpoint (`<checkpoint dir>/step-<N>/`) holds one optimizer shard per rank and loads only
at the world size that wrote it. To resume at another world size, rank 0 converts it with
DeepSpeed's own tool (deepspeed.checkpoint.ds_to_universal, in this process) into the sibling
`<checkpoint dir>/step-<N>-universal/` while the other ranks wait; every rank then loads that with
the engine's `load_universal` switch on.

The conversion never touches what the job wrote: it writes into `.step-<N>-universal.tmp-<pid>/`
(which also takes the `latest_universal` file the tool writes next to its output) and renames the
finished folder into place, so `step-<N>-universal/` exists complete or not at all; a finished one
is reused (the format does not depend on the world size). Its output goes to `ds_to_universal.log`
inside the converted folder, and `launch_universal.json` there says what it was made from.
Non-Megatron models carry no `universal_checkpoint_info`, so the tool's --inject_missing_state is
used (the version key only).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import time
import traceback

from .metrics import write_json_atomic

SUFFIX = "-universal"
INFO = "launch_universal.json"
LOG = "ds_to_universal.log"


def universal_name(name: str) -> str:
    return name + SUFFIX


def run_tool(src: str, out: str) -> None:
    """DeepSpeed's ds_to_universal main() on src -> out (no worker processes), its output into out's
    log."""
    from deepspeed.checkpoint import ds_to_universal

    args = argparse.Namespace(
        input_folder=src,
        output_folder=out,
        num_extract_workers=1,
        num_merge_workers=1,
        keep_temp_folder=False,
        strict=True,
        inject_missing_state=True,
    )
    log_path = os.path.join(os.path.dirname(out), LOG)
    with (
        open(log_path, "w", encoding="utf-8") as f,
        contextlib.redirect_stdout(f),
        contextlib.redirect_stderr(f),
    ):
        try:
            ds_to_universal.main(args)
        except Exception:
            traceback.print_exc()
            raise
    os.replace(log_path, os.path.join(out, LOG))


def why(exc: BaseException) -> str:
    """The first line of an exception (at most 160 characters), with its type (the tool mostly
    asserts)."""
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    first = first if len(first) <= 160 else first[:157] + "..."
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def convert(ckpt_dir: str, name: str, meta: dict) -> tuple[str, float] | str:
    """(universal checkpoint name, seconds spent converting; 0 when reused) or a one-line error.
    Rank 0 only."""
    src, target = os.path.join(ckpt_dir, name), universal_name(name)
    dst = os.path.join(ckpt_dir, target)
    if os.path.isfile(os.path.join(dst, INFO)):
        return target, 0.0
    if os.path.exists(dst):
        return (
            f"checkpoint {src} cannot be resharded: {dst} exists but is not a finished conversion "
            f"(no {INFO}); move it away to convert again"
        )
    t0 = time.perf_counter()
    tmp = os.path.join(ckpt_dir, f".{target}.tmp-{os.getpid()}")
    out = os.path.join(tmp, target)
    try:
        os.makedirs(tmp)
        run_tool(src, out)
        import deepspeed

        write_json_atomic(
            os.path.join(out, INFO),
            {
                "source": name,
                "source_world_size": meta.get("world_size"),
                "step": meta.get("step"),
                "deepspeed": deepspeed.__version__,
            },
        )
        os.rename(out, dst)
    except Exception as e:  # the tool asserts, raises ValueError/NotImplementedError/OSError...
        return (
            f"checkpoint {src} cannot be converted to DeepSpeed's universal format for resharding "
            f"({why(e)}; its output and traceback: {tmp}/{LOG}); resume at its own world size "
            f"({meta.get('world_size')} ranks)"
        )
    shutil.rmtree(tmp, ignore_errors=True)
    return target, time.perf_counter() - t0
