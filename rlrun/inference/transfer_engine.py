"""rlrun's weight-transfer engine inside vLLM: `--weight-transfer-config '{"backend": "rlrun"}'`,
registered through vLLM's plugin entry point (`rlrun.inference.vllm_plugin`), driven through
vLLM's own RL routes (`/init_weight_transfer_engine`, `/start_weight_update`, `/update_weights`,
`/finish_weight_update`). vLLM 0.32 ships NCCL and CUDA-IPC engines only; this one serves the CPU
and the two ways rlrun moves weights:

- `update_info = {"path": FOLDER}`: a complete safetensors folder (trainer.weight_transfer=disk).
- `update_info = {"shm": FILE}`: the trainer's weights in a file this worker maps, laid out by
  `rlrun/weights/shared.py` (trainer.weight_transfer=shm, a server on the trainer's host): views of
  it, no copy before vLLM's own load.
- `update_info = {}`: one whole broadcast in Fast-LLM's wire format (`backends/fast_llm/broadcast.py`)
  from rank 0 of the group joined by `init_info` (the hf trainer's =broadcast, and Fast-LLM's own
  push). The join runs in a thread, so the engine keeps serving while the sender starts; the
  tensors are all received before any is loaded, so a broadcast cut short loads nothing.

Either way the load is vLLM's in-place `reload_weights`, then the layers of tied parameters the
weights do not name are processed again: on CPU the tied LM head keeps a packed copy for its GEMM
that the reload leaves stale (0.22 nats off, docs/architecture.md "Measured trap"; vLLM's reload
notes "tied parameters will only reflect processing from one of the parent layers").
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import torch
from vllm.distributed.weight_transfer.base import WeightTransferEngine, WeightTransferInitInfo, WeightTransferUpdateInfo
from vllm.model_executor.model_loader.reload.inplace import reload_weights

from rlrun.weights import broadcast
from rlrun.weights.shared import SharedReader

log = logging.getLogger("vllm.rlrun.transfer_engine")  # under vLLM's logger: its level, its handler


@dataclass
class RlrunInitInfo(WeightTransferInitInfo):
    """Join the broadcast group rank 0 opens at host:port as `rank` of `world_size`."""

    host: str
    port: int
    rank: int
    world_size: int
    backend: str = "gloo"  # gloo on CPU, nccl on GPUs
    timeout_s: float = 600.0  # forming the group, and each collective of a broadcast
    namespace: str = ""  # the keys of this formation of the group (broadcast.member_of)


@dataclass
class RlrunUpdateInfo(WeightTransferUpdateInfo):
    """`path`: a complete safetensors folder to load; `shm`: a shared weights file to load; neither:
    receive one broadcast."""

    path: str | None = None
    shm: str | None = None
    timeout_s: float = 600.0  # how long to wait for a join still in progress


def shared_parameter_groups(model: torch.nn.Module) -> list[list[str]]:
    """Names of the parameters that share one tensor (tied weights), one list per tensor."""
    by_tensor: dict[int, list[str]] = {}
    for module_name, module in model.named_modules():
        for name, param in module.named_parameters(recurse=False):
            full = f"{module_name}.{name}" if module_name else name
            by_tensor.setdefault(id(param), []).append(full)
    return [names for names in by_tensor.values() if len(names) > 1]


def retie(model: torch.nn.Module, groups: list[list[str]], loaded: set[str]) -> list[str]:
    """Every tied parameter the weights did not name made equal to the one they did, its layer's
    post-load processing run again (on CPU a packed copy a reload leaves stale); their names."""
    owners = {}
    for module_name, module in model.named_modules():
        for name, param in module.named_parameters(recurse=False):
            owners[f"{module_name}.{name}" if module_name else name] = (module, param)
    redone = []
    for names in groups:
        loaded_here = [n for n in names if n in loaded]
        if not loaded_here:
            continue
        source = owners[loaded_here[0]][1]
        for name in names:
            if name in loaded:
                continue
            module, target = owners[name]
            if target is not source:
                target.data.copy_(source.data)
            method = getattr(module, "quant_method", None)
            if method is not None and hasattr(method, "process_weights_after_loading"):
                method.process_weights_after_loading(module)
            redone.append(name)
    return redone


def folder_tensor_names(path: str) -> set[str]:
    from safetensors import safe_open

    names: set[str] = set()
    for file in sorted(Path(path).glob("*.safetensors")):
        with safe_open(str(file), "pt") as handle:
            names |= set(handle.keys())
    return names


class RlrunWeightTransferEngine(WeightTransferEngine[RlrunInitInfo, RlrunUpdateInfo]):
    init_info_cls = RlrunInitInfo
    update_info_cls = RlrunUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config, vllm_config, device, model) -> None:
        super().__init__(config, vllm_config, device, model)
        self._membership: Future | None = None  # the last join; its result is the group
        self._shared = SharedReader()  # the shared weights file, mapped once

    def init_transfer_engine(self, init_info: RlrunInitInfo) -> None:
        joined: Future = Future()
        self._membership = joined
        info = init_info

        def join() -> None:
            try:
                still_wanted = lambda: self._membership is joined  # noqa: E731 - a newer join overtakes this one
                member = broadcast.join(
                    info.host,
                    int(info.port),
                    int(info.rank),
                    int(info.world_size),
                    info.backend,
                    float(info.timeout_s),
                    still_wanted,
                    str(info.namespace),
                )
                joined.set_result(member)
            except BaseException as exc:  # noqa: BLE001 - handed to the next update
                joined.set_exception(exc)

        threading.Thread(target=join, name="rlrun-broadcast-join", daemon=True).start()
        log.info(
            "joining tcp://%s:%s as rank %s of %s (%s)", info.host, info.port, info.rank, info.world_size, info.backend
        )

    def start_weight_update(self) -> None:
        pass  # receive_weights is one whole reload (vLLM's layerwise reload inside)

    def finish_weight_update(self) -> None:
        pass

    def update_weights(self, update_info: dict) -> None:
        # The base class synchronizes an accelerator afterwards, which raises where there is none (CPU).
        self.receive_weights(self.parse_update_info(update_info))
        if torch.accelerator.is_available():
            torch.accelerator.synchronize()

    def receive_weights(self, update_info: RlrunUpdateInfo) -> None:
        started = time.perf_counter()
        if update_info.path is not None:
            weights, loaded = None, folder_tensor_names(update_info.path)
        elif update_info.shm is not None:
            weights = list(self._shared.tensors(update_info.shm))
            loaded = {name for name, _ in weights}
        else:
            weights = self._receive(float(update_info.timeout_s))
            loaded = {name for name, _ in weights}
        received = time.perf_counter()
        groups = shared_parameter_groups(self.model)
        reload_weights(
            self.vllm_config,
            self.model,
            weights_iterator=weights,
            weights_path=update_info.path,
            is_checkpoint_format=True,
        )
        retied = retie(self.model, groups, loaded)
        log.info(
            "weights loaded from %s: %d tensors, received in %.3f s, loaded in %.3f s, retied %s",
            update_info.path or update_info.shm or "the broadcast",
            len(loaded),
            received - started,
            time.perf_counter() - received,
            retied,
        )

    def _receive(self, timeout_s: float) -> list[tuple[str, torch.Tensor]]:
        membership = self._membership
        if membership is None:
            raise RuntimeError("this vLLM server was never asked to join a weight broadcast group")
        member = membership.result(timeout=timeout_s)  # raises the join's error, or TimeoutError
        try:
            received = list(broadcast.receive_weights(member))
        except BaseException:
            self._membership = None  # the group is broken: only a new join mends it
            raise
        return [(name, tensor) for shard, name, tensor in received if shard == broadcast.WEIGHTS_SHARD]

    def shutdown(self) -> None:
        self._membership = None  # the group's members go with their last reference
