"""rlrun's vLLM worker extension (`--worker-extension-cls`), called through `/collective_rpc`:

- `rlrun_reload_weights(weights_path)`: vLLM's in-place `reload_weights`, then the layers of tied
  parameters the checkpoint does not name processed again (vLLM 0.32 on CPU kept a stale packed
  copy of the tied LM head: 0.22 nats off; docs/architecture.md, "Measured trap").
- `rlrun_join_broadcast(...)`, `rlrun_broadcast_group()`, `rlrun_receive_broadcast(event_id,
  step)`: the trainer's broadcast group, joined in a thread (the engine keeps serving); a
  broadcast cut short loads nothing, a second call for the event loaded last returns at once.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import torch

from rlrun.backends.fast_llm import broadcast

log = logging.getLogger("rlrun.worker_extension")


def shared_parameter_groups(model: torch.nn.Module) -> list[list[str]]:
    """Names of the parameters that share one tensor (tied weights), one list per tensor."""
    by_tensor: dict[int, list[str]] = {}
    for module_name, module in model.named_modules():
        for name, param in module.named_parameters(recurse=False):
            full = f"{module_name}.{name}" if module_name else name
            by_tensor.setdefault(id(param), []).append(full)
    return [names for names in by_tensor.values() if len(names) > 1]


def retie(model: torch.nn.Module, groups: list[list[str]], loaded: set[str]) -> list[str]:
    """Every tied parameter the checkpoint did not name made equal to the one it did, its layer's
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


class RlrunWorkerExtension:
    # vLLM refuses an extension whose attribute names clash with the worker's: all start with rlrun_.

    def rlrun_reload_weights(self, weights_path: str) -> dict:
        from safetensors import safe_open

        model = self.model_runner.get_model()
        groups = shared_parameter_groups(model)
        self.reload_weights(weights_path=weights_path, is_checkpoint_format=True)
        loaded = set()
        for file in sorted(Path(weights_path).glob("*.safetensors")):
            with safe_open(str(file), "pt") as handle:
                loaded |= set(handle.keys())
        fixed = retie(model, groups, loaded)
        return {"tied_groups": groups, "retied": fixed}

    def rlrun_join_broadcast(
        self, host: str, port: int, rank: int, world_size: int, backend: str, timeout_s: float, group_id: str = ""
    ) -> str:
        joined: Future = Future()
        port, rank, world_size, timeout_s = int(port), int(rank), int(world_size), float(timeout_s)  # JSON in

        def join() -> None:
            try:
                still_wanted = lambda: getattr(self, "rlrun_membership", None) is joined  # noqa: E731
                joined.set_result(broadcast.join(host, port, rank, world_size, backend, timeout_s, still_wanted))
            except BaseException as exc:  # noqa: BLE001 - handed to the next receive
                joined.set_exception(exc)

        self.rlrun_membership = joined
        self.rlrun_group_id = str(group_id)
        threading.Thread(target=join, name="rlrun-broadcast-join", daemon=True).start()
        return f"joining tcp://{host}:{port} as rank {rank} of {world_size}"

    def rlrun_broadcast_group(self) -> dict:
        """The group id given to the last join; None: never joined, or the group broke or never formed."""
        membership: Future | None = getattr(self, "rlrun_membership", None)
        broken = membership is None or (membership.done() and membership.exception() is not None)
        return {"group_id": None if broken else getattr(self, "rlrun_group_id", "")}

    def rlrun_receive_broadcast(self, event_id: str, step: int, timeout_s: float) -> dict:
        step, timeout_s = int(step), float(timeout_s)
        if event_id == getattr(self, "rlrun_loaded_event", None):
            return {"step": step, "tensors": 0, "already_loaded": True}
        membership: Future | None = getattr(self, "rlrun_membership", None)
        if membership is None:
            raise RuntimeError("this vLLM server was never asked to join the trainer's broadcast group")
        member = membership.result(timeout=timeout_s)  # raises the join's error, or TimeoutError
        started = time.perf_counter()
        try:
            received = list(broadcast.receive_weights(member))
        except BaseException:
            self.rlrun_membership = None  # the group is broken: only a new join (trainer restart) mends it
            raise
        weights = [(name, tensor) for shard, name, tensor in received if shard == broadcast.WEIGHTS_SHARD]
        receive_s = time.perf_counter() - started
        model = self.model_runner.get_model()
        groups = shared_parameter_groups(model)
        self.reload_weights(weights_iterator=weights, is_checkpoint_format=True)  # vLLM's in-place reload
        retie(model, groups, {name for name, _ in weights})
        self.rlrun_loaded_event = event_id
        return {
            "step": step,
            "tensors": len(weights),
            "bytes": sum(t.numel() * t.element_size() for _, t in weights),
            "receive_s": round(receive_s, 4),
            "load_s": round(time.perf_counter() - started - receive_s, 4),
        }
