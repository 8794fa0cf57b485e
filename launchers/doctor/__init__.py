"""`launch doctor`: check nodes before a long job -- on this machine (--local), SSH hosts
(--hosts/--hostfile) or Slurm nodes (--slurm, a short srun job). One row per node: reachable,
versions equal to the submitting side, GPUs, master port free and reachable, run root shared, disk,
/dev/shm, open files, clock skew, NCCL env; --collective adds a short all_reduce/all_to_all. Exit 0
when every check passes, 1 when one fails, 2 for bad input (nothing run). Modules: probe (the node
side, stdlib), targets (where it runs), checks/report (verdict).
"""
