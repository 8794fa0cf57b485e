"""Parsers of the GPU and NIC tools' outputs, pure functions over their text (they run no tool: the
node side, tools below, runs them on each node and hands the text back). One module per tool, each
with `parse(text) -> facts` and `findings(facts, node, ...) -> [Finding]` (one line: node, device,
fact):

  smi       `nvidia-smi -q -x`: GPU count, uncorrectable ECC, retired pages, row remaps,
            persistence, MIG, hardware/thermal clock slowdowns
  topo      `nvidia-smi topo -m`: NVLink vs PCIe paths between GPUs, the nearest NIC of each GPU
  nvlink    `nvidia-smi nvlink -s`: links reported `<inactive>`
  ib        `ibstat` or /sys/class/infiniband/*/ports/*/{state,phys_state,rate,link_layer}: ports
            not Active
  xid       kernel messages (`dmesg`): `NVRM: Xid (PCI:...): N` lines

The node side and the judgement, shared by every backend's GPU check (doctor --gpu, --preflight
gpu):

  tools     the stdlib fragment a node runs (the tools above, raw text back): in doctor's probe, or
            in a
            Slurm node task (run())
  verdict   a node's findings from that text, and its one preflight line when it has a fault

Fixtures: tests/data/gpu/ (real outputs, each source in tests/data/gpu/sources.md).
"""
