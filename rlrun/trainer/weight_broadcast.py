"""The sending end of the in-memory weight path: the hf trainer's rank 0 as rank 0 of Fast-LLM's
weight broadcast group, so the vLLM servers receive with the very receiver they run for Fast-LLM
(rlrun/backends/fast_llm/broadcast.py, rlrun/inference/worker_extension.py).

Wire format (the receiver's docstring): the group of `receivers + 1` ranks is made at
`tcp://host:port` by `torch.distributed.rendezvous` (rank 0 serves the TCP store) under the
store prefix `range_0_<n>_1/`; per tensor, `broadcast_object((shard, name, shape, dtype))` (the
pickle's byte count as an int64 tensor, then its bytes) and the tensor; then
`broadcast_object(None)`. gloo on CPU, NCCL on GPUs.

Owns the sender only. Not yet wired into the trainer's loop (weights still reach vLLM through
files, rlrun/trainer/main.py): bench/weight_sync.py measures it against the disk path.
"""

from __future__ import annotations

import datetime
import pickle

import torch
import torch.distributed as dist

from rlrun.backends.fast_llm.broadcast import SOURCE_RANK, WEIGHTS_SHARD, store_prefix


class WeightBroadcaster:
    """Rank 0 of a broadcast group to `receivers` vLLM workers (ranks 1..receivers)."""

    def __init__(self, host: str, port: int, receivers: int, transport: str = "gloo", timeout_s: float = 600.0) -> None:
        world_size = receivers + 1
        timeout = datetime.timedelta(seconds=timeout_s)
        # Blocks until every receiver has joined (they join from rlrun_join_broadcast).
        self.store, _, _ = next(dist.rendezvous(f"tcp://{host}:{port}", SOURCE_RANK, world_size, timeout=timeout))
        prefixed = dist.PrefixStore(store_prefix(world_size), self.store)
        if transport == "gloo":
            self.group, self.device = dist.ProcessGroupGloo(prefixed, SOURCE_RANK, world_size, timeout), torch.device("cpu")
        elif transport == "nccl":
            self.device = torch.device("cuda", torch.cuda.current_device())
            self.group = dist.ProcessGroupNCCL(prefixed, SOURCE_RANK, world_size, timeout)
        else:
            raise ValueError(f"unknown broadcast transport {transport!r} (gloo or nccl)")

    def _broadcast(self, tensor: torch.Tensor) -> None:
        options = dist.BroadcastOptions()
        options.rootRank, options.rootTensor = SOURCE_RANK, 0
        self.group.broadcast([tensor], options).wait()

    def _broadcast_object(self, value) -> None:
        payload = torch.frombuffer(bytearray(pickle.dumps(value)), dtype=torch.uint8).to(self.device)
        self._broadcast(torch.tensor([payload.numel()], dtype=torch.int64, device=self.device))
        self._broadcast(payload)

    def send(self, weights: dict[str, torch.Tensor]) -> int:
        """Broadcast every tensor of `weights` (a full state dict), then the end marker; the bytes sent."""
        sent = 0
        for name, tensor in weights.items():
            tensor = tensor.detach().to(self.device).contiguous()
            self._broadcast_object((WEIGHTS_SHARD, name, tuple(tensor.shape), tensor.dtype))
            self._broadcast(tensor)
            sent += tensor.numel() * tensor.element_size()
        self._broadcast_object(None)
        return sent
