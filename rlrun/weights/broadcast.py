"""Fast-LLM's weight broadcast: the receiving end (what a vLLM worker runs) and its wire format.

Fast-LLM's rank 0 (fast_llm/engine/training/streaming.py) opens a group of `external_world_size
+ 1` ranks at `tcp://host:port` and after every `weights_ready` sends, per tensor,
`broadcast_object((shard, name, shape, dtype))` then the tensor; `broadcast_object(None)` ends it.
The headers come from the network: unpickled by an allow-list. Every collective, and the forming
of the group, is bounded by the group's timeout (`CollectiveTimeout`): NCCL would otherwise wait
for a member that stopped taking part for as long as the process lives.
"""

from __future__ import annotations

import datetime
import io
import pickle
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

from rlrun import listen
from rlrun.listen import LOOPBACK

SOURCE_RANK = 0  # Fast-LLM's trainer rank 0 sends; the vLLM workers are ranks 1..n
WEIGHTS_SHARD = "weights"  # the shard of `iter_checkpoint` that holds the model's parameters
# gloo, NCCL and the store word a timeout differently (and differently per torch version): a
# failure this close to the deadline is taken for one.
AT_DEADLINE = 0.95


class CollectiveTimeout(RuntimeError):
    """A collective of the group, or forming it, did not complete within the group's timeout: a
    member stopped taking part (hung, stopped, or never joined)."""


@dataclass(frozen=True)
class BroadcastGroup:
    group: dist.ProcessGroup
    rank: int
    world_size: int
    device: torch.device
    timeout: datetime.timedelta | None = None  # each collective's; None: the backend's own (NCCL: none on the CPU)


def serve_store(host: str, port: int, world_size: int, timeout_s: float) -> dist.TCPStore:
    """Serve the group's TCP store at host:port, on that interface only (rlrun/listen.py),
    for when Fast-LLM's rank 0 will not (`installed.store_host`) and for the hf trainer's group:
    every member, rank 0 included, is then its client. The server runs until the returned store
    is dropped."""
    return listen.serve_store(host, port, world_size, timeout_s)


def join(
    host: str,
    port: int,
    rank: int,
    world_size: int,
    backend: str,
    timeout_s: float,
    still_wanted=lambda: True,
    namespace: str = "",
) -> BroadcastGroup:
    """Join the group rank 0 opens at `host:port` as `rank` (1..world_size-1); blocks until every
    member has joined, or raises after `timeout_s`. `still_wanted()`: false for a join overtaken by
    a newer one (the hf trainer forms its group again on the same port): it claims no rank.
    `namespace`: see `member_of`."""
    if not 0 < rank < world_size:
        raise ValueError(f"a receiver's rank must be in 1..{world_size - 1}, got {rank}")
    timeout = datetime.timedelta(seconds=timeout_s)
    store, _, _ = next(dist.rendezvous(f"tcp://{host}:{port}", rank, world_size, timeout=timeout))
    if not still_wanted():
        raise RuntimeError(f"the join of tcp://{host}:{port} as rank {rank} was overtaken by a newer one")
    return member_of(store, rank, world_size, backend, timeout, namespace, host)


def member_of(
    store, rank: int, world_size: int, backend: str, timeout: datetime.timedelta, namespace: str = "", host: str = ""
) -> BroadcastGroup:
    """Rank `rank` of the group made on `store` (the sender's side too: rank 0). `namespace`
    prefixes its keys: "" for Fast-LLM's group; one of its own for each formation of the hf
    trainer's group on one store, so that no member reads the keys a killed member of an earlier
    formation left there (its address: the connection then times out). `host`: the store's; a
    loopback one keeps gloo's sockets on loopback too."""
    # Fast-LLM's prefix for ranks range(0, n) (`ProcessGroupPool`: range_{start}_{stop}_{step}/)
    prefixed = dist.PrefixStore(f"{namespace}range_0_{world_size}_1/", store)
    if backend == "gloo":
        options = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]  # private, not in torch's stubs
        options._timeout = timeout
        options._devices = [
            dist.ProcessGroupGloo.create_device(hostname=host)
            if host in LOOPBACK
            else dist.ProcessGroupGloo.create_default_device()
        ]
        group = bounded(
            f"forming the group as rank {rank} of {world_size}",
            timeout,
            lambda: dist.ProcessGroupGloo(prefixed, rank, world_size, options),
        )
        device = torch.device("cpu")
    elif backend == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        group = dist.ProcessGroupNCCL(prefixed, rank, world_size, options)
    else:
        raise ValueError(f"unknown broadcast backend {backend!r} (gloo or nccl)")
    return BroadcastGroup(group, rank, world_size, device, timeout)


def bounded(what: str, timeout: datetime.timedelta | None, action):
    """`action()`; a failure at its deadline raised as CollectiveTimeout naming `what`."""
    started = time.monotonic()
    try:
        return action()
    except Exception as exc:
        took = time.monotonic() - started
        if timeout is None or took < AT_DEADLINE * timeout.total_seconds():
            raise
        raise CollectiveTimeout(f"{what} did not complete in {timeout.total_seconds():g} s ({exc})") from exc


def broadcast_tensor(member: BroadcastGroup, tensor: torch.Tensor) -> torch.Tensor:
    """Rank 0's `tensor` on every member, in place (Fast-LLM's `broadcast`: rootRank, rootTensor 0).
    With a timeout the wait blocks the CPU until the collective is done (NCCL's plain wait only
    orders the stream, and the next `.item()` would then wait forever) or raises CollectiveTimeout."""
    options = dist.BroadcastOptions()
    options.rootRank, options.rootTensor = SOURCE_RANK, 0
    what = f"a broadcast of {tuple(tensor.shape)} {tensor.dtype} as rank {member.rank} of {member.world_size}"
    if member.timeout is None:
        member.group.broadcast([tensor], options).wait()
    else:
        bounded(what, member.timeout, lambda: member.group.broadcast([tensor], options).wait(member.timeout))
    return tensor


def receive_object(member: BroadcastGroup) -> object:
    """One `broadcast_object` from rank 0: the byte count, then the pickle's bytes."""
    size = broadcast_tensor(member, torch.empty([1], dtype=torch.int64, device=member.device))
    payload = broadcast_tensor(member, torch.empty(int(size.item()), dtype=torch.uint8, device=member.device))
    return _HeaderUnpickler(io.BytesIO(payload.cpu().numpy().tobytes())).load()  # an allow-list: see below


def receive_weights(member: BroadcastGroup) -> Iterator[tuple[str, str, torch.Tensor]]:
    """One whole broadcast: `(shard_name, layer_name, tensor)` for every tensor, until rank 0's
    end marker. Consume it to the end: the sender waits for every receiver at every tensor."""
    while True:
        header = receive_object(member)
        if header is None:
            return
        shard_name, layer_name, shape, dtype = _check_header(header)
        tensor = torch.empty(shape, dtype=dtype, device=member.device)
        yield shard_name, layer_name, broadcast_tensor(member, tensor)


def _check_header(header: object) -> tuple[str, str, torch.Size, torch.dtype]:
    if not (isinstance(header, tuple) and len(header) == 4):
        raise ValueError(f"a weight header must be (shard_name, layer_name, shape, dtype), got {header!r}")
    shard_name, layer_name, shape, dtype = header
    if not (isinstance(shard_name, str) and isinstance(layer_name, str) and isinstance(dtype, torch.dtype)):
        raise ValueError(f"malformed weight header {header!r}")
    if not (isinstance(shape, tuple) and all(type(d) is int and d >= 0 for d in shape)):
        raise ValueError(f"malformed shape in weight header {header!r}")
    return shard_name, layer_name, torch.Size(shape), dtype


_DTYPES = {name for name in dir(torch) if isinstance(getattr(torch, name, None), torch.dtype)}


class _HeaderUnpickler(pickle.Unpickler):
    """Headers are pickles from the network: no class but torch.Size and torch dtypes."""

    def find_class(self, module: str, name: str):
        if module == "torch" and name == "Size":
            return torch.Size
        if module == "torch" and name in _DTYPES:
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"a weight header may not name {module}.{name}")
