"""What follows a failed attempt: the recovery policy and its node pool, its options, Slurm's
decisions, the one loop over attempts, the recovery timeline."""
