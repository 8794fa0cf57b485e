"""DCP checkpoints that make a crashed-and-resumed run bit-identical to an uninterrupted one.

One checkpoint = `<checkpoint dir>/step-<N:08d>/` written by torch.distributed.checkpoint, holding:
  * the caller's Stateful objects (e.g. ModelOptimState for model+optimizer via get_state_dict,
    PickledState for an lr scheduler or anything with state_dict()/load_state_dict()),
  * "progress": a pickled dict (step, epoch, global sample offset in the epoch, world size, ...),
  * "rng.rank<r>": rank r's python/numpy/torch(/cuda) RNG state, saved by rank r alone (a key per
    rank: DCP keeps one copy of an item saved under the same key by several ranks, so one shared key
    would silently keep only one rank's stream). No collective is needed to save them.
Commit protocol: dcp.save returns on every rank only after the coordinator (rank 0) has collected
every rank's write result (data files fsynced by DCP, FileSystemWriter sync_files=True) and written
.metadata; then rank 0 writes the step's manifest (every file's size and digest), fsyncs the step
directory and atomically rewrites `latest` (launchers.ckptptr.commit), and a barrier ends the save.
The digests are taken while the files are written, each rank its own (ckptwrite.DigestingWriter,
which also starts each file's write-back as it goes): nothing is read back at the commit. A sync
save skips torch.save's CRC32 of its zip records, which torch.load never checks (ckptwrite). A crash
anywhere before the pointer is written leaves `latest` on the previous complete checkpoint. A rank
of an older attempt than its run's (a paused or partitioned node that came back:
launchers.records.fence) writes nothing: the save and the commit raise fence.Fenced in that rank.
Repeated saves reuse DCP's cached save plans (the state layout does not change between steps), which
skips most of the plan gather/scatter. Async (save_async): training is blocked only while the state
dict is taken; the copy to CPU memory (staging) and the write run in background threads, the write
over a dedicated gloo group (never the training group, whose collectives run concurrently). Until
staging is done, the next optimizer step (and the next forward, for models with buffers, which a
forward may update) waits for it: that wait is counted as blocked time too. Rank 0 moves `latest` as
soon as its write completes (which implies every rank's write completed); finalize() -- called by
the next save/save_async, or by the caller at the end -- waits for this rank's write and the pointer
(collective). On start, rank 0 reads `latest`, verifies it against its manifest (a damaged one: the
newest complete earlier checkpoint, said in one line; none: every rank stops in one line naming the
damaged file, exit 2) and broadcasts its decision, so every rank loads the same checkpoint
(resolved()). Not for use before the first optimizer step: get_state_dict initialises the optimizer
state.
"""

from __future__ import annotations

import errno
import os
import pickle
import shutil
import sys
import time

import torch
import torch.distributed as dist

from launchers.ckptptr import commit, read_latest, resolve
from launchers.memcodec import get_rng_state, set_rng_state  # noqa: F401  (dsloop's too)
from launchers.records import fence

from .stateful import ModelOptimState

# torch.distributed.checkpoint costs ~1.7 s to import (DTensor, dynamo); it is imported at the first
# save/load, so training starts sooner (the Stateful wrappers: workloads.common.stateful).


def disk_full(exc: BaseException) -> bool:
    """Whether a failed write ran out of space (ENOSPC/EDQUOT), however DCP wrapped it (its
    CheckpointException keeps each rank's exception in `failures`)."""
    todo, seen = [exc], set()
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        todo += [
            e.__cause__,
            e.__context__,
            *(
                f[0]
                for f in (getattr(e, "failures", None) or {}).values()
                if isinstance(f, tuple) and f
            ),
        ]
    return False


def no_space(path: str, floor: int = 1 << 20) -> bool:
    """Whether the file system holding path has (almost) no space left: after a failed save, that is
    why (torch.save's zip writer loses the errno: 'RuntimeError: ... unexpected pos')."""
    try:
        vfs = os.statvfs(path)
    except OSError:
        return False
    return vfs.f_bavail * vfs.f_frsize < floor


def resolved(
    ckpt_dir: str, rank: int, required: tuple[str, ...], log=print, read=None
) -> tuple[str | None, object]:
    """launchers.ckptptr.resolve() on rank 0, broadcast (collective): (the name to load, None to
    start fresh; read(path of that checkpoint) as rank 0 returned it, when given). Rank 0 logs its
    note (a damaged checkpoint skipped, an unverified one loaded); when nothing complete is left,
    every rank prints the one error line and exits 2 (before any other collective)."""
    box: list = [None]
    if rank == 0:
        res = resolve(ckpt_dir, required)
        box[0] = (res, read(os.path.join(ckpt_dir, res.name)) if read and res.name else None)
    dist.broadcast_object_list(box, src=0)
    res, extra = box[0]
    if res.note:
        log(res.note)
    if res.error:
        print(f"error: {res.error}", file=sys.stderr, flush=True)
        raise SystemExit(2)
    return res.name, extra


def step_name(step: int) -> str:
    return f"step-{step:08d}"


class Checkpointer:
    def __init__(self, env, *, fault=None, log=print) -> None:
        self.env, self.dir, self.fault, self.log = env, env.checkpoint_dir, fault, log
        self.last_saved_step: int | None = None
        self.save_seconds = 0.0
        # training time spent blocked by save_async (call + staging waits)
        self.blocked_seconds = 0.0
        self._pending = None  # (step, name, upload future, pointer-written event) of an async save
        self._staging = None  # future: the async save's CPU copy is complete
        self._hooks: list = []  # the staging-wait hooks on optimizers/models (installed once)
        self._async_group = None  # dedicated gloo group for async writes, created once
        self._stager = None  # staging copy for async writes, reused (see save_async)

    @staticmethod
    def _writer_planner(path: str):
        from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

        from .ckptwrite import DigestingWriter

        return (
            DigestingWriter(path, single_file_per_rank=True, sync_files=True),
            DefaultSavePlanner(enable_plan_caching=True),
        )

    def latest_name(self) -> str | None:
        """The checkpoint to resume from (None: start fresh): rank 0 verifies `latest` against its
        manifest (falling back to the newest complete earlier one, said in one line) and broadcasts
        its decision, so every rank loads the same one -- or every rank stops with the same line
        naming the damaged file."""
        return resolved(self.dir, self.env.rank, (".metadata",), self.log)[0]

    def _prepare(self, step: int, states: dict, progress: dict) -> tuple[str, str, dict]:
        name = step_name(step)
        # an older attempt: Fenced
        fence.require_env(f"the checkpoint save of {name} by rank {self.env.rank}")
        path = os.path.join(self.dir, name)
        state = dict(states)
        state["progress"] = pickle.dumps(dict(progress, step=step, world_size=self.env.world_size))
        state["rng"] = {f"rank{self.env.rank}": pickle.dumps(get_rng_state())}
        self._fault(step, "pre_save")
        os.makedirs(path, exist_ok=True)
        return name, path, state

    def _point_latest(self, name: str, known: dict) -> None:
        """Rank 0, once its dcp write returned: every rank's files and .metadata are durable. The
        manifest (sizes and digests of every file; `known`: those the writer took while writing,
        ckptwrite) is written and the step directory fsynced (its entries: .metadata's rename)
        before the pointer moves (launchers.ckptptr.commit)."""
        commit(self.dir, name, known)

    def _commit(
        self, step: int, name: str, *, point: bool = True, known: dict | None = None
    ) -> None:
        """After dcp.save returned on this rank (on rank 0 that means on all ranks): pointer, then
        barrier. point=False: rank 0 has moved the pointer already (an async save's completion
        callback)."""
        self._fault(step, "save")
        if point and self.env.rank == 0:
            self._point_latest(name, known or {})
        dist.barrier()
        self._fault(step, "after_save")
        self.last_saved_step = step

    def save(self, step: int, states: dict, progress: dict) -> str:
        """Save, then commit the `latest` pointer. Collective: every rank calls it at the same
        step."""
        import torch.distributed.checkpoint as dcp

        from .ckptwrite import no_zip_crc32

        self.finalize()
        t0 = time.perf_counter()
        name, path, state = self._prepare(step, states, progress)
        writer, planner = self._writer_planner(path)
        try:
            with no_zip_crc32():
                dcp.save(state, storage_writer=writer, planner=planner)
        except BaseException as e:
            if disk_full(e) or no_space(path):
                self._disk_full(path)
            raise
        self._commit(step, name, known=writer.files)
        self.save_seconds += time.perf_counter() - t0
        return name

    def save_async(self, step: int, states: dict, progress: dict) -> str:
        """Take the state dict and return: staging and writing go on in the background (see the
        module doc). Collective, like save; the pointer moves on rank 0 when the write is
        complete."""
        import threading

        import torch.distributed.checkpoint as dcp

        self.finalize()
        t0 = time.perf_counter()
        if self._async_group is None:
            self._set_up_async(states)
        name, path, state = self._prepare(step, states, progress)
        writer, planner = self._writer_planner(path)
        try:
            resp = dcp.async_save(
                state,
                storage_writer=writer,
                planner=planner,
                process_group=self._async_group,
                async_stager=self._stager,
            )
            self._staging, upload = resp.staging_completion, resp.upload_completion
            pointed = threading.Event()
            if self.env.rank == 0:

                def point(fut) -> None:
                    try:
                        if fut.exception() is None:
                            self._point_latest(name, writer.files)
                    finally:
                        pointed.set()

                upload.add_done_callback(point)  # (never inline: the upload waits for the copy)
            else:
                pointed.set()
            self._pending = (step, name, upload, pointed)
        finally:
            # The copy starts last (ckptwrite.deferred_stager): once its thread runs, every line
            # this thread still had to run here waited for the GIL (up to a switch interval, 5 ms,
            # each). On an error too: a copy already asked for still settles its future.
            self._stager.go()
        dt = time.perf_counter() - t0
        self.blocked_seconds += dt
        self.save_seconds += dt
        return name

    def _set_up_async(self, states: dict) -> None:
        """The first save_async: its gloo group, its stager and the staging-wait hooks."""
        from torch.distributed.checkpoint.staging import StagingOptions

        from .ckptwrite import deferred_stager

        self._async_group = dist.new_group(backend="gloo")
        # Kept across saves: it caches its CPU copies by source storage, so later saves copy into
        # the same (already faulted-in) buffers. Safe because finalize() (first in save_async)
        # waited for the previous write, the only reader of those buffers.
        self._stager = deferred_stager(
            StagingOptions(
                use_pinned_memory=torch.cuda.is_available(),
                use_shared_memory=False,
                use_async_staging=True,
                use_non_blocking_copy=torch.cuda.is_available(),
            )
        )
        self._install_staging_hooks(states)

    def _install_staging_hooks(self, states: dict) -> None:
        """Training must not change the state being copied: the optimizer step (and, when the model
        has buffers, the forward) first waits for the pending async save's staging."""

        def wait(*_args, **_kwargs) -> None:
            self.wait_staging()

        for st in states.values():
            if isinstance(st, ModelOptimState):
                opts = (
                    st.optimizers if isinstance(st.optimizers, (list, tuple)) else [st.optimizers]
                )
                self._hooks += [o.register_step_pre_hook(wait) for o in opts]
                if any(True for _ in st.model.buffers()):
                    self._hooks.append(st.model.register_forward_pre_hook(wait))

    def wait_staging(self) -> None:
        """Block until the pending async save's CPU copy is complete (counted as blocked time)."""
        if self._staging is None:
            return
        t0 = time.perf_counter()
        self._staging.result()
        self._staging = None
        dt = time.perf_counter() - t0
        self.blocked_seconds += dt
        self.save_seconds += dt

    def finalize(self) -> str | None:
        """Wait for a pending async save on this rank, then for its pointer on rank 0
        (collective)."""
        if self._pending is None:
            return None
        self.wait_staging()
        t0 = time.perf_counter()
        step, name, upload, pointed = self._pending
        self._pending = None
        upload.result()
        pointed.wait()
        self._commit(step, name, point=False)
        self.save_seconds += time.perf_counter() - t0
        return name

    def close(self) -> None:
        """finalize() (collective), then remove the hooks and free the async staging buffers."""
        self.finalize()
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if self._stager is not None:
            self._stager.close()
            self._stager = None

    def load(self, name: str, states: dict) -> tuple[dict, bool]:
        """Load `name` into `states` (in place). Returns (progress, rng_restored).

        RNG streams are restored only when the world size is unchanged; otherwise the caller should
        re-seed (per-rank streams cannot be mapped onto a different number of ranks).
        """
        import torch.distributed.checkpoint as dcp

        path = os.path.join(self.dir, name)
        keys = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
        rng_keys = sorted(k.split(".", 1)[1] for k in keys if k.startswith("rng."))
        state = dict(states)
        state["progress"] = b""
        state["rng"] = {k: b"" for k in rng_keys}
        dcp.load(state, checkpoint_id=path)
        progress = pickle.loads(state["progress"])
        mine = state["rng"].get(f"rank{self.env.rank}")
        restored = progress.get("world_size") == self.env.world_size and bool(mine)
        if restored:
            set_rng_state(pickle.loads(mine))
        self.last_saved_step = progress["step"]
        return progress, restored

    def _disk_full(self, path: str) -> None:
        """A save that ran out of space (every rank's write has returned: DCP reports on all ranks):
        rank 0 removes the partial step directory (never `latest`; the space lets the error be
        logged); exit 1."""
        if self.env.rank == 0:
            shutil.rmtree(path, ignore_errors=True)
        raise SystemExit(
            f"disk full: the checkpoint {path} could not be written (no space left on device); "
            f"removed; checkpoints/latest still names {read_latest(self.dir)}"
        )

    def _fault(self, step: int, phase: str) -> None:
        if self.fault is not None:
            self.fault.maybe(step, phase)
