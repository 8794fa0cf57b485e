"""Why a rank died, as its wrapper (launchers.rankexec) finds out: the last line of the Python
traceback in the rank's log (`RuntimeError: boom`), and a kill by the kernel's OOM killer (the
oom_kill counter of the rank's memory cgroup went up while the program ran; its memory limit named
when one is set). Parsers over text plus the few bounded reads that feed them; stdlib only (os): the
wrapper imports it on every rank's start-up path. The kernel log is not read (dmesg needs privileges
on most machines)."""

from __future__ import annotations

import os

TAIL_BYTES = 64 * 1024  # only the end of the log is read
LINE_CHARS = 200  # the exception line as recorded, at most
TRACEBACK = "Traceback (most recent call last):"
CGROUP_ROOT = "/sys/fs/cgroup"
SIGKILL = 9
UNLIMITED = 1 << 62  # cgroup v1's "no limit" is a number near 2**63
# what a collective library says when a peer process went away (the rank failed because another did
# first): gloo's tcp pair ("Connection closed by peer [ADDR]:PORT", torch adding "This is typically
# caused by a remote worker crashing"), NCCL's ncclRemoteError (nccl-2.21.5/src/init.cc:2265) and
# socket warning (nccl-2.21.5/src/misc/socket.cc:50)
PEER_LOSS = (
    "connection closed by peer",
    "connection reset by peer",
    "remote worker crashing",
    "remote process exited",
    "connection closed by remote peer",
)
# per cgroup version: (its controller field in /proc/self/cgroup, its mount under CGROUP_ROOT, the
# file holding the `oom_kill N` counter, the file holding the limit)
MEMORY_FILES = (
    ("", "", "memory.events", "memory.max"),  # v2: "0::/path"
    # v1: "4:memory:/path"
    ("memory", "memory", "memory.oom_control", "memory.limit_in_bytes"),
)


def clean(line: str) -> str:
    """One printable line of at most LINE_CHARS characters."""
    text = "".join(c if c.isprintable() else "?" for c in line).strip()
    return text if len(text) <= LINE_CHARS else text[: LINE_CHARS - 3] + "..."


def last_exception(text: str) -> str | None:
    """The exception line of the last traceback in `text` (the first unindented line after its
    `Traceback` header: `RuntimeError: boom`); None when there is no traceback. A prefix before the
    header (a logger's) is taken off the lines after it too."""
    lines = text.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        line = lines[i].rstrip()
        if line.endswith(TRACEBACK):
            prefix = line[: -len(TRACEBACK)]
            for after in lines[i + 1 :]:
                body = after[len(prefix) :] if prefix and after.startswith(prefix) else after
                if body.strip() and not body[0].isspace():
                    return clean(body)
            return None
    return None


def peer_lost(line: str | None) -> bool:
    """Whether an exception line says the rank lost a peer (PEER_LOSS): a symptom of another
    failure."""
    return bool(line) and any(p in line.lower() for p in PEER_LOSS)


def exception_line(log: str, start: int = 0) -> str | None:
    """last_exception() of the rank log's last TAIL_BYTES written after offset `start` (this
    attempt's part), the rank's secret values (LAUNCH_PRIVATE_ENV's) and credential-shaped words in
    it as *** (secretenv)."""
    from ..credentials.secretenv import rank_known
    from ..credentials.secretshape import redact_text

    try:
        with open(log, "rb") as f:
            f.seek(max(start, os.fstat(f.fileno()).st_size - TAIL_BYTES))
            line = last_exception(f.read(TAIL_BYTES).decode("utf-8", "replace"))
            return redact_text(line, rank_known(os.environ)) if line else line
    except OSError:
        return None


def counter(text: str, key: str = "oom_kill") -> int | None:
    """`key N` of a memory.events / memory.oom_control text."""
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return None


def read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read(4096)
    except OSError:
        return None


def memory_cgroup(proc_cgroup: str, root: str = CGROUP_ROOT) -> tuple[str, str, str, str] | None:
    """(cgroup dir, its mount, counter file, limit file) of the memory cgroup `proc_cgroup` (the
    text of /proc/<pid>/cgroup) names, where its counter file is readable; the mount itself when the
    path is not under it (a cgroup namespace)."""
    for line in proc_cgroup.splitlines():
        _, ctrl, path = (line.split(":", 2) + ["", ""])[:3]
        for want, mount, events, limit in MEMORY_FILES:
            if ctrl == want if not want else want in ctrl.split(","):
                base = os.path.join(root, mount)
                for d in (os.path.join(base, path.strip().lstrip("/")), base):
                    if read(os.path.join(d, events)) is not None:
                        return os.path.normpath(d), os.path.normpath(base), events, limit
    return None


def memory_limit(cgroup: str, mount: str, limit_file: str) -> int | None:
    """The smallest memory limit on the way from `cgroup` up to its mount (the one that binds)."""
    limits, d = [], cgroup
    while True:
        text = (read(os.path.join(d, limit_file)) or "").strip()
        if text.isdigit() and int(text) < UNLIMITED:
            limits.append(int(text))
        if d == mount or len(d) <= len(mount):
            return min(limits) if limits else None
        d = os.path.dirname(d)


def size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f}".rstrip("0").rstrip(".") + f" {unit}"
    return f"{n} B"


class OomWatch:
    """The oom_kill counter of this process's memory cgroup at start (the program inherits the
    cgroup), compared once the program has died of SIGKILL."""

    def __init__(self, proc_cgroup: str = "/proc/self/cgroup", root: str = CGROUP_ROOT):
        self.where = memory_cgroup(read(proc_cgroup) or "", root)
        self.before = self.kills()

    def kills(self) -> int | None:
        return (
            counter(read(os.path.join(self.where[0], self.where[2])) or "") if self.where else None
        )

    def reason(self) -> str | None:
        """`out of memory (...)` when the counter went up, else None."""
        after = self.kills()
        if self.before is None or after is None or after <= self.before:
            return None
        cgroup, mount, _, limit_file = self.where
        limit = memory_limit(cgroup, mount, limit_file)
        return "out of memory (killed by the kernel's OOM killer" + (
            f"; {limit_file} {size(limit)})" if limit is not None else ")"
        )


def cause(code: int, log: str, start: int, oom: OomWatch | None) -> dict[str, str]:
    """The rank record's cause fields for a program that ended with `code` (waitstatus_to_exitcode):
    the exception line of a failing exit, the OOM kill of a SIGKILL."""
    if code > 0:
        line = exception_line(log, start)
        return {"exception": line} if line else {}
    if code == -SIGKILL and oom is not None:
        why = oom.reason()
        return {"reason": why} if why else {}
    return {}
