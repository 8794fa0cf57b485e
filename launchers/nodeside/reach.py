"""Rendezvous reachability on the SSH hosts (launchers.backends.sshcheck.check_reach): the master
listens on the chosen port and hands a token to every other host. Run as `python -m
launchers.nodeside.reach JSON` in the job's working directory (the host check found launchers
importable there first). The master prints LISTENING, then SERVED n; a client REACHED (exit 0) or
UNREACHABLE <why> (exit 1).
"""

import json
import socket
import sys
import threading
import time


def read(c, n):
    got = b""
    while len(got) < n:
        part = c.recv(n - len(got))
        if not part:
            break
        got += part
    return got


def master(a, deadline, tok):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("", a["port"]))
    s.listen(128)
    print("LISTENING", flush=True)
    acked, lock = set(), threading.Lock()

    def serve(c):
        try:
            c.settimeout(10)
            who = read(c, 8)
            c.sendall(tok)
            if read(c, 3) == b"ACK":
                with lock:
                    acked.add(who)
        except OSError:
            pass
        finally:
            c.close()

    while len(acked) < a["clients"] and time.time() < deadline:
        s.settimeout(max(0.05, min(0.5, deadline - time.time())))
        try:
            c, _ = s.accept()
        except socket.timeout:
            continue
        except OSError:
            break
        threading.Thread(target=serve, args=(c,), daemon=True).start()
    print("SERVED %d" % len(acked), flush=True)


def client(a, deadline, tok):
    err = "no answer"
    while time.time() < deadline:
        try:
            c = socket.create_connection(
                (a["addr"], a["port"]), timeout=max(0.1, deadline - time.time())
            )
            c.settimeout(10)
            c.sendall(b"%08d" % a["id"])
            got = read(c, len(tok))
            if got == tok:
                c.sendall(b"ACK")
                c.close()
                print("REACHED", flush=True)
                return 0
            c.close()
            err = "something else answers there"
        except OSError as e:
            err = e.strerror or str(e)
        time.sleep(0.1)
    print("UNREACHABLE " + err, flush=True)
    return 1


if __name__ == "__main__":
    A = json.loads(sys.argv[1])
    END, TOKEN = time.time() + A["timeout"], A["token"].encode()
    if A["role"] == "master":
        master(A, END, TOKEN)
    else:
        sys.exit(client(A, END, TOKEN))
