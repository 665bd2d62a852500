"""Torch threads by what vLLM is doing (`world.cpu_affinity=by_need`, one hf rank on CPU).

On one machine the vLLM servers have cores of their own, yet on SmolLM2 they have a request in
flight for ~30 % of a trainer step (bench/README.md). With this the trainer may run on every core:
it uses `trainer.threads` threads while any actor has a request in flight, and one thread per core
it may use while none has. Two threads on a core vLLM computes on cost far more than they bring
(OpenMP waits for its slowest thread: 2-thread steps took 3x as long on cores other jobs used), so
the count follows the actors' flags (`rlrun/parts/generation_flags.py`) layer by layer, forward and
backward.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from rlrun.parts.generation_flags import GenerationFlags


class ThreadsByNeed:
    def __init__(self, busy: Callable[[], bool], busy_threads: int, idle_threads: int) -> None:
        self.busy, self.busy_threads, self.idle_threads = busy, busy_threads, idle_threads
        self.threads = torch.get_num_threads()
        self.switches = 0  # how often the count changed (the metrics' idle_core_switches)

    def __call__(self, *_) -> None:
        """Set the count for what vLLM does now; a hook's signature (its arguments unused)."""
        want = self.busy_threads if self.busy() else self.idle_threads
        if want != self.threads:
            torch.set_num_threads(want)  # the calling thread's: CPU autograd runs the backward on it too
            self.threads = want
            self.switches += 1

    def also_busy_while(self, busy: Callable[[], bool]) -> None:
        """Count vLLM as busy while `busy()` too (an overlapped weight update: the servers reload
        on their cores while the step runs; idle threads there made 2-core steps ~1.4x as long)."""
        flags = self.busy
        self.busy = lambda: flags() or busy()

    def attach(self, model: torch.nn.Module) -> None:
        """Check before each block of the model runs, forward and backward."""
        for block in blocks(model):
            block.register_forward_pre_hook(self)
            block.register_full_backward_pre_hook(self)


def blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks: its longest ModuleList (a transformer's decoder layers)."""
    lists = [list(m) for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    return max(lists, key=len) if lists else [model]


def threads_by_need(flags: GenerationFlags, busy_threads: int) -> ThreadsByNeed:
    """One thread per core this process may run on while vLLM idles (world.cpu_affinity=by_need
    gives the trainer every core rlrun has), `busy_threads` while it generates."""
    return ThreadsByNeed(flags.any_busy, busy_threads, max(busy_threads, len(os.sched_getaffinity(0))))
