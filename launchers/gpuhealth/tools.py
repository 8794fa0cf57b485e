"""The node side of the GPU check (`launch doctor --gpu`, `--preflight gpu` on every backend): a stdlib
fragment joined into the doctor's probe (launchers.doctor.probe: local and SSH nodes) and run as is by a Slurm
node task before its agent starts (run() below). It runs the GPU and NIC tools a node has, each with a
timeout, and returns their raw text (parsing: launchers.gpuhealth.verdict, on the submitting side or the node):

  nvidia-smi -q -x, nvidia-smi topo -m, nvidia-smi nvlink -s   (when nvidia-smi is on PATH)
  ibstat, else the files /sys/class/infiniband/*/ports/*/{state,phys_state,rate,link_layer}
  dmesg, only its `NVRM: Xid` lines (often not readable without root: kernel.dmesg_restrict)

Each result is {"out": text, "rc": n}, {"error": why} (with "timeout": seconds when the tool gave no
answer; the other nvidia-smi calls are then not made) or {"missing": true}. The tools are looked up on the
node's PATH, so a test can put stand-ins first on it.
"""
from __future__ import annotations

GPU_TOOLS = r'''
TOOLS = (("smi_xml", "nvidia-smi", ["-q", "-x"]), ("topo", "nvidia-smi", ["topo", "-m"]),
         ("nvlink", "nvidia-smi", ["nvlink", "-s"]), ("ibstat", "ibstat", []), ("dmesg", "dmesg", []))
IB_FILES = ("state", "phys_state", "rate", "link_layer")

def run_tool(exe, args, timeout):
    """Output into files, not pipes: a tool stuck in the kernel (a hung GPU) may never die, and we must not
    wait for it -- it is named as not answering and left behind."""
    import tempfile
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
            return {"error": "%s %s gave no answer in %g s" % (exe, " ".join(args), timeout), "timeout": timeout}
        out.seek(0); err.seek(0)
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
'''


def run(timeout: float) -> dict:
    """The same fragment run in this process (a Slurm node task, where launchers is importable): the tools'
    raw outputs, keyed like the probe's `gpu_tools`."""
    space: dict = {}
    exec(compile("import os, shutil, subprocess\n" + GPU_TOOLS, "launchers.gpuhealth.tools", "exec"), space)  # noqa: S102
    return space["gpu_tools"](timeout)
