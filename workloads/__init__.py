"""Training programs run under `launch` (torch lives here, never in `launchers`).

`python -m workloads.convnet` is the DDP ConvNet; `workloads.common` holds the pieces every workload
shares: distributed init/teardown, DCP checkpoints with the atomic `latest` pointer, datasets,
metrics and fault injection.
"""
