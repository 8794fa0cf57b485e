"""Judge each node's probe record against the submitting side and the other nodes: one Check per
column.

Thresholds (documented in docs/TROUBLESHOOTING.md, launch doctor): free disk under the run root >= 1
GiB; /dev/shm >= 512 MiB free (Docker's 64 MiB default breaks NCCL's shared-memory transport and
DataLoader workers); open files (soft limit) < 1024 fails, < 4096 warns; |clock skew| > 2 s fails.
GPUs: a node without nvidia-smi (and without CUDA) is "0 GPUs (CPU only)", fine for gloo; it fails
only with --require-gpus, or when it sees GPUs but fewer than --gpus-per-node, or when another node
sees GPUs (a mixed job picks different backends).
"""

from __future__ import annotations

from dataclasses import dataclass

from .targets import NodeRun

GIB = 2**30
DISK_MIN, SHM_MIN = 1 * GIB, 512 * 2**20
NOFILE_FAIL, NOFILE_WARN = 1024, 4096
SKEW_MAX = 2.0
SLOW = 0.5  # a bandwidth under half the median is named as slow


@dataclass(frozen=True)
class Check:
    status: str  # ok | warn | fail | skip
    value: str
    why: str = ""
    fix: str = ""


def ok(value: str) -> Check:
    return Check("ok", value)


def skip(value: str = "-") -> Check:
    return Check("skip", value)


def size(n: float) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / 2**20:.0f} MiB"


@dataclass
class Context:
    ref: dict  # the submitting side's facts
    first: dict  # node 0's record (or {}), the reference when the submitting side lacks one
    master: str  # "sshhost1 (10.216.0.11)"
    port: int
    gpus_per_node: int | None
    require_gpus: bool
    shared_required: bool
    env: dict
    collective: bool
    medians: dict
    gpu: bool = False  # --gpu: the GPU/NIC tools' findings (launchers.doctor.gpucheck)
    # --container-runtime: (what is checked, its binaries: any one makes it usable)
    container: tuple | None = None
    image: str | None = None  # --container-image: the image every node must have


def versions(r: dict, c: Context) -> dict[str, Check]:
    out = {"python": ok(r["python"])}
    if r["python"] != c.ref.get("python"):
        out["python"] = Check(
            "fail",
            r["python"] + "!",
            f"python {r['python']} ({r['executable']}) here, "
            f"{c.ref.get('python')} on the submitting side",
            "use the same python everywhere (give --python)",
        )
    for key, what in (("torch", "torch"), ("launchers", "launchers")):
        want = c.ref.get(key) or c.first.get(key)
        if f"{key}_error" in r:
            fix = (
                f"install torch=={want} into {r['executable']} or give --python"
                if key == "torch"
                else "install launchers there (a shared checkout as cwd, or pip install) or give "
                "--python"
            )
            out[key] = Check(
                "fail",
                "missing!",
                f"python {r['executable']} cannot import {what} ({r[key + '_error']})",
                fix,
            )
        elif want and r[key] != want:
            out[key] = Check(
                "fail",
                r[key] + "!",
                f"{what} {r[key]} here, {want} on the submitting side",
                f"install {what} {want} there (every node and the submitting side the same)",
            )
        else:
            out[key] = ok(r[key])
    return dict(out, nccl=nccl_version(r, c))


def nccl_version(r: dict, c: Context) -> Check:
    if "torch_error" in r:
        return skip("?")
    if not r.get("cuda"):
        return ok("n/a (no CUDA)")
    want = c.ref.get("nccl") or c.first.get("nccl")
    if want and r["nccl"] != want:
        return Check(
            "fail",
            r["nccl"] + "!",
            f"NCCL {r['nccl']} here, {want} on the submitting side / node 0",
            "install the same torch build (it brings its NCCL) on every node",
        )
    return ok(r["nccl"])


def gpus(r: dict, c: Context, any_gpus: bool) -> Check:
    n = r.get("gpus", 0)
    shown = f"{n} GPUs" if n else "0 GPUs (CPU only)"
    want = c.gpus_per_node or 1
    if r.get("gpus_error"):
        return Check(
            "fail", "?!", r["gpus_error"], "check the NVIDIA driver (nvidia-smi -L must work)"
        )
    if n and n < want:
        return Check(
            "fail",
            shown + "!",
            f"sees {n} GPUs, --gpus-per-node is {want}",
            "lower --gpus-per-node or fix the node's GPUs (nvidia-smi -L, CUDA_VISIBLE_DEVICES)",
        )
    if c.require_gpus and n < want:
        return Check(
            "fail",
            shown + "!",
            f"sees {n} GPUs; --require-gpus wants {want}",
            "run on GPU nodes, or drop --require-gpus for a CPU (gloo) job",
        )
    if not n and any_gpus:
        return Check(
            "fail",
            shown + "!",
            "sees no GPU while other nodes do (nccl there, gloo here)",
            "fix this node's GPUs/driver or leave it out",
        )
    return ok(shown)


def master_port(run: NodeRun, c: Context) -> Check:
    r = run.result
    if run.node != 0:
        return skip()
    taken = r.get("port_taken")
    if taken:
        by = f" (held by {taken['holder']})" if taken.get("holder") else ""
        return Check(
            "fail",
            "in use!",
            f"master port {c.port} is in use on {run.host}{by}",
            "stop that process or give a free --master-port",
        )
    return ok(f"{c.port} free")


def reach(run: NodeRun, c: Context, master_run: NodeRun | None) -> Check:
    r = run.result
    if run.node == 0:
        return skip()
    if master_run is None or master_run.result is None:
        return skip("n/a (node 0 down)")
    if master_run.result.get("port_taken"):
        return skip("n/a (port in use)")
    if "reach" not in r:
        return skip("not checked")
    if r.get("reach"):
        return Check(
            "fail",
            "no!",
            f"cannot reach the master at {c.master}:{c.port} ({r['reach']})",
            "MASTER_ADDR must be node 0's address as the nodes see it, and the port open between "
            "nodes",
        )
    return ok("yes")


def shared(run: NodeRun, c: Context, master_run: NodeRun | None) -> Check:
    r = run.result
    if run.node == 0:
        if r.get("root_error"):
            return Check("fail", "unwritable!", r["root_error"], "give a writable --run-root")
        return ok("written")
    if master_run is None or master_run.result is None or master_run.result.get("root_error"):
        return skip("n/a")
    if "shared" not in r:
        return skip("not checked")
    if r.get("shared"):
        return ok("yes")
    pf = master_run.result.get("probe_file", "the probe file")
    if not c.shared_required:
        return Check("skip", "not shared", f"{pf} not visible (fine with --no-shared-storage)")
    return Check(
        "fail",
        "not shared!",
        f"run root not shared: {pf} written on node 0 ({master_run.host}) is not visible here",
        "put --run-root on storage every node mounts (NFS, Lustre...), or use "
        "`launch ssh --no-shared-storage`",
    )


def resources(run: NodeRun) -> dict[str, Check]:
    r, out = run.result, {}
    for key, least, fix in (
        ("disk", DISK_MIN, "free space there or give another --run-root"),
        ("shm", SHM_MIN, "mount a bigger /dev/shm (docker: --shm-size=8g or --ipc=host)"),
    ):
        d = r[key]
        if "error" in d:
            out[key] = Check("fail", "none!", f"{d['path']}: {d['error']}", fix)
        elif d["free"] < least:
            out[key] = Check(
                "fail",
                size(d["free"]) + "!",
                f"only {size(d['free'])} free in {d['path']} (needs {size(least)})",
                fix,
            )
        else:
            out[key] = ok(size(d["free"]))
    soft, hard = r["nofile"]
    fix = f"raise it (ulimit -n 65536; hard limit {hard}; systemd LimitNOFILE / limits.conf)"
    if soft < NOFILE_FAIL:
        out["nofile"] = Check("fail", f"{soft}!", f"open-file limit {soft} < {NOFILE_FAIL}", fix)
    elif soft < NOFILE_WARN:
        out["nofile"] = Check("warn", f"{soft}?", f"open-file limit {soft} < {NOFILE_WARN}", fix)
    else:
        out["nofile"] = ok(str(soft))
    s = run.skew
    if s is None:
        out["clock"] = skip("?")
    elif abs(s) > SKEW_MAX:
        out["clock"] = Check(
            "fail",
            f"{s:+.1f}s!",
            f"clock differs from the submitting side by {s:+.1f} s",
            "run NTP/chrony on every node (timestamps, heartbeats and hang ages need it)",
        )
    else:
        out["clock"] = ok(f"{s:+.2f}s")
    return out


def nccl_env(r: dict, c: Context) -> Check:
    env = {**r.get("env", {}), **c.env}
    env = {k: v for k, v in env.items() if k.startswith(("NCCL_", "TORCH_NCCL_"))}
    try:
        from nccl_tuning.validate import validate_env
    except ImportError:
        return Check(
            "skip", "not checked", "nccl_tuning.validate.validate_env is not available here"
        )
    try:
        found = validate_env(env, r.get("nccl") or None)
    except ValueError as e:
        return Check("skip", "not checked", str(e))
    errors = [f for f in found if f.severity == "error"]
    warns = [f for f in found if f.severity == "warning"]
    if errors:
        return Check(
            "fail",
            f"{len(errors)} error(s)!",
            "; ".join(map(str, errors)),
            "fix those variables (launch nccl check shows the rules)",
        )
    if warns:
        return Check(
            "warn",
            f"{len(warns)} warning(s)?",
            "; ".join(map(str, warns)),
            "review those variables",
        )
    return ok(f"{len(env)} set" if env else "none set")


def container_runtime(r: dict, c: Context) -> Check:
    """--container-runtime: one of its binaries is on the node's PATH
    (launchers.containers.containeropts.BINARIES); --container-image: a runtime found there has the
    image (r["image"]: runtime -> None, or why it has not)."""
    what, bins = c.container
    found = {b: p for b, p in (r.get("container") or {}).items() if p}
    images = r.get("image") or {}
    if found and images and all(images.values()):
        return Check(
            "fail",
            "no image!",
            f"image {c.image} is not there ({'; '.join(images.values())})",
            "build, pull or copy it to that node (the test image: clusters/image.sh build), or "
            "give another --container-image",
        )
    if found:
        return ok(next(iter(found)) + (", image" if images else ""))
    return Check(
        "fail",
        "missing!",
        f"{what}: none of {', '.join(bins)} is on PATH there",
        "install it on that node (Debian: apt-get install podman or apptainer; pyxis: enroot and "
        "the pyxis plugin; oci: crun or runc and oci.conf) or choose another --container-runtime",
    )
