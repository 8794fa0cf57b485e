"""In-memory checkpoints replicated to a peer node (--memory-checkpoint, issue 37).

Every M steps (LAUNCH_MEMORY_CHECKPOINT) each rank packs its state -- the storage checkpoint's: the
Stateful objects (model + optimizer, scheduler), progress and this rank's RNG -- into one byte
string in CPU memory on the training thread (launchers.memcodec.pack: a copy, the only part on the
step's critical path; FSDP2's DTensors: this rank's local shards), and a background thread writes it
into its node's store (LAUNCH_MEMORY_CHECKPOINT_DIR: tmpfs, host memory, launchers.node.memstore)
and sends it over a dedicated gloo group (never the training group) to the same local rank of the
next node (node k -> k+1 mod N, another failure domain), which writes it into its own node's store
as a peer copy. Each store keeps the newest 2 steps of each copy; a step waits for the previous
copy's transfer only when that is still under way (counted as blocked time). Budget: at the first
copy every rank checks that its store's file system holds 2 own + 2 peer copies for each local rank;
when one does not, none keeps memory checkpoints, said in one line (never silently).

Restore (collective, at the start, before storage is read): every rank tells what its node's store
holds (own copies, peer copies held for others: (owner rank, step)); choose() picks the newest step,
no older than storage's `latest`, that every rank's state is held for; a rank whose node lost it
gets it point to point from the holder. When no step is whole, storage is read (one line says why).
The same states as the storage checkpoint's, loaded the same way, so the resumed run is
bit-identical to an uninterrupted one.

Runs in a rank's process (the workloads' loop: workloads.common.loop; a user's program:
launchers.integrations .memory_checkpoints): torch (and numpy, when installed) are imported inside
the functions that use them, never when the launcher is imported (tests/test_layers.py: RANK_SIDE).
"""

from __future__ import annotations

import os
import shutil
import time
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from typing import NamedTuple

from .memcodec import get_rng_state, pack, set_rng_state, unpack
from .memplan import Cadence, choose, line, why_storage
from .node.memfiles import KEEP, file_name, listing, private_dir, write_copy
from .node.memstore import ENV_DIR, ENV_EVERY


class RankEnv(NamedTuple):
    """What MemCheckpoints reads of a rank's place in the run (workloads.common.dist.DistEnv has
    these too)."""

    rank: int
    world_size: int
    local_world_size: int
    run_dir: str
    attempt: int

    @classmethod
    def from_environ(cls, environ=None) -> "RankEnv":
        """From the environment torchrun and the launcher give a rank (absent: a 1-rank world)."""
        env = os.environ if environ is None else environ
        return cls(
            int(env.get("RANK") or 0),
            int(env.get("WORLD_SIZE") or 1),
            int(env.get("LOCAL_WORLD_SIZE") or 1),
            env.get("LAUNCH_RUN_DIR") or "",
            int(env.get("LAUNCH_ATTEMPT") or 0),
        )


def rollback(env, step: int) -> str:
    """The rollback a restore of `step` makes: the newest step any rank of an earlier attempt
    reported (launchers.heartbeat's records in the run dir) minus step."""
    from . import heartbeat

    recs = [heartbeat.read(env.run_dir, r) or {} for r in range(env.world_size)]
    seen = [
        rec["step"]
        for rec in recs
        if isinstance(rec.get("step"), int) and (rec.get("attempt") or 0) < env.attempt
    ]
    if not seen:
        return "rollback: unknown (no earlier step reported)"
    return f"rollback: {max(seen) - step} step(s) (last step reported before the loss: {max(seen)})"


class MemCheckpoints:
    """One rank's in-memory checkpoints (see the module doc). from_env(): None when
    --memory-checkpoint is off."""

    def __init__(self, env, every: int | None, store: str, log=print) -> None:
        """every: M (None: auto, launchers.memplan.Cadence)."""
        self.env, self.store, self.log = env, store, log
        self.cadence, self.auto = Cadence(every), every is None
        self.world, self.rank = env.world_size, env.rank
        lws = max(env.local_world_size, 1)
        self.nnodes = max(self.world // lws, 1)
        self.peer = (self.rank + lws) % self.world if self.nnodes > 1 else None  # node k -> k+1
        # whose copy this rank keeps
        self.source = (self.rank - lws) % self.world if self.nnodes > 1 else None
        self.group = None
        self.on = True
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="memckpt")
        self.pending: Future | None = None
        self.copies, self.blocked_s, self.copy_s, self.bytes = 0, 0.0, 0.0, 0

    @classmethod
    def from_env(cls, env, log=print, environ=None) -> "MemCheckpoints | None":
        environ = os.environ if environ is None else environ
        every, store = environ.get(ENV_EVERY, ""), environ.get(ENV_DIR, "")
        if not every or not store:
            return None
        return cls(env, None if every == "auto" else int(every), store, log)

    def _reduce(self, value: int, op: str) -> int:
        """Collective over the side group: every rank's value reduced by op ("MIN", "MAX")."""
        import torch
        import torch.distributed as dist

        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=getattr(dist.ReduceOp, op), group=self.group)
        return int(t.item())

    def _agree(self, ok: bool) -> bool:
        """Collective over the side group: True when every rank says ok."""
        return bool(self._reduce(1 if ok else 0, "MIN"))

    def setup(self) -> None:
        """The side group (collective: every rank at the same point) and the store (made, 0700, on
        every rank; one unusable: none keeps memory checkpoints, said in one line)."""
        import torch.distributed as dist

        if not dist.is_initialized():
            raise RuntimeError(
                "memory checkpoint: torch.distributed is not initialized (call "
                "init_process_group first)"
            )
        self.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=300))
        why = private_dir(self.store)
        if not why:
            # used from now on: a link swapped later does not move it
            self.store = os.path.realpath(self.store)
        if not self._agree(not why):
            self._off(why, "another rank's store is unusable")
            return
        if self.peer is None:
            self.log(
                "memory checkpoint: one node, so no peer copy (a copy needs another failure domain)"
            )

    def _off(self, why: str, theirs: str) -> None:
        """Memory checkpoints off on every rank: one line where it failed (and on rank 0 always)."""
        self.on = False
        if why:
            print(
                f"memory checkpoint: off (rank {self.rank}: {why}); storage checkpoints only",
                flush=True,
            )
        elif self.rank == 0:
            self.log(f"memory checkpoint: off ({theirs}); storage checkpoints only")

    def restore(self, storage_step: int | None, states: dict) -> dict | None:
        """Collective, at the start: load the newest whole step of memory (see the module doc) into
        states and this rank's RNG -> its progress; None: read storage (one line on rank 0 says
        why)."""
        import torch.distributed as dist

        if not self.on:
            return None
        t0 = time.perf_counter()
        mine = listing(self.store, self.world)
        held: list = [None] * self.world
        dist.all_gather_object(held, [(o, s) for o, s, _ in mine], group=self.group)
        step, plan = choose(held, self.world, storage_step)
        if step is None:
            if any(held) or storage_step is not None:  # a fresh start has nothing to say
                self.log(
                    "memory checkpoint: storage read: "
                    f"{why_storage(held, self.world, storage_step)}; "
                    + rollback(self.env, storage_step or 0)
                )
            return None
        data = self._gather_state(step, plan, mine)
        # FSDP: shards
        payload = unpack(data, lambda: {"states": {k: st.state_dict() for k, st in states.items()}})
        for key, st in states.items():
            st.load_state_dict(payload["states"][key])
        set_rng_state(payload["rng"])
        came = (
            "own copy" if plan[self.rank] == self.rank else f"the copy rank {plan[self.rank]} held"
        )
        from_peer = sorted(r for r, h in plan.items() if h != r)
        self.log(
            f"memory checkpoint: restored step {step} from memory (rank 0: {came}; ranks "
            f"restored from a peer's copy: {from_peer or 'none'}; "
            f"{time.perf_counter() - t0:.3f}s); storage not read"
            + (f" (its latest: step {storage_step})" if storage_step is not None else "")
            + "; "
            + rollback(self.env, step)
        )
        return payload["progress"]

    def _gather_state(self, step: int, plan: dict, mine: list) -> bytes:
        """This rank's state of `step`: read from its node's store, or sent by the rank that holds
        it (point to point over the side group, in owner order on every rank: no deadlock)."""
        import torch
        import torch.distributed as dist

        kinds = {(o, s): k for o, s, k in mine}
        out = b""
        for owner in range(self.world):
            holder = plan[owner]
            if self.rank not in (owner, holder):
                continue
            if holder == self.rank:
                with open(
                    os.path.join(
                        self.store, file_name(self.world, owner, step, kinds[(owner, step)])
                    ),
                    "rb",
                ) as f:
                    data = f.read()
                if owner == self.rank:
                    out = data
                    continue
                dist.send(torch.tensor([len(data)], dtype=torch.int64), owner, group=self.group)
                dist.send(
                    torch.frombuffer(bytearray(data), dtype=torch.uint8), owner, group=self.group
                )
            else:
                n = torch.zeros(1, dtype=torch.int64)
                dist.recv(n, holder, group=self.group)
                buf = torch.empty(int(n.item()), dtype=torch.uint8)
                dist.recv(buf, holder, group=self.group)
                out = buf.numpy().tobytes()
        return out

    @property
    def every(self) -> int:
        """M now (auto: 1 until every rank agreed on its M)."""
        return self.cadence.every

    def due(self, step: int) -> bool:
        return self.on and self.cadence.due(step)

    def snapshot(self, step: int, states: dict, progress: dict) -> None:
        """Every rank at the same step: the copy here (pack), the rest in the background (waits for
        the previous copy's transfer first, when still under way: blocked time)."""
        t0 = time.perf_counter()
        self.wait()
        if self.cadence.deciding(self.copies):
            self._decide(step, t0)
        data = pack(
            {
                "states": {k: st.state_dict() for k, st in states.items()},
                "rng": get_rng_state(),
                "progress": dict(progress, step=step, world_size=self.world),
                "step": step,
                "rank": self.rank,
            }
        )
        if self.copies == 0 and not self._budget(len(data)):
            self.blocked_s += time.perf_counter() - t0
            return
        self.pending = self.pool.submit(self._store_and_send, step, data, self.copies)
        spent = time.perf_counter() - t0
        self.cadence.add(self.copies, step, t0, spent)
        self.copies += 1
        self.bytes = len(data)
        self.blocked_s += spent

    def _decide(self, step: int, now: float) -> None:
        """Auto (collective: every rank at the same copy): the largest M any rank proposes."""
        mine, cost, step_s = self.cadence.propose(step, now)
        self.cadence.agreed(self._reduce(mine, "MAX"))
        if self.rank == 0:
            self.log(line(self.cadence.every, step, cost, step_s))

    def _budget(self, size: int) -> bool:
        """At the first copy (collective): the store's file system holds 2 own + 2 peer copies of
        every local rank (x1.2), on every rank; else off, said in one line."""
        need = int(size * 2 * KEEP * max(self.env.local_world_size, 1) * 1.2)
        free = shutil.disk_usage(self.store).free
        short = (
            ""
            if free >= need
            else (
                f"{self.store} has {free / 2**20:.1f} MiB free, {need / 2**20:.1f} MiB "
                "needed for 2 own + 2 peer copies"
            )
        )
        if not self._agree(not short):
            self._off(short, "another rank's store has too little free memory")
            return False
        self.log(
            f"memory checkpoint: {self._every()}, {size / 2**20:.2f} MiB per copy, up "
            f"to {2 * KEEP * size / 2**20:.2f} MiB of host memory per rank (2 own + 2 peer "
            f"copies; {free / 2**30:.1f} GiB free in {os.path.dirname(self.store) or self.store})"
        )
        return True

    def _every(self) -> str:
        if self.auto:
            return "every step while a copy's cost is measured (auto)"
        return f"every {self.every} step(s)"

    def _store_and_send(self, step: int, data: bytes, copy: int) -> None:
        """The background part: write the own copy, swap copies with the peer nodes' ranks."""
        import torch
        import torch.distributed as dist

        t0, cpu0 = time.perf_counter(), time.thread_time()
        write_copy(self.store, self.world, self.rank, step, "own", data)
        if self.peer is not None:
            n_in = torch.zeros(1, dtype=torch.int64)
            reqs = [
                dist.isend(
                    torch.tensor([len(data)], dtype=torch.int64), self.peer, group=self.group
                ),
                dist.irecv(n_in, self.source, group=self.group),
            ]
            for r in reqs:
                r.wait()
            buf = torch.empty(int(n_in.item()), dtype=torch.uint8)
            reqs = [
                dist.isend(
                    torch.frombuffer(bytearray(data), dtype=torch.uint8),
                    self.peer,
                    group=self.group,
                ),
                dist.irecv(buf, self.source, group=self.group),
            ]
            for r in reqs:
                r.wait()
            write_copy(self.store, self.world, self.source, step, "peer", buf.numpy().tobytes())
        self.copy_s += time.perf_counter() - t0
        self.cadence.add_background(copy, time.thread_time() - cpu0)

    def wait(self) -> None:
        """The previous copy done (its error raised here)."""
        if self.pending is not None:
            pending, self.pending = self.pending, None
            pending.result()

    def close(self, finished: bool) -> None:
        """Wait for the last copy; a finished run's copies this rank wrote go (own, and the peer
        copy it kept)."""
        t0 = time.perf_counter()
        self.wait()
        self.blocked_s += time.perf_counter() - t0
        self.pool.shutdown(wait=True)
        if finished and self.on:
            for o, s, k in listing(self.store, self.world):
                if o == (self.rank if k == "own" else self.source):
                    try:
                        os.unlink(os.path.join(self.store, file_name(self.world, o, s, k)))
                    except FileNotFoundError:
                        pass
            try:
                # when this node's ranks are all done (else another local rank does it)
                os.rmdir(self.store)
            except OSError:
                pass

    def summary(self) -> dict:
        return {
            "memory_checkpoint": {
                "every": self.every,
                "auto": self.auto,
                "on": self.on,
                "copies": self.copies,
                "bytes_per_copy": self.bytes,
                "blocked_s": round(self.blocked_s, 4),
                "background_s": round(self.copy_s, 4),
            }
        }


def init_dist() -> None:
    """torch.distributed's default group from torchrun's environment, unless it is up already
    (LAUNCH_DIST_BACKEND, else nccl with CUDA, else gloo): a framework that finds it up (Lightning's
    DDP) uses it."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group(
            os.environ.get("LAUNCH_DIST_BACKEND")
            or ("nccl" if torch.cuda.is_available() else "gloo")
        )
