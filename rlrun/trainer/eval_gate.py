"""The trainer's side of the held-out evaluation: weights that are being evaluated are not replaced
until their result is in (or `eval.wait_s` has passed), and each result becomes a metrics.jsonl
record of kind "eval" (rank 0 only).

Actor 0 samples the evaluation (`rlrun/actor/evaluator.py`) on the servers while the trainer goes on
with its next step; only the weight update that would replace the version being evaluated waits,
so the figures are of exactly that version. A record is written once per trainer process; after a
restart, a version's record may appear again, later in the file, with the same figures: readers
keep the last per version (`rlrun.telemetry.metrics.eval_records`).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Callable

from rlrun.config.schema import EvalConfig
from rlrun.streams import names
from rlrun.task.evaluation import is_due
from rlrun.trainer.stopping import Stopping

log = logging.getLogger("rlrun.trainer")

POLL_S = 0.1


class EvalGate:
    def __init__(
        self,
        eval_cfg: EvalConfig,
        last_version: int,
        stopping: Stopping,
        heartbeat: Callable[..., None],
        write: Callable[[dict], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cfg, self.last_version, self.stopping, self.heartbeat, self.write = (
            eval_cfg,
            last_version,
            stopping,
            heartbeat,
            write,
        )
        self.clock = clock
        self._recorded: set[int] = set()
        self._lock = threading.Lock()  # an overlapped update's thread and the loop's end may both ask

    def wait_for(self, version: int) -> None:
        """Return once `version`'s evaluation is in (recorded) or not due, or after eval.wait_s
        (logged), or when the trainer is asked to stop."""
        if not is_due(version, self.cfg, self.last_version):
            return
        with self._lock:
            if version in self._recorded:
                return
            deadline = self.clock() + self.cfg.wait_s
            while True:
                raw = self.stopping.call(lambda: self.stopping.redis.hget(names.EVAL_RESULTS, str(version)))
                if raw:
                    self._record(version, json.loads(raw))
                    return
                if self.stopping.requested.is_set():
                    return
                if self.clock() > deadline:
                    log.warning(
                        "no evaluation of policy version %d after eval.wait_s=%g s (is actor 0 running?): the weights move on "
                        "and that version goes unevaluated",
                        version,
                        self.cfg.wait_s,
                    )
                    self._recorded.add(version)
                    return
                self.heartbeat(waiting_for=f"the evaluation of policy version {version} (actor 0 samples it)")
                time.sleep(POLL_S)

    def _record(self, version: int, result: dict) -> None:
        self._recorded.add(version)
        if "abandoned" in result:
            log.warning("evaluation of policy version %d abandoned: %s", version, result["abandoned"])
            return
        record = {
            "kind": "eval",
            "step": version,
            "policy_version": version,
            **{k: v for k, v in result.items() if k != "version"},
        }
        self.write(record)
        log.info(
            "eval v%d: reward %.3f, pass@1 %.3f over %d prompts",
            version,
            result["reward_mean"],
            result["pass@1"],
            result["prompts"],
        )
