"""The launcher's watch over each SSH host's output (launchers.backends.ssh): a Prefixed stream per
host prints its lines as "[host] line" and keeps when the host was last heard (the host agent's
heartbeat counts, unprinted); Silence calls a host lost that stayed silent too long while others
were heard, and drops its connection."""

from __future__ import annotations

import threading
import time
from typing import Callable, Sequence

from .sshconn import close_all

# a running host that sent nothing, not even its agent's heartbeat, this long is lost ...
LOST_S = 10.0
# ... the same for a host never heard, once the others stopped coming up this long
FIRST_WORD_S = 30.0
# ... unless no host at all was heard meanwhile: a stalled launcher or a machine slowed
ALL_QUIET_S = 60.0
# alike (64 hosts' torch imports on 2 cores) is not one lost host; past this it is


class Silence:
    """The launcher's side of the host agents' heartbeat (launchers.remote, every second) over each
    host's Prefixed stream: a host silent past LOST_S while another host was heard lately is lost (a
    cut network, a hung host: TCP keepalive would take minutes to tell), recorded in `ended` as k ->
    (last heard, None, reason) and its connection dropped. A host not heard yet is lost once
    FIRST_WORD_S passed since the last host came up (each host is waited for while others are still
    arriving). When nobody was heard for LOST_S / 2, the silence is the launcher's or the whole
    machine's, not one host's: the verdict waits up to ALL_QUIET_S."""

    def __init__(self, streams: Sequence["Prefixed"], conns) -> None:
        self.streams, self.conns, self.lost = streams, conns, set()
        self.start = time.monotonic()

    def verdicts(self, ended: dict, now: float) -> dict[int, float]:
        """k -> seconds quiet, of each host to call lost now (pure over the streams' times)."""
        live = [k for k in range(len(self.streams)) if k not in ended]
        others_heard = [
            now - self.streams[k].last < LOST_S / 2 for k in live if self.streams[k].heard
        ]
        arriving = max([self.start, *(s.first for s in self.streams if s.heard)])
        out = {}
        for k in live:
            s = self.streams[k]
            if s.heard:
                talked = sum(others_heard) - (now - s.last < LOST_S / 2)
                waited, limit = now - s.last, (LOST_S if talked > 0 else ALL_QUIET_S)
            else:
                waited, limit = now - arriving, (FIRST_WORD_S if any(others_heard) else ALL_QUIET_S)
            if waited > limit:
                out[k] = now - s.last
        return out

    def check(self, ended: dict) -> None:
        for k, quiet in self.verdicts(ended, time.monotonic()).items():
            self.lost.add(k)
            ended[k] = (
                time.time() - quiet,
                None,
                f"lost: silent for {quiet:.0f} s (network cut or host hung)",
            )
            close_all([self.conns[k]])


class Prefixed:
    """A file-like out_stream: each remote line (pty: \\r\\n) printed as "[host] line", whole lines
    only. `last`: when the host last sent anything (monotonic); lines equal to `skip` (a heartbeat)
    are not printed; a line `<note> value` of a word in `notes` is not printed either: `noted[note]`
    keeps its last value."""

    lock = threading.Lock()

    def __init__(
        self,
        prefix: str,
        sink: Callable[[str], None],
        skip: str | None = None,
        notes: Sequence[str] = (),
    ):
        self.prefix, self.sink, self.buf, self.skip = prefix, sink, "", skip
        self.last, self.heard, self.first = time.monotonic(), False, 0.0
        self.notes, self.noted = tuple(notes), {}

    def kept(self, line: str) -> bool:
        """Whether a line is printed (not the heartbeat, not a note: that one is kept in
        `noted`)."""
        word, _, value = line.partition(" ")
        if word in self.notes:
            self.noted[word] = value
        return line != self.skip and word not in self.notes

    def write(self, s: str) -> None:
        self.last = time.monotonic()
        if not self.heard:
            self.heard, self.first = True, self.last
        self.buf += s.replace("\r", "")
        *lines, self.buf = self.buf.split("\n")
        lines = [ln for ln in lines if self.kept(ln)]
        if lines:
            with self.lock:
                self.sink("".join(f"{self.prefix}{ln}\n" for ln in lines))

    def flush(self) -> None:
        pass

    def close(self) -> None:
        if self.buf:
            self.write("\n")
