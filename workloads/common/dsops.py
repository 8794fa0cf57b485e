"""DeepSpeed's JIT-compiled ops on CPU: one shared, prebuilt cache instead of a compile per run.

On a CPU-only machine DeepSpeed compiles C++ ops with ninja the first time they are loaded:
`deepspeed_shm_comm` at every deepspeed.initialize (its CPU communication backend) and `fused_adam`
when the config's Adam is DeepSpeed's own. Each costs minutes on a small machine. torch caches the
result in TORCH_EXTENSIONS_DIR (default ~/.cache/torch_extensions, per user and per node).

use_shared_cache() points TORCH_EXTENSIONS_DIR at <venv>/torch_extensions unless the user set it,
so the cache travels with the environment; `python -m workloads.common.dsops [--all]` fills it once
(the Makefile runs it after installing deepspeed). Torch-free until prebuild() runs.
"""

from __future__ import annotations

import os
import sys
import time

OPS = {"shm_comm": "ShareMemCommBuilder", "fused_adam": "FusedAdamBuilder"}


def shared_cache_dir() -> str:
    return os.path.join(sys.prefix, "torch_extensions")


def use_shared_cache() -> str:
    """This venv's prebuilt cache unless the user set TORCH_EXTENSIONS_DIR; the launcher's own
    directory (LAUNCH_TORCH_EXTENSIONS_DIR: launchers.frozen.extcache, per environment under the
    runs root) gives way to the venv's when that holds a build (the Makefile's prebuild), so a run
    under launch loads it instead of compiling it again."""
    mine, given = shared_cache_dir(), os.environ.get("TORCH_EXTENSIONS_DIR")
    if given is None or (
        given == os.environ.get("LAUNCH_TORCH_EXTENSIONS_DIR") and os.path.isdir(mine)
    ):
        os.environ["TORCH_EXTENSIONS_DIR"] = mine
    return os.environ["TORCH_EXTENSIONS_DIR"]


def prebuild(names) -> dict:
    """Build (or load from the cache) the named ops; returns seconds per op."""
    use_shared_cache()
    from deepspeed.accelerator import get_accelerator

    out = {}
    for name in names:
        t0 = time.perf_counter()
        builder = get_accelerator().create_op_builder(OPS[name])
        if builder is not None:
            builder.load()
        out[name] = round(time.perf_counter() - t0, 1)
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    bad = [a for a in argv if a != "--all"]
    if bad:
        print(f"dsops: error: unknown argument {bad[0]!r} (accepted: --all)", file=sys.stderr)
        return 2
    names = list(OPS) if "--all" in argv else ["shm_comm"]
    secs = prebuild(names)
    print(
        f"dsops: TORCH_EXTENSIONS_DIR={os.environ['TORCH_EXTENSIONS_DIR']} "
        + " ".join(f"{k} {v}s" for k, v in secs.items())
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
