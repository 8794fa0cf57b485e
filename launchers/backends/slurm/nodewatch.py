"""The watches of a Slurm node task over its agent while it runs (NodeRun's base;
launchers.backends.slurm.node): --hang-timeout's monitor and, on node 0, the run's coordinator; a
peer node that ended in failure (this node stopped after PEER_GRACE_S instead of waiting in
torchrun's exit barrier); the run dir removed (the node's processes killed at once). Each watch runs
in a daemon thread and reads the NodeRun's fields (ns, rd, env, node, attempt, stops, here), setting
peer_failed or dir_gone when it stops the node."""

from __future__ import annotations

import signal
import sys
import threading
import time

from ... import procs
from ...stops import stop_decision, wait_s
from . import gone

# a node still running this long after another node failed is stopped (watch_peers)
PEER_GRACE_S = 5.0


class NodeWatches:
    """The watch threads of NodeRun (its fields are set by NodeRun.__init__)."""

    def watch_hangs(self, agent_pid: int) -> None:
        """--hang-timeout: this node's monitor (it stops the node's processes once a hang is
        decided) and, on node 0, the run's coordinator."""
        spec = self.ns.spec
        if not spec.hang_timeout:
            return
        from ...hang.verdict import hang_reason
        from ...hang.watch import Coordinator, NodeMonitor
        from ...nodeagent import stop_node

        # the ranks waiting on the hung one get the stop and the grace
        def stop(verdict: dict) -> None:
            print(
                f"launch: node {self.node}: {hang_reason(verdict)}; stopping this node",
                file=sys.stderr,
                flush=True,
            )
            how = stop_decision("hang", spec.stop_grace)
            stop_node(
                self.ns.run_id, self.node, sig=how.signal, wait_s=how.wait_s, agent_pid=agent_pid
            )

        NodeMonitor(
            self.rd.path, self.ns.run_id, self.attempt, nodes=[self.node], on_verdict=stop
        ).start()
        if self.node == 0:
            coord = Coordinator(
                self.rd, self.attempt, spec.hang_timeout, spec.nodes, spec.world_size
            )
            threading.Thread(
                target=coordinate, args=(coord,), daemon=True, name="launch-hang-coordinator"
            ).start()

    def watch_peers(self, agent) -> None:
        """Another node of this attempt ended in failure without a stop signal (its agent died, its
        task failed) while this agent still runs: its workers may already be gone (done, or stopped
        by that node's sweep) and this agent would wait for the dead peer in torchrun's exit barrier
        (300 s). After PEER_GRACE_S (the failure's own propagation first) this node is stopped like
        a cancel: the stop to the agent, the programs' stop grace, then the sweep; an agent whose
        workers are all gone is killed."""
        since = None
        while agent.poll() is None and not self.stops:
            failed = [
                k
                for k, r in self.rd.node_records(self.ns.spec.nodes, self.attempt).items()
                if k != self.node
                and r.get("state") == "EXITED"
                and not r.get("stop_signals")
                and r.get("slurm_job_id") == self.env.job_id
                and (r.get("exit_code") or r.get("signal"))
            ]
            since = (since or time.monotonic()) if failed else None
            if since is not None and time.monotonic() - since >= PEER_GRACE_S:
                self.peer_failed = f"node {failed[0]} ended in failure"
                print(
                    f"launch: node {self.node}: {self.peer_failed} while this node still runs; "
                    "stopping it",
                    file=sys.stderr,
                    flush=True,
                )
                from ...nodeagent import node_pids, stop_node

                if [p for p in node_pids(self.ns.run_id, self.node) if p != agent.pid]:
                    stop_node(
                        self.ns.run_id,
                        self.node,
                        wait_s=wait_s(self.ns.spec.stop_grace),
                        agent_pid=agent.pid,
                    )
                # only the agent is left, in the exit barrier: a C++ wait no signal handler
                # interrupts
                else:
                    procs.kill(agent.pid, signal.SIGKILL)
                return
            time.sleep(1.0)

    def watch_gone(self, agent) -> None:
        """The run dir removed while this node runs: its records cannot be kept. This node's
        processes are killed at once (no grace: what a program wrote would recreate half a run dir),
        the node writes nothing more, node 0 cancels the job (launchers.backends.slurm.gone)."""
        if gone.watch(self.here.gone, lambda: agent.poll() is not None):
            from ...nodeagent import stop_node

            self.dir_gone = True
            how = stop_decision("run dir gone", 0)
            stop_node(
                self.ns.run_id, self.node, sig=how.signal, wait_s=how.wait_s, agent_pid=agent.pid
            )


def coordinate(coord) -> None:
    from ...hang.watch import INTERVAL_S

    try:
        while coord.check(time.time()) is None:
            time.sleep(INTERVAL_S)
    except FileNotFoundError:  # the run dir was removed: NodeRun.watch_gone ends the node
        return
