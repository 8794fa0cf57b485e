"""The node side of the GPU check (`launch doctor --gpu`, `--preflight gpu` on every backend): the
stdlib module launchers.nodeside.gputools, joined into the doctor's probe (launchers.doctor.probe:
local and SSH nodes) and called in-process by a Slurm node task before its agent starts (run()
below). It runs the GPU and NIC tools a node has, each with a timeout, and returns their raw text
(parsing: launchers.gpuhealth.verdict, on the submitting side or the node):

  nvidia-smi -q -x, nvidia-smi topo -m, nvidia-smi nvlink -s   (when nvidia-smi is on PATH)
  ibstat, else the files /sys/class/infiniband/*/ports/*/{state,phys_state,rate,link_layer}
  dmesg, only its `NVRM: Xid` lines (often not readable without root: kernel.dmesg_restrict)

Each result is {"out": text, "rc": n}, {"error": why} (with "timeout": seconds when the tool gave no
answer; the other nvidia-smi calls are then not made) or {"missing": true}. The tools are looked up
on the node's PATH, so a test can put stand-ins first on it.
"""

from __future__ import annotations

from ..nodeside import gputools


def run(timeout: float) -> dict:
    """The tools run from this process (a Slurm node task, where launchers is importable): their raw
    outputs, keyed like the probe's `gpu_tools`."""
    return gputools.gpu_tools(timeout)
