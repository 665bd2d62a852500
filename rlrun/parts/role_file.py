"""One file per child process: everything it needs to start, so any role can be rerun by hand.

`<run>/roles/<name>.yaml` (written before every start, read by the child's `main`): the run
directory, the role's endpoints, the model path, an actor's index and the run's resolved config;
no secret (those stay in `<run>/secrets/`). To debug a role, stop the run's copy and start
`python -m rlrun.entrypoints.actor <run>/roles/actor.yaml` (or another role's, `rlrun/entrypoints/`) by hand.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import yaml

from rlrun.config import RunConfig
from rlrun.errors import ConfigError
from rlrun.rundir import RunDir, write_atomic

FORMAT = 1  # bumped when a field changes meaning (a new field with a default, as actor_index, is read from older files as its default)


@dataclass(frozen=True)
class Role:
    name: str
    run_dir: Path
    redis_url: str  # without the password (secrets/redis.password)
    model_path: str
    vllm_urls: list[str] = field(default_factory=list)
    broadcast_host: str = ""  # the trainer's weight broadcast (the weight follower; the hf trainer with trainer.weight_transfer=broadcast)
    broadcast_port: int = 0
    actor_index: int = 0  # k of actor.num_actors (the actor only): its prompts, servers, stream and journal
    config: dict = field(default_factory=dict)  # the run's resolved config, as config.yaml holds it

    @property
    def run(self) -> RunDir:
        return RunDir(self.run_dir)

    def load_config(self) -> RunConfig:
        """The typed config (ConfigError when it does not check: a restart would fail the same way)."""
        from rlrun.config.compose import config_from_data

        return config_from_data(self.config, source=f"the role file of {self.name}")


def write_role_file(run_dir: RunDir, role: Role) -> Path:
    """Write `<run>/roles/<role.name>.yaml` atomically (a child never reads half of it)."""
    path = run_dir.role_file(role.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"format": FORMAT, **asdict(role), "run_dir": str(role.run_dir)}
    write_atomic(path, yaml.safe_dump(data, sort_keys=False))
    return path


def read_role_file(path: Path) -> Role:
    """The role a child was started with; ConfigError naming the file when it cannot be used."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(
            f"cannot read the role file {path}: {exc}. Start roles through `rlrun train` / `rlrun resume`, which write it."
        ) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ConfigError(
            f"{path} is not an rlrun role file of format {FORMAT}: write it again with `rlrun resume RUN_DIR`."
        )
    try:  # a field an older file lacks (actor_index) takes its default
        role = Role(**{f.name: data[f.name] for f in fields(Role) if f.name in data})
        return replace(role, run_dir=Path(role.run_dir))
    except TypeError as exc:
        raise ConfigError(
            f"the role file {path} is incomplete ({exc!r}): write it again with `rlrun resume RUN_DIR`."
        ) from None


def role_from_argv(prog: str, argv: list[str] | None = None) -> Role:
    """A child's command line, `python -m <module> ROLE_FILE`, read (ConfigError when unusable)."""
    import argparse

    parser = argparse.ArgumentParser(
        prog=prog, description="Started by rlrun with its role file (<run>/roles/<name>.yaml)."
    )
    parser.add_argument("role_file", type=Path, help="the role file rlrun wrote for this process")
    return read_role_file(parser.parse_args(argv).role_file)
