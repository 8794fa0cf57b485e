"""Shared building blocks for workloads (import the submodules you need; torch is imported lazily).

args        common command-line flags + validation that runs before the process group exists
dist        DistEnv from the worker environment, init (threads, device, process group), teardown
checkpoint  Checkpointer: DCP save/load of Stateful objects + progress + per-rank RNG, `latest`
            pointer
data        digits | synthetic | cifar10 tensors, a resumable DistributedSampler, loaders
metrics     metrics.jsonl / final.json (rank 0), param_sha256, per-rank TensorBoard
faults      crash injection (--crash-at-step/--crash-rank/--crash-phase; --crash-slot: a lemon node)
loop        fit(): the one resumable training loop (sampler position, logging, checkpoints, agreed
            stop, eval); TorchSteps = its hooks for a torch model + optimizer + scheduler
dsloop      DeepSpeed's engine as fit()'s hooks: engine forward/backward/step,
            engine.save/load_checkpoint
models      the shared ConvNet (seeds' CIFAR-10 net, 8x8 sibling) and cast_input
preempt     USR2/SIGTERM -> checkpoint at the next step and stop, agreed over all ranks
dsconfig    DeepSpeed config load/validate/resolve; dsops: DeepSpeed's prebuilt C++ ops cache
expert_parallel  all_to_all dispatch/combine of tokens to expert ranks (moe); sharded: hashes/counts
                 of DTensor models
"""
