"""The in-memory checkpoints (--memory-checkpoint) are the launcher's: launchers.memckpt (and launchers.memcodec),
one implementation for the workloads (workloads.common.loop) and users' programs (launchers.integrations
.memory_checkpoints). The names the tests use, here too."""
from launchers.memckpt import KEEP, MemCheckpoints, choose, listing, private_dir, why_storage, write_copy
from launchers.memcodec import pack, unpack

__all__ = ["KEEP", "MemCheckpoints", "choose", "listing", "pack", "private_dir", "unpack", "why_storage", "write_copy"]
