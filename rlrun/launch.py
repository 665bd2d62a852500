"""`rlrun train` as a library call: prepare the run directory, build the specs, supervise, stop.

    run_dir = create_run(cfg, resolved_yaml, overrides)
    reason = train(cfg, run_dir, on_tick=...)

The CLI renders; this module decides. The completion rule of the trainer backend (a pure
function in `rlrun.completion`) is fed by what the trainer publishes in Redis.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import yaml

from rlrun import completion, preflight
from rlrun.cluster import spawner_for
from rlrun.config import RunConfig
from rlrun.errors import ConfigError, EnvironmentProblem, ProcessFailed
from rlrun.inference.server import base_url
from rlrun.roles import Endpoints, build_specs
from rlrun.rundir import RunDir
from rlrun.streams import names
from rlrun.streams import server as redis_server
from rlrun.streams.tail import StreamTail
from rlrun.supervisor import EventLog, ExitRejected, ProcessSpec, ProcessStatus, Supervisor

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Progress:
    """What the live view shows of training, read from the trainer's published state."""

    step: int = 0
    max_train_steps: int = 0
    samples: int = 0
    reward_mean: Optional[float] = None
    policy_version: int = 0
    groups_published: int = 0


def run_root(cfg: RunConfig) -> Path:
    name = cfg.run.name or f"{cfg.recipe}-{time.strftime('%Y%m%d-%H%M%S')}"
    return Path(cfg.run.dir).expanduser() if cfg.run.dir else Path(cfg.run.runs_root) / name


def create_run(cfg: RunConfig, resolved_yaml: str, overrides: list[str], root: Optional[Path] = None) -> RunDir:
    run_dir = RunDir((root or run_root(cfg)).resolve())
    preflight.check(cfg, run_dir.root, fresh=True)  # a run that cannot work leaves no trace
    run_dir.create({"kind": "rlrun-run", "recipe": cfg.recipe, "created": time.time(), "overrides": overrides})
    run_dir.config.write_text(resolved_yaml)
    run_dir.overrides.write_text(yaml.safe_dump(list(overrides)))
    run_dir.write_state(status="created")
    return run_dir


def model_path(cfg: RunConfig, build: bool) -> str:
    """The folder (or hub id) vLLM and the trainer load. Builds the tiny model if asked to."""
    m = cfg.model
    if m.source == "tiny":
        from rlrun.models.tiny import TinyBuild, ensure_tiny_model

        args = dict(seed=cfg.run.seed, warm_start_steps=m.warm_start_steps, max_operand=cfg.dataset.max_operand, max_model_len=m.max_model_len)
        if not build:
            return str(Path(m.cache_dir).expanduser() / TinyBuild(**args).folder_name())
        return str(ensure_tiny_model(Path(m.cache_dir), **args))
    if m.source == "path":
        path = Path(m.path).expanduser()
        if not (path / "config.json").is_file():
            what = "does not exist" if not path.exists() else "is not a Hugging Face model folder (no config.json)"
            raise ConfigError(f"model.path={m.path} {what}. Point model.path at a folder saved with save_pretrained, or use model=tiny.")
        return str(path.resolve())
    try:  # a hub id: fetched once into the Hugging Face cache, then served from that folder
        from huggingface_hub import snapshot_download

        return snapshot_download(m.path)
    except Exception as exc:  # noqa: BLE001 - any failure means "cannot get the model"
        raise EnvironmentProblem(
            f"cannot fetch model {m.path!r} from the Hugging Face hub ({exc}). Download it where the hub is "
            f"reachable and use model.source=path model.path=FOLDER."
        ) from None


def plan_endpoints(cfg: RunConfig, pick_port: Callable[[str], int]) -> Endpoints:
    if cfg.streams.url:
        from rlrun.streams.external import process_url

        redis_url, redis_port = process_url(cfg.streams.url, cfg.streams.password_file is not None), None
    else:
        redis_port = pick_port(cfg.streams.host)
        redis_url = redis_server.redis_url(cfg.streams.host, redis_port)
    vllm_urls = [base_url(cfg.inference.host, pick_port(cfg.inference.host)) for _ in range(cfg.inference.num_servers)]
    broadcast_port = 0
    if cfg.trainer.backend == "fast_llm":
        broadcast_port = cfg.trainer.fast_llm.broadcast_port or pick_port(cfg.inference.host)
    return Endpoints(redis_url=redis_url, redis_port=redis_port, vllm_urls=vllm_urls, broadcast_port=broadcast_port)


def plan_specs(cfg: RunConfig, run_dir: RunDir) -> list[ProcessSpec]:
    """The specs `train` would start (for --dry-run): ports are placeholders, nothing is built."""
    endpoints = plan_endpoints(cfg, pick_port=lambda host: 0)
    return build_specs(cfg, run_dir, endpoints, model_path(cfg, build=False))


def check_dependencies(cfg: RunConfig) -> None:
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise EnvironmentProblem(
            "vLLM is not installed in this environment. Install the inference stack: "
            "pip install 'rlrun[cpu]' on a laptop, or 'rlrun[gpu]' on GPU machines."
        )
    if importlib.util.find_spec("transformers") is None or importlib.util.find_spec("torch") is None:
        raise EnvironmentProblem("torch and transformers are needed by the trainer: pip install 'rlrun[cpu]' (or 'rlrun[gpu]').")

    if cfg.metrics.tensorboard:
        from rlrun.metrics import require_tensorboard

        require_tensorboard()
    if cfg.metrics.wandb:
        from rlrun.wandb_sink import require_wandb

        require_wandb()


PORT_ATTEMPTS = 3  # a service losing its port to another process at start gets new ports


def train(
    cfg: RunConfig,
    run_dir: RunDir,
    on_tick: Optional[Callable[[list[ProcessStatus], Progress], None]] = None,
    resumed: bool = False,
) -> str:
    """Run the whole job; return why it finished. Raises ProcessFailed / KeyboardInterrupt.

    A fresh run and a resumed one take this same path: every role recovers from what the run
    directory and Redis hold (checkpoint, pending groups, token journal).
    """
    preflight.check(cfg, run_dir.root, fresh=False)  # packages, model, data, binary, ports, checkpoints
    run_dir = run_dir.for_new_launch()  # logs/launch-<n>/: each train/resume keeps its own logs
    if cfg.streams.url is not None:
        _use_external_redis(cfg, run_dir)
    path = model_path(cfg, build=True)
    run_dir.ensure_secret(run_dir.vllm_api_key)
    if not run_dir.current_weights.exists():
        run_dir.point_current_weights(Path(path))  # vLLM starts from the base model
    events = EventLog(run_dir.events, clock=time.time)
    if resumed:
        events.emit("run_resumed", previous_status=run_dir.read_state().get("status"), launch=run_dir.launch)
    else:
        events.emit("run_started", launch=run_dir.launch)  # where the run's wall time begins (rlrun/ettr.py)
    run_dir.write_state(status="running", supervisor_pid=os.getpid(), started_at=time.time(), model_path=path, launch=run_dir.launch)
    status = "failed"
    supervisor: Optional[Supervisor] = None
    progress: Optional[ProgressReader] = None
    try:
        for attempt in range(1, PORT_ATTEMPTS + 1):
            # Ports are picked free, but another program may bind one before our server does:
            # such a start is retried on fresh ports (nothing depends on the old ones yet).
            endpoints = plan_endpoints(cfg, redis_server.pick_free_port)
            if endpoints.redis_port is not None:
                redis_server.write_server_config(
                    run_dir, endpoints.redis_port, cfg.streams.host, cfg.streams.appendfsync, default_user=_default_redis_user(cfg)
                )
            progress = ProgressReader(endpoints.redis_url, run_dir, events)
            tick = _ticker(on_tick, progress, cfg)
            supervisor = Supervisor(
                build_specs(cfg, run_dir, endpoints, path), events, spawner=spawner_for(cfg, run_dir),
                poll_interval_s=cfg.supervisor.poll_interval_s, on_tick=tick, diagnose=diagnoser_for(cfg, run_dir),
            )  # fmt: skip
            try:
                supervisor.start_all()
                break
            except ProcessFailed as exc:
                if attempt == PORT_ATTEMPTS or "address already in use" not in exc.log_tail.lower():
                    raise
                events.emit("port_taken", process=exc.process, attempt=attempt)
                supervisor.stop_all()
        reason = supervisor.watch(completion_check(cfg, progress))
        status = "finished"
        return reason
    except KeyboardInterrupt:
        status = "interrupted"
        events.emit("interrupted")
        raise
    finally:
        if supervisor is not None:
            supervisor.stop_all()
            if on_tick and progress is not None:
                on_tick(supervisor.processes, progress.read(cfg))
        run_dir.write_state(status=status, stopped_at=time.time())
        events.emit("run_stopped", status=status, malformed_events=progress.malformed_events if progress else 0)


def diagnoser_for(cfg: RunConfig, run_dir: RunDir):
    """Stack dumps before kills (local processes only: under Ray the pids live on other nodes)."""
    if cfg.supervisor.dump_timeout_s <= 0 or cfg.world.kind != "local":
        return None
    from rlrun.supervisor.diagnostics import Diagnoser

    return Diagnoser(run_dir.diagnostics, budget_s=cfg.supervisor.dump_timeout_s).capture


def _use_external_redis(cfg: RunConfig, run_dir: RunDir) -> None:
    """Claim the external Redis's database for this run and put its password (if any) where the
    run's processes read it (0600, under secrets/)."""
    from rlrun.streams import external

    password = external.read_password(cfg.streams.password_file)
    external.check_and_claim(cfg.streams.url, password, str(run_dir.root.resolve()), claim=True)
    if password is not None:
        run_dir.secrets.mkdir(parents=True, exist_ok=True, mode=0o700)
        run_dir.write_secret(run_dir.redis_password, password)
    elif run_dir.redis_password.exists():
        run_dir.redis_password.unlink()  # none now: an old one would be sent to a server that wants none


def _ticker(on_tick, progress: "ProgressReader", cfg: RunConfig):
    if on_tick is None:
        return None
    return lambda processes: on_tick(processes, progress.read(cfg))


class ProgressReader:
    """Reads the trainer's and actor's published state, and the trainer's events stream from
    where it stopped last time; tolerant of Redis being down or restarting."""

    def __init__(self, url: str, run_dir: RunDir, events: Optional[EventLog] = None) -> None:
        self._url, self._run_dir = url, run_dir
        self._client = None
        self._events = events
        # This launch's events only: a resumed run's stream still holds the previous launch's.
        # Stream ids start with the server's time in ms: read from this millisecond on.
        self._trainer_events = StreamTail(names.TRAINER_EVENTS, "event", start_id=f"{int(time.time() * 1000) - 1}-{2**64 - 1}")
        self.training_done_seen = False
        self.malformed_events = 0
        self._last: dict[str, dict] = {}  # the last value read of each hash

    def poll_trainer_events(self) -> bool:
        """Read the trainer's new events; True once its `training_done` event has been seen.
        A malformed event is counted, logged with its id and recorded in events.jsonl."""
        try:
            polled = self._trainer_events.poll(self._redis())
        except Exception:  # Redis not up yet, or restarting: read on from the same id next time
            self._client = None
            return self.training_done_seen
        for message_id, why in polled.malformed:
            self.malformed_events += 1
            log.warning("rejected message %s on %s: %s", message_id, names.TRAINER_EVENTS, why)
            if self._events is not None:
                self._events.emit(
                    "malformed_message", stream=names.TRAINER_EVENTS, id=message_id, reason=why, count=self.malformed_events
                )
        if any(message.get("type") == "training_done" for _id, message in polled.messages):
            self.training_done_seen = True
        return self.training_done_seen

    def note_rejected_event(self, stream: str, message_id: str, why: str) -> None:
        """An event that is malformed or does not fit the run: counted, recorded, never acted on."""
        self.malformed_events += 1
        if self._events is not None:
            self._events.emit("malformed_message", stream=stream, id=message_id, reason=why, count=self.malformed_events)

    @property
    def run_dir(self) -> RunDir:
        return self._run_dir

    def redis(self):
        """A client for the run's Redis (made on first use, again after a failure)."""
        return self._redis()

    def _redis(self):
        if self._client is None:
            self._client = redis_server.connect(self._url, self._run_dir.read_redis_password(), socket_timeout=2.0, reconnect_s=0)
        return self._client

    def trainer_state(self) -> dict:
        return self._hash(names.TRAINER_STATE)

    def read(self, cfg: RunConfig) -> Progress:
        t, a = self._hash(names.TRAINER_STATE), self._hash(names.ACTOR_STATE)
        reward = t.get("reward_mean")
        return Progress(
            step=int(t.get("step", 0)),
            max_train_steps=cfg.trainer.max_train_steps,
            samples=int(t.get("samples_processed", 0)),
            reward_mean=float(reward) if reward is not None else None,
            policy_version=int(t.get("policy_version", 0)),
            groups_published=int(a.get("groups_published", 0)),
        )

    def _hash(self, key: str) -> dict:
        try:
            value = self._redis().hgetall(key) or {}
        except Exception:  # Redis not up yet, restarting or stopped: what was read last
            self._client = None
            return self._last.get(key, {})
        # Kept so that the end of a run (Redis stopped) still shows the final step and reward.
        self._last[key] = value
        return value


def _default_redis_user(cfg: RunConfig) -> str:
    """Redis's passwordless `default` user: off, or (Fast-LLM) limited to Fast-LLM's streams."""
    if cfg.trainer.backend != "fast_llm":
        return redis_server.DEFAULT_USER_OFF
    from rlrun.backends.fast_llm.acl import default_user_line

    f = cfg.trainer.fast_llm
    return default_user_line([f.stream], f.events_stream)  # rlrun's own user is written by the server module


def completion_check(cfg: RunConfig, progress: ProgressReader):
    """The supervisor's completion predicate for this run's trainer backend."""
    if cfg.trainer.backend == "fast_llm":
        return _fast_llm_completion_check(cfg, progress)
    target = completion.HfTarget(cfg.trainer.max_train_steps, cfg.trainer.train_batch_size, cfg.trainer.gradient_accumulation_passes)

    def check(exits: dict[str, Optional[int]]) -> tuple[bool, str]:
        state = progress.trainer_state()
        obs = completion.TrainerObservation(
            samples_processed=int(state.get("samples_processed", 0)),
            trainer_exit_code=exits.get("trainer"),
            training_done_event=progress.poll_trainer_events(),  # the trainer's own training_done event
            last_step=int(state.get("step", 0)),
        )
        verdict = completion.is_finished(cfg.trainer.backend, obs, hf_target=target)
        if not verdict.finished and exits.get("trainer") == 0:
            raise ExitRejected("trainer", verdict.reason)  # restarted from its checkpoint
        return verdict.finished, verdict.reason

    return check


def _fast_llm_completion_check(cfg: RunConfig, progress: ProgressReader):
    """Fast-LLM: `training_finished` + exit 0 + the step reached, never a count of documents.

    `training_finished` after an interrupt at an earlier step is not completion: the trainer's
    exit is rejected, so the supervisor restarts it from its last complete checkpoint.
    """
    from rlrun.backends.fast_llm import checkpoints as fl_checkpoints
    from rlrun.backends.fast_llm.events import EventsReader
    from rlrun.roles import fast_llm_experiment_dir

    experiment_dir = fast_llm_experiment_dir(cfg, progress.run_dir)
    reader: dict[str, EventsReader] = {}

    def check(exits: dict[str, Optional[int]]) -> tuple[bool, str]:
        try:
            if "events" not in reader:
                reader["events"] = EventsReader(
                    progress.redis(), cfg.trainer.fast_llm.events_stream, cfg.trainer.max_train_steps,
                    skips_possible=cfg.model.dtype == "float16", on_rejected=lambda i, why: progress.note_rejected_event(cfg.trainer.fast_llm.events_stream, i, why),
                )  # fmt: skip
            reader["events"].poll()
        except Exception:  # Redis restarting: decide on what was read so far
            reader.pop("events", None)
        events = reader.get("events")
        obs = completion.TrainerObservation(
            samples_processed=(events.documents_seen or 0) if events else 0,
            trainer_exit_code=exits.get("trainer"),
            training_done_event=False,
            last_step=(events.last_weights_ready_step or 0) if events else 0,
            training_finished_seen=bool(events and events.training_finished_seen),
            last_checkpoint_step=fl_checkpoints.latest_complete_step(experiment_dir),
            last_weights_ready_step=events.last_weights_ready_step if events else None,
        )
        verdict = completion.is_finished("fast_llm", obs, train_iters=cfg.trainer.max_train_steps)
        if not verdict.finished and exits.get("trainer") == 0:
            raise ExitRejected("trainer", verdict.reason)
        return verdict.finished, verdict.reason

    return check


def summary(run_dir: RunDir) -> dict:
    """The last metrics record and where things are, for the end-of-run message."""
    last = {}
    if run_dir.metrics.is_file():
        lines = run_dir.metrics.read_text().splitlines()
        if lines:
            last = json.loads(lines[-1])
    return {"run_dir": str(run_dir.root), "last_metrics": last}
