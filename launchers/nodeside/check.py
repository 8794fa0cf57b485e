"""The preflight's check of a node (launchers.node.nodecheck: what it checks, how it is sent and
read), stdlib only: sent as `python -c` because it runs before `launchers` is known to be importable
there. One JSON argument; one line `CHECK {host, errors[, port]}`.
"""

import importlib.util
import json
import os
import shutil
import socket
import sys


def findable(name):
    try:
        return importlib.util.find_spec(name) is not None
    except Exception:
        return False


def check(a):
    r = {"host": socket.gethostname(), "errors": []}
    cwd = a["cwd"]
    if os.path.isdir(cwd):
        os.chdir(cwd)
        sys.path.insert(0, cwd)
    else:
        r["errors"].append("working directory %s does not exist there" % cwd)
    for m in a.get("modules", ("torch", "launchers")):
        if not findable(m):
            r["errors"].append(
                "python %s cannot import %s (give --python an interpreter that can)"
                % (sys.executable, m)
            )
    bins = a.get("binaries") or []
    if bins and not any(shutil.which(b) for b in bins):
        r["errors"].append("container runtime %s is not on PATH there" % " or ".join(bins))
    prog = a["program"]
    if prog and prog[0] == "-m":
        if not findable(prog[1]):
            r["errors"].append("program module %s cannot be found (cwd %s)" % (prog[1], cwd))
    elif prog and not os.path.isfile(prog[0]):
        r["errors"].append("program file %s does not exist there" % prog[0])
    for d in a.get("dirs", []):
        p = d
        while not os.path.exists(p) and os.path.dirname(p) != p:
            p = os.path.dirname(p)
        if not os.access(p, os.W_OK | os.X_OK):
            r["errors"].append("cannot create %s (%s is not writable)" % (d, p))
    for p in a.get("ports") or []:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", p))
            r["port"] = p
            break
        except OSError:
            pass
        finally:
            s.close()
    return r


if __name__ == "__main__":
    print("CHECK " + json.dumps(check(json.loads(sys.argv[1]))), flush=True)
