"""The Slurm backend, in one room: what the launcher does and what runs on the nodes.

    env.py      SlurmEnv: the one reader of SLURM_* variables (and of the nodelist's syntax)
    render.py   the sbatch script and its srun lines (pure; golden-tested, submitit's layout)
    options.py  the Slurm options validated, with their defaults (pure)
    submit.py   submission through submitit (in-process, or from the warm submitter the CLI forks)
    status.py   what Slurm says about a job (squeue / scontrol / sacct -c), parsed purely
    backend.py  SlurmBackend: plan (= dry-run), preflight, start, refresh, cancel
    jobctl.py   the job in the queue: squeue states, scancel, the wait until it is gone, launch
                cancel of a run
    allocrun.py a run in the user's own allocation: its srun step followed here, its end recorded by
                the launcher
    nodespec.py what the launcher resolved for the nodes (slurm/spec-a<A>.json): they read, never
                re-derive
    node.py     the per-node task: rendezvous, then the one torchrun command
    nodecmd.py  a node's command (the torchrun builder's, its stop settings and memory store, in the
                container)
    rendezvous.py  node 0's master address and beacon; the other nodes' wait for it and reach check
    nodewatch.py   the node task's watches while its agent runs: a hang, a failed peer node, the run
                   dir removed
    gpugate.py  --preflight gpu in each node task: the GPU check, every node's verdict before any
                agent
    requeue.py  the end of an attempt on Slurm: requeue after USR2, or record the result (finalize)
    task.py     the node entry point (`python -m launchers.backends.slurm.task`) and submitit's
                NodeTask

This package's __init__ imports nothing: a node's start-up imports only env, nodespec, node (with
nodecmd, rendezvous, nodewatch), requeue and task.
"""
