"""Plain data (from Hydra or a saved YAML file) → the typed `RunConfig`, and the invariants.

Types, unknown keys and missing keys are checked by OmegaConf against the schema (a structured
config); its errors become a `ConfigError` that names the field by its dotted path and says what
would be accepted. The cross-field rules are `validate`'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import re
import types
import typing
from collections.abc import Callable
from typing import Any, Literal, Optional, Union, cast

from rlrun.config import bounds
from rlrun.config.problems import NeedFn, Problems, refuse
from rlrun.config.schema import RunConfig
from rlrun.errors import ConfigError
from rlrun.listen import LOOPBACK


def from_dict(cls: type, data: Any) -> Any:
    return instantiate(cls, to_plain(typed(data)))


def typed(data: Any):
    """`data` merged onto the schema's structured config: an OmegaConf `DictConfig` in struct mode."""
    from omegaconf import OmegaConf

    if not isinstance(data, dict):
        raise ConfigError(f"the config must be a mapping of sections (trainer, actor, ...), got {data!r}.")
    with omegaconf_errors():
        return OmegaConf.merge(OmegaConf.structured(_structured(RunConfig)), data)


def to_plain(node) -> dict:
    """A typed `DictConfig` → plain data (choices as strings), every required key checked."""
    from omegaconf import OmegaConf

    with omegaconf_errors():
        return cast(dict, OmegaConf.to_container(node, resolve=True, enum_to_str=True, throw_on_missing=True))


def instantiate(cls: type, data: dict) -> Any:
    """Checked plain data → the frozen dataclasses (OmegaConf has converted every value already)."""
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        inner = unwrap_optional(hints[f.name])
        value = data[f.name]
        nested = isinstance(inner, type) and dataclasses.is_dataclass(inner) and value is not None
        kwargs[f.name] = instantiate(inner, value) if nested else value
    return cls(**kwargs)


@functools.cache
def _structured(cls: type) -> type:
    """An OmegaConf-ready copy of schema dataclass `cls`: Literal choices become enums (OmegaConf
    2.3 has no Literal), nested sections their copies; defaults are the schema's."""
    from omegaconf import MISSING

    hints = typing.get_type_hints(cls)
    fields = []
    for f in dataclasses.fields(cls):
        if f.default_factory is not dataclasses.MISSING:
            default = dataclasses.field(default_factory=functools.partial(_made_plain, f.default_factory))
        else:
            default = dataclasses.field(default=MISSING if f.default is dataclasses.MISSING else f.default)
        fields.append((f.name, _omega_type(hints[f.name]), default))
    return dataclasses.make_dataclass(cls.__name__, fields)


def _made_plain(make: Callable[[], Any]) -> Any:
    return _plain_default(make())


def _plain_default(value: Any) -> Any:
    """A schema default as OmegaConf takes it: a section default as an instance of its copy."""
    if not dataclasses.is_dataclass(value):
        return value
    section: type = type(value)
    return _structured(section)(**{f.name: _plain_default(getattr(value, f.name)) for f in dataclasses.fields(value)})


def _omega_type(tp: Any) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        return Optional[_omega_type(unwrap_optional(tp))]
    if origin is Literal:
        return enum.Enum("Choice", [(choice, choice) for choice in args])
    if origin is list:
        return list[_omega_type(args[0])]  # type: ignore[misc]  # types built at run time
    if origin is dict:
        return dict[args[0], _omega_type(args[1])]  # type: ignore[misc, valid-type]
    return _structured(tp) if isinstance(tp, type) and dataclasses.is_dataclass(tp) else tp


def unwrap_optional(tp: Any) -> Any:
    if typing.get_origin(tp) in (Union, types.UnionType):
        (inner,) = [a for a in typing.get_args(tp) if a is not type(None)]
        return inner
    return tp


@contextlib.contextmanager
def omegaconf_errors():
    """Turns OmegaConf's error about a config key into a one-paragraph `ConfigError`."""
    from omegaconf import errors

    try:
        yield
    except errors.OmegaConfBaseException as exc:
        key = exc.full_key or "<root>"
        if isinstance(exc, (errors.ConfigKeyError, errors.ConfigAttributeError)):
            raise ConfigError(unknown_key_message(key)) from None
        if isinstance(exc, errors.MissingMandatoryValue):
            raise ConfigError(f"config key '{key}' is required but missing.") from None
        expected = _kind(type_at(key))
        if expected is None or not isinstance(exc, errors.ValidationError):
            raise ConfigError(f"invalid config value at '{key}': {str(exc.msg).splitlines()[0]}") from None
        raise ConfigError(f"{key} must be {expected}, got {exc.value!r}.") from None


def unknown_key_message(dotted: str) -> str:
    parent, _, _ = dotted.rpartition(".")
    section = type_at(parent) if parent else RunConfig
    names = [f.name for f in dataclasses.fields(section)] if dataclasses.is_dataclass(section) else []
    where = f"under '{parent}'" if parent else "at the top level"
    return (
        f"unknown config key '{dotted}'. Valid keys {where}: {', '.join(names) or '(none)'}. Check the spelling; "
        "`rlrun train --dry-run` prints the whole resolved config."
    )


def type_at(dotted: str) -> Any:
    """The schema type at `a.b[0].c` (Any inside a free-form mapping); None where there is no such key."""
    tp: Any = RunConfig
    for part in re.findall(r"[^.\[\]]+", dotted):
        tp = unwrap_optional(tp)
        if tp is Any:
            return Any
        if dataclasses.is_dataclass(tp):
            tp = typing.get_type_hints(tp).get(part)
        elif typing.get_origin(tp) in (list, dict):
            tp = typing.get_args(tp)[-1]
        else:
            return None
    return tp


def _kind(tp: Any) -> Optional[str]:
    tp = unwrap_optional(tp)
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(c) for c in typing.get_args(tp))
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    words = {
        bool: "true or false",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "a mapping",
    }
    return words.get(typing.get_origin(tp) or tp)


DEVICE = re.compile(r"(cpu|cuda|xpu|mps|npu|hpu|xla)(:\d+)?")  # torch's device strings (no torch import)


def validate(cfg: RunConfig) -> None:
    """Every key within the range its schema annotation gives (rlrun/config/bounds.py), then the
    rules between keys (which may assume those ranges)."""
    refuse(bounds.problems(cfg))
    problems = Problems()
    need = problems.need
    t, a, act = cfg.trainer, cfg.algo, cfg.actor
    need(
        t.train_batch_size % a.group_size == 0,
        f"trainer.train_batch_size ({t.train_batch_size}) must be a multiple of algo.group_size "
        f"({a.group_size}) so that every pass holds whole groups.",
    )
    need(
        t.nproc_per_node <= 1 or not t.device.startswith("cuda:"),
        f"trainer.device={t.device} names one GPU, but trainer.nproc_per_node={t.nproc_per_node} ranks "
        "cannot share it: set trainer.device=cuda (each rank takes the GPU of its local rank, as with "
        "torchrun).",
    )
    need(
        t.weight_transfer != "broadcast" or t.backend == "hf",
        "trainer.weight_transfer=broadcast is the hf trainer's choice: trainer=fast_llm always broadcasts its "
        "weights itself (trainer.fast_llm.broadcast_*). Remove trainer.weight_transfer.",
    )
    need(
        t.weight_transfer != "shm" or (t.backend == "hf" and cfg.world.kind == "local"),
        "trainer.weight_transfer=shm hands the weights through a file in /dev/shm that every vLLM server maps: "
        "rlrun's own trainer (trainer=hf) with world=local only, the servers on the trainer's host. Use "
        "trainer.weight_transfer=broadcast or disk.",
    )
    broadcasting = "trainer=fast_llm" if t.backend == "fast_llm" else "trainer.weight_transfer=broadcast"
    need(
        (t.backend == "hf" and t.weight_transfer in ("disk", "shm"))
        or (cfg.inference.tensor_parallel_size == 1 and not _sharded_vllm(cfg.inference.extra_args)),
        f"{broadcasting} needs one vLLM worker per server: each server joins the trainer's weight broadcast as "
        "one rank. Set inference.tensor_parallel_size=1, remove --pipeline-parallel-size from inference.extra_args and use "
        f"inference.num_servers{'' if t.backend == 'fast_llm' else ', or use trainer.weight_transfer=disk'}.",
    )
    need(len(t.betas) == 2, f"trainer.betas must be two numbers in [0, 1) (got {t.betas}).")
    need(
        act.min_new_tokens <= act.max_new_tokens,
        f"actor.min_new_tokens ({act.min_new_tokens}) must be between 0 and actor.max_new_tokens ({act.max_new_tokens}).",
    )
    need(
        act.max_new_tokens < cfg.model.max_model_len,
        f"actor.max_new_tokens ({act.max_new_tokens}) must be below model.max_model_len "
        f"({cfg.model.max_model_len}) to leave room for the prompt.",
    )
    env = cfg.environment
    if env.step:
        need(
            env.max_total_tokens < cfg.model.max_model_len,
            f"environment.max_total_tokens ({env.max_total_tokens}) must be below model.max_model_len "
            f"({cfg.model.max_model_len}): a conversation is the prompt and that many tokens.",
        )
        need(
            not cfg.reward.functions,
            "environment.step gives the reward (its last step's answer): remove reward.functions.",
        )
    need(
        not env.tools or bool(env.step),
        "environment.tools without environment.step: the step runs the tools; set both.",
    )
    need(
        not env.tools or cfg.model.chat_template,
        "environment.tools are shown to the model through its chat template: set model.chat_template=true.",
    )
    k = act.num_actors
    need(
        k <= 1 or act.journal,
        f"actor.num_actors={k} needs actor.journal=true (the journal is what keeps actors apart).",
    )
    need(
        cfg.model.source == "tiny" or bool(cfg.model.path),
        f"model.path must be set when model.source={cfg.model.source}.",
    )
    need(
        cfg.dataset.name != "arithmetic" or cfg.dataset.num_problems >= 1,
        f"dataset.num_problems must be at least 1 with dataset=arithmetic: it generates that many problems (got {cfg.dataset.num_problems}).",
    )
    need(
        cfg.model.source != "tiny" or cfg.dataset.name in ("arithmetic", "files"),
        "model=tiny has a character vocabulary made for dataset=arithmetic (sums as text, which dataset=files may "
        f"hold too); choose a real model for dataset={cfg.dataset.name}.",
    )
    need(
        cfg.model.source != "tiny" or not cfg.model.chat_template,
        "model.chat_template=true: the tiny model has no chat template (it is given the sums as they are); remove it.",
    )
    need(
        cfg.dataset.name != "reasoning_gym" or bool(cfg.dataset.task),
        "dataset=reasoning_gym needs dataset.task: the library's dataset name, e.g. dataset.task=chain_sum.",
    )
    for host, key in ((cfg.inference.host, "inference.host"), (cfg.streams.host, "streams.host")):
        need(
            host in LOOPBACK or cfg.world.kind != "local",
            f"{key}={host}: with world=local servers listen on loopback only (127.0.0.1).",
        )
    for role in ("redis", "vllm", "trainer", "actor", "weights"):
        policy = getattr(cfg.supervisor, role)
        need(
            policy.backoff_max_s >= policy.backoff_initial_s,
            f"supervisor.{role}.backoff_max_s ({policy.backoff_max_s}) must be at least supervisor.{role}.backoff_initial_s "
            f"({policy.backoff_initial_s}): it caps the delay before a restart.",
        )
    need(
        DEVICE.fullmatch(t.device) is not None,
        f"trainer.device={t.device!r} is not a torch device: use cpu, cuda (a GPU per rank), cuda:K (one GPU), "
        "or another torch device type such as xpu or mps.",
    )
    _validate_streams(cfg, need)
    _validate_world(cfg, need)
    refuse(problems)


def _sharded_vllm(extra_args) -> bool:
    """True when vLLM's extra arguments split a server over several workers (TP or PP > 1)."""
    args = [str(a) for a in extra_args]
    for i, arg in enumerate(args):
        for flag in ("--tensor-parallel-size", "--pipeline-parallel-size", "-tp", "-pp"):
            value = (
                arg.split("=", 1)[1]
                if arg.startswith(flag + "=")
                else (args[i + 1] if arg == flag and i + 1 < len(args) else None)
            )
            if value is not None and value.strip() not in ("", "1"):
                return True
    return False


def _validate_streams(cfg: RunConfig, need: NeedFn) -> None:
    s = cfg.streams  # (the URL itself: rlrun.streams.external.url_problems, asked by preflight)
    need(
        s.url is not None or s.password_file is None,
        "streams.password_file is the password of an external Redis: set streams.url too, or remove it.",
    )


def _validate_world(cfg: RunConfig, need: NeedFn) -> None:
    w = cfg.world
    need(
        w.cpu_affinity != "by_need"
        or (
            w.kind == "local"
            and cfg.trainer.backend == "hf"
            and cfg.trainer.nproc_per_node == 1
            and cfg.trainer.device == "cpu"
        ),
        "world.cpu_affinity=by_need lends the vLLM servers' idle CPU cores to one hf trainer rank on CPU, on the "
        "servers' machine: it needs world=local, trainer=hf, trainer.nproc_per_node=1 and trainer.device=cpu. Use "
        "world.cpu_affinity=auto.",
    )
    if w.kind == "slurm":  # Ray's keys, said before relevance's notice; SLURM's own rules: slurm_job.config_problems
        for role in ("redis", "vllm", "trainer", "actor"):
            need(
                getattr(w, role).resources is None,
                f"world.{role}.resources names Ray resources, which SLURM does not have: remove it (world.{role}.gpus and "
                f"world.{role}.cpus place the role; world.srun_args or world.sbatch_lines pass SLURM options).",
            )
    if w.kind != "ray":
        return
    need(
        bool(w.address and w.address.strip()),
        "world.address must name the Ray cluster to join with world=ray: HOST:PORT of its head "
        "(as printed by `ray start --head`), or auto for the cluster this machine is part of.",
    )
    for role in ("redis", "vllm", "trainer", "actor"):
        place = getattr(w, role)
        need(
            place.local or bool(place.bundle()),
            f"world.{role} reserves no Ray resource, so Ray cannot place it: give it some "
            f"(world.{role}.cpus=1, world.{role}.gpus=1 or world.{role}.resources={{NAME: 1}}), "
            f"or run it on this machine with world.{role}.local=true.",
        )
