"""A run's progress as the supervisor sees it: what the trainer and the actors publish in Redis
(a trainer that publishes no state of its own, Fast-LLM, has its steps noted from its events by
its backend: `note_trainer_step`). Feeds the live view, the completion check and the progress
watchdog (with `stall_state`, what each process waits for); tolerant of Redis being down or
restarting (the last values read are kept).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from rlrun.rundir import RunDir
from rlrun.streams import names
from rlrun.streams import server as redis_server
from rlrun.supervisor import EventLog


@dataclass(frozen=True)
class Progress:
    """What the live view shows of training, read from the trainer's published state."""

    step: int = 0
    max_train_steps: int = 0
    samples: int = 0
    reward_mean: Optional[float] = None
    policy_version: int = 0
    groups_published: int = 0


class ProgressReader:
    """Reads the run's Redis at `url`; `num_actors` and `max_train_steps` (actor.num_actors,
    trainer.max_train_steps) are all it needs of the config."""

    def __init__(
        self,
        url: str,
        run_dir: RunDir,
        events: Optional[EventLog] = None,
        *,
        num_actors: int,
        max_train_steps: int,
    ) -> None:
        self._url = url
        self.num_actors, self.max_train_steps = num_actors, max_train_steps
        self.run_dir = run_dir
        self._client = None
        self._events = events
        self.malformed_events = 0
        self._last: dict[str, dict] = {}  # the last value read of each hash
        self.reported: Optional[tuple[int, Optional[int]]] = None  # (step, samples) noted from the trainer's events

    def note_rejected_event(self, stream: str, message_id: str, why: str) -> None:
        """An event that is malformed or does not fit the run: counted, recorded, never acted on."""
        self.malformed_events += 1
        if self._events is not None:
            self._events.emit(
                "malformed_message", stream=stream, id=message_id, reason=why, count=self.malformed_events
            )

    def redis(self):
        """A client for the run's Redis (made on first use, again after a failure)."""
        if self._client is None:
            password = self.run_dir.read_redis_password()
            self._client = redis_server.connect(self._url, password, socket_timeout=2.0, reconnect_s=0)
        return self._client

    def trainer_state(self) -> dict:
        return self._hash(names.TRAINER_STATE)

    def note_trainer_step(self, step: int, samples: Optional[int]) -> None:
        """The step (and samples) a trainer without a state of its own has announced; each new one
        is a `trainer_step` event in events.jsonl, which `rlrun status` and `rlrun runs` read."""
        if self.reported == (step, samples):
            return
        self.reported = (step, samples)
        if self._events is not None:
            self._events.emit("trainer_step", step=step, samples=samples)

    def read(self) -> Progress:
        t = self._hash(names.TRAINER_STATE)
        actors = [self._hash(key) for key in names.actor_states(self.num_actors)]
        reward = t.get("reward_mean")
        step, samples = int(t.get("step", 0)), int(t.get("samples_processed", 0))
        version = int(t.get("policy_version", 0))
        if (
            self.reported is not None
        ):  # Fast-LLM: what its events said; vLLM serves the step the weight follower published
            step, samples, version = self.reported[0], self.reported[1] or 0, self._policy_version(version)
        return Progress(
            step=step,
            max_train_steps=self.max_train_steps,
            samples=samples,
            reward_mean=float(reward) if reward is not None else None,
            policy_version=version,
            groups_published=sum(int(a.get("groups_published", 0) or 0) for a in actors),
        )

    def _policy_version(self, last: int) -> int:
        try:
            return int(self.redis().get(names.POLICY_VERSION) or 0)
        except Exception:  # Redis not up, or stopped
            self._client = None
            return last

    def stall_state(self, trainer_view: Callable[[Any, int], Any]) -> dict:
        """Where the trainer and each actor wait, and the back-pressure between them, as plain data
        (the diagnostics of a stalled run). Never raises: what cannot be read is said.
        `trainer_view(client, k)`: actor k's view of the trainer (the run's bound backend's)."""
        from rlrun.streams.names import actor_name

        now, k_all = time.time(), self.num_actors
        state: dict = {"waits": {}}
        try:
            client = self.redis()
            t = client.hgetall(names.TRAINER_STATE) or {}
            beat = t.get("heartbeat")
            state["trainer"] = {
                **{k: v for k, v in sorted(t.items()) if not k.startswith(("heartbeat", "pid", "ready_pid"))},
                "heartbeat_age_s": round(now - float(beat), 1) if beat else None,
            }
            if self.reported is not None:
                state["trainer"]["reported_by_its_events"] = {"step": self.reported[0], "samples": self.reported[1]}
            state["policy_version_served"] = client.get(names.POLICY_VERSION)
            state["waits"]["trainer"] = trainer_wait(t, now)
            streams = {}
            for k in range(k_all):
                name, a = actor_name(k, k_all), client.hgetall(names.actor_state(k, k_all)) or {}
                view = trainer_view(client, k)
                window = view.window(int(a.get("in_flight", 0) or 0))
                held = float(a.get("held_by_backpressure_since", 0) or 0)
                state[name] = {
                    "in_flight": a.get("in_flight"),
                    "groups_published": a.get("groups_published"),
                    "heartbeat_age_s": round(now - float(a["heartbeat"]), 1) if a.get("heartbeat") else None,
                    "held_by_backpressure_for_s": round(now - held, 1) if held else 0,
                    "backpressure": {
                        "unit": window.unit,
                        "waiting": window.waiting,
                        "limit": window.limit,
                        "room": window.room,
                        **window.detail,
                    },
                }
                state["waits"][name] = (
                    f"back-pressure for {now - held:.0f} s: {window.waiting} {window.unit} handed over and not trained, limit {window.limit}"
                    if held
                    else f"its {a.get('in_flight', '?')} groups in flight (vLLM)"
                )
                streams[view.stream] = _stream_info(client, view.stream)
            state["streams"] = streams
        except Exception as exc:  # noqa: BLE001 - a report, never a reason to fail
            self._client = None
            state["error"] = f"cannot read the run's Redis: {type(exc).__name__}: {exc}"
        return state

    def _hash(self, key: str) -> dict:
        try:
            value = self.redis().hgetall(key) or {}
        except Exception:  # Redis not up yet, restarting or stopped: what was read last
            self._client = None
            return self._last.get(key, {})
        # Kept so that the end of a run (Redis stopped) still shows the final step and reward.
        self._last[key] = value
        return value


def trainer_wait(trainer_state: dict, now: float) -> str:
    """What the trainer waits for, as a stalled run's report says it (`trainer_state`: its hash as
    read): a weight update in flight first, to which version and for how long, then what its
    heartbeat says."""
    said = trainer_state.get("waiting_for") or ""
    version, since = trainer_state.get(names.UPDATING_WEIGHTS_TO), trainer_state.get(names.UPDATING_WEIGHTS_SINCE)
    if version is not None and since is not None:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(since)))
        update = f"its weight update to policy version {version}, in progress for {now - float(since):.0f} s (since {started})"
        return f"{update}; {said}" if said else update
    return said or "nothing it says (in a step, or a trainer that does not say)"


def _stream_info(client, stream: str) -> dict:
    """Its length and each consumer group's place in it (XINFO GROUPS)."""
    info = {"entries": client.xlen(stream)}
    for group in client.xinfo_groups(stream) if info["entries"] or client.exists(stream) else []:
        info[f"group {group.get('name')}"] = {
            k: group.get(k) for k in ("last-delivered-id", "entries-read", "lag", "pending")
        }
    return info
