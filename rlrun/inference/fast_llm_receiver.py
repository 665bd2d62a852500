"""A vLLM worker extension that loads the weights Fast-LLM broadcasts (trainer=fast_llm only).

vLLM mixes this class into its worker (`--worker-extension-cls`); its methods are called through
the server's `/collective_rpc` by rlrun (see `rlrun/backends/fast_llm/follower.py`):

- `rlrun_join_broadcast(...)`: start joining the trainer's broadcast group, in a thread (Fast-LLM
  opens the group when it starts and waits there for every receiver; the engine keeps serving
  meanwhile). Called before every (re)start of the trainer; an earlier membership is dropped.
- `rlrun_receive_broadcast(event_id, step)`: receive the broadcast announced by `weights_ready`
  event `event_id` and load it in place. The engine is busy while it runs, so the caller pauses
  generation around it. A second call for the event loaded last returns at once (a retried call
  never waits for a broadcast that will not come). Steps are no key: a restarted trainer goes
  back to its checkpoint's step and broadcasts it again, and that must be loaded.

The whole broadcast is received before anything is loaded: a broadcast cut short leaves the old
weights served, never a mix of two policies (it costs one extra copy of the weights in memory).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

from rlrun.backends.fast_llm import broadcast


class FastLlmWeightReceiver:
    # vLLM refuses an extension whose attribute names clash with the worker's: all start with rlrun_.

    def rlrun_join_broadcast(self, host: str, port: int, rank: int, world_size: int, backend: str, timeout_s: float) -> str:
        joined: Future = Future()
        port, rank, world_size, timeout_s = int(port), int(rank), int(world_size), float(timeout_s)  # JSON in

        def join() -> None:
            try:
                joined.set_result(broadcast.join(host, port, rank, world_size, backend, timeout_s))
            except BaseException as exc:  # noqa: BLE001 - handed to the next receive
                joined.set_exception(exc)

        self.rlrun_membership = joined
        threading.Thread(target=join, name="rlrun-broadcast-join", daemon=True).start()
        return f"joining tcp://{host}:{port} as rank {rank} of {world_size}"

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
        self.reload_weights(weights_iterator=weights, is_checkpoint_format=True)  # vLLM's in-place reload
        self.rlrun_loaded_event = event_id
        return {
            "step": step,
            "tensors": len(weights),
            "bytes": sum(t.numel() * t.element_size() for _, t in weights),
            "receive_s": round(receive_s, 4),
            "load_s": round(time.perf_counter() - started - receive_s, 4),
        }
