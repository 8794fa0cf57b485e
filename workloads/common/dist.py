"""Distributed environment: read the worker env, init the process group, tear it down safely.

Env contract (docs/ARCHITECTURE.md): torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR/PORT; the launcher adds NODE_RANK, LAUNCH_RUN_DIR, LAUNCH_RUN_ID, LAUNCH_CHECKPOINT_DIR,
LAUNCH_ATTEMPT, LAUNCH_DIST_BACKEND. Without them (plain `python -m ...`) this is a 1-rank world.

Teardown order matters (gloo + DDP can deadlock at exit when the DDP Reducer holds the last
reference to the process group): keep model/optimizer/loader inside a function, and after it returns
call `teardown()` = gc.collect(), barrier, destroy_process_group(). `run_worker` does exactly that
and leaves with os._exit(1) on an exception, so a failing rank never hangs in destructors.
"""

from __future__ import annotations

import gc
import os
import sys
import traceback
from dataclasses import dataclass
from datetime import timedelta

BACKENDS = ("gloo", "nccl")


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    run_dir: str
    run_id: str
    checkpoint_dir: str
    attempt: int
    restart_count: int  # torchrun in-place restarts (TORCHELASTIC_RESTART_COUNT)
    backend: str  # gloo | nccl | "" (= decide at init: nccl if CUDA else gloo)
    launched: bool  # True when started by torchrun (MASTER_ADDR present)
    # the node slot it runs on (LAUNCH_NODE_SLOT: launch local; -1 when not told)
    node_slot: int = -1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _int_env(env, name: str, default: int) -> int:
    text = env.get(name, "")
    if text == "":
        return default
    try:
        return int(text)
    except ValueError:
        raise SystemExit(f"error: environment variable {name}={text!r} is not an integer") from None


def read_env(run_dir_flag: str | None = None, environ=None) -> DistEnv:
    """The worker's place in the job, from the environment. Torch-free."""
    env = os.environ if environ is None else environ
    run_dir = os.path.abspath(env.get("LAUNCH_RUN_DIR") or run_dir_flag or "run-local")
    backend = env.get("LAUNCH_DIST_BACKEND", "")
    if backend not in BACKENDS + ("",):
        raise SystemExit(
            f"error: LAUNCH_DIST_BACKEND={backend!r} is not accepted (accepted: gloo, nccl)"
        )
    world = _int_env(env, "WORLD_SIZE", 1)
    rank = _int_env(env, "RANK", 0)
    if world < 1 or not 0 <= rank < world:
        raise SystemExit(f"error: RANK={rank} / WORLD_SIZE={world} is not a valid rank/world size")
    return DistEnv(
        rank=rank,
        world_size=world,
        local_rank=_int_env(env, "LOCAL_RANK", 0),
        local_world_size=_int_env(env, "LOCAL_WORLD_SIZE", 1),
        node_rank=_int_env(env, "NODE_RANK", _int_env(env, "GROUP_RANK", 0)),
        run_dir=run_dir,
        run_id=env.get("LAUNCH_RUN_ID", "local"),
        checkpoint_dir=os.path.abspath(
            env.get("LAUNCH_CHECKPOINT_DIR") or os.path.join(run_dir, "checkpoints")
        ),
        attempt=_int_env(env, "LAUNCH_ATTEMPT", 0),
        restart_count=_int_env(env, "TORCHELASTIC_RESTART_COUNT", 0),
        backend=backend,
        launched="MASTER_ADDR" in env,
        node_slot=_int_env(env, "LAUNCH_NODE_SLOT", -1),
    )


def init(env: DistEnv, *, deterministic: bool = False, timeout_s: float = 300.0):
    """Threads, determinism, device and process group. Returns (device, backend)."""
    from . import preempt

    preempt.install()  # before the torch import: USR2/SIGTERM mean checkpoint-and-stop
    import torch
    import torch.distributed as dist

    if "OMP_NUM_THREADS" not in os.environ:
        # torchrun only sets OMP_NUM_THREADS=1 for nproc_per_node > 1; bit-exact resume needs the
        # same intra-op thread count in every attempt, so pin it when nobody chose one.
        torch.set_num_threads(1)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
    backend = env.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise SystemExit(
                "error: LAUNCH_DIST_BACKEND=nccl but CUDA is not available (accepted here: gloo)"
            )
        torch.cuda.set_device(env.local_rank)
        device = torch.device("cuda", env.local_rank)
    else:
        device = torch.device("cpu")
    timeout = timedelta(seconds=timeout_s)
    if env.launched:
        dist.init_process_group(
            backend, init_method="env://", rank=env.rank, world_size=env.world_size, timeout=timeout
        )
    else:  # plain single process: no rendezvous needed
        dist.init_process_group(
            backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout
        )
    return device, backend


def teardown() -> None:
    """Destroy the process group through its own binding, after everything that references it
    died."""
    import torch.distributed as dist

    gc.collect()
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def run_worker(body) -> int:
    """Run `body()` (which owns every model/optimizer/loader object), then tear down.

    On an exception: print it and leave with os._exit(1) right away; the other ranks see the broken
    connection and fail too, instead of anyone waiting in a destructor or a barrier. A hang's stop
    (preempt.HangStop: the loop cleaned up, its peers are gone): os._exit(0), no teardown barrier.
    """
    from .preempt import HangStop

    try:
        body()
        teardown()
    except HangStop:
        _hard_exit(0)
    except SystemExit as e:
        if e.code not in (0, None):
            if isinstance(e.code, str):
                print(e.code, file=sys.stderr)
            _hard_exit(e.code if isinstance(e.code, int) else 1)
        raise
    except BaseException:  # noqa: BLE001 - a worker must never hang on the way out
        traceback.print_exc()
        _hard_exit(1)
    return 0


def _hard_exit(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def serve(name: str, env: DistEnv, args, load_data, train, describe=lambda data: "") -> int:
    """The one worker entry of every workload: load data (bad files fail before the process group
    exists), init, log one line on rank 0, then train(args, env, device, data, log) inside
    run_worker's teardown."""
    import time

    def log(msg: str) -> None:
        if env.rank == 0:
            print(msg, flush=True)

    def body() -> None:
        t0 = time.time()
        data = load_data()
        device, backend = init(env, deterministic=args.deterministic, timeout_s=args.pg_timeout)
        import torch

        log(
            f"{name}: {describe(data)}world_size {env.world_size} batch {args.batch_size}/rank "
            f"backend {backend} device {device} threads {torch.get_num_threads()} attempt "
            f"{env.attempt} init {time.time() - t0:.1f}s run_dir {env.run_dir}"
        )
        train(args, env, device, data, log)

    return run_worker(body)


def load_dataset(args):
    """Loader for serve(): the --dataset / --data-dir datasets of workloads.common.data."""
    from . import data as wdata

    return lambda: wdata.load(args.dataset, args.data_dir)
