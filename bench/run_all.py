"""`make bench`: run every benchmark script in bench/ (not the helpers); each prints its figure
lines."""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# the last: by hand, minutes a run
SKIP = {"run_all.py", "benchlib.py", "first_step.py", "ssh64_healthy.py"}
# its short form (~2 min): one kill every 20 s; the long form by hand
ARGS = {"chaos.py": ["20", "300"]}

failed = []
for name in sorted(os.listdir(HERE)):
    if name.endswith(".py") and name not in SKIP and not name.startswith("_"):
        print(f"== {name}", flush=True)
        if (
            subprocess.run(
                [sys.executable, os.path.join(HERE, name), *ARGS.get(name, [])]
            ).returncode
            != 0
        ):
            failed.append(name)
if failed:
    sys.exit(f"bench scripts failed: {', '.join(failed)}")
