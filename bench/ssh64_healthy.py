"""Detection that does not cry wolf (issue 23 item 8): a healthy run on 64 SSH test hosts x 1 rank,
on this 2-core machine, N times in a row (default 3; argv[1]). Every run must end COMPLETED with 64
all-reduce reports: no host called lost because all 64 were slowed alike, no host refused by the
reach check. Brings up 64 test hosts (clusters/ssh-hosts.sh, LAUNCH_SSH_HOSTS_N=64) and puts the
usual 4 back at the end. Not run by `make bench` (minutes per run); run it by hand: .venv/bin/python
bench/ssh64_healthy.py [N]. BENCH_TINY=1 (tests/test_bench_tiny.py): the same check on the 4 test
hosts as they are (nothing brought up or down), one run."""

import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOSTS = os.path.join(ROOT, "clusters", "ssh-hosts.sh")
STATE = os.environ.get("LAUNCH_SSH_HOSTS_STATE", "/run/launch-ssh-hosts")
LAUNCH = os.path.join(os.path.dirname(sys.executable), "launch")
TINY = os.environ.get("BENCH_TINY") == "1"
N = 4 if TINY else 64


def hosts(n: int) -> None:
    if TINY:  # the shared test hosts stay as `make ssh-up` left them
        return
    subprocess.run([HOSTS, "down"], capture_output=True)
    subprocess.run(
        [HOSTS, "up"],
        env=dict(os.environ, LAUNCH_SSH_HOSTS_N=str(n)),
        check=True,
        capture_output=True,
    )


def main() -> int:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else (1 if TINY else 3)
    hosts(N)
    bad = 0
    try:
        with tempfile.TemporaryDirectory() as d:
            with (
                open(os.path.join(ROOT, "tests", "data", "report.py")) as src,
                open(f"{d}/report.py", "w") as dst,
            ):
                dst.write(src.read())
            for i in range(runs):
                t0 = time.monotonic()
                p = subprocess.run(
                    [
                        LAUNCH,
                        "ssh",
                        "--hostfile",
                        f"{STATE}/hostfile",
                        "--ssh-config",
                        f"{STATE}/ssh_config",
                        "--known-hosts",
                        f"{STATE}/known_hosts",
                        "--gpus-per-node",
                        "1",
                        "--run-dir",
                        f"runs/r{i}",
                        "--",
                        "report.py",
                    ],
                    cwd=d,
                    capture_output=True,
                    text=True,
                )
                reports = p.stdout.count("REPORT ")
                ok = p.returncode == 0 and reports == N
                bad += not ok
                end = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
                print(
                    f"ssh64 run {i + 1}/{runs}: {'ok' if ok else 'FAILED'} in "
                    f"{time.monotonic() - t0:.0f} s, {reports} of {N} ranks reported; {end[:300]}",
                    flush=True,
                )
    finally:
        hosts(4)
    print(f"ssh64_healthy: {runs - bad} of {runs} healthy runs completed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
