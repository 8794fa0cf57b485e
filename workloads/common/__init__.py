"""Shared building blocks for workloads (import the submodules you need; torch is imported lazily).

args        common command-line flags + validation that runs before the process group exists
dist        DistEnv from the worker environment, init (threads, device, process group), teardown
checkpoint  Checkpointer: DCP save/load of Stateful objects + progress + per-rank RNG, `latest` pointer
data        digits | synthetic | cifar10 tensors, a resumable DistributedSampler, loaders
metrics     metrics.jsonl / final.json (rank 0), param_sha256, per-rank TensorBoard
faults      crash injection (--crash-at-step/--crash-rank/--crash-phase)
loop        fit(): the resumable data-parallel training loop (sampler position, logging, checkpoints, eval)
"""
