"""Log flood (fault suite, bench/log_flood.py): rank FLOOD_RANK (default 1) writes FLOOD_MB (default
200) MB of numbered 100-byte lines ('L000000042 xxx...') to stdout as fast as it can, 1000 lines per
write; the time it took goes to the file FLOOD_RESULT when set. Every other rank exits at once."""

import os
import sys
import time

if int(os.environ.get("RANK", "0")) != int(os.environ.get("FLOOD_RANK", "1")):
    sys.exit(0)
n = int(float(os.environ.get("FLOOD_MB", "200")) * 1e6) // 100
pad = "x" * 88
out = sys.stdout.buffer
t0 = time.perf_counter()
for start in range(0, n, 1000):
    out.write("".join(f"L{i:09d} {pad}\n" for i in range(start, min(n, start + 1000))).encode())
out.flush()
dt = time.perf_counter() - t0
if os.environ.get("FLOOD_RESULT"):
    with open(os.environ["FLOOD_RESULT"], "w") as f:
        f.write(f"{n} {dt:.3f}\n")
