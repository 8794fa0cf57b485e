"""oci_bundle.py BUNDLE CHECKOUT: turn the config.json that `runc spec` wrote in BUNDLE into the
launchers test bundle for Slurm's `srun --container=BUNDLE` (issue 22), and make its rootfs
(BUNDLE/rootfs). Run by `clusters/image.sh bundle DIR` with the job's interpreter (its sys.prefix
and sys.base_prefix are mounted). Stdlib only, no download.

The rootfs holds directories only (the mount points), the merged-/usr links of this host and
podman's marker file /run/.containerenv (tests/data/report.py: `container`). Everything the node
task needs is this host's, mounted at the same paths: /usr, /etc, the checkout, the interpreter's
prefixes and sys.path (read-only), launchers again at /opt/launchers/launchers
(launchers.containers.container: srun exports PYTHONPATH=/opt/launchers), /tmp, /var/tmp (run dirs,
the dev cluster's state dir), /dev/shm (NCCL, DataLoader workers) and /run/munge (scontrol requeue
from a node). Only a mount namespace of its own: the node's network (ranks talk across the bridge),
its UTS (hostname lnodeK), PID (the pids the rank wrappers record, the tagged sweep, py-spy) and IPC
namespaces stay the host's, as with podman (launchers.containers.container._podman). The job's root
keeps the capabilities this host gives it (its bounding set), no rlimit of runc's own (the task's,
as Slurm set them), every device allowed (task/none: none is fenced off). slurmstepd rewrites
process.args, appends the job's environment to process.env, sets process.terminal false and
root.path to BUNDLE/rootfs (slurm-22-05-8-1 src/slurmd/slurmstepd/container.c:255-466); process.cwd
stays "/".
"""

from __future__ import annotations

import json
import os
import sys

CAPS = (
    "CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP LINUX_IMMUTABLE "
    "NET_BIND_SERVICE NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER SYS_MODULE SYS_RAWIO "
    "SYS_CHROOT SYS_PTRACE SYS_PACCT SYS_ADMIN SYS_BOOT SYS_NICE SYS_RESOURCE SYS_TIME "
    "SYS_TTY_CONFIG MKNOD LEASE AUDIT_WRITE AUDIT_CONTROL SETFCAP MAC_OVERRIDE MAC_ADMIN SYSLOG "
    "WAKE_ALARM BLOCK_SUSPEND AUDIT_READ PERFMON BPF CHECKPOINT_RESTORE"
).split()  # capability(7) numbers 0..40, in order
TOP_LINKS = (
    "bin",
    "sbin",
    "lib",
    "lib32",
    "lib64",
    "libx32",
)  # merged /usr: links to usr/...; else mounted
PACKAGE_AT = "/opt/launchers/launchers"  # launchers.containers.container.PACKAGE_AT + /launchers
MARKER = "run/.containerenv"


def bounding_caps(status: str = "/proc/self/status") -> list[str]:
    with open(status, encoding="ascii") as f:
        bits = int(next(ln.split()[1] for ln in f if ln.startswith("CapBnd:")), 16)
    return [f"CAP_{name}" for i, name in enumerate(CAPS) if bits >> i & 1]


def binds(checkout: str) -> list[tuple[str, str, bool]]:
    """(source, destination, read-only), parents before what is mounted below them."""
    out = [
        ("/usr", "/usr", True),
        ("/etc", "/etc", True),
        (checkout, checkout, True),
        (os.path.join(checkout, "launchers"), PACKAGE_AT, True),
    ]
    out += [
        (f"/{d}", f"/{d}", True)
        for d in TOP_LINKS
        if os.path.isdir(f"/{d}") and not os.path.islink(f"/{d}")
    ]
    covered = ["/usr", checkout]
    # the interpreter's prefixes, then what else is on its sys.path (an editable install's checkout,
    # from a .pth)
    for p in dict.fromkeys(
        os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, *sys.path[1:]) if p
    ):
        if os.path.isdir(p) and not any(
            p == d or p.startswith(d.rstrip("/") + "/") for d in covered
        ):
            out.append((p, p, True))
            covered.append(p)
    out += [
        (d, d, False) for d in ("/tmp", "/var/tmp", "/dev/shm", "/run/munge") if os.path.isdir(d)
    ]
    return sorted(out, key=lambda m: m[1].rstrip("/").count("/"))


def edit(config: dict, checkout: str) -> dict:
    proc = config["process"]
    proc["terminal"] = False
    proc["noNewPrivileges"] = False
    proc.pop("rlimits", None)
    caps = bounding_caps()
    proc["capabilities"] = {k: caps for k in ("bounding", "effective", "permitted")}
    config.pop("hostname", None)  # no UTS namespace of its own: runc refuses a hostname then
    linux = config["linux"]
    linux["namespaces"] = [{"type": "mount"}]
    linux["resources"] = {"devices": [{"allow": True, "access": "rwm"}]}
    mounts = [m for m in config["mounts"] if m["destination"] != "/dev/shm"]
    mounts += [
        {
            "destination": dst,
            "type": "bind",
            "source": src,
            "options": ["rbind", "ro" if ro else "rw"],
        }
        for src, dst, ro in binds(checkout)
    ]
    config["mounts"] = mounts
    return config


def make_rootfs(rootfs: str, config: dict) -> None:
    """The mount points (runc mounts onto them before it makes the root read-only), the host's /usr
    links, /tmp and /var/tmp sticky, the marker file."""
    os.makedirs(rootfs, 0o755)
    for d in TOP_LINKS:
        if os.path.islink(f"/{d}"):
            os.symlink(os.readlink(f"/{d}"), os.path.join(rootfs, d))
    for m in config["mounts"]:
        if m["destination"].startswith("/dev/"):  # runc's own /dev tmpfs holds these
            continue
        os.makedirs(os.path.join(rootfs, m["destination"].lstrip("/")), 0o755, exist_ok=True)
    for d in ("tmp", "var/tmp"):
        os.chmod(os.path.join(rootfs, d), 0o1777)
    for d in ("root", "run", "dev"):
        os.makedirs(os.path.join(rootfs, d), 0o755, exist_ok=True)
    open(os.path.join(rootfs, MARKER), "w", encoding="ascii").close()


def main(bundle: str, checkout: str) -> None:
    path = os.path.join(bundle, "config.json")
    with open(path, encoding="utf-8") as f:
        config = edit(json.load(f), checkout)
    make_rootfs(os.path.join(bundle, config["root"]["path"]), config)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(config, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: oci_bundle.py BUNDLE CHECKOUT")
    main(sys.argv[1], os.path.realpath(sys.argv[2]))
