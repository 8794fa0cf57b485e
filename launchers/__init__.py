"""launchers: start multi-node torchrun jobs locally, over SSH or on Slurm, with one run directory."""
__version__ = "0.1.0"
