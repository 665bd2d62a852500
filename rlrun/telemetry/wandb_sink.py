"""Weights & Biases for `metrics.wandb=true`: the trainer's step scalars, its held-out evaluations
(`eval/...`) and the supervisor's restart/failure events, in one W&B run per rlrun run
(docs/operations.md). Its id is kept in `<run>/wandb-run-id`, so a restarted trainer and
`rlrun resume` continue it. Events newer than the last step sent go with the next step. `wandb`
(an extra) is imported here only, when the sink is made.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any, Literal, Optional

import yaml

from rlrun.rundir import RunDir
from rlrun.telemetry.metrics import require, scalars

EVENTS_SENT = ("process_failed", "process_restarted", "process_stalled", "stack_dump")
EVAL_X = "eval/policy_version"  # W&B charts the eval/ scalars over this, not over W&B's step
require_wandb = partial(require, "wandb")


def run_id(run_dir: RunDir) -> str:
    """This rlrun run's W&B run id, made (and stored) on first use."""
    path = run_dir.root / "wandb-run-id"
    if not path.is_file():
        path.write_text(secrets.token_hex(8) + "\n")
    return path.read_text().strip()


def event_line(event: Mapping[str, Any]) -> str:
    detail = event.get("reason") or event.get("file") or ""
    return f"{event.get('event')} {event.get('process', '')}: {detail}".strip().rstrip(":")


class WandbSink:
    """Logs step records, eval records and new supervisor events to one W&B run."""

    def __init__(
        self, run_dir: RunDir, project: str, mode: Literal["online", "offline"], last_step_time: Optional[float] = None
    ) -> None:
        require_wandb()
        import wandb

        config = yaml.safe_load(run_dir.config.read_text()) if run_dir.config.is_file() else {}
        self._run = wandb.init(
            project=project,
            id=run_id(run_dir),
            resume="allow",
            dir=str(run_dir.root),
            mode=mode,
            name=run_dir.root.name,
            config=config,
        )
        self._run.define_metric(EVAL_X)
        self._run.define_metric("eval/*", step_metric=EVAL_X)
        self._since = last_step_time or 0.0  # events up to the last step sent were sent with it

    def log(self, record: Mapping[str, Any], events: Sequence[Mapping[str, Any]] = ()) -> None:
        """The record's scalars at its step, with the events since the last step sent."""
        data: dict[str, Any] = dict(scalars(record))
        new = [e for e in events if e.get("event") in EVENTS_SENT and float(e.get("time", 0)) > self._since]
        data["supervisor/failures"] = sum(1 for e in events if e.get("event") == "process_failed")
        data["supervisor/restarts"] = sum(1 for e in events if e.get("event") == "process_restarted")
        if new:
            data["supervisor/event"] = "\n".join(event_line(e) for e in new)
        self._run.log(data, step=record.get("step"))
        self._since = max([self._since, float(record.get("time") or 0), *[float(e.get("time", 0)) for e in new]])

    def log_eval(self, record: Mapping[str, Any]) -> None:
        """An evaluation's scalars as `eval/<field>` (per source `eval/<source>/<field>`), charted
        over EVAL_X. Logged at its version's W&B step, or the step in progress when W&B is past it
        (an evaluation recorded after the next step's record, or after a resume): W&B drops a row
        older than its current step."""
        data = {f"eval/{key}": value for key, value in scalars(record).items()}
        step = record.get("step")
        self._run.log(data, step=max(step if type(step) is int else 0, self._run.step))

    def close(self) -> None:
        import wandb

        self._run.finish()
        # wandb 0.31's finish() returns before its service has written a resumed run's file
        # (seen: 7 bytes, the history a second later); teardown waits for the service to flush.
        wandb.teardown()
