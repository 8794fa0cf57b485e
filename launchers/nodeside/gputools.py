"""The node side of the GPU check (`launch doctor --gpu`, `--preflight gpu`): runs the GPU and NIC
tools a node has, each with a timeout, and returns their raw text (launchers.gpuhealth.tools says
which tools and what comes back). Stdlib only: joined ahead of the doctor's probe
(launchers.nodeside.source), imported by a Slurm node task.
"""

import os
import shutil
import subprocess
import tempfile

TOOLS = (
    ("smi_xml", "nvidia-smi", ["-q", "-x"]),
    ("topo", "nvidia-smi", ["topo", "-m"]),
    ("nvlink", "nvidia-smi", ["nvlink", "-s"]),
    ("ibstat", "ibstat", []),
    ("dmesg", "dmesg", []),
)
IB_FILES = ("state", "phys_state", "rate", "link_layer")


def run_tool(exe, args, timeout):
    """Output into files, not pipes: a tool stuck in the kernel (a hung GPU) may never die, and we
    must not wait for it -- it is named as not answering and left behind."""
    path = shutil.which(exe)
    if not path:
        return {"missing": True}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        try:
            p = subprocess.Popen([path] + args, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        except OSError as e:
            return {"error": "%s: %s" % (exe, e.strerror or e)}
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            try:
                p.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass
            return {
                "error": "%s %s gave no answer in %g s" % (exe, " ".join(args), timeout),
                "timeout": timeout,
            }
        out.seek(0)
        err.seek(0)
        text, said = out.read(), err.read()
    if exe == "dmesg":
        text = "\n".join(ln for ln in text.splitlines() if "NVRM: Xid" in ln)
    res = {"out": text, "rc": rc}
    if rc:
        res["err"] = (said.strip().splitlines() or [""])[-1][:300]
    return res


def ib_sysfs(root="/sys/class/infiniband"):
    files = {}
    try:
        devs = sorted(os.listdir(root))
    except OSError:
        return None
    for dev in devs:
        try:
            ports = sorted(os.listdir(os.path.join(root, dev, "ports")))
        except OSError:
            continue
        for port in ports:
            for name in IB_FILES:
                try:
                    with open(os.path.join(root, dev, "ports", port, name)) as f:
                        files["%s/ports/%s/%s" % (dev, port, name)] = f.read()
                except OSError:
                    pass
    return files


def gpu_tools(timeout):
    out = {}
    for key, exe, args in TOOLS:
        if exe == "nvidia-smi" and out.get("smi_xml", {}).get("timeout"):
            out[key] = {"error": "not run: nvidia-smi -q -x gave no answer", "skipped": True}
            continue
        out[key] = run_tool(exe, args, timeout)
    if out["ibstat"].get("missing") or out["ibstat"].get("rc"):
        out["ib_sysfs"] = ib_sysfs()
    return out
