"""Old name of the Slurm node entry point, kept because the sbatch scripts of jobs queued or
requeued before the Slurm code moved run `python -m launchers.slurmnode {task RUN_DIR/slurm | run
RUN_DIR | finalize RUN_DIR}`. Everything lives in launchers.backends.slurm.task now (which accepts
both forms)."""

from __future__ import annotations

import sys

from launchers.backends.slurm import task


def __getattr__(name: str):
    return getattr(task, name)  # NodeTask, for pickles made before the move


if __name__ == "__main__":
    sys.exit(task.exit_status(task.main()))
