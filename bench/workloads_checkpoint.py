"""Checkpoint write (FSDP2 MLP + Adam state) through the workloads' Checkpointer: DCP sync save vs
save_async (time training is blocked) vs torch.save of the full state on rank 0 vs dd of the same
byte count; and resume: `launch resume` restart-to-first-step vs a cold start of the same workload.
Prints figure lines. The figures run with no more ranks than cores (min(4, os.cpu_count())), so they
measure DCP, not ranks fighting over CPUs; on a machine with fewer than 4 cores the 4-rank ratios
follow as a second line.

    python bench/workloads_checkpoint.py            # outer: starts torchrun itself, then launch local
"""  # noqa: E501

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
# the tiny form (tests/test_bench_tiny.py): 2 ranks, small model
TINY = os.environ.get("BENCH_TINY") == "1"
ROUNDS = 1 if TINY else int(os.environ.get("BENCH_ROUNDS", "5"))
WIDTH, LAYERS = (64, 2) if TINY else (1024, 8)


def inner(out_dir: str) -> None:
    """Times the workloads' own Checkpointer (get_state_dict, DCP write with fsync, `latest` commit)
    -- sync save, and save_async's blocked time (the call plus any wait of the next training step
    for the staging copy) -- interleaved with plain `dcp.save`/`dcp.async_save` on defaults, rank-0
    torch.save, and (rank 0, the others waiting) dd of the same byte count, so disk drift hits every
    case alike."""
    import types

    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
    from torch.distributed.fsdp import fully_shard

    from workloads.common.checkpoint import Checkpointer
    from workloads.common.stateful import ModelOptimState

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def train_step() -> float:
        t0 = time.perf_counter()
        model(torch.randn(8, WIDTH)).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    train_step()
    env = types.SimpleNamespace(rank=rank, world_size=dist.get_world_size(), checkpoint_dir=out_dir)
    ckpt = Checkpointer(env)
    states = {"app": ModelOptimState(model, opt)}
    keys = (
        "sync",
        "async_blocked",
        "async_call",
        "async_total",
        "step_alone",
        "step_during_write",
        "rank0_torch_save",
        "plain_sync",
        "plain_async_blocked",
        "dd",
    )
    res = {k: [] for k in keys}
    res["bytes"] = 0
    step = 0

    def settle() -> None:
        """Before each timed case: drop what earlier cases wrote and flush the page cache's dirty
        data, so no case pays for another's write-back (otherwise the later cases slow down as GBs
        pile up)."""
        dist.barrier()
        if rank == 0:
            for f in os.listdir(out_dir):
                p = os.path.join(out_dir, f)
                shutil.rmtree(p) if os.path.isdir(p) else os.unlink(p)
            os.sync()
        dist.barrier()

    for r in range(ROUNDS + 1):  # round 0 warms up (imports, first plan, async group, byte count)
        rec = {}
        settle()
        step += 1
        t0 = time.perf_counter()
        ckpt.save(step, states, {"epoch": 0})
        rec["sync"] = time.perf_counter() - t0
        dist.barrier()
        rec["step_alone"] = train_step()
        settle()
        step += 1
        b0 = ckpt.blocked_seconds
        t0 = time.perf_counter()
        ckpt.save_async(step, states, {"epoch": 0})
        rec["async_call"] = time.perf_counter() - t0
        # waits for staging at opt.step if the copy is not done
        rec["step_during_write"] = train_step()
        rec["async_blocked"] = ckpt.blocked_seconds - b0
        ckpt.finalize()
        rec["async_total"] = time.perf_counter() - t0
        settle()
        t0 = time.perf_counter()
        msd, osd = get_state_dict(model, opt)
        dcp.save(
            {"model": msd, "optim": osd}, checkpoint_id=os.path.join(out_dir, f"plain-sync{r}")
        )
        dist.barrier()
        rec["plain_sync"] = time.perf_counter() - t0
        settle()
        t0 = time.perf_counter()
        msd, osd = get_state_dict(model, opt)
        fut = dcp.async_save(
            {"model": msd, "optim": osd}, checkpoint_id=os.path.join(out_dir, f"plain-async{r}")
        )
        rec["plain_async_blocked"] = time.perf_counter() - t0
        fut.result()
        settle()
        t0 = time.perf_counter()
        full_m, full_o = get_state_dict(
            model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )
        if rank == 0:
            path = os.path.join(out_dir, f"full{r}.pt")
            with open(path, "wb") as f:
                torch.save({"model": full_m, "optim": full_o}, f)
                f.flush()
                os.fsync(f.fileno())
            res["bytes"] = os.path.getsize(path)
        dist.barrier()
        rec["rank0_torch_save"] = time.perf_counter() - t0
        settle()
        rec["dd"] = dd_seconds(res["bytes"], out_dir) if rank == 0 else 0.0
        dist.barrier()
        if r > 0:
            for k, v in rec.items():
                res[k].append(v)
    ckpt.close()
    if rank == 0:
        print("RESULT " + json.dumps(res), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def dd_seconds(nbytes: int, d: str) -> float:
    t0 = time.perf_counter()
    subprocess.run(
        [
            "dd",
            "if=/dev/zero",
            f"of={os.path.join(d, 'dd.bin')}",
            "bs=1M",
            f"count={max(1, nbytes // 2**20)}",
            "conv=fsync",
        ],
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - t0


def first_step_seconds(argv: list[str], log: str, marker: str, cwd: str) -> float:
    """Start `launch ...`, return seconds until `marker` shows up in rank 0's log; wait for the
    end."""
    t0 = time.perf_counter()
    p = subprocess.Popen(
        argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    seen = None
    while p.poll() is None or seen is None:
        if (
            seen is None
            and os.path.isfile(log)
            and marker in open(log, encoding="utf-8", errors="replace").read()
        ):
            seen = time.perf_counter() - t0
        if p.poll() is not None and seen is None:
            if not (
                os.path.isfile(log)
                and marker in open(log, encoding="utf-8", errors="replace").read()
            ):
                raise SystemExit(
                    f"{' '.join(argv)} exited {p.returncode} before {marker!r}: "
                    f"{p.stderr.read()[-2000:]}"
                )
        time.sleep(0.02)
    if p.wait() != 0:
        raise SystemExit(f"{' '.join(argv)} exited {p.returncode}")
    return seen


def inner_results(nproc: int, tmp: str) -> dict:
    """inner() under torchrun with `nproc` ranks; its RESULT record."""
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(nproc),
            os.path.abspath(__file__),
            "--inner",
            tmp,
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if p.returncode != 0 or not line:
        raise SystemExit(
            f"inner benchmark ({nproc} ranks) failed ({p.returncode}): {p.stderr[-3000:]}"
        )
    return json.loads(line[0][len("RESULT ") :])


def main() -> None:
    from benchlib import figure, median

    tmp = tempfile.mkdtemp(prefix="bench-ckpt-")
    try:
        ranks = 2 if TINY else max(1, min(4, os.cpu_count() or 1))
        r = inner_results(ranks, tmp)
        dd = median(r["dd"])
        sync, blocked, torch_save = (
            median(r["sync"]),
            median(r["async_blocked"]),
            median(r["rank0_torch_save"]),
        )
        mb = r["bytes"] / 2**20
        print(
            f"checkpoint: {mb:.0f} MiB of model+Adam state, {ranks} ranks on {os.cpu_count()} "
            f"cores (FSDP2, gloo), median of {ROUNDS}"
        )
        print(
            f"  per round (ms): DCP sync {[round(x * 1e3) for x in r['sync']]}, dd "
            f"{[round(x * 1e3) for x in r['dd']]}"
        )
        figure("ckpt rank0 torch.save / DCP sync save", torch_save * 1e3, sync * 1e3, ">= 3.0")
        figure("ckpt dd same bytes / DCP sync save", dd * 1e3, sync * 1e3, ">= 0.7")
        figure("ckpt DCP async blocked / DCP sync save", blocked * 1e3, sync * 1e3, "<= 0.10")
        print(
            f"  (Checkpointer async: call {median(r['async_call']) * 1e3:.0f} ms, total incl. "
            f"finalize {median(r['async_total']) * 1e3:.0f} ms; a training step takes "
            f"{median(r['step_alone']) * 1e3:.0f} ms alone, "
            f"{median(r['step_during_write']) * 1e3:.0f} ms while the write runs; plain dcp.save "
            f"on defaults {median(r['plain_sync']) * 1e3:.0f} ms, plain dcp.async_save blocked "
            f"{median(r['plain_async_blocked']) * 1e3:.0f} ms)"
        )
        if ranks < 4 and not TINY:
            r4 = inner_results(4, tmp)
            s4 = median(r4["sync"])
            print(
                f"  4 ranks on {os.cpu_count()} cores (CPU contention included): DCP sync "
                f"{s4 * 1e3:.0f} ms, rank0 torch.save / DCP sync "
                f"{median(r4['rank0_torch_save']) / s4:.2f}, dd / DCP sync "
                f"{median(r4['dd']) / s4:.2f}, async blocked / DCP sync "
                f"{median(r4['async_blocked']) / s4:.2f}"
            )

        launch = os.path.join(os.path.dirname(sys.executable), "launch")
        prog = [
            "-m",
            "workloads.fsdp",
            "--dataset",
            "digits",
            "--log-every",
            "1",
            "--checkpoint-every",
            "2",
            "--no-tensorboard",
        ]
        cold, warm = [], []
        for i in range(ROUNDS):
            run = os.path.join(tmp, f"run{i}")
            log = os.path.join(run, "logs", "node0", "rank0.log")
            cold.append(
                first_step_seconds(
                    [
                        launch,
                        "local",
                        "--nodes",
                        "1",
                        "--gpus-per-node",
                        "2",
                        "--run-dir",
                        run,
                        "--",
                        *prog,
                        "--max-steps",
                        "2",
                    ],
                    log,
                    "step 1/",
                    tmp,
                )
            )
            warm.append(
                first_step_seconds(
                    [launch, "resume", run, "--", *prog, "--max-steps", "4"], log, "step 3/", tmp
                )
            )
        figure(
            "resume: restart-to-first-step / cold start",
            median(warm) * 1e3,
            median(cold) * 1e3,
            "<= 1.20",
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--inner":
        inner(sys.argv[2])
    else:
        main()
