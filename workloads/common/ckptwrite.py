"""The DCP writer of the workloads' checkpoints: torch's FileSystemWriter (same files, same bytes,
same fsync) that digests every file while it writes it, so the commit's manifest needs no read-back
of the checkpoint.

Each rank's data file is hashed in the writer thread as its bytes go out (xxh3_128, or what
launchers.ckptptr.hash_name() asks for), and its write-back to disk is started every few MiB
(sync_file_range, Linux) so the final fsync waits for the tail only, not for the whole file. The
digests travel to the coordinator with DCP's own write results (a WriteResult that carries them; DCP
reads only index and storage_data), and the coordinator digests `.metadata` as it writes it. `files`
then holds {relative path: {"size": n, algo: hex}} for launchers.ckptptr.commit(known=...): every
file of the step dir is still in the manifest, and a file not digested here (or whose size on disk
differs) is read and hashed there as before.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
from contextlib import contextmanager

from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from launchers import ckptptr

_WRITEBACK = 4 << 20  # start the disk write of every this many bytes written
_SYNC_FILE_RANGE_WRITE = 2
_HEAD_START = 0.001  # s: the async staging copy starts this long after save_async returns


def _sync_file_range():
    try:
        f = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (AttributeError, OSError):  # not Linux: the final fsync writes it all
        return None
    f.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    return f


_start_writeback = _sync_file_range()


class _DigestStream:
    """A file opened for writing that hashes what is written and starts its write-back as it
    goes."""

    def __init__(self, f, algo: str) -> None:
        self.f, self.h, self.n, self.synced = f, ckptptr.hasher(algo), 0, 0

    def write(self, b) -> int:
        self.h.update(b)
        n = self.f.write(b)
        self.n += n
        if _start_writeback is not None and self.n - self.synced >= _WRITEBACK:
            self.f.flush()
            _start_writeback(
                self.f.fileno(), self.synced, self.n - self.synced, _SYNC_FILE_RANGE_WRITE
            )
            self.synced = self.n
        return n

    def tell(self) -> int:
        return self.n

    def flush(self) -> None:
        self.f.flush()

    def fileno(self) -> int:
        return self.f.fileno()

    def close(self) -> None:
        self.f.close()


class _DigestFS(FileSystem):
    def __init__(self, algo: str) -> None:
        self.algo = algo
        self.files: dict[str, dict] = {}  # file name -> {"size": n, algo: hex}, once closed

    @contextmanager
    def create_stream(self, path, mode: str):
        if mode != "wb":
            with super().create_stream(path, mode) as s:
                yield s
            return
        with open(path, "wb") as f:
            s = _DigestStream(f, self.algo)
            yield s  # DCP closes it (after its fsync)
        self.files[os.path.basename(path)] = {"size": s.n, self.algo: s.h.hexdigest()}


@dataclasses.dataclass(frozen=True)
class _DigestedResult(WriteResult):
    """A rank's last write result, carrying the digests of the files that rank wrote to the
    coordinator."""

    files: dict = dataclasses.field(default_factory=dict)


class DigestingWriter(FileSystemWriter):
    """FileSystemWriter that digests what it writes; after the save, on the coordinator, `files`
    holds every rank's data files and .metadata (see the module doc)."""

    def __init__(self, path, **kwargs) -> None:
        super().__init__(path, **kwargs)
        self.fs = _DigestFS(ckptptr.hash_name())
        self.files: dict[str, dict] = {}

    def write_data(self, plan, planner):
        fut = super().write_data(plan, planner)
        res = list(fut.value())
        mine = {n: d for n, d in self.fs.files.items() if n.startswith(plan.storage_data.prefix)}
        if res:
            last = res[-1]
            res[-1] = _DigestedResult(last.index, last.size_in_bytes, last.storage_data, files=mine)
        out: Future = Future()  # (the done future cannot be set again)
        out.set_result(res)
        return out

    def finish(self, metadata, results) -> None:
        super().finish(metadata, results)
        files = {}
        for wrs in results:
            for wr in wrs:
                files.update(getattr(wr, "files", None) or {})
        tmp = self.fs.files.get(".metadata.tmp")
        if tmp is not None:
            files[".metadata"] = tmp
        self.files = files


@contextmanager
def no_zip_crc32():
    """torch.save without the CRC32 of its zip records, for the duration (a synchronous save: the
    training thread waits in it). torch.load never checks that CRC (a flipped data byte loads
    silently), and every file is digested here anyway, so computing it (~17 ms per 48 MB, on the
    save's path) buys nothing. torch's setting is process-wide: restored after."""
    import torch.serialization as ts

    was = ts.get_crc32_options()
    ts.set_crc32_options(False)
    try:
        yield
    finally:
        ts.set_crc32_options(was)


def deferred_stager(options):
    """A DCP DefaultStager (async staging: the CPU copy in its own thread, its buffers reused) whose
    copy starts only at go(), which save_async calls as it returns. Started inside dcp.async_save,
    the copy's thread competed for the GIL and the CPUs with the rest of that call (its writer
    thread's start, the plan): on a busy node the call returned 10-20 ms later instead of ~3. The
    copy still runs while the next step computes, and that step's optimizer step waits for it.

    The copy's thread also waits _HEAD_START before its first step: woken by go(), it took the GIL
    and a CPU from the call's last lines, which then returned 4-20 ms later instead of ~3 (most of
    the copy's Python and its storage copies hold the GIL)."""
    import time
    from concurrent.futures import Future as Staged

    from torch.distributed.checkpoint.staging import DefaultStager

    class Deferred(DefaultStager):
        _held: tuple | None = None

        def stage(self, state_dict, **kwargs):
            self._held = (state_dict, kwargs, Staged())
            return self._held[2]

        def _stage(self, state_dict, **kwargs):
            time.sleep(_HEAD_START)
            return super()._stage(state_dict, **kwargs)

        def go(self) -> None:
            if self._held is None:
                return
            (state_dict, kwargs, done), self._held = self._held, None
            try:
                copy = super().stage(state_dict, **kwargs)
            except BaseException as e:  # noqa: BLE001  -- the waiters get it
                done.set_exception(e)
                return
            copy.add_done_callback(
                lambda f: (
                    done.set_exception(f.exception())
                    if f.exception() is not None
                    else done.set_result(f.result())
                )
            )

    return Deferred(options)
