"""rlrun's own trainer (`rlrun.trainer`, torch + transformers): its process, completion and checkpoints
(`checkpoints/step_NNNNNN/`); finished: exit 0 and the samples target or `training_done`.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ClassVar, Optional

from rlrun.backends import HALF, Candidate, recorded_fields, run_verdict
from rlrun.config import RunConfig
from rlrun.parts.role_parts import Endpoints, RedisProbe, child_env, role_command, role_spec
from rlrun.rules import completion
from rlrun.rundir import RunDir
from rlrun.streams import names
from rlrun.supervisor import EventLog, ProcessSpec, RunVerdict
from rlrun.trainer import checkpoint

_STEP_NAME = re.compile(r"step_(\d+)")


class HfLayout:
    """`<run>/checkpoints/step_NNNNNN/`: weights, optimizer, trainer_state.json, `ok` last."""

    name = "hf"

    def looks_like(self, path: Path) -> bool:
        return (path / checkpoint.STATE_FILE).is_file() or _step_of(path) is not None

    def candidates(self, run: RunDir) -> list[Candidate]:
        """Chosen by the trainer's own rule (`checkpoint.scan`): a damaged one is skipped here
        exactly as a resume skips it."""
        found = checkpoint.scan(run.checkpoints)
        out = [Candidate(_step_of(path) or -1, path, HALF) for path in found.half_written]
        out += [Candidate(_step_of(path) or -1, path, why) for path, why in found.damaged]
        if found.usable is not None:
            out.append(Candidate(_step_of(found.usable) or -1, found.usable))
        return out

    def is_complete(self, path: Path) -> bool:
        return checkpoint.is_complete(path)

    def problem(self, path: Path) -> Optional[str]:
        if not (path / checkpoint.OK_MARKER).is_file():
            return HALF
        return checkpoint.problem(path)  # what `checkpoint.scan` skips a complete one for

    def read_fields(self, path: Path, warnings: list[str]) -> dict:
        def read() -> dict:
            state = checkpoint.read_state(path)
            fields = {
                "step": state.step,
                "samples_processed": state.samples_processed,
                "policy_version": state.policy_version,
                "checkpoint_config_hash": state.config_hash,
            }
            if state.written_at > 0:
                fields.update(written_at=state.written_at, written_at_source=checkpoint.STATE_FILE)
            return fields

        return recorded_fields(path, _step_of(path), checkpoint.STATE_FILE, read, warnings)


def _step_of(path: Path) -> Optional[int]:
    """The step in the folder name (the temporary prefix `checkpoint.save` writes under ignored)."""
    match = _STEP_NAME.fullmatch(path.name.removeprefix(".tmp-"))
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class HfBackend:
    """rlrun's own trainer, bound to the run's config."""

    cfg: RunConfig
    name: ClassVar[str] = "hf"
    layout: ClassVar[HfLayout] = HfLayout()
    ranks_span_nodes: ClassVar[bool] = True  # its rank group is started per node (rlrun.entrypoints.rank_group)

    def roles(self) -> list[str]:
        return ["trainer"]

    def trainer_ranks(self) -> int:
        return self.cfg.trainer.nproc_per_node

    def config_problems(self) -> list[str]:
        t = self.cfg.trainer
        if t.nproc_per_node > 1 and t.gradient_accumulation_passes % t.nproc_per_node:
            return [
                f"trainer.gradient_accumulation_passes ({t.gradient_accumulation_passes}) must be a multiple of "
                f"trainer.nproc_per_node ({t.nproc_per_node}): each rank takes an equal share of the step's passes "
                f"(e.g. trainer.gradient_accumulation_passes={t.nproc_per_node * max(1, t.gradient_accumulation_passes // t.nproc_per_node)})."
            ]
        return []

    def broadcast_port(self, pick_port: Callable[[str], int]) -> int:
        """trainer.weight_transfer=broadcast: where rank 0 serves its group's store (on
        inference.host, where the servers reach it); 0 when weights go through files."""
        cfg = self.cfg
        return pick_port(cfg.inference.host) if cfg.trainer.weight_transfer == "broadcast" else 0

    def explicit_ports(self) -> list[tuple[str, str, int]]:
        return []

    def listeners(self) -> list:
        from rlrun.parts import sockets

        cfg, out = self.cfg, []
        t, ranks_host = cfg.trainer, "127.0.0.1" if cfg.world.kind == "local" else "rank 0's node"
        if t.nproc_per_node > 1:
            out.append(sockets.tcp_store("trainer", "the trainer's ranks (rank 0 serves it)", ranks_host))
            if t.device.startswith("cuda"):
                out.append(
                    sockets.Listener(
                        "trainer",
                        "NCCL bootstrap of the trainer's ranks",
                        ranks_host,
                        sockets.EPHEMERAL,
                        "nothing: NCCL has no authentication",
                    )
                )
            else:
                out.append(sockets.gloo_pairs("trainer (each rank)", ranks_host))
        if t.weight_transfer == "broadcast":
            host = cfg.inference.host
            out.append(sockets.tcp_store("trainer", "the weight broadcast (rank 0 serves it)", host))
            out.append(sockets.gloo_pairs("trainer, every vllm-N (the weight broadcast)", host))
        return out

    def redis_default_user(self) -> str:
        from rlrun.streams.server import DEFAULT_USER_OFF

        return DEFAULT_USER_OFF  # every process of this backend authenticates

    def check_launchable(self, root: Path) -> None:
        return None  # rlrun's own trainer: check_dependencies has covered torch and transformers

    def check_resumable(self, run_dir: RunDir) -> None:
        """RunDirError (CorruptCheckpoint) when every complete checkpoint is damaged; damaged newer
        ones above a good one are only warned about (the trainer falls back)."""
        checkpoint.resume_point(run_dir.checkpoints)

    def specs(
        self, run_dir: RunDir, endpoints: Endpoints, model_path: str, probe: RedisProbe, events: EventLog
    ) -> list[ProcessSpec]:
        cfg = self.cfg
        argv, write_role_file = role_command(
            run_dir,
            "rlrun.entrypoints.trainer",
            "trainer",
            redis_url=endpoints.redis_url,
            model_path=model_path,
            vllm_urls=endpoints.vllm_urls,
            broadcast_host=endpoints.host("trainer", cfg.inference.host),
            broadcast_port=endpoints.broadcast_port,
        )
        nproc = cfg.trainer.nproc_per_node
        if nproc > 1:  # one supervised process: a rank that fails takes the group down (rank_group.py)
            argv = [sys.executable, "-m", "rlrun.entrypoints.rank_group", "--nproc", str(nproc), "--", *argv]
        others = tuple(names.rank_heartbeat(rank) for rank in range(1, nproc))  # the watchdog sees every rank
        # A fresh trainer needs only Redis before its first step: it loads torch and the model while
        # vLLM starts. One resuming from a checkpoint first hands its weights to vLLM: it waits.
        fresh = checkpoint.latest_complete(run_dir.checkpoints) is None
        after = ("redis",) if endpoints.redis_port is not None else ()
        trainer = role_spec(
            cfg.supervisor,
            run_dir,
            "trainer",
            "trainer",
            argv=argv,
            before_start=write_role_file,
            env=child_env(cfg.trainer.threads),
            ready=lambda pid: probe.marker(names.TRAINER_STATE, "ready_pid", pid),
            alive=lambda pid: probe.heartbeat(names.TRAINER_STATE, pid, also=others),
            finishes=True,
            after=after if fresh else None,
        )
        return [trainer]

    def completion_check(self, progress) -> Callable[[dict[str, Optional[int]]], RunVerdict]:
        t = self.cfg.trainer
        target = completion.HfTarget(t.max_train_steps, t.samples_per_step)

        def check(exits: dict[str, Optional[int]]) -> RunVerdict:
            state = progress.trainer_state()
            obs = completion.TrainerObservation(
                samples_processed=int(state.get("samples_processed", 0)),
                trainer_exit_code=exits.get("trainer"),
                training_done=names.training_done(state),  # the signal the actors stop on too
                last_step=int(state.get("step", 0)),
            )
            return run_verdict(completion.hf_finished(target, obs), exits)

        return check

    def trainer_view(self, redis, actor: int = 0):
        from rlrun.actor.trainer_view import HfView

        return HfView(self.cfg.actor, self.cfg.groups_per_step, redis, actor)

    def metrics_hint(self, run_dir: RunDir) -> Optional[str]:
        return None  # metrics.jsonl, written by the trainer
