"""Connect latency to the SSH test hosts (clusters/ssh-hosts.sh up first), with strict host-key
checks.

    .venv/bin/python clusters/ssh_hosts_latency.py [ROUNDS]

Prints medians over ROUNDS (default 8) of: one connect (TCP + key exchange + auth), one `true` on an
open connection, and connect + `true` on all hosts serially and in parallel (one thread per host).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import fabric
import paramiko

STATE = os.environ.get("LAUNCH_SSH_HOSTS_STATE", "/run/launch-ssh-hosts")


def hosts() -> list[str]:
    with open(f"{STATE}/hostfile") as f:
        return [ln.split()[0] for ln in f if ln.strip() and not ln.startswith("#")]


def connect(host: str) -> fabric.Connection:
    c = fabric.Connection(
        host,
        config=fabric.Config(runtime_ssh_path=f"{STATE}/ssh_config"),
        connect_timeout=5,
        connect_kwargs={"look_for_keys": False, "allow_agent": False},
    )
    c.client.set_missing_host_key_policy(paramiko.RejectPolicy())
    c.client.load_system_host_keys(f"{STATE}/known_hosts")
    return c


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def one_trip(host: str) -> None:
    with connect(host) as c:
        c.run("true", hide=True, in_stream=False)


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    hs = hosts()
    conn, cmd, serial, par = [], [], [], []
    for _ in range(rounds):
        c = connect(hs[0])
        conn.append(timed(c.open))
        cmd.append(timed(lambda: c.run("true", hide=True, in_stream=False)))
        c.close()
        serial.append(timed(lambda: [one_trip(h) for h in hs]))
        with ThreadPoolExecutor(len(hs)) as ex:
            par.append(timed(lambda: list(ex.map(one_trip, hs))))
    med = lambda xs: f"{statistics.median(xs) * 1000:7.1f} ms"  # noqa: E731
    print(f"hosts={len(hs)} rounds={rounds} load={os.getloadavg()[0]:.2f}")
    print(f"connect (tcp+kex+auth, 1 host)   {med(conn)}")
    print(f"run 'true' on an open connection {med(cmd)}")
    print(f"connect+true, {len(hs)} hosts serial     {med(serial)}")
    print(
        f"connect+true, {len(hs)} hosts parallel   {med(par)}  (serial/parallel = "
        f"{statistics.median(serial) / statistics.median(par):.2f}x)"
    )


if __name__ == "__main__":
    main()
