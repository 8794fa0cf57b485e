"""Parsers of the GPU and NIC tools' outputs, pure functions over their text (no tool is run here; the
doctor's probe runs them on each node and hands the text back). One module per tool, each with
`parse(text) -> facts` and `findings(facts, node, ...) -> [Finding]` (one line: node, device, fact):

  smi       `nvidia-smi -q -x`: GPU count, uncorrectable ECC, retired pages, row remaps, persistence, MIG,
            hardware/thermal clock slowdowns
  topo      `nvidia-smi topo -m`: NVLink vs PCIe paths between GPUs, the nearest NIC of each GPU
  nvlink    `nvidia-smi nvlink -s`: links reported `<inactive>`
  ib        `ibstat` or /sys/class/infiniband/*/ports/*/{state,phys_state,rate,link_layer}: ports not Active
  xid       kernel messages (`dmesg`): `NVRM: Xid (PCI:...): N` lines

Fixtures: tests/data/gpu/ (real outputs, each source in tests/data/gpu/sources.md).
"""
