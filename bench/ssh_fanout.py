"""SSH fan-out: connect to the 4 test hosts and start a trivial command (`true`) on each, side by side:
`launch ssh`'s fan-out (launchers.sshconn.fanout: one Fabric Connection per host, threads, host keys
verified) vs pdsh (Debian package) vs a serial `ssh` loop. Whole-process wall time (like pdsh's) and
our fan-out alone (timed inside one process, after imports). Interleaved rounds, medians.
Needs the SSH test hosts (`make ssh-up`); fails clearly when they are not up."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import figure, interleaved, median, ms_since  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STATE = os.environ.get("LAUNCH_SSH_HOSTS_STATE", "/run/launch-ssh-hosts")
CFG, KH = f"{STATE}/ssh_config", f"{STATE}/known_hosts"
HOSTS = [f"sshhost{k}" for k in range(1, 5)]
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "7"))

ONE = f"""
import sys, time
t0 = time.perf_counter()
from launchers.hostfile import parse_hosts_option, resolve
from launchers.sshconn import SSHSettings, fanout
s = SSHSettings(ssh_config={CFG!r}, known_hosts={KH!r})
codes = fanout(resolve(parse_hosts_option({",".join(HOSTS)!r}), {CFG!r}), s, "true")
sys.exit(0 if codes == [0] * {len(HOSTS)} else 1)
"""


def need_hosts() -> None:
    st = subprocess.run([os.path.join(ROOT, "clusters", "ssh-hosts.sh"), "status"], capture_output=True, text=True)
    if st.returncode != 0 or not os.path.exists(KH):
        sys.exit(f"ssh_fanout: the SSH test hosts are not up (run `make ssh-up`): {st.stdout.strip() or st.stderr.strip()}")
    if shutil.which("pdsh") is None:
        sys.exit("ssh_fanout: pdsh is not installed (apt-get install pdsh)")


def wall(argv: list[str], env: dict | None = None) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, env={**os.environ, **(env or {})})
    return ms_since(t0)


def main() -> None:
    need_hosts()
    from launchers.hostfile import parse_hosts_option, resolve
    from launchers.sshconn import SSHSettings, fanout

    settings = SSHSettings(ssh_config=CFG, known_hosts=KH)
    rhosts = resolve(parse_hosts_option(",".join(HOSTS)), CFG)

    def inproc() -> float:
        t0 = time.perf_counter()
        assert fanout(rhosts, settings, "true") == [0] * len(HOSTS)
        return ms_since(t0)

    pdsh_env = {"PDSH_RCMD_TYPE": "ssh", "PDSH_SSH_ARGS_APPEND": f"-F {CFG}"}
    serial = "for h in " + " ".join(HOSTS) + f"; do ssh -F {CFG} $h true || exit 1; done"
    cases = {
        "ours_process": lambda: wall([sys.executable, "-c", ONE]),
        "ours_fanout": inproc,
        "pdsh": lambda: wall(["pdsh", "-R", "ssh", "-w", ",".join(HOSTS), "true"], pdsh_env),
        "serial": lambda: wall(["bash", "-c", serial]),
    }
    res = interleaved(cases, ROUNDS)
    m = {k: median(v) for k, v in res.items()}
    for k, v in res.items():
        print(f"  {k:14s} min {min(v):7.1f} ms  median {m[k]:7.1f} ms  (n={len(v)})")
    n = len(HOSTS)
    figure(f"ssh fan-out {n} hosts: launch (process) vs pdsh", m["ours_process"], m["pdsh"], "<= 1.5x")
    figure(f"ssh fan-out {n} hosts: launch (fan-out only) vs pdsh", m["ours_fanout"], m["pdsh"], "<= 1.5x")
    figure(f"ssh fan-out {n} hosts: launch (process) vs serial ssh", m["ours_process"], m["serial"], "< 1x")


if __name__ == "__main__":
    main()
