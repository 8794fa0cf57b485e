"""Failure detection in every phase (issue 37 item 4): the time from a rank's death to the end of
its attempt (the recovery timeline's fault -> detected), and on to the next attempt's first step,
when the rank dies
  - at import, before the world forms (the other node waits in the rendezvous),
  - while the attempt loads its checkpoint (the other ranks are inside the collective load),
  - in the first step after that load (the other ranks wait in its first collective),
per backend: local always, SSH when its dev hosts are up; 2 nodes x 1 rank, workloads.convnet on
CPU, one run resumed twice (attempt 0 dies at import, 2 in the load, 4 in its first step; 1, 3 and 5
go on; the faults are injected, not a node's: --quarantine-after 100 keeps the policy from
quarantining the slot they land on twice). The run must end COMPLETED with those three restarts
recorded, else the script fails. BENCH_BACKENDS=local,ssh: only those; BENCH_TINY=1: the tiny form
(local, the import and load phases)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

from benchlib import ROOT, TINY, compile_project, figure, median, rounds

LAUNCH = os.path.join(os.path.dirname(sys.executable), "launch")
SSH = [
    "ssh",
    "--hosts",
    "sshhost1,sshhost2",
    "--ssh-config",
    "/run/launch-ssh-hosts/ssh_config",
    "--known-hosts",
    "/run/launch-ssh-hosts/known_hosts",
]
GOAL_S = 2.0
PROGRAM = """import os, runpy, sys, time
if os.environ.get("LAUNCH_ATTEMPT") == "0" and os.environ.get("RANK") == "1":     # dies before the world forms
    print(f"fault injection: rank 1 exits at import at {time.time():.3f}", flush=True)
    os._exit(1)
sys.argv = ["convnet", *sys.argv[1:]]
runpy.run_module("workloads.convnet", run_name="__main__")
"""  # noqa: E501
# (phase, the launch's words after the backend, the attempt that dies): each launch ends COMPLETED
# after one restart
PHASES = [
    ("import", ["--max-steps", "4"], 0),
    (
        "checkpoint load",
        [
            "--max-steps",
            "8",
            "--crash-at-step",
            "4",
            "--crash-phase",
            "load",
            "--crash-attempt",
            "2",
        ],
        2,
    ),
    (
        "first step",
        ["--max-steps", "12", "--crash-at-step", "9", "--crash-rank", "1", "--crash-attempt", "4"],
        4,
    ),
]


def launch(words: list[str], tmp: str) -> None:
    p = subprocess.run([LAUNCH, *words], capture_output=True, text=True, timeout=600, cwd=tmp)
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["(no output)"])[-1][:500]
        raise SystemExit(f"detection: launch {' '.join(words[:2])} exited {p.returncode}: {last}")


def one_run(backend: list[str], tmp: str, i: int) -> dict[str, tuple[float, float]]:
    """phase -> (fault -> detected, fault -> first step of the next attempt), seconds, from the
    run's timeline."""
    run_dir, phases = os.path.join(tmp, "runs", f"{backend[0]}{i}"), PHASES[:2] if TINY else PHASES
    for k, (_, words, _) in enumerate(phases):
        prog = ["--", "crash_import.py", "--checkpoint-every", "2", *words]
        launch(
            [
                *backend,
                "--nodes",
                "2",
                "--gpus-per-node",
                "1",
                "--max-restarts",
                "6",
                "--quarantine-after",
                "100",
                "--run-dir",
                run_dir,
                *prog,
            ]
            if k == 0
            else ["resume", run_dir, *prog],
            tmp,
        )
    with open(os.path.join(run_dir, "status.json")) as f:
        st = json.load(f)
    by_attempt = {r["attempt"]: r for r in st.get("recovery") or ()}
    out = {}
    for phase, _, died in phases:
        r = by_attempt.get(died + 1)
        if st.get("state") != "COMPLETED" or r is None or r.get("decision") != "restart":
            raise SystemExit(
                f"detection: {backend[0]}: no restart after attempt {died} ({phase}) recorded; "
                f"state {st.get('state')}, restarts after attempts "
                f"{sorted(a - 1 for a in by_attempt)}"
            )
        at = {p["phase"]: p["since_fault_s"] for p in r["phases"]}
        out[phase] = (at["detected"], at.get("first_step", float("nan")))
    return out


def backends() -> dict[str, list[str]]:
    only = set(filter(None, os.environ.get("BENCH_BACKENDS", "").split(",")))
    found = {"local": ["local"]} if not only or "local" in only else {}
    if "ssh" in only or not only and not TINY:
        if (
            subprocess.run(
                [os.path.join(ROOT, "clusters", "ssh-hosts.sh"), "status"], capture_output=True
            ).returncode
            == 0
        ):
            found["ssh"] = SSH
    if only - set(found):
        sys.exit(
            f"detection: BENCH_BACKENDS names {','.join(sorted(only - set(found)))}: not up or "
            "not known; accepted: local, ssh (its dev hosts up)"
        )
    return found


def main() -> None:
    compile_project()
    tmp = tempfile.mkdtemp(prefix="bench-detect-", dir="/tmp")  # /tmp: the SSH test hosts see it
    with open(os.path.join(tmp, "crash_import.py"), "w") as f:
        f.write(PROGRAM)
    for name, backend in backends().items():
        runs = [one_run(backend, tmp, i) for i in range(rounds(1))]
        for phase in runs[0]:
            detected = median([r[phase][0] for r in runs])
            figure(
                f"detection: {phase}, {name} (fault -> detected)",
                detected,
                GOAL_S,
                f"<= 1.00 ({GOAL_S:g} s)",
                unit="s",
            )
            print(
                f"{'':44s} fault -> next attempt's first step: "
                f"{median([r[phase][1] for r in runs]):.2f} s",
                flush=True,
            )
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
