"""Test worker for stop semantics: prints READY, records every stop signal it gets ("GOT <name>"),
then a cleanup of TEST_CLEANUP_S seconds in `finally` ("CLEANUP DONE"). TEST_IGNORE=1: ignores
SIGTERM/SIGINT."""

import os
import signal
import sys
import time

got = []


def note(signum, _frame):
    got.append(signum)
    print(f"GOT {signal.Signals(signum).name}", flush=True)


for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR2):
    signal.signal(
        s, signal.SIG_IGN if os.environ.get("TEST_IGNORE") == "1" and s != signal.SIGUSR2 else note
    )
print(f"READY rank {os.environ.get('RANK')}", flush=True)
try:
    deadline = time.time() + 300
    while not got and time.time() < deadline:
        time.sleep(0.05)
finally:
    time.sleep(float(os.environ.get("TEST_CLEANUP_S", "2")))
    print("CLEANUP DONE", flush=True)
sys.exit(0 if got else 3)
