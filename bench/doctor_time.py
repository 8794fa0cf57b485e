"""`launch doctor` wall time on the dev clusters, side by side with the least a person would do by
hand: the nodes' python importing torch and launchers, at once on every node (parallel `ssh`
processes on the 4 SSH hosts; one `srun -N4` on the Slurm cluster). Doctor does that and every other
check (port, reach, shared storage, disk, shm, limits, clock, NCCL env) plus the submitting side's
own facts. Interleaved rounds, medians. Goal: doctor <= 2x the bare version check on each target.
Needs `make ssh-up` and `make slurm-up` (BENCH_TARGETS=ssh or slurm: that one only; BENCH_TINY=1:
one round, tests/test_bench_tiny.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import ROOT, compile_project, figure, interleaved, median, ms_since, rounds  # noqa: E402

STATE = os.environ.get("LAUNCH_SSH_HOSTS_STATE", "/run/launch-ssh-hosts")
SSH = [
    "--hostfile",
    f"{STATE}/hostfile",
    "--ssh-config",
    f"{STATE}/ssh_config",
    "--known-hosts",
    f"{STATE}/known_hosts",
]
HOSTS = [f"sshhost{k}" for k in range(1, 5)]
ROUNDS = rounds(3)
LAUNCH = os.path.join(os.path.dirname(sys.executable), "launch")
BARE = "import torch, launchers; print(torch.__version__, launchers.__version__)"


def timed(argv_list: list[list[str]]) -> float:
    """Start every argv at once, wait for all; ms. Any failure ends the bench (a figure of a failure
    is none)."""
    t0 = time.perf_counter()
    procs = [
        subprocess.Popen(a, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for a in argv_list
    ]
    for a, p in zip(argv_list, procs):
        if p.wait() != 0:
            sys.exit(
                f"doctor_time: {' '.join(a[:4])} ... exited {p.returncode}: "
                f"{p.stderr.read().strip()[-300:]}"
            )
    return ms_since(t0)


def main() -> None:
    targets = os.environ.get("BENCH_TARGETS", "ssh,slurm").split(",")
    if set(targets) - {"ssh", "slurm"}:
        sys.exit(
            f"doctor_time: BENCH_TARGETS={','.join(targets)} is not accepted; accepted: ssh, "
            "slurm or ssh,slurm"
        )
    for what, argv in (
        (
            "the SSH test hosts (make ssh-up)",
            [str(os.path.join(ROOT, "clusters", "ssh-hosts.sh")), "status"],
        ),
        (
            "the dev Slurm cluster (make slurm-up)",
            [os.path.join(ROOT, "slurm", "dev-cluster.sh"), "status"],
        ),
    ):
        if (
            what.split()[1].lower() in targets
            and subprocess.run(argv, capture_output=True).returncode != 0
        ):
            sys.exit(f"doctor_time: {what} is not up")
    compile_project()
    root = f"/tmp/doctor-bench-{os.getpid()}"
    cases = {
        "ssh_doctor": lambda: timed([[LAUNCH, "doctor", *SSH, "--run-root", root]]),
        "ssh_bare": lambda: timed(
            [
                [
                    "ssh",
                    "-F",
                    f"{STATE}/ssh_config",
                    h,
                    f"cd {ROOT} && {sys.executable} -c '{BARE}'",
                ]
                for h in HOSTS
            ]
        ),
        "slurm_doctor": lambda: timed(
            [[LAUNCH, "doctor", "--slurm", "--nodes", "4", "--run-root", root]]
        ),
        "slurm_bare": lambda: timed(
            [["srun", "-N4", "--ntasks-per-node", "1", "--chdir", ROOT, sys.executable, "-c", BARE]]
        ),
    }
    got = interleaved({k: f for k, f in cases.items() if k.split("_")[0] in targets}, ROUNDS)
    m = {k: median(v) / 1000 for k, v in got.items()}
    if "ssh" in targets:
        figure(
            "doctor wall, 4 SSH hosts vs bare imports",
            m["ssh_doctor"],
            m["ssh_bare"],
            "<= 2x",
            unit="s",
        )
    if "slurm" in targets:
        figure(
            "doctor wall, 4 Slurm nodes vs bare srun",
            m["slurm_doctor"],
            m["slurm_bare"],
            "<= 2x",
            unit="s",
        )


if __name__ == "__main__":
    main()
