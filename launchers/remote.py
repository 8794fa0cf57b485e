"""`python -m launchers.remote ...`: the entry name every rendered command uses (the SSH hosts'
lines, the dry-run) for launchers.nodeagent; nothing imports this module."""

import sys

from .nodeagent import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
