"""`launch doctor`'s node side (launchers.doctor.probe: how it is run and what it answers), stdlib
only: sent as `python -c` with gputools ahead of it (launchers.nodeside.source: `launchers` may not
even be importable on a node). One JSON argument; `DOCTOR-T <epoch>` first, then the record as
`DOCTOR+ <json string>` lines, `DOCTOR-END`.
"""

import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import threading
import time

from launchers.nodeside.gputools import gpu_tools, ib_sysfs

# A: the argument, R: the record, T0: the start (set below, when run). It imports torch: it runs on
# the node, in its own process, never imported by the launcher (tests/test_layers.py:
# NODE_PROGRAMS).


# the node's network interfaces from /sys/class/net (a missing tree: none); flags bit 0x8 is
# IFF_LOOPBACK


def net_sysfs(root="/sys/class/net"):
    out = []
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return out
    for name in names:
        if not os.path.isdir(os.path.join(root, name)):  # bonding_masters and the like
            continue
        one = {"name": name}
        for key in ("operstate", "flags"):
            try:
                with open(os.path.join(root, name, key)) as f:
                    one[key] = f.read().strip()
            except OSError:
                pass
        try:
            one["loopback"] = bool(int(one.pop("flags", ""), 16) & 0x8)
        except ValueError:
            one["loopback"] = name == "lo"
        out.append(one)
    return out


def first_line(e):
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def facts():
    cwd = A.get("cwd")
    if cwd and os.path.isdir(cwd):
        os.chdir(cwd)
        sys.path.insert(0, cwd)
    try:
        import launchers

        R["launchers"] = getattr(launchers, "__version__", "?")
    except Exception as e:
        R["launchers_error"] = "%s: %s" % (type(e).__name__, first_line(e))
    try:
        import torch  # the node's torch, in this process on the node

        R["torch"] = torch.__version__
        R["cuda"] = bool(torch.cuda.is_available())
        R["nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if R["cuda"] else None
    except Exception as e:
        R["torch_error"] = "%s: %s" % (type(e).__name__, first_line(e))
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run(
                [smi, "-L"], capture_output=True, text=True, timeout=A.get("tool_timeout", 20)
            ).stdout
            R["gpus"] = sum(1 for ln in out.splitlines() if ln.startswith("GPU "))
        except Exception as e:
            R["gpus"] = 0
            R["gpus_error"] = "nvidia-smi: " + first_line(e)
    else:
        R["gpus"] = torch.cuda.device_count() if R.get("cuda") else 0
    R["nvidia_smi"] = bool(smi)
    R["cuda_visible"] = cv = os.environ.get("CUDA_VISIBLE_DEVICES")
    if smi and cv is not None:  # what a job here may use, not what the machine has
        R["gpus"] = min(R["gpus"], len([d for d in cv.split(",") if d.strip()]))
    d = A.get("root") or "/"
    while not os.path.exists(d) and os.path.dirname(d) != d:
        d = os.path.dirname(d)
    for key, path in (("disk", d), ("shm", "/dev/shm")):
        try:
            st = os.statvfs(path)
            R[key] = {
                "path": path,
                "free": st.f_bavail * st.f_frsize,
                "total": st.f_blocks * st.f_frsize,
            }
        except OSError as e:
            R[key] = {"path": path, "error": e.strerror or str(e)}
    R["nofile"] = list(resource.getrlimit(resource.RLIMIT_NOFILE))
    # --container-runtime: where each of its binaries is on PATH (or None)
    if A.get("container_bins"):
        R["container"] = {b: shutil.which(b) for b in A["container_bins"]}
    for rt, how in (A.get("image_checks") or {}).items():  # --container-image: has this node got it
        if any(shutil.which(b) for b in how["bins"]):
            R.setdefault("image", {})[rt] = image_here(how)
    R["env"] = {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "TORCH_NCCL_"))}
    R["net"], R["hca_files"] = net_sysfs(), ib_sysfs() or {}
    if A.get("gpu"):
        R["gpu_tools"] = gpu_tools(A.get("tool_timeout", 20))


def image_here(how):
    """None when the image is here, else why not (a path, or the runtime's own check)."""
    if "path" in how:
        return None if os.path.exists(how["path"]) else "%s is not there" % how["path"]
    try:
        p = subprocess.run(
            how["argv"], capture_output=True, text=True, timeout=A.get("tool_timeout", 20)
        )
    except Exception as e:
        return "%s: %s" % (" ".join(how["argv"]), first_line(e))
    return None if p.returncode == 0 else "%s: exit %d" % (" ".join(how["argv"]), p.returncode)


def holder(port):
    """pid (comm) of the process listening on port, from /proc (best effort)."""
    inodes = set()
    for f in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            for ln in open(f).read().splitlines()[1:]:
                w = ln.split()
                if w[3] == "0A" and int(w[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add("socket:[%s]" % w[9])
        except (OSError, IndexError, ValueError):
            pass
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir("/proc/%s/fd" % pid):
                if os.readlink("/proc/%s/fd/%s" % (pid, fd)) in inodes:
                    return "pid %s (%s)" % (pid, open("/proc/%s/comm" % pid).read().strip())
        except OSError:
            continue
    return None


def send(c, obj):
    c.sendall((json.dumps(obj) + "\n").encode())


def recv(c, limit):
    c.settimeout(max(0.1, limit))
    buf = b""
    while not buf.endswith(b"\n"):
        got = c.recv(4096)
        if not got:
            break
        buf += got
    return json.loads(buf) if buf.endswith(b"\n") else None


def serve(srv, expect, out, deadline):
    """Node 0: every other node gets the token on connecting, then reports; then each hears whether
    the collective runs."""
    conns = []
    while len(conns) < expect and time.time() < deadline:
        srv.settimeout(max(0.05, deadline - time.time()))
        try:
            c, peer = srv.accept()
            send(c, {"token": A["token"]})
            conns.append((c, peer[0]))
        except OSError:
            continue
    srv.close()
    for c, addr in conns:
        try:
            rep = recv(c, deadline + 10 - time.time()) or {}
            out[str(rep.get("node"))] = dict(rep, addr=addr)
        except (OSError, ValueError):
            pass
    go = len(conns) == expect and all(r.get("torch") for r in out.values()) and "torch" in R
    for c, _ in conns:
        try:
            send(c, {"go": go})
            c.settimeout(5)
            c.recv(16)
        except (OSError, ValueError):
            pass
        c.close()
    out["_go"] = go


def write_probe():
    R["probe_file"] = pf = os.path.join(A["root"], ".launch-doctor-" + A["token"])
    d, R["made"] = A["root"], []
    while not os.path.exists(d) and os.path.dirname(d) != d:
        R["made"].insert(0, d)
        d = os.path.dirname(d)
    try:
        os.makedirs(A["root"], exist_ok=True)
        with open(pf, "w") as f:
            f.write(A["token"])
    except OSError as e:
        R["root_error"] = "cannot write %s: %s" % (pf, e.strerror or e)
    return pf


def listen():
    """Node 0, after its imports (an import holds the GIL for seconds: the token must go out at
    once)."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        srv.bind(("", A["port"]))
        srv.listen(128)
    except OSError as e:
        srv.close()
        srv = None
        R["port_taken"] = {"error": e.strerror or str(e), "holder": holder(A["port"])}
    R["peers"] = {}
    if srv is None or not A["expect"]:
        if srv is not None:
            srv.close()
        return None
    th = threading.Thread(
        target=serve, args=(srv, A["expect"], R["peers"], T0 + A["timeout"]), daemon=True
    )
    th.start()
    return th


def read_probe(pf, wait):
    end = time.time() + wait
    while True:
        try:
            with open(pf) as f:
                if f.read() == A["token"]:
                    return True
        except OSError:
            pass
        if time.time() >= end:
            return False
        time.sleep(0.2)


def client_side():
    """Reach the master, check the probe file, report; returns whether the collective runs."""
    pf = os.path.join(A["root"], ".launch-doctor-" + A["token"])
    err, c = "no answer", None
    while c is None and time.time() < T0 + A["timeout"]:
        try:
            c = socket.create_connection((A["master"], A["port"]), timeout=3)
        except OSError as e:
            err = e.strerror or first_line(e)
            time.sleep(0.2)
            continue
        try:
            got = recv(c, 2)
        except (OSError, ValueError):
            got = None
        if not got or got.get("token") != A["token"]:
            err = "another program answers on that port"
            c.close()
            c = None
            break
    R["reach"] = None if c else err
    R["shared"] = read_probe(pf, 0 if c else A.get("shared_wait", 2))
    if not c:
        return False
    try:
        send(c, {"node": A["node"], "shared": R["shared"], "torch": "torch" in R})
        go = (recv(c, A["timeout"] + 30) or {}).get("go", False)
    except (OSError, ValueError) as e:
        R["reach"] = "the master dropped the connection (%s)" % first_line(e)
        go = False
    c.close()
    return go


def collective(master, port):
    import datetime

    import torch
    import torch.distributed as dist

    n, rank, iters = A["nnodes"], A["node"], A.get("iters", 5)
    dev = torch.device("cuda", 0) if R.get("cuda") else torch.device("cpu")
    dist.init_process_group(
        "nccl" if R.get("cuda") else "gloo",
        init_method="tcp://%s:%d" % (master, port),
        rank=rank,
        world_size=n,
        timeout=datetime.timedelta(seconds=A["timeout"] + 30),
    )
    x = torch.ones(A["mb"] * 2**18 // n * n, device=dev)
    y = torch.empty_like(x)
    nbytes = x.numel() * 4
    out = {}
    for name, fn, factor in (
        ("all_reduce", lambda: dist.all_reduce(x), 2.0 * (n - 1) / n),
        ("all_to_all", lambda: dist.all_to_all_single(y, x), (n - 1) / float(n)),
    ):
        fn()
        dist.barrier()
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        if R.get("cuda"):
            torch.cuda.synchronize()
        out[name] = nbytes / ((time.perf_counter() - t) / iters) * factor / 1e9
    links = {}
    for k in range(1, n):
        dist.barrier()
        best = None
        for _ in range(3):
            t = time.perf_counter()
            if rank == 0:
                dist.send(x, k)
                dist.recv(y[:1], k)
            elif rank == k:
                dist.recv(x, 0)
                dist.send(y[:1], 0)
            dt = time.perf_counter() - t
            best = dt if best is None else min(best, dt)
        if rank == 0:
            links[str(k)] = nbytes / best / 1e9
    dist.barrier()
    dist.destroy_process_group()
    out["links"] = links
    return out


def main():
    if A.get("slurm"):
        A["node"] = int(os.environ.get("SLURM_NODEID", "0"))
        hosts = subprocess.run(
            ["scontrol", "show", "hostnames", os.environ.get("SLURM_JOB_NODELIST", "")],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.split()
        A["master"] = A.get("master") or (hosts[0] if hosts else None)
        if not A["master"]:
            R["reach"] = (
                "cannot tell node 0's address (scontrol show hostnames $SLURM_JOB_NODELIST failed)"
            )
    R["node"] = A.get("node")
    if A.get("facts_only"):
        facts()
        return
    if A.get("tools_only"):  # --preflight gpu on one simulated node of `launch local --spares`
        R["gpu_tools"] = gpu_tools(A.get("tool_timeout", 20))
        return
    pf = write_probe() if A["node"] == 0 else None
    facts()
    go = False
    if A["node"] == 0:
        th = listen()
        if th is not None:
            th.join()
        elif A["expect"] and "port_taken" in R:  # the others look for the probe file without us
            time.sleep(min(A["timeout"], A.get("shared_wait", 2) + 4))
        go = R["peers"].get("_go", not A["expect"] and "port_taken" not in R and "torch" in R)
        for p in [pf] + R.pop("made")[::-1]:  # leave nothing behind, not even a root we made
            try:
                os.rmdir(p) if p != pf else os.unlink(p)
            except OSError:
                pass
    elif A.get("master"):
        go = client_side()
    if A.get("collective") and go:
        try:
            R["collective"] = collective(A["master"], A["port"])
        except Exception as e:
            R["collective_error"] = "%s: %s" % (type(e).__name__, first_line(e))


if __name__ == "__main__":
    print("DOCTOR-T %.6f" % time.time(), flush=True)
    A = json.loads(sys.argv[1])
    R = {
        "host": socket.gethostname(),
        "python": sys.version.split()[0],
        "executable": sys.executable,
    }
    T0 = time.time()
    main()
    # in pieces, each a JSON string: srun --unbuffered cuts a long line (~1 KiB) in two
    S = json.dumps(R)
    for i in range(0, len(S), 400):
        print("DOCTOR+ " + json.dumps(S[i : i + 400]))
    print("DOCTOR-END", flush=True)
