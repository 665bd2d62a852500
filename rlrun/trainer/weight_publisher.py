"""The hf trainer's weights handed to every vLLM server after each step: through a folder
(trainer.weight_transfer=disk: `write_weights`, which each server reloads), a broadcast from
rank 0 (=broadcast, `weight_broadcast.py`) or a shared memory file every server on the host maps
(=shm, `rlrun/weights/shared.py`), in a thread while the next step trains when
trainer.overlap_weight_update is on; a server being restarted is waited for.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from rlrun.config.schema import TrainerConfig
from rlrun.inference.admin import VllmAdmin, in_thread
from rlrun.rundir import RunDir
from rlrun.streams import names
from rlrun.trainer.disk import temporary_folder
from rlrun.trainer.parallel import Parallel
from rlrun.trainer.stopping import Stopping

if TYPE_CHECKING:
    from rlrun.trainer.weight_broadcast import BroadcastSync
    from rlrun.weights.shared import SharedWeights

log = logging.getLogger("rlrun.trainer")

VLLM_WAIT_S = 600.0  # a weight update waits this long for a restarting vLLM server


class WeightPublisher:
    """`push` each step's weights (every rank takes part: rank 0 gathers them and hands them over),
    `finish` the update in flight before the trainer says it is done. `broadcast`, `shared`: the
    way weights go (trainer.weight_transfer=broadcast, =shm); both None: through folders. `stop`: set by SIGTERM (a stopping trainer gives an update up: the
    servers stop with it). `heartbeat(waiting_for=...)` is called while it waits for a server;
    `updating(version)` when an update starts, `updating(None)` when it ends (a stalled run's report
    names a stuck one)."""

    def __init__(
        self,
        t: TrainerConfig,
        run_dir: RunDir,
        redis,
        vllm: VllmAdmin,
        parallel: Parallel,
        broadcast: "BroadcastSync | None",
        stop: threading.Event,
        heartbeat: Callable[..., None],
        vllm_wait_s: float = VLLM_WAIT_S,
        before_replacing: Callable[[int], None] = lambda version: None,
        updating: Callable[[int | None], None] = lambda version: None,
        shared: "SharedWeights | None" = None,
    ) -> None:
        """`before_replacing(version)`: called before the weights of `version` are replaced (the
        held-out evaluation of that version finishes first)."""
        self.t, self.run_dir, self.redis, self.vllm, self.parallel = t, run_dir, redis, vllm, parallel
        self.before_replacing, self.updating = before_replacing, updating
        self.broadcast, self.stop, self.heartbeat, self.vllm_wait_s = broadcast, stop, heartbeat, vllm_wait_s
        self.shared = shared
        self._update: Future | None = None  # the update in flight (overlapped)
        self._last_update_s: float | None = None  # how long the last overlapped update took

    def push(self, model, version: int, step: int, overlap: bool = False, replacing: int | None = None) -> None:
        """Hand policy `version` (the weights after `step`) to every vLLM server that answers (a
        server being restarted loads weights/current at its start). `overlap`: in a thread, while
        the next step trains; an update still in flight is finished first, so at most one is.
        `replacing`: the version the servers hold now (None: unknown, as at a restart)."""
        weights = self.parallel.full_state_dict(model)  # every rank takes part; rank 0 gets them
        if not self.parallel.ranks.is_main:
            return
        assert weights is not None  # rank 0 gets them
        if self.shared is not None:
            from rlrun.weights.shared import without_aliases

            weights = without_aliases(weights)  # a tied head once, as a folder holds it
        self.finish()
        bare = self.parallel.unwrapped(model)
        if not overlap:
            return self._hand_over(bare, weights, version, step, replacing)
        # The next step changes the parameters in place: the thread sends a copy taken now. With shm
        # the file is that copy (0.1 s into pages that exist, not ~1 s into fresh ones): the servers
        # read it only inside the update, and the next write waits for it (finish above).
        if self.shared is not None:
            self.shared.write(weights)
            weights = self.shared.views
        else:
            weights = {name: tensor.detach().to("cpu", copy=True) for name, tensor in weights.items()}

        def timed() -> float:
            started = time.monotonic()
            self._hand_over(bare, weights, version, step, replacing)
            return time.monotonic() - started

        self._update = in_thread(timed)  # its failure is re-raised by finish()

    def in_flight(self) -> bool:
        """An overlapped update is still running (its server reloads beside the step)."""
        return self._update is not None and not self._update.done()

    def finish(self) -> None:
        """Wait for the update in flight, if any (its failure raised here)."""
        update, self._update = self._update, None
        if update is not None:
            self._last_update_s = update.result()

    def last_update_s(self) -> float | None:
        """How long the last overlapped update took, once (None: none finished since last asked)."""
        took, self._last_update_s = self._last_update_s, None
        return took

    def _hand_over(self, bare, weights: dict, version: int, step: int, replacing: int | None = None) -> None:
        """Through a folder or a broadcast from rank 0; `bare`: the model unwrapped (its
        save_pretrained writes the folder)."""
        if replacing is not None:
            self.before_replacing(replacing)
        self.updating(version)
        try:
            self._update_servers(bare, weights, version, step)
        finally:
            self.updating(None)

    def _update_servers(self, bare, weights: dict, version: int, step: int) -> None:
        # Under the stop rule: a SLURM job's cancel signals every process at once, so the run's Redis
        # may be gone by the time vLLM has the weights; its error would end the trainer before the
        # checkpoint at this step boundary. The version is not published then (a restart does it).
        stopping = Stopping(self.redis, self.stop)
        publish = lambda: stopping.call(lambda: self.redis.set(names.POLICY_VERSION, version))  # noqa: E731
        if (
            self.broadcast is None and self.shared is None
        ):  # first the folder: a server (re)starting from now on loads it
            target = write_weights(self.run_dir, bare, weights, version)
            down = self._until_vllm_answers(lambda: self.vllm.update_from_folder(str(target), version, publish))
        else:
            from rlrun.trainer.weight_broadcast import disk_copy_due

            copied: list[Path] = []  # a folder for the servers that start cold, written at most once per version
            if self.shared is not None:  # before the pause: the servers read the file only in their update
                if weights is not self.shared.views:  # (an overlapped push wrote it already)
                    self.shared.write(weights)
                send = lambda: self.vllm.update_from_shared(str(self.shared.path), version, publish)  # noqa: E731
            else:
                broadcast = self.broadcast
                assert broadcast is not None  # neither the folder nor the shared file: a broadcast
                send = lambda: broadcast.update(weights, version, publish, self.heartbeat)  # noqa: E731

            def in_memory():
                try:
                    return send()
                except Exception:  # none answers, or the update failed: a server may be restarting
                    if not copied:  # it loads weights/current at its start: make that this version
                        copied.append(write_weights(self.run_dir, bare, weights, version))
                        log.info("weights v%d written to weights/current for a vLLM server that starts cold", version)
                    raise

            down = self._until_vllm_answers(in_memory)
            if not copied and disk_copy_due(step, self.t.checkpoint_every, self.t.max_train_steps, down):
                write_weights(self.run_dir, bare, weights, version)
        if down:
            log.warning(
                "weights v%d: %s not reachable (restarting: it starts from weights/current)", version, ", ".join(down)
            )

    def _until_vllm_answers(self, action):
        """Retry a weight update while a vLLM server is down (the supervisor restarts it). A stuck
        broadcast (WeightSyncTimeout) is not retried: it ends the trainer."""
        import httpx

        deadline = time.monotonic() + self.vllm_wait_s
        while True:
            try:
                return action()
            except (httpx.HTTPError, RuntimeError) as exc:
                if self.stop.is_set():  # the servers stop with us: a restart hands them its checkpoint's weights
                    log.warning("weight update given up while stopping: %s", exc)
                    return None
                if time.monotonic() > deadline:
                    raise
                log.warning("weight update waits for vLLM: %s", exc)
                self.heartbeat(waiting_for=f"a vLLM server for the weight update ({exc})")
                time.sleep(2.0)


def write_weights(run_dir: RunDir, model, weights: dict, version: int):
    """weights/vNNNNNN written whole and renamed into place, weights/current pointed at it; older
    versions deleted but the one current pointed at before (it may still be loading somewhere)."""
    target = run_dir.weights_version(version)
    tmp = target.with_name(f".tmp-{target.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    with temporary_folder(tmp):  # removed if the write fails; DiskFull when the disk is full
        model.save_pretrained(tmp, state_dict=weights, safe_serialization=True)
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    current = run_dir.current_weights
    previous = os.path.basename(os.readlink(current)) if current.is_symlink() else ""
    run_dir.point_current_weights(target)
    for old in run_dir.weights.glob("v*"):
        if old.name not in {target.name, previous}:
            shutil.rmtree(old, ignore_errors=True)
    return target
