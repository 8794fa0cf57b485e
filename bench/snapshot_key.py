"""Frozen code costs nothing when nothing changed (issue 38 item 1): `snapshot.take` +
`snapshot.commit` of a tree of 2,000 files / 300 MiB under /tmp, each launch in its own process (the
stat cache read from its file, as a real launch does): the first launch (nothing cached, nothing in
the store: every file read and copied), the second (the same tree unchanged: found by its stat
keys), and the second with the stat cache turned off (every file of the tree and of the store's copy
hashed again: what every launch did before). Interleaved rounds, medians. The page cache is warm for
all three alike."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import ROOT, TINY, figure, interleaved, median, rounds  # noqa: E402

FILES, MIB = (20, 1) if TINY else (2000, 300)
ROUNDS = rounds(5)
# one launch's snapshot work, timed inside its own process: argv = tree, store, cache on (1) or off
# (0)
LAUNCH = """
import os, sys, time
from launchers.frozen import snapshot, statcache
from launchers.spec import RunSpec
tree, store, on = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
statcache.ENABLED = on
os.chdir(tree)
spec = RunSpec(backend="local", nodes=1, gpus_per_node=1, program=(tree + "/train.py",), program_args=(),
               run_dir=store + "/../runs/a", name="a", snapshot=store)
t0 = time.perf_counter()
snapshot.commit(snapshot.take(spec))
print((time.perf_counter() - t0) * 1000)
"""  # noqa: E501


def make_tree(root: str) -> None:
    per = (MIB << 20) // FILES
    for i in range(FILES):
        d = os.path.join(root, f"pkg{i % 40}", f"sub{i % 7}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"m{i}.py"), "wb") as f:
            f.write(os.urandom(per))
    with open(os.path.join(root, "train.py"), "w") as f:
        f.write("print(1)\n")


def clear(d: str) -> None:
    for here, _, _ in os.walk(d):
        os.chmod(here, 0o755)  # a snapshot dir is read-only
    shutil.rmtree(d, ignore_errors=True)


def main() -> None:
    tmp = tempfile.mkdtemp(prefix="bench-snapshot-")
    tree, store, state = (os.path.join(tmp, n) for n in ("tree", "runs/.snapshots", "state"))
    t0 = time.time()
    make_tree(tree)
    # older than statcache.RACY_NS, as a tree you launch is
    time.sleep(max(0.0, 2.1 - (time.time() - t0)))
    env = {**os.environ, "LAUNCH_STATE_DIR": state, "PYTHONPATH": ROOT}

    def launch(on: bool) -> float:
        p = subprocess.run(
            [sys.executable, "-c", LAUNCH, tree, store, "1" if on else "0"],
            env=env,
            capture_output=True,
            text=True,
        )
        if p.returncode != 0:
            sys.exit(f"snapshot_key: a launch failed: {p.stderr.strip()[-800:]}")
        return float(p.stdout.split()[-1])

    def first() -> float:
        clear(store)
        clear(state)
        return launch(True)

    res = interleaved(
        {"first": first, "second": lambda: launch(True), "uncached": lambda: launch(False)},
        rounds=ROUNDS,
    )
    name = f"snapshot {FILES} files/{MIB} MiB"
    figure(
        f"{name}: 2nd launch vs no cache", median(res["second"]), median(res["uncached"]), "<= 0.25"
    )
    figure(f"{name}: 2nd launch vs 1st", median(res["second"]), median(res["first"]), "<= 0.25")
    clear(tmp)


if __name__ == "__main__":
    main()
