"""NCCL tuning: presets as data, a validator that mirrors NCCL's env parsers, bench and sweep.

Nothing here imports torch at import time except bench.py (a worker program run under torchrun).
"""
