"""The Fast-LLM trainer backend as rlrun's supervisor sees it: its processes (the weight follower,
then Fast-LLM), completion check, checkpoints, ports and Redis user; the sibling modules say what
each piece means, this one puts them behind `rlrun.backends.TrainerBackend`.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, ClassVar, Optional

from rlrun.backends import HALF, Candidate, recorded_fields, run_verdict
from rlrun.backends.fast_llm import checkpoints as fl_checkpoints
from rlrun.backends.fast_llm.config import LAUNCH_ENV, config_problems, docs_per_step, launch_argv, write_config
from rlrun.backends.fast_llm.follower import last_id, request_join
from rlrun.backends.fast_llm.installed import choose_revision
from rlrun.backends.fast_llm.rewind import rewind_group
from rlrun.config import RunConfig
from rlrun.parts.role_parts import Endpoints, RedisProbe, child_env, role_command, role_spec
from rlrun.rules import completion
from rlrun.rundir import RunDir
from rlrun.streams import names
from rlrun.supervisor import EventLog, ProcessSpec, RunVerdict

log = logging.getLogger(__name__)

# where Fast-LLM's `checkpoint/<step>/` folders may sit inside a run directory
_RUN_GLOBS = ("checkpoint/*", "*/checkpoint/*", "*/*/checkpoint/*")


def experiment_dir_of(cfg: RunConfig, run_root: Path) -> Path:
    return Path(run_root).expanduser().absolute() / cfg.trainer.fast_llm.experiment_dir_name


class FastLlmLayout:
    """`<experiment_dir>/checkpoint/<step>/` with `metadata.yaml`, `ok` last (see checkpoints.py)."""

    name = "fast_llm"

    def looks_like(self, path: Path) -> bool:
        return (path / fl_checkpoints.METADATA_FILE).is_file() or (
            path.name.isdigit() and path.parent.name == fl_checkpoints.CHECKPOINT_DIR
        )

    def candidates(self, run: RunDir) -> list[Candidate]:
        return [
            Candidate(int(folder.name), folder, None if fl_checkpoints.is_complete(folder) else HALF)
            for pattern in _RUN_GLOBS
            for folder in run.root.glob(pattern)
            if folder.name.isdigit() and folder.is_dir()
        ]

    def is_complete(self, path: Path) -> bool:
        return fl_checkpoints.is_complete(path)

    def problem(self, path: Path) -> Optional[str]:
        return None if fl_checkpoints.is_complete(path) else HALF  # Fast-LLM's own rule: the ok marker

    def read_fields(self, path: Path, warnings: list[str]) -> dict:
        def read() -> dict:
            meta = fl_checkpoints.read_metadata(path)
            return {"step": meta.completed_steps, "documents_seen": meta.documents_seen}

        step = int(path.name) if path.name.isdigit() else None
        return recorded_fields(path, step, fl_checkpoints.METADATA_FILE, read, warnings)


@dataclass(frozen=True)
class FastLlmBackend:
    """Fast-LLM, bound to the run's config."""

    cfg: RunConfig
    name: ClassVar[str] = "fast_llm"
    layout: ClassVar[FastLlmLayout] = FastLlmLayout()
    ranks_span_nodes: ClassVar[bool] = False  # its launch command (torchrun) is the user's: all ranks on one node

    def roles(self) -> list[str]:
        return ["weights", "trainer"]  # the follower first: the trainer waits for it at its broadcast

    def trainer_ranks(self) -> int:
        return self.cfg.trainer.fast_llm.nproc_per_node  # torchrun's processes, one per GPU

    def config_problems(self) -> list[str]:
        return config_problems(self.cfg)

    def broadcast_port(self, pick_port: Callable[[str], int]) -> int:
        return self.cfg.trainer.fast_llm.broadcast_port or pick_port(self.cfg.inference.host)

    def explicit_ports(self) -> list[tuple[str, str, int]]:
        port = self.cfg.trainer.fast_llm.broadcast_port
        return [("trainer.fast_llm.broadcast_port", self.cfg.inference.host, port)] if port else []

    def listeners(self) -> list:
        """The weight broadcast's store is the weight follower's (rlrun binds it) or Fast-LLM's rank 0's:
        torch's TCPStore, on every interface; rlrun cannot bind it (trainer.fast_llm.broadcast_store)."""
        from rlrun.parts import sockets

        host, f = self.cfg.inference.host, self.cfg.trainer.fast_llm
        port = str(f.broadcast_port) if f.broadcast_port else sockets.PICKED
        store = {
            "rlrun": sockets.tcp_store(
                "weights", "Fast-LLM's weight broadcast (the weight follower serves it)", host, port
            ),
            "trainer": sockets.Listener(
                "trainer",
                "torch TCPStore: Fast-LLM's weight broadcast (Fast-LLM's rank 0 serves it)",
                ":: (every interface: torch's own; trainer.fast_llm.broadcast_store=rlrun keeps it on "
                f"{host} where Fast-LLM's torch lets its rank 0 be a client)",
                port,
                "nothing: TCPStore has no authentication",
            ),
            "auto": sockets.Listener(
                "trainer or weights",
                "torch TCPStore: Fast-LLM's weight broadcast (whoever "
                "trainer.fast_llm.broadcast_store=auto finds at start)",
                f"{host} (the weight follower) or :: (Fast-LLM's rank 0)",
                port,
                "nothing: TCPStore has no authentication",
            ),
        }[f.broadcast_store]
        pairs = sockets.gloo_pairs("every vllm-N (the weight broadcast)", host)
        own = sockets.Listener(
            "trainer",
            "Fast-LLM's own (torchrun's rendezvous, its ranks' and its broadcast's gloo or NCCL)",
            "Fast-LLM's and torch's choice",
            sockets.EPHEMERAL,
            "Fast-LLM's",
        )
        return [store, pairs, own]

    def redis_default_user(self) -> str:
        """Fast-LLM's clients connect without a password: the `default` user may touch its streams
        and nothing else (rlrun's own user is written by the server module)."""
        from rlrun.backends.fast_llm.acl import default_user_line

        f = self.cfg.trainer.fast_llm
        return default_user_line([f.stream], f.events_stream)

    def check_launchable(self, root: Path) -> None:
        """Fast-LLM's own validate-only mode reads the generated config of each candidate revision
        (the tiny model is built first: Fast-LLM reads the pretrained model's config too); the
        revision it accepts is the run's."""
        from rlrun.backends.fast_llm.launchable import ensure_launchable
        from rlrun.models.source import model_path

        cfg = self.cfg
        ensure_launchable(launch_argv(cfg, Path("fast_llm.yaml")))
        choose_revision(
            cfg,
            model_path(cfg.model, build=True, seed=cfg.run.seed, max_operand=cfg.dataset.max_operand),
            experiment_dir_of(cfg, root),
        )

    def check_resumable(self, run_dir: RunDir) -> None:
        return None  # half-written checkpoints are moved aside before every start; none at all means step 0

    def specs(
        self, run_dir: RunDir, endpoints: Endpoints, model_path: str, probe: RedisProbe, events: EventLog
    ) -> list[ProcessSpec]:
        cfg = self.cfg
        return [
            follower_spec(cfg, run_dir, endpoints, probe),
            trainer_spec(cfg, run_dir, endpoints, model_path, probe, events),
        ]

    def completion_check(self, progress) -> Callable[[dict[str, Optional[int]]], RunVerdict]:
        """`completion.fast_llm_finished` over what the trainer announced; an exit 0 before the last
        step is rejected, so the supervisor restarts it from its last complete checkpoint."""
        from rlrun.backends.fast_llm.events import EventsReader

        cfg = self.cfg
        experiment_dir = experiment_dir_of(cfg, progress.run_dir.root)
        stream = cfg.trainer.fast_llm.events_stream
        reader: dict[str, EventsReader] = {}

        def check(exits: dict[str, Optional[int]]) -> RunVerdict:
            try:
                if "events" not in reader:
                    reader["events"] = EventsReader(
                        progress.redis(),
                        stream,
                        cfg.trainer.max_train_steps,
                        skips_possible=cfg.model.dtype == "float16",
                        on_rejected=lambda i, why: progress.note_rejected_event(stream, i, why),
                    )
                reader["events"].poll()
            except Exception:  # Redis restarting: decide on what was read so far
                reader.pop("events", None)
            events = reader.get("events")
            if (
                events is not None and events.last_weights_ready_step is not None
            ):  # `rlrun status`, the live line, the watchdog
                progress.note_trainer_step(events.last_weights_ready_step, events.documents_seen)
            obs = completion.TrainerObservation(
                samples_processed=(events.documents_seen or 0) if events else 0,
                trainer_exit_code=exits.get("trainer"),
                training_done=False,  # the hf trainer's signal; Fast-LLM's is training_finished
                last_step=(events.last_weights_ready_step or 0) if events else 0,
                training_finished_seen=bool(events and events.training_finished_seen),
                last_checkpoint_step=fl_checkpoints.latest_complete_step(experiment_dir),
                last_weights_ready_step=events.last_weights_ready_step if events else None,
            )
            return run_verdict(completion.fast_llm_finished(cfg.trainer.max_train_steps, obs), exits)

        return check

    def trainer_view(self, redis, actor: int = 0):  # one actor only (config_problems)
        from rlrun.backends.fast_llm.view import FastLlmView

        cfg = self.cfg
        return FastLlmView(
            cfg.trainer.fast_llm,
            redis,
            docs_per_step=docs_per_step(cfg),
            max_steps_ahead=cfg.actor.max_steps_ahead,
            group_size=cfg.algo.group_size,
        )

    def metrics_hint(self, run_dir: RunDir) -> Optional[str]:
        logs = run_dir.launch_logs(max(run_dir.launches(), default=None))
        return f"Fast-LLM's log, {logs / 'trainer.log'}"


def trainer_spec(
    cfg: RunConfig, run_dir: RunDir, endpoints: Endpoints, model_path: str, probe: RedisProbe, events: EventLog
) -> ProcessSpec:
    """Fast-LLM from the config rlrun generates, tidied before every (re)start; ready at its first
    `weights_ready`. No heartbeat: it has none (it times out by itself after `fast_llm.timeout_s`)."""
    sup, f = cfg.supervisor, cfg.trainer.fast_llm
    experiment_dir = experiment_dir_of(cfg, run_dir.root)
    config_path = run_dir.root / "fast_llm.yaml"
    redis_host, _, redis_port = endpoints.redis_url.split("://", 1)[1].split("/", 1)[0].rpartition(":")

    def rewind_documents() -> None:
        """The documents read after the checkpoint the trainer restarts from are delivered again."""
        latest = fl_checkpoints.latest_complete(experiment_dir)
        try:
            checkpoint = fl_checkpoints.read_metadata(latest) if latest is not None else None
        except fl_checkpoints.CheckpointError as exc:
            log.error("documents not rewound: %s", exc)
            return

        def rewind(client) -> None:
            try:
                events.emit("documents_rewound", **asdict(rewind_group(client, f.stream, f.consumer_group, checkpoint)))
            except RuntimeError as exc:  # the stream holds fewer documents than the checkpoint covers
                events.emit("documents_rewound", error=str(exc))

        if not probe.call(rewind):
            log.warning("documents not rewound: Redis unreachable")

    # The events stream's newest id before the current attempt started: a weights_ready after it is
    # that attempt's (the stream's own ids, not a clock: an external Redis's may differ from ours).
    attempt_after: dict[str, Optional[str]] = {"id": None}

    def before_start() -> None:
        attempt_after["id"] = None
        moved = fl_checkpoints.move_aside_incomplete(experiment_dir)
        for path in moved:
            log.warning("moved a half-written Fast-LLM checkpoint aside: %s", path)
        # The new trainer opens its broadcast group at start and waits there for the vLLM servers.
        start_step = fl_checkpoints.latest_complete_step(experiment_dir) or 0  # what it resumes from
        if not probe.call(lambda client: attempt_after.update(id=request_join(client, f.events_stream, start_step))):
            log.warning(
                "could not ask the weight follower to join the trainer's broadcast (Redis unreachable); "
                "the trainer waits for it up to trainer.fast_llm.timeout_s, then is restarted"
            )
        rewind_documents()
        revision = choose_revision(cfg, model_path, experiment_dir)  # asked in preflight: remembered
        write_config(
            cfg,
            revision,
            config_path,
            redis_host=redis_host,
            redis_port=int(redis_port),
            experiment_dir=experiment_dir,
            model_path=model_path,
            broadcast_host=endpoints.host("trainer", cfg.inference.host),
            broadcast_port=endpoints.broadcast_port,
        )

    started: dict[int, str] = {}

    def ready(pid: int) -> bool:  # a weights_ready event published after this attempt started
        if pid not in started:
            if attempt_after["id"] is None:  # Redis was unreachable before the start: what it holds now
                probe.call(lambda client: attempt_after.update(id=last_id(client, f.events_stream)))
            if attempt_after["id"] is None:
                return False
            started[pid] = attempt_after["id"]
        return probe.stream_has_event_after(f.events_stream, started[pid], '"weights_ready"')

    return role_spec(
        cfg.supervisor,
        run_dir,
        "trainer",
        "trainer",
        argv=launch_argv(cfg, config_path),
        env={**child_env(cfg.trainer.threads), **LAUNCH_ENV},
        ready=ready,
        ready_timeout_s=max(sup.ready_timeout_s, 600.0),
        stop_grace_s=max(sup.stop_grace_s, 60.0),  # it finishes its step and saves a checkpoint on SIGTERM
        finishes=True,
        before_start=before_start,
        # SIGTERMed, Fast-LLM finishes its step (it needs documents, and the vLLM servers for its
        # broadcast), saves a checkpoint and exits: everything else keeps running until then.
        stop_first=True,
    )


def follower_spec(cfg: RunConfig, run_dir: RunDir, endpoints: Endpoints, probe: RedisProbe) -> ProcessSpec:
    """trainer=fast_llm: the process that has the vLLM servers load what Fast-LLM broadcasts
    (rlrun/backends/fast_llm/follower.py, started by rlrun/entrypoints/weights.py). Started before the trainer, which waits for it."""
    argv, write_role_file = role_command(
        run_dir,
        "rlrun.entrypoints.weights",
        "weights",
        redis_url=endpoints.redis_url,
        model_path="",
        vllm_urls=endpoints.vllm_urls,
        broadcast_host=endpoints.host("trainer", cfg.inference.host),
        broadcast_port=endpoints.broadcast_port,
    )
    return role_spec(
        cfg.supervisor,
        run_dir,
        "weights",
        "weights",
        argv=argv,
        before_start=write_role_file,
        env=child_env(1),
        ready=lambda pid: probe.heartbeat(names.WEIGHTS_STATE, pid),
        alive=lambda pid: probe.heartbeat(names.WEIGHTS_STATE, pid),
    )
