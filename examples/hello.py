"""The smallest program for launch (README's quickstart): each rank says who it is. It imports no
torch; launch sets the variables. `--fail-rank R` makes rank R fail, as in
docs/TROUBLESHOOTING.md."""

import os
import socket
import sys

rank = int(os.environ["RANK"])
print(
    f"rank {rank} of {os.environ['WORLD_SIZE']} on {socket.gethostname()}"
    f" (node {os.environ['NODE_RANK']}, local rank {os.environ['LOCAL_RANK']})"
)
if sys.argv[1:] == ["--fail-rank", str(rank)]:
    raise RuntimeError(f"rank {rank} failed on purpose (--fail-rank)")
