"""The rendezvous' network side of a Slurm node task (launchers.backends.slurm.node): node 0's
master address as the other nodes reach it, the beacon that proves it local and reachable, the other
nodes' wait for what node 0 published and their check that its beacon answers -- an unreachable
master is a one-line NodeError, never a hang."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

from ... import layout

MASTER_WAIT_S = 120.0  # other nodes wait this long for node 0 to publish the master address
BEACON_WAIT_S = 60.0  # ... and this long for node 0's beacon to answer


class NodeError(Exception):
    """A node could not start its part of the job; recorded in status/node<K>.json."""


def master_address(first_host: str, other_host: str | None, nnodes: int) -> str:
    """The first host's address as other nodes reach it; loopback only for a one-node job."""
    try:
        ips = [
            ai[4][0]
            for ai in socket.getaddrinfo(first_host, None, socket.AF_INET, socket.SOCK_STREAM)
        ]
    except socket.gaierror as e:
        raise NodeError(f"first host {first_host!r} does not resolve on itself: {e}") from None
    routable = [ip for ip in ips if not ip.startswith("127.")]
    if routable:
        return routable[0]
    if other_host:  # the source address this host uses to reach another node of the allocation
        try:
            peer = socket.gethostbyname(other_host)
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((peer, 9))
                ip = s.getsockname()[0]
            if not ip.startswith("127."):
                return ip
        except OSError:
            pass
    if nnodes == 1:
        return ips[0] if ips else "127.0.0.1"
    raise NodeError(
        f"first host {first_host!r} resolves only to loopback ({', '.join(ips)}); the other nodes "
        "cannot reach it: fix its /etc/hosts or DNS entry"
    )


class Beacon:
    """A listening socket on the master address: binding proves the address is local, connecting
    proves other nodes reach it."""

    def __init__(self, addr: str):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self.sock.bind((addr, 0))
        except OSError as e:
            raise NodeError(
                f"master address {addr} is not an address of this host ({socket.gethostname()}): "
                f"{e}"
            ) from None
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
                conn.close()
            except OSError:
                return


def check_reachable(addr: str, port: int, deadline: float, stopped) -> None:
    last = None
    while time.monotonic() < deadline and not stopped():
        try:
            with socket.create_connection((addr, port), timeout=3):
                return
        except OSError as e:
            last = e
            time.sleep(0.5)
    raise NodeError(
        f"master {addr} (beacon port {port}) is not reachable from {socket.gethostname()}: {last}"
    )


def wait_master(path: str, stopped) -> dict[str, Any]:
    deadline = time.monotonic() + MASTER_WAIT_S
    while time.monotonic() < deadline and not stopped():
        rec = layout.read_json(path)
        if rec is not None:
            return rec
        time.sleep(0.02)
    raise NodeError(
        f"node 0 did not publish the master address within {MASTER_WAIT_S:.0f} s ({path})"
    )
