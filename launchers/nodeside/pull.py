"""The job's image on this host's podman (launchers.containers.imagepull: why, and how the answer is
read), stdlib only: sent as `python -c` (like the host check). One JSON argument {image, answer_s,
pull_s}; one line `IMAGE {host, pulled, digest | error}`.
"""

import json
import socket
import subprocess
import sys
import threading
import time


def podman(a, *w):
    return subprocess.run(
        ["podman", *w],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=a["answer_s"],
    )


def pull(a, r):
    """podman pull: the registry must answer (the first `Getting image source signatures`/`Copying`
    line) within answer_s, the whole download within pull_s; r gets pulled, pull_s or error."""
    t0, lines, answered = time.time(), [], threading.Event()
    p = subprocess.Popen(
        ["podman", "pull", a["image"]],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )

    def read():
        for ln in p.stderr:
            lines.append(ln.strip())
            if ln.startswith(("Getting image source signatures", "Copying ")):
                answered.set()
        answered.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    if not answered.wait(a["answer_s"]):
        p.kill()
        r["error"] = "timeout: no answer from the registry in %d s" % a["answer_s"]
    else:
        try:
            code = p.wait(a["pull_s"])
        except subprocess.TimeoutExpired:
            p.kill()
            code = None
            r["error"] = "timeout: the download took over %d s" % a["pull_s"]
        reader.join(5)
        if code:
            errs = (
                [ln for ln in lines if ln.startswith("Error:")] or lines or ["exit code %d" % code]
            )
            r["error"] = errs[-1]
    r["pulled"], r["pull_s"] = "error" not in r, round(time.time() - t0, 3)


def ensure(a):
    img, r = a["image"], {"host": socket.gethostname(), "pulled": False}
    try:
        if podman(a, "image", "exists", img).returncode != 0:
            pull(a, r)
        if "error" not in r:
            d = podman(a, "image", "inspect", "--format", "{{.Id}}", img)
            r["digest"] = (
                "sha256:" + d.stdout.strip() if d.returncode == 0 and d.stdout.strip() else None
            )
    except (OSError, subprocess.TimeoutExpired) as e:
        r["error"] = "podman: %s" % e
    return r


if __name__ == "__main__":
    print("IMAGE " + json.dumps(ensure(json.loads(sys.argv[1]))), flush=True)
