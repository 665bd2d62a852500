"""The run directory: the one place that names every path a run writes (docs/operations.md's
table says what each holds), so a run is inspected, resumed or deleted as a unit.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from rlrun.errors import RunDirError

MARKER = "rlrun-run.json"  # present in every run directory; its absence means "not a run"
LOCK = "run.lock"  # flock-ed by the process running the run (rlrun/run/runlock.py); never written
LAUNCH_PREFIX = "launch-"  # logs/launch-<n>/: the n-th `rlrun train`/`rlrun resume` of the run


def write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """Write `text` to `path` through a temporary sibling renamed over it: never half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as handle:
        os.fchmod(handle.fileno(), mode)  # in case a stale tmp file had another mode
        handle.write(text)
    os.replace(tmp, path)


def read_jsonl(path: Path) -> list[dict]:
    """The objects of a JSON-lines file, in order; a line cut short by a crash is skipped."""
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, RecursionError):  # RecursionError: a line of nested brackets
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


@dataclass(frozen=True)
class RunDir:
    root: Path
    launch: Optional[int] = None  # set by the launcher: this launch's logs go to logs/launch-<n>/

    @property
    def marker(self) -> Path:
        return self.root / MARKER

    @property
    def lock_file(self) -> Path:
        return self.root / LOCK

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    def config_hash(self) -> str:
        """sha256[:12] of `config`: the hf trainer records it in its checkpoints; inspect compares."""
        return hashlib.sha256(self.config.read_bytes()).hexdigest()[:12]

    @property
    def overrides(self) -> Path:
        return self.root / "overrides.yaml"

    @property
    def roles(self) -> Path:
        """One file per child process: what it needs to start (rlrun/parts/role_file.py)."""
        return self.root / "roles"

    def role_file(self, name: str) -> Path:
        return self.roles / f"{name}.yaml"

    @property
    def secrets(self) -> Path:
        return self.root / "secrets"

    @property
    def redis_password(self) -> Path:
        return self.secrets / "redis.password"

    @property
    def vllm_api_key(self) -> Path:
        return self.secrets / "vllm.key"

    def read_redis_password(self) -> Optional[str]:
        """The run's Redis password; None when its server wants none (an external one)."""
        try:
            return self.redis_password.read_text().strip() or None
        except FileNotFoundError:
            return None

    def read_vllm_api_key(self) -> str:
        """The key the run's vLLM servers want on every route but /health ("" before it exists)."""
        try:
            return self.vllm_api_key.read_text().strip()
        except FileNotFoundError:
            return ""

    def ensure_secret(self, path: Path) -> str:
        """The secret at `path`, generated on first use and kept, so restarted servers accept old clients."""
        stored = path.read_text().strip() if path.is_file() else ""
        if not stored:
            stored = secrets.token_urlsafe(32)
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            self.write_secret(path, stored)
        return stored

    @property
    def redis_dir(self) -> Path:
        return self.root / "redis"

    @property
    def redis_conf(self) -> Path:
        return self.redis_dir / "redis.conf"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def launch_logs(self, launch: Optional[int] = None) -> Path:
        """The log folder of launch `launch` (default this RunDir's; logs/ itself when none is set)."""
        n = self.launch if launch is None else launch
        return self.logs if n is None else self.logs / f"{LAUNCH_PREFIX}{n}"

    def launches(self) -> list[int]:
        """The numbers of the launches that have a log folder, in order."""
        if not self.logs.is_dir():
            return []
        found = (
            p.name[len(LAUNCH_PREFIX) :] for p in self.logs.iterdir() if p.is_dir() and p.name.startswith(LAUNCH_PREFIX)
        )
        return sorted(int(n) for n in found if n.isdigit())

    def for_new_launch(self) -> "RunDir":
        """This run directory for its next launch, with its own log folder (created now)."""
        n = max(self.launches(), default=0) + 1
        launched = RunDir(self.root, n)
        launched.launch_logs().mkdir(parents=True, exist_ok=False)
        return launched

    def log(self, process: str, attempt: int = 0) -> Path:
        """One log file per process and start attempt, in this launch's log folder."""
        suffix = "" if attempt == 0 else f".{attempt}"
        return self.launch_logs() / f"{process}{suffix}.log"

    def here(self, recorded: str) -> Path:
        """A path events.jsonl recorded (a log, a stack dump), in this run directory: a relative one
        is under it; an absolute one written where the run was before it was copied or moved is
        taken from its `logs/` or `diagnostics/` part on."""
        path = Path(recorded)
        if not path.is_absolute():
            return self.root / path
        if path.is_relative_to(self.root):
            return path
        for folder in (self.logs.name, self.diagnostics.name):
            if folder in path.parts[:-1]:
                at = len(path.parts) - 1 - path.parts[::-1].index(folder)
                return self.root.joinpath(*path.parts[at:])
        return path

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    def checkpoint(self, step: int) -> Path:
        return self.checkpoints / f"step_{step:06d}"

    @property
    def weights(self) -> Path:
        """Weights handed to vLLM after each optimizer step, one folder per policy version."""
        return self.root / "weights"

    @property
    def current_weights(self) -> Path:
        """A symlink to the newest complete weights (the base model at first): vLLM (re)starts from it."""
        return self.weights / "current"

    def point_current_weights(self, target: Path) -> None:
        """Make `current_weights` point at `target`, atomically (a new link renamed over the old)."""
        tmp = self.weights / ".current.tmp"
        tmp.unlink(missing_ok=True)
        os.symlink(os.path.abspath(target), tmp)
        os.replace(tmp, self.current_weights)

    def weights_version(self, version: int) -> Path:
        return self.weights / f"v{version:06d}"

    @property
    def audit(self) -> Path:
        """Optional audit trails (actor.audit=true): what was journaled and delivered."""
        return self.root / "audit"

    @property
    def trained_groups(self) -> Path:
        """One line per optimizer step: the ids of the groups it trained on."""
        return self.root / "trained_groups.jsonl"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def generation_flags(self) -> Path:
        """world.cpu_affinity=by_need: a byte per actor, 1 while it has a request in flight."""
        return self.root / "generating"

    @property
    def tensorboard(self) -> Path:
        return self.root / "tensorboard"

    @property
    def plot(self) -> Path:
        return self.root / "plot.png"

    @property
    def events(self) -> Path:
        return self.root / "events.jsonl"

    @property
    def diagnostics(self) -> Path:
        return self.root / "diagnostics"

    @property
    def state(self) -> Path:
        return self.root / "state.json"

    @property
    def slurm(self) -> Path:
        """world=slurm: the batch script `rlrun submit` wrote, the job's output (one file per job id)."""
        return self.root / "slurm"

    def slurm_output(self, job_id: str) -> Path:
        return self.slurm / f"job-{job_id}.out"

    @property
    def slurm_steps(self) -> Path:
        """Where each srun step records its pid and node as it starts (rlrun/cluster/slurm_step.py)."""
        return self.slurm / "steps"

    def is_run(self) -> bool:
        return self.marker.is_file()

    def require_run(self) -> None:
        """RunDirError unless this is a run directory (status, logs, plot, resume)."""
        if not self.is_run():
            raise RunDirError(
                f"{self.root} is not an rlrun run directory (no {MARKER}). Give the directory `rlrun train` printed."
            )

    def check_can_create(self) -> None:
        """RunDirError unless the directory is new, or empty (but for a lock file), not a run, this
        user's and writable by nobody else: another user could replace the run's files (creates nothing)."""
        if self.is_run():
            raise RunDirError(
                f"{self.root} already holds a run ({self.marker.name} is there). Use "
                f"`rlrun resume {self.root}` to continue it, or choose another directory with "
                f"run.dir=PATH."
            )
        if not self.root.is_dir():
            return
        if any(entry.name != LOCK for entry in self.root.iterdir()):
            raise RunDirError(
                f"{self.root} exists and is not empty, and it is not an rlrun run. Choose an empty "
                f"or new directory with run.dir=PATH."
            )
        st = self.root.stat()
        if st.st_uid != os.geteuid():
            raise RunDirError(
                f"{self.root} belongs to another user (uid {st.st_uid}), who could replace the run's files. "
                f"Choose a directory of your own with run.dir=PATH (or a new one: rlrun creates it)."
            )
        if st.st_mode & 0o022:
            raise RunDirError(
                f"{self.root} can be written by {'every user' if st.st_mode & 0o002 else 'its group'} (mode "
                f"{st.st_mode & 0o777:o}), who could replace the run's files. Run `chmod go-w {self.root}`, or choose "
                f"another directory with run.dir=PATH (or a new one: rlrun creates it 0700)."
            )

    def create(self, info: dict) -> None:
        """Create a fresh run directory; refuse one that holds another run or is not writable."""
        self.check_can_create()
        try:
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.chmod(self.root, 0o700)
            self.lock_file.touch(mode=0o600, exist_ok=True)
            for folder in (self.logs, self.redis_dir, self.checkpoints, self.weights):
                folder.mkdir(exist_ok=True)
            self.secrets.mkdir(exist_ok=True, mode=0o700)
            self.marker.write_text(json.dumps(info, indent=2) + "\n")
        except OSError as exc:
            raise RunDirError(
                f"cannot create the run directory {self.root}: {exc.strerror}. Choose a writable "
                f"location with run.dir=PATH."
            ) from exc

    def write_secret(self, path: Path, value: str) -> None:
        """Write `value` to `path` readable by the owner only (never world-readable), atomically."""
        write_atomic(path, value, mode=0o600)

    def read_state(self) -> dict:
        """state.json ({} before the run first started); RunDirError naming it when it is damaged."""
        if not self.state.exists():
            return {}
        try:
            data = json.loads(self.state.read_text())
        except (OSError, ValueError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            why = exc.strerror if isinstance(exc, OSError) else f"not JSON: {' '.join(str(exc).split())}"
            data, problem = None, why
        else:
            problem = None if isinstance(data, dict) else f"it holds a {type(data).__name__}, not an object"
        if problem is not None:
            raise RunDirError(
                f"{self.state} is damaged ({problem}). It only records the run's status: move it aside "
                f"(mv {self.state} {self.state}.damaged) and the run reads as stopped; `rlrun resume` writes a new one."
            )
        return data

    def read_yaml(self, path: Path, what: str):
        """A YAML file of the run (config.yaml, overrides.yaml); RunDirError naming it when damaged."""
        import yaml

        try:
            return yaml.safe_load(path.read_text())
        except (OSError, ValueError, yaml.YAMLError) as exc:
            why = exc.strerror if isinstance(exc, OSError) else " ".join(str(exc).split())
            copy = (
                f" (every role file, {self.roles}/<name>.yaml, holds a copy under `config:`)"
                if path == self.config
                else ""
            )
            raise RunDirError(f"{path}, {what}, cannot be read ({why}). Restore it from a copy{copy}.") from None

    def write_state(self, **fields) -> None:
        """Merge `fields` into state.json atomically (write a temporary file, then rename); a damaged
        one is replaced (it records the status only, which is being written now)."""
        try:
            known = self.read_state()
        except RunDirError:
            known = {}
        write_atomic(self.state, json.dumps({**known, **fields}, indent=2, sort_keys=True) + "\n")
