"""Run on node 0 for a node whose doctor probe could not start (its python is missing): reports it
gone, so node 0's probe stops waiting for it at once instead of at the timeout. Stdlib only, sent as
`python -c` (like the probe).
"""

import json
import socket
import sys
import time


def report(a):
    end = time.time() + a["wait"]
    try:
        while True:  # node 0's probe may not be listening yet
            try:
                c = socket.create_connection(("127.0.0.1", a["port"]), timeout=3)
                break
            except ConnectionRefusedError:
                if time.time() > end:
                    raise
                time.sleep(0.1)
        c.settimeout(3)
        if json.loads(c.recv(4096)).get("token") == a["token"]:
            c.sendall((json.dumps({"node": a["node"], "gone": True}) + "\n").encode())
            c.settimeout(a["wait"])
            c.recv(4096)
        c.close()
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    report(json.loads(sys.argv[1]))
