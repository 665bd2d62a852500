"""The processes of a run as supervisor specs: Redis → vLLM servers → trainer → actor.

Each role's command line, environment, log file, readiness and liveness probes and restart
policy are decided here, from the typed config; the supervisor only ever sees the specs.

Liveness: Redis answers PING; vLLM answers /health; the trainer and the actor write a heartbeat
(time and pid) into their state hash in Redis from their main loops.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import asdict, dataclass

from rlrun.config import RunConfig
from rlrun.config.schema import RoleSupervision
from rlrun.inference import server as vllm_server
from rlrun.rundir import RunDir
from rlrun.streams import names
from rlrun.streams import server as redis_server
from rlrun.supervisor import EventLog, ProcessSpec
from rlrun.supervisor.policy import RestartPolicy

HEARTBEAT_FRESH_S = 5.0  # a heartbeat older than this is "no sign of life" for this poll


@dataclass(frozen=True)
class Endpoints:
    """Where the run's services listen (ports chosen by the launcher)."""

    redis_url: str
    redis_port: int | None  # None when streams.url names an external server
    vllm_urls: list[str]
    broadcast_port: int = 0  # Fast-LLM's weight broadcast rendezvous (trainer=fast_llm only)


def child_env(threads: int) -> dict[str, str]:
    return {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}


def restart_policy(role: RoleSupervision) -> RestartPolicy:
    return RestartPolicy(
        restart=role.restart,
        max_restarts=role.max_restarts,
        window_s=role.window_s,
        backoff_initial_s=role.backoff_initial_s,
        backoff_max_s=max(role.backoff_max_s, role.backoff_initial_s),
        healthy_after_s=role.healthy_after_s,
    )


class RedisProbe:
    """Probes that read the run's Redis, with one lazily (re)connected client. Never raise."""

    def __init__(self, url: str, run_dir: RunDir) -> None:
        self._url, self._run_dir = url, run_dir
        self._client = None

    def _password(self) -> str | None:
        try:
            return self._run_dir.read_redis_password()
        except OSError:
            return None

    def ping(self, pid: int = 0) -> bool:
        """PING on the probe's own connection (a new connection and AUTH per poll cost CPU)."""
        return self.call(lambda client: client.ping())

    def heartbeat(self, key: str, pid: int, max_age_s: float = HEARTBEAT_FRESH_S) -> bool:
        """True when process `pid` wrote a heartbeat into hash `key` less than max_age_s ago."""
        state = self._hgetall(key)
        try:
            return int(state.get("pid", -1)) == pid and time.time() - float(state.get("heartbeat", 0)) < max_age_s
        except ValueError:
            return False

    def marker(self, key: str, field: str, pid: int) -> bool:
        """True when process `pid` set `field` = its pid in hash `key` (a readiness marker)."""
        return self._hgetall(key).get(field) == str(pid)

    def call(self, action) -> bool:
        """Run `action(client)`; True if it went through, False if Redis could not be reached."""
        try:
            if self._client is None:
                self._client = redis_server.connect(self._url, self._password(), socket_timeout=2.0, reconnect_s=0)
            action(self._client)
            return True
        except Exception:  # not reachable means "no"
            self._client = None
            return False

    def stream_has_event_after(self, stream: str, after_id: str, needle: str) -> bool:
        """True when `stream` holds an entry newer than `after_id` whose fields contain `needle`."""
        try:
            if self._client is None:
                self._client = redis_server.connect(self._url, self._password(), socket_timeout=2.0, reconnect_s=0)
            for _id, fields in self._client.xrange(stream, min=f"({after_id}", count=1000):
                if any(needle in value for value in fields.values()):
                    return True
            return False
        except Exception:  # not reachable means "no"
            self._client = None
            return False

    def _hgetall(self, key: str) -> dict:
        try:
            if self._client is None:
                self._client = redis_server.connect(self._url, self._password(), socket_timeout=2.0, reconnect_s=0)
            return self._client.hgetall(key) or {}
        except Exception:  # not reachable means "no", never an exception in the supervisor
            self._client = None
            return {}


def build_specs(cfg: RunConfig, run_dir: RunDir, endpoints: Endpoints, model_path: str) -> list[ProcessSpec]:
    sup = cfg.supervisor
    grace = sup.stop_grace_s
    probe = RedisProbe(endpoints.redis_url, run_dir)
    specs: list[ProcessSpec] = []
    if endpoints.redis_port is not None:
        binary = redis_server.find_server_binary(cfg.streams.server)
        specs.append(
            ProcessSpec(
                name="redis",
                argv=redis_server.server_argv(binary, run_dir),
                log_path=run_dir.log("redis"),
                ready=probe.ping,
                alive=probe.ping,
                ready_timeout_s=sup.ready_timeout_s,
                stop_grace_s=grace,
                restart=restart_policy(sup.redis),
                stall_timeout_s=sup.redis.stall_timeout_s,
            )
        )
    for i, url in enumerate(endpoints.vllm_urls):
        port = int(url.rsplit(":", 1)[1])
        specs.append(
            ProcessSpec(
                name=f"vllm-{i}",
                # Started (and restarted) from the newest weights the trainer published.
                argv=vllm_server.server_argv(cfg.inference, cfg.model, str(run_dir.current_weights), port, tokenizer=model_path),
                env=vllm_server.server_env(cfg.inference),
                secret_env={"VLLM_API_KEY": run_dir.vllm_api_key},  # every route but /health (rlrun.inference.auth)
                log_path=run_dir.log(f"vllm-{i}"),
                ready=vllm_server.HealthCheck(url),
                alive=vllm_server.HealthCheck(url),
                ready_timeout_s=cfg.inference.ready_timeout_s,
                stop_grace_s=grace,
                restart=restart_policy(sup.vllm),
                stall_timeout_s=sup.vllm.stall_timeout_s,
            )
        )
    common = ["--run-dir", str(run_dir.root), "--redis-url", endpoints.redis_url, "--model-path", model_path]
    vllm_args = [arg for url in endpoints.vllm_urls for arg in ("--vllm-url", url)]
    if cfg.trainer.backend == "fast_llm":
        specs.append(weight_follower_spec(cfg, run_dir, endpoints, probe))
        specs.append(fast_llm_trainer_spec(cfg, run_dir, endpoints, model_path, probe))
    else:
        specs.append(hf_trainer_spec(cfg, run_dir, common + vllm_args, probe))
    specs.append(
        ProcessSpec(
            name="actor",
            argv=[sys.executable, "-m", "rlrun.actor.main", *common, *vllm_args],
            env=child_env(1),
            log_path=run_dir.log("actor"),
            alive=lambda pid: probe.heartbeat(names.ACTOR_STATE, pid),
            stop_grace_s=grace,
            finishes=True,
            restart=restart_policy(sup.actor),
            stall_timeout_s=sup.actor.stall_timeout_s,
        )
    )
    return specs


def hf_trainer_spec(cfg: RunConfig, run_dir: RunDir, args: list[str], probe: RedisProbe) -> ProcessSpec:
    sup = cfg.supervisor
    return ProcessSpec(
        name="trainer",
        argv=[sys.executable, "-m", "rlrun.trainer.main", *args],
        env=child_env(cfg.trainer.threads),
        log_path=run_dir.log("trainer"),
        ready=lambda pid: probe.marker(names.TRAINER_STATE, "ready_pid", pid),
        alive=lambda pid: probe.heartbeat(names.TRAINER_STATE, pid),
        ready_timeout_s=sup.ready_timeout_s,
        stop_grace_s=sup.stop_grace_s,
        finishes=True,
        restart=restart_policy(sup.trainer),
        stall_timeout_s=sup.trainer.stall_timeout_s,
    )


def fast_llm_trainer_spec(cfg: RunConfig, run_dir: RunDir, endpoints: Endpoints, model_path: str, probe: RedisProbe) -> ProcessSpec:
    """Fast-LLM, launched from the config rlrun generates; tidied before every (re)start.

    Ready when it announces `weights_ready` after its start. No heartbeat: Fast-LLM has none
    (it may legitimately wait for documents; it times out by itself after `fast_llm.timeout_s`).
    """
    from rlrun.backends.fast_llm import checkpoints as fl_checkpoints
    from rlrun.backends.fast_llm.config import LAUNCH_ENV, launch_argv, write_config
    from rlrun.backends.fast_llm.follower import request_join
    from rlrun.backends.fast_llm.installed import choose_revision
    from rlrun.backends.fast_llm.rewind import Rewind, rewind_group

    sup, f = cfg.supervisor, cfg.trainer.fast_llm
    experiment_dir = fast_llm_experiment_dir(cfg, run_dir)
    config_path = run_dir.root / "fast_llm.yaml"
    redis_host, _, redis_port = endpoints.redis_url.split("://", 1)[1].split("/", 1)[0].rpartition(":")

    events = EventLog(run_dir.events)

    def rewind_documents() -> None:
        """The documents read after the checkpoint the trainer restarts from are delivered again."""
        latest = fl_checkpoints.latest_complete(experiment_dir)
        try:
            checkpoint = fl_checkpoints.read_metadata(latest) if latest is not None else None
        except fl_checkpoints.CheckpointError as exc:
            logging.getLogger(__name__).error("documents not rewound: %s", exc)
            return
        done: list[Rewind | str] = []

        def rewind(client) -> None:
            try:
                done.append(rewind_group(client, f.stream, f.consumer_group, checkpoint))
            except RuntimeError as exc:  # the stream holds fewer documents than the checkpoint covers
                done.append(str(exc))

        if not probe.call(rewind) or not done:
            logging.getLogger(__name__).warning("documents not rewound: Redis unreachable")
        elif isinstance(done[0], str):
            events.emit("documents_rewound", error=done[0])
        else:
            events.emit("documents_rewound", **asdict(done[0]))

    def before_start() -> None:
        log = logging.getLogger(__name__)
        moved = fl_checkpoints.move_aside_incomplete(experiment_dir)
        for path in moved:
            log.warning("moved a half-written Fast-LLM checkpoint aside: %s", path)
        # The new trainer opens its broadcast group at start and waits there for the vLLM servers.
        start_step = fl_checkpoints.latest_complete_step(experiment_dir) or 0  # what it resumes from
        if not probe.call(lambda client: request_join(client, f.events_stream, start_step)):
            log.warning("could not ask the weight follower to join the trainer's broadcast (Redis unreachable); "
                        "the trainer waits for it up to trainer.fast_llm.timeout_s, then is restarted")  # fmt: skip
        rewind_documents()
        revision = choose_revision(cfg, model_path, experiment_dir)  # asked in preflight: remembered
        write_config(
            cfg, revision, config_path, redis_host=redis_host, redis_port=int(redis_port), experiment_dir=experiment_dir,
            model_path=model_path, broadcast_host=cfg.inference.host, broadcast_port=endpoints.broadcast_port,
        )  # fmt: skip

    started: dict[int, str] = {}

    def ready(pid: int) -> bool:  # a weights_ready event published after this attempt started
        since = started.setdefault(pid, f"{int(time.time() * 1000)}-0")
        return probe.stream_has_event_after(f.events_stream, since, '"weights_ready"')

    return ProcessSpec(
        name="trainer",
        argv=launch_argv(cfg, config_path),
        env={**child_env(cfg.trainer.threads), **LAUNCH_ENV},
        log_path=run_dir.log("trainer"),
        ready=ready,
        ready_timeout_s=max(sup.ready_timeout_s, 600.0),
        stop_grace_s=max(sup.stop_grace_s, 60.0),  # it finishes its step and saves a checkpoint on SIGTERM
        finishes=True,
        restart=restart_policy(sup.trainer),
        before_start=before_start,
        # SIGTERMed, Fast-LLM finishes its step (it needs documents, and the vLLM servers for its
        # broadcast), saves a checkpoint and exits: everything else keeps running until then.
        stop_first=True,
    )


def weight_follower_spec(cfg: RunConfig, run_dir: RunDir, endpoints: Endpoints, probe: RedisProbe) -> ProcessSpec:
    """trainer=fast_llm: the process that has the vLLM servers load what Fast-LLM broadcasts
    (rlrun/backends/fast_llm/follower.py). Started before the trainer, which waits for it."""
    sup = cfg.supervisor
    return ProcessSpec(
        name="weights",
        argv=[
            sys.executable, "-m", "rlrun.backends.fast_llm.follower", "--run-dir", str(run_dir.root),
            "--redis-url", endpoints.redis_url, *[arg for url in endpoints.vllm_urls for arg in ("--vllm-url", url)],
            "--broadcast-host", cfg.inference.host, "--broadcast-port", str(endpoints.broadcast_port),
        ],  # fmt: skip
        env=child_env(1),
        log_path=run_dir.log("weights"),
        ready=lambda pid: probe.heartbeat(names.WEIGHTS_STATE, pid),
        alive=lambda pid: probe.heartbeat(names.WEIGHTS_STATE, pid),
        ready_timeout_s=sup.ready_timeout_s,
        stop_grace_s=sup.stop_grace_s,
        restart=restart_policy(sup.weights),
        stall_timeout_s=sup.weights.stall_timeout_s,
    )


def fast_llm_experiment_dir(cfg: RunConfig, run_dir: RunDir):
    return run_dir.root / cfg.trainer.fast_llm.experiment_dir_name


