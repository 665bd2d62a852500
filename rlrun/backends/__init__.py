"""Trainer backends: everything rlrun must know about one trainer, behind one interface.

    backend = backend_for(cfg)                       # by cfg.trainer.backend, bound to cfg
    backend.specs(run_dir, endpoints, model_path, probe, events)   # its processes, in start order
    backend.completion_check(progress)               # the supervisor's RunVerdict per poll
    for layout in checkpoint_layouts(): ...          # inspect-checkpoint reads any backend's

A run looks its backend up once, when it is built (`rlrun.run.built.build`), and hands the bound
backend to whatever needs it. Nothing else names a backend: a new trainer is one new module,
registered in `_BACKENDS` (imported on first use). Completion rules stay pure, in `rlrun.rules.completion`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional, Protocol

if TYPE_CHECKING:  # pragma: no cover - types only
    from rlrun.actor.trainer_view import TrainerView
    from rlrun.config import RunConfig
    from rlrun.parts.progress import ProgressReader
    from rlrun.parts.role_parts import Endpoints, RedisProbe
    from rlrun.parts.sockets import Listener
    from rlrun.rules.completion import Verdict
    from rlrun.rundir import RunDir
    from rlrun.supervisor import EventLog, ProcessSpec, RunVerdict

# name -> "module:class" of its TrainerBackend (config validation lists these names)
_BACKENDS = {"hf": "rlrun.backends.hf:HfBackend", "fast_llm": "rlrun.backends.fast_llm.backend:FastLlmBackend"}
NAMES = tuple(_BACKENDS)

HALF = "half-written"  # why a checkpoint candidate is skipped (damaged ones say their damage)


@dataclass(frozen=True)
class Candidate:
    """A checkpoint folder found in a run directory, and why it would be skipped (None: usable)."""

    step: int
    path: Path
    skipped_because: Optional[str] = None  # HALF, or what is damaged


class CheckpointLayout(Protocol):
    """How one backend's checkpoints look on disk, for `rlrun inspect-checkpoint`."""

    name: str  # shown as the checkpoint's layout

    def looks_like(self, path: Path) -> bool: ...  # one of its checkpoint folders (even half-written)

    def candidates(self, run: "RunDir") -> list[Candidate]: ...  # each with why resume would skip it

    def is_complete(self, path: Path) -> bool: ...

    def problem(self, path: Path) -> Optional[str]:
        """Why a resume would skip the checkpoint at `path` (HALF, or its damage), None when it
        would load it: the rule `candidates` applies, for one folder."""

    def read_fields(self, path: Path, warnings: list[str]) -> dict:
        """`step` and what else it records (samples_processed, documents_seen, policy_version,
        checkpoint_config_hash, written_at[_source]); what cannot be read goes to `warnings`."""


class TrainerBackend(Protocol):
    """One trainer, bound to the run's config at construction (`backend_for(cfg)`)."""

    name: str
    layout: CheckpointLayout
    cfg: "RunConfig"

    def roles(self) -> list[str]: ...  # its processes' names, in start order

    def trainer_ranks(self) -> int: ...  # world=ray reserves world.trainer.cpus/gpus per rank

    # world=ray: its ranks may run on several nodes, one bundle each (its trainer command is a
    # `rlrun.entrypoints.rank_group`, started once per node); False: all on one node, in one bundle.
    ranks_span_nodes: bool

    def config_problems(self) -> list[str]:
        """What its own settings get wrong, one sentence each (preflight refuses them: exit 2)."""

    def broadcast_port(self, pick_port: Callable[[str], int]) -> int: ...  # 0: none

    def listeners(self) -> list["Listener"]:
        """The sockets its processes listen on (rlrun/parts/sockets.py; --dry-run lists them)."""

    def explicit_ports(self) -> list[tuple[str, str, int]]:
        """(config key, host, port) of every port its config fixes (preflight checks they are free)."""

    def redis_default_user(self) -> str: ...  # the ACL line of Redis's `default` user

    def check_launchable(self, root: Path) -> None:
        """Preflight: its program is there and takes rlrun's config (ConfigError / EnvironmentProblem)."""

    def check_resumable(self, run_dir: "RunDir") -> None:
        """Preflight of a resume: its checkpoints leave something to resume from (RunDirError)."""

    def specs(
        self, run_dir: "RunDir", endpoints: "Endpoints", model_path: str, probe: "RedisProbe", events: "EventLog"
    ) -> list["ProcessSpec"]:
        """Its processes (the trainer, and what serves it), in start order; what their hooks do
        goes to `events`, the supervisor's own log (events.jsonl has that one writer)."""

    def completion_check(self, progress: "ProgressReader") -> Callable[[dict[str, Optional[int]]], "RunVerdict"]:
        """The supervisor's check, called with the exit codes of the processes that finish."""

    def trainer_view(self, redis, actor: int = 0) -> "TrainerView":
        """What actor `actor` needs to know about this trainer (rlrun/actor/trainer_view.py)."""

    def metrics_hint(self, run_dir: "RunDir") -> Optional[str]:
        """Where the training metrics are when not in metrics.jsonl (shown at the end of a run)."""


class BackendClass(Protocol):
    """A TrainerBackend class: its checkpoint layout, and a backend bound to a config when called."""

    layout: CheckpointLayout

    def __call__(self, cfg: "RunConfig") -> TrainerBackend: ...


def backend_for(cfg: "RunConfig") -> TrainerBackend:
    """The backend cfg.trainer.backend names, bound to `cfg`. Called once per run, by
    `rlrun.run.built.build`: everything else is handed the built run."""
    return backend_class(cfg.trainer.backend)(cfg)


def backend_class(name: str) -> BackendClass:
    """The TrainerBackend class registered as `name` (imported on first use)."""
    try:
        module, attribute = _BACKENDS[name].split(":")
    except KeyError:
        raise ValueError(f"unknown trainer backend '{name}': expected one of {', '.join(NAMES)}.") from None
    return getattr(importlib.import_module(module), attribute)


def checkpoint_layouts() -> list[CheckpointLayout]:
    """Every backend's checkpoint layout (a checkpoint on disk does not say which run made it)."""
    return [backend_class(name).layout for name in NAMES]


def recorded_fields(path: Path, step: Optional[int], file: str, read: Callable[[], dict], warnings: list[str]) -> dict:
    """A layout's `read_fields`: the step in the folder name, then what `read()` gets from `file`."""
    if not (path / file).is_file():
        warnings.append(f"no {file}: step taken from the folder name")
        return {"step": step}
    try:
        recorded = read()
    except (OSError, ValueError, TypeError) as exc:
        warnings.append(" ".join(f"cannot read {file}: {exc}".split()))
        return {"step": step}
    if step is not None and step != recorded["step"]:
        warnings.append(f"the folder name says step {step} but {file} says {recorded['step']}")
    return recorded


def run_verdict(verdict: "Verdict", exits: dict[str, Optional[int]]) -> "RunVerdict":
    """A backend's verdict for the supervisor: a trainer that exited 0 before the end is rejected,
    so it is restarted from its checkpoint."""
    from rlrun.supervisor import RunVerdict

    rejected = not verdict.finished and exits.get("trainer") == 0
    return RunVerdict(verdict.finished, verdict.reason, reject="trainer" if rejected else None)
