"""Test worker for first-failure ordering: TEST_PLAN="rank:delay:code,..." makes each listed rank
exit with `code` after `delay` seconds, a traceback of `RuntimeError: planned failure of rank R`
printed first (its last line is what the first failure names); TEST_SLOW_STOP="rank,..." ranks take
6 s to stop after SIGTERM/SIGINT (their node ends late). Every other rank waits to be stopped."""

import os
import signal
import sys
import time
import traceback

rank = int(os.environ["RANK"])
plan = {
    int(r): (float(d), int(c))
    for r, d, c in (p.split(":") for p in os.environ.get("TEST_PLAN", "").split(",") if p)
}
slow = {int(r) for r in os.environ.get("TEST_SLOW_STOP", "").split(",") if r}


def stop(signum, _frame):
    if rank in slow:
        time.sleep(6)
    sys.exit(128 + signum)


signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
print(f"STARTED rank {rank}", flush=True)
if rank in plan:
    time.sleep(plan[rank][0])
    print(f"FAILING rank {rank} with {plan[rank][1]} at {time.time():.3f}", flush=True)
    try:
        raise RuntimeError(f"planned failure of rank {rank}")
    except RuntimeError:
        traceback.print_exc()
    sys.exit(plan[rank][1])
time.sleep(300)
