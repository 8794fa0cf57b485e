"""The node side of `launch doctor`: the stdlib module launchers.nodeside.probe (gputools joined
ahead of it), sent inline (`python -c PROBE ARGS`) because `launchers` may not even be importable on
a node. Run with the nodes' python on every node at once.

It prints `DOCTOR-T <epoch>` first (the submitting side stamps its arrival: clock skew), then its
record as `DOCTOR+ <json string>` lines (the record's JSON in pieces of 400 characters: srun
--unbuffered cuts a line of about 1 KiB in two) and `DOCTOR-END`. The record: versions (python,
torch, launchers, NCCL when CUDA exists), GPUs (nvidia-smi; none = CPU only), free disk under the
run root, /dev/shm, the open-file limit, the NCCL_* / TORCH_NCCL_* environment; with `gpu`, the GPU
and NIC tools' raw outputs (launchers.gpuhealth.tools); always the network interfaces
(/sys/class/net: name, operstate, loopback) and the HCA ports' files (/sys/class/infiniband, read by
nodeside.gputools' ib_sysfs), which doctor keeps per node (launchers.diagnosis.nodefacts). Node 0
writes `<root>/.launch-doctor-<token>`, then (after its imports) binds the master port (when it is
taken, its holder is named from /proc) and serves every other node: a node connects to MASTER:port,
must read the token, then reads the probe file (shared storage) and reports back. With `collective`,
once every node has reported, they run all_reduce, all_to_all and node-0-to-node-k transfers
(torch.distributed, gloo on CPU) on the same port and print their bus bandwidths (nccl-tests' busbw
factors).
"""

from __future__ import annotations

from ..nodeside import source

PROBE = source("gputools", "probe")
# run on node 0 for a node whose probe could not start (launchers.nodeside.gone)
GONE = source("gone")
