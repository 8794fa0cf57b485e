"""Fault injection for tests: one chosen rank dies with os._exit(1) at a chosen step and phase;
--step-delay slows every step (a job long enough to kill, stop or cut mid-training, on any machine).

The crash fires only in one attempt (LAUNCH_ATTEMPT == --crash-attempt, default 0) and not after an
in-place torchrun restart, so the resumed run with the very same arguments trains through.
--crash-slot S instead: local rank 0 of the node on node slot S (LAUNCH_NODE_SLOT) crashes in every
attempt (a lemon node). os._exit skips every destructor and flush handler, like a killed process
would. --crash-phase hang: the rank is stuck instead (sleeps for good outside any collective, its
signal handlers alive: a hung rank for --hang-timeout).
"""

from __future__ import annotations

import os
import sys
import time

# hang: at "mid", stuck for good instead of
PHASES = ("mid", "pre_save", "save", "after_save", "hang", "load")
# exiting; load: while the attempt loads the checkpoint of step --crash-at-step (a resumed attempt:
# --crash-attempt)


class FaultInjector:
    def __init__(
        self,
        *,
        step: int | None,
        rank: int,
        phase: str,
        attempt: int,
        env,
        delay: float = 0.0,
        slot: int | None = None,
    ) -> None:
        self.step, self.phase, self.delay = step, phase, delay
        if slot is not None:  # the lemon node: whichever rank runs there, in every attempt
            self.armed = step is not None and env.node_slot == slot and env.local_rank == 0
        else:
            self.armed = (
                step is not None
                and env.rank == rank
                and env.attempt == attempt
                and env.restart_count == 0
            )
        self.rank = env.rank

    @classmethod
    def from_args(cls, args, env) -> "FaultInjector":
        return cls(
            step=args.crash_at_step,
            rank=args.crash_rank,
            phase=args.crash_phase,
            attempt=args.crash_attempt,
            env=env,
            delay=getattr(args, "step_delay", 0.0),
            slot=getattr(args, "crash_slot", None),
        )

    def maybe(self, step: int, phase: str) -> None:
        if self.delay and phase == "mid":
            time.sleep(self.delay)  # --step-delay: every step (the loop calls "mid" once per step)
        if self.armed and step == self.step and self.phase == "hang" and phase == "mid":
            print(
                f"fault injection: rank {self.rank} hangs at step {step} at {time.time():.3f}",
                flush=True,
            )
            while True:
                time.sleep(3600)
        if self.armed and step == self.step and phase == self.phase:
            print(
                f"fault injection: rank {self.rank} exits with code 1 at step {step} ({phase})",
                flush=True,
            )
            sys.stderr.flush()
            os._exit(1)
