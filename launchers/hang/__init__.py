"""Hang detection (--hang-timeout): which rank stopped moving, and which ones only wait for it.

    sample.py   what a node sees of its ranks without their help (/proc state and CPU time, log
                growth) and
                with it (launchers.heartbeat): when each rank last advanced
    stacks.py   every rank's Python stack through py-spy, and the stalled/waiting call for each
    watch.py    NodeMonitor (one per node: samples, publishes, answers a stack request) and
                Coordinator (one per run: sees that no rank advanced for the timeout, asks for
                stacks, writes the verdict)

Where they run: local -- both in the launcher; SSH -- a NodeMonitor in each host's launchers.remote,
the Coordinator in the launcher; Slurm -- a NodeMonitor in each node task, the Coordinator in node
0's. They meet in the run dir: progress/node<K>.json, hang/attempt<A>/{request.json, node<K>.json,
rank<R>.txt, verdict.json}.
"""
