"""The programs launch runs on a node, each a real module here (stdlib only: a node may have no
`launchers`), so the layer, size and lint checks see them like any other module. Two ways to run one
there:

  python -m launchers.nodeside.NAME JSON   where the node's python imports launchers (the SSH hosts'
                                           reach check, after the host check found launchers there;
                                           gpuhealth.tools in-process)
  python -c SOURCE JSON                    where it may not (the doctor's probe, the host check, the
                                           image pull):
                                           SOURCE is source(NAME...), the modules' own text read from this folder

source() joins modules in order with their `from launchers...` import lines left out: what a module
takes from another node-side module comes ahead of it in the same text (the probe: gputools, then
probe). So a node-side module imports other node-side modules only, one name per `from
launchers.nodeside.X import ...` line, and has no `from __future__` line (the nodes' python may be
old; a joined text can hold only one, first).

  gputools  the GPU and NIC tools' raw outputs (`launch doctor --gpu`, `--preflight gpu`)
  probe     `launch doctor`'s node side (DOCTOR lines)        gone   node 0 told that a node's probe never started
  check     the preflight's check of a node (CHECK line)      pull   the job's image on a host (IMAGE line)
  reach     the SSH master reachable from every other host (LISTENING/SERVED, REACHED/UNREACHABLE)
"""  # noqa: E501

from __future__ import annotations

import os

# os.path, not pathlib: `launch local`'s entry imports this package before its early agents start
# (launchers.backends.earlyagent), and pathlib's import alone costs ~5 ms there
HERE = os.path.dirname(os.path.realpath(__file__))


def source(*names: str) -> str:
    """The text sent as `python -c`: the named modules' sources in order, their `from launchers.`
    lines left out."""
    parts = []
    for name in names:
        with open(os.path.join(HERE, f"{name}.py"), encoding="utf-8") as f:
            text = f.read()
        parts.append(
            "".join(
                ln for ln in text.splitlines(keepends=True) if not ln.startswith("from launchers.")
            )
        )
    return "\n".join(parts)
