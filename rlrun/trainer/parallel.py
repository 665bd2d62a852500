"""The trainer's ranks: torch.distributed setup, the model's wrapping, the loop's few collectives.

Owns: which rank (and GPU) this process is, FSDP2 or DDP, bf16 and activation checkpointing, rank
0's batch to every rank, metric sums, rank 0's full state dict. Refuses: Redis, the loss maths, the
checkpoint layout. One rank creates no process group: every collective is the identity.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping, Optional

log = logging.getLogger(__name__)

POLL_S = 0.005  # a rank waiting for rank 0's batch checks this often whether it has come
HEARTBEAT_S = 1.0  # and heartbeats this often meanwhile


def usable_device(wanted: str) -> str:
    """`wanted` (this rank's trainer.device) when torch can use it on this machine; ConfigError naming
    trainer.device otherwise (a restart would fail the same way: the trainer exits 2, the run 5)."""
    import torch

    from rlrun.errors import ConfigError

    try:
        device = torch.device(wanted)
    except (RuntimeError, ValueError) as exc:
        raise ConfigError(
            f"trainer.device={wanted!r} is not a torch device ({' '.join(str(exc).split())}): use cpu or cuda."
        ) from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0 or (device.index is not None and device.index >= count):
            raise ConfigError(
                f"trainer.device={wanted}: torch sees {count} CUDA GPU(s) on this machine. Use trainer.device=cpu, "
                "or run where the GPU is (a CUDA build of torch: pip install 'rlrun[gpu]')."
            )
    return wanted


def collective_backend(device: str) -> str:
    """torch.distributed's backend for tensors on `device`: NCCL for CUDA, gloo otherwise."""
    return "nccl" if device.startswith("cuda") else "gloo"


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    local_rank: int = 0  # rank on this node: with several ranks, the GPU it takes

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "Ranks":
        """This process's rank as its launcher (rlrun.entrypoints.rank_group or torchrun) set it."""
        if "WORLD_SIZE" not in env or int(env["WORLD_SIZE"]) <= 1:
            return cls()
        master = env.get("MASTER_ADDR", "127.0.0.1"), int(env.get("MASTER_PORT", "0"))
        return cls(int(env["RANK"]), int(env["WORLD_SIZE"]), *master, int(env.get("LOCAL_RANK", env["RANK"])))

    def device(self, wanted: str) -> str:
        """This rank's torch device: with several ranks, `cuda` is the GPU of its local rank (torchrun's
        convention; config validation refuses `cuda:K` then), anything else is taken as it is."""
        if self.distributed and wanted.split(":")[0] == "cuda":
            return f"cuda:{self.local_rank}"
        return wanted


def _rendezvous_store(ranks: Ranks, timeout_s: float):
    """The ranks' TCP store: rank 0 serves it on MASTER_ADDR only (torch's own would listen on every
    interface: rlrun/listen.py), the others are its clients."""
    import datetime

    import torch.distributed as dist

    if ranks.is_main:
        from rlrun import listen

        return listen.serve_store(ranks.master_addr, ranks.master_port, ranks.world_size, timeout_s)
    return dist.TCPStore(
        ranks.master_addr,
        ranks.master_port,
        ranks.world_size,
        is_master=False,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


class Parallel:
    """The loop's view of its ranks. Built once per trainer process; `close()` at exit."""

    def __init__(self, ranks: Ranks, sharding: str = "auto", device: str = "cpu", store_prefix: str = "") -> None:
        self.ranks = ranks
        self.sharding, self.device = "none", device
        if ranks.distributed:
            import datetime

            import torch.distributed as dist
            import torch.distributed.fsdp as fsdp

            self.sharding = sharding
            if sharding == "auto":  # FSDP2 where this torch has `fully_shard` (CPU/gloo since 2.6)
                self.sharding = "fsdp2" if hasattr(fsdp, "fully_shard") else "ddp"

            if dist.is_initialized():  # a second view of the same ranks (tests compare shardings)
                return

            backend = collective_backend(device)
            if device.startswith("cuda"):  # NCCL's communicator on this rank's GPU, not on cuda:0
                import torch

                torch.cuda.set_device(device)
            timeout = datetime.timedelta(seconds=1800)
            store = dist.PrefixStore(store_prefix, _rendezvous_store(ranks, timeout.total_seconds()))
            dist.init_process_group(backend, store=store, rank=ranks.rank, world_size=ranks.world_size, timeout=timeout)
            log.info("rank %d of %d joined (%s, %s)", ranks.rank, ranks.world_size, backend, self.sharding)

    # --- the model -----------------------------------------------------------------------------
    def wrap(self, model, mixed_precision: str = "none", activation_checkpointing: bool = False):
        """The model the loop calls: sharded (FSDP2), replicated (DDP) or as it is (one rank)."""
        if activation_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if self.sharding == "fsdp2":
            import torch
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

            policy = MixedPrecisionPolicy()
            if mixed_precision == "bf16":  # compute in bf16, gradients reduced and kept in fp32
                policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            # One unit per transformer block (the classes HF says must not be split), then the rest.
            blocks = set(getattr(model, "_no_split_modules", None) or [])
            for module in list(model.modules()):
                if type(module).__name__ in blocks:
                    fully_shard(module, mp_policy=policy)
            return fully_shard(model, mp_policy=policy)
        if self.sharding == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            return DistributedDataParallel(model)
        return model

    @staticmethod
    def unwrapped(model):
        """The Hugging Face model under a DDP wrapper (FSDP2 modifies the model in place)."""
        return getattr(model, "module", model)

    def autocast(self, mixed_precision: str):
        """bf16 autocast where FSDP2's policy does not already cast (one rank, DDP)."""
        if mixed_precision != "bf16" or self.sharding == "fsdp2":
            return contextlib.nullcontext()
        import torch

        return torch.autocast(device_type=self.device.split(":")[0], dtype=torch.bfloat16)

    @contextlib.contextmanager
    def accumulating(self, model, sync: bool) -> Iterator[None]:
        """A backward pass whose gradients are reduced over ranks only when `sync` (the last pass)."""
        if self.sharding == "ddp" and not sync:
            with model.no_sync():
                yield
            return
        if self.sharding == "fsdp2":
            model.set_requires_gradient_sync(sync)
        yield

    def full_state_dict(self, model) -> Optional[dict]:
        """Every rank must call it; rank 0 gets the whole model's tensors (CPU), the others None."""
        if self.sharding != "fsdp2":
            return self.unwrapped(model).state_dict() if self.ranks.is_main else None
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(model, options=options)
        return state if self.ranks.is_main else None

    # --- collectives -----------------------------------------------------------------------------
    def share(self, payload: Optional[bytes], heartbeat: Callable[[], None]) -> bytes:
        """Rank 0's `payload` on every rank (several ranks only). The others wait without blocking
        (polling an async broadcast), heartbeating meanwhile: rank 0 may wait a long time for the
        actor's groups."""
        import torch
        import torch.distributed as dist

        device = self._collective_device()
        size = torch.tensor([len(payload) if payload is not None else 0], dtype=torch.int64, device=device)
        self._wait(dist.broadcast(size, src=0, async_op=True), heartbeat)
        if self.ranks.is_main:
            assert payload is not None  # rank 0 always has one
            data = torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(device)
        else:
            data = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
        self._wait(dist.broadcast(data, src=0, async_op=True), heartbeat)
        return payload if payload is not None and self.ranks.is_main else data.cpu().numpy().tobytes()

    def _collective_device(self):
        import torch

        return torch.device(self.device) if self.device.startswith("cuda") else torch.device("cpu")

    @staticmethod
    def _wait(work, heartbeat: Callable[[], None]) -> None:
        last = 0.0
        while not work.is_completed():
            if time.monotonic() - last > HEARTBEAT_S:
                heartbeat()
                last = time.monotonic()
            time.sleep(POLL_S)
        work.wait()

    def sum(self, values: list[float]) -> list[float]:
        if not self.ranks.distributed:
            return list(values)
        import torch
        import torch.distributed as dist

        tensor = torch.tensor(values, dtype=torch.float64, device=self._collective_device())
        dist.all_reduce(tensor)
        return tensor.cpu().tolist()

    def max(self, values: list[float]) -> list[float]:
        if not self.ranks.distributed:
            return list(values)
        import torch
        import torch.distributed as dist

        tensor = torch.tensor(values, dtype=torch.float64, device=self._collective_device())
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return tensor.cpu().tolist()

    def barrier(self) -> None:
        if self.ranks.distributed:
            import torch.distributed as dist

            dist.barrier()

    def close(self) -> None:
        if self.ranks.distributed:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
