"""Prints the CPUs this rank may run on: `AFFINITY {"rank": R, "local_rank": L, "cpus": [...]}`
(tests/test_cpubind.py)."""

import json
import os

print(
    "AFFINITY "
    + json.dumps(
        {
            "rank": int(os.environ["RANK"]),
            "local_rank": int(os.environ["LOCAL_RANK"]),
            "cpus": sorted(os.sched_getaffinity(0)),
        }
    ),
    flush=True,
)
