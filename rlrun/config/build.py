"""Plain data (from Hydra or a saved YAML file) → the typed `RunConfig`, and the invariants.

Every error names the field by its dotted path and says what would be accepted.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal, Union

from rlrun.config.schema import RunConfig
from rlrun.errors import ConfigError


def from_dict(cls: type, data: Any, path: str = "") -> Any:
    """Build dataclass `cls` from a nested dict, checking every key and type."""
    if not isinstance(data, dict):
        raise ConfigError(f"config section '{path or '<root>'}' must be a mapping, got {data!r}.")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(names))
    if unknown:
        where = f"under '{path}'" if path else "at the top level"
        raise ConfigError(
            f"unknown config key '{_join(path, unknown[0])}'. Valid keys {where}: "
            f"{', '.join(names)}. Check the spelling of the override."
        )
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ConfigError(f"config key '{_join(path, f.name)}' is required but missing.")
            continue
        kwargs[f.name] = _convert(hints[f.name], data[f.name], _join(path, f.name))
    return cls(**kwargs)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _convert(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _convert(inner, value, path)
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            raise ConfigError(
                f"{path}={value!r} is not a valid choice. Valid choices: "
                f"{', '.join(repr(c) for c in choices)}."
            )
        return value
    if tp is Any:
        return value
    if origin is dict:
        key_type, inner = typing.get_args(tp)
        if not isinstance(value, dict) or not all(isinstance(k, key_type) for k in value):
            raise ConfigError(f"{path} must be a mapping with {key_type.__name__} keys, got {value!r}.")
        return {k: _convert(inner, v, f"{path}.{k}") for k, v in value.items()}
    if origin is list:
        (inner,) = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{path} must be a list, got {value!r}.")
        return [_convert(inner, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, path)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path} must be true or false, got {value!r}.")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path} must be an integer, got {value!r}.")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path} must be a number, got {value!r}.")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path} must be a string, got {value!r}.")
        return value
    raise TypeError(f"unsupported config type {tp!r} at {path}")  # a schema bug, not user input


def validate(cfg: RunConfig) -> None:
    """Check the invariants that span fields and roles; raise ConfigError naming field and fix."""
    problems: list[str] = []

    def need(ok: bool, message: str) -> None:
        if not ok:
            problems.append(message)

    t, a, act = cfg.trainer, cfg.algo, cfg.actor
    need(t.max_train_steps >= 1, f"trainer.max_train_steps must be at least 1 (got {t.max_train_steps}).")
    need(t.train_batch_size >= 1, f"trainer.train_batch_size must be at least 1 (got {t.train_batch_size}).")
    need(
        t.gradient_accumulation_passes >= 1,
        f"trainer.gradient_accumulation_passes must be at least 1 (got {t.gradient_accumulation_passes}).",
    )
    need(a.group_size >= 2, f"algo.group_size must be at least 2: advantages compare samples of a group (got {a.group_size}).")
    if a.group_size >= 1 and t.train_batch_size >= 1:
        need(
            t.train_batch_size % a.group_size == 0,
            f"trainer.train_batch_size ({t.train_batch_size}) must be a multiple of algo.group_size "
            f"({a.group_size}) so that every pass holds whole groups.",
        )
    need(t.lr > 0, f"trainer.lr must be positive (got {t.lr}).")
    need(len(t.betas) == 2 and all(0 <= b < 1 for b in t.betas), f"trainer.betas must be two numbers in [0, 1) (got {t.betas}).")
    need(t.grad_clip > 0, f"trainer.grad_clip must be positive (got {t.grad_clip}).")
    need(t.checkpoint_every >= 1, f"trainer.checkpoint_every must be at least 1 (got {t.checkpoint_every}).")
    need(t.keep_checkpoints >= 1, f"trainer.keep_checkpoints must be at least 1 (got {t.keep_checkpoints}).")
    need(a.clip_eps_low > 0 and a.clip_eps_high > 0, "algo.clip_eps_low and algo.clip_eps_high must be positive.")
    need(act.max_new_tokens >= 1, f"actor.max_new_tokens must be at least 1 (got {act.max_new_tokens}).")
    need(act.temperature > 0, f"actor.temperature must be positive (got {act.temperature}).")
    need(act.max_steps_ahead >= 0, f"actor.max_steps_ahead must be 0 or more (got {act.max_steps_ahead}).")
    need(act.max_concurrent_groups >= 1, "actor.max_concurrent_groups must be at least 1.")
    need(act.max_prefix_staleness >= 0, f"actor.max_prefix_staleness must be 0 or more (got {act.max_prefix_staleness}).")
    need(
        0 <= act.min_new_tokens <= act.max_new_tokens,
        f"actor.min_new_tokens ({act.min_new_tokens}) must be between 0 and actor.max_new_tokens ({act.max_new_tokens}).",
    )
    need(act.journal_flush_tokens >= 1, f"actor.journal_flush_tokens must be at least 1 (got {act.journal_flush_tokens}).")
    need(
        act.max_new_tokens < cfg.model.max_model_len,
        f"actor.max_new_tokens ({act.max_new_tokens}) must be below model.max_model_len "
        f"({cfg.model.max_model_len}) to leave room for the prompt.",
    )
    need(cfg.inference.num_servers >= 1, "inference.num_servers must be at least 1.")
    need(0 < cfg.inference.gpu_memory_utilization <= 1, "inference.gpu_memory_utilization must be in (0, 1].")
    need(cfg.model.source == "tiny" or bool(cfg.model.path), f"model.path must be set when model.source={cfg.model.source}.")
    _validate_tiny(cfg, need)
    need(
        cfg.model.source != "tiny" or cfg.dataset.name == "arithmetic",
        "model=tiny has a character vocabulary made for dataset=arithmetic; choose a real model for "
        f"dataset={cfg.dataset.name}.",
    )
    for host, key in ((cfg.inference.host, "inference.host"), (cfg.streams.host, "streams.host")):
        need(
            host in ("127.0.0.1", "localhost", "::1") or cfg.world.kind != "local",
            f"{key}={host}: with world=local servers listen on loopback only (127.0.0.1).",
        )
    _validate_fast_llm(cfg, need)
    _validate_streams(cfg, need)
    _validate_world(cfg, need)
    if problems:
        raise ConfigError("invalid configuration: " + " ".join(problems))


def _validate_tiny(cfg: RunConfig, need) -> None:
    """What building the tiny model would refuse, refused before the run directory exists."""
    m, d = cfg.model, cfg.dataset
    if m.source != "tiny":
        return
    need(m.warm_start_steps >= 0, f"model.warm_start_steps must be 0 or more (got {m.warm_start_steps}).")
    if d.name == "arithmetic" and d.max_operand >= 0:
        from rlrun.models.tiny import longest_sequence  # no torch at import

        longest = longest_sequence(d.max_operand)
        need(
            m.max_model_len >= longest,
            f"model.max_model_len={m.max_model_len} is too short for sums up to {d.max_operand}+{d.max_operand} "
            f"({longest} tokens): set model.max_model_len={longest} or more, or lower dataset.max_operand.",
        )


def _validate_fast_llm(cfg: RunConfig, need) -> None:
    t, f = cfg.trainer, cfg.trainer.fast_llm
    if f.train_iters is not None:
        need(
            f.train_iters == t.max_train_steps,
            f"trainer.fast_llm.train_iters ({f.train_iters}) disagrees with trainer.max_train_steps "
            f"({t.max_train_steps}): rlrun sets Fast-LLM's training.train_iters from "
            "trainer.max_train_steps, and the run is complete only when Fast-LLM reaches it. Set "
            "trainer.max_train_steps to the step count you want and remove trainer.fast_llm.train_iters.",
        )
    if t.backend != "fast_llm":
        return
    from rlrun.backends.fast_llm.revisions import AUTO, NAMES

    need(
        f.version == AUTO or f.version in NAMES,
        f"trainer.fast_llm.version={f.version} is not a Fast-LLM revision rlrun drives: choose {AUTO} (ask the "
        f"installed Fast-LLM) or one of {', '.join(NAMES)} (rlrun/backends/fast_llm/revisions.py).",
    )
    need(
        t.gradient_accumulation_passes == 1,
        f"trainer.gradient_accumulation_passes={t.gradient_accumulation_passes} has no effect with "
        "trainer=fast_llm: Fast-LLM ignores it and takes schedule.docs_per_step documents per step. "
        "Set trainer.gradient_accumulation_passes=1 and trainer.fast_llm.docs_per_step="
        f"{t.train_batch_size * t.gradient_accumulation_passes} (or trainer.train_batch_size) instead.",
    )
    if f.docs_per_step is not None:
        need(f.docs_per_step >= 1, f"trainer.fast_llm.docs_per_step must be at least 1 (got {f.docs_per_step}).")
    need(f.nproc_per_node >= 1, f"trainer.fast_llm.nproc_per_node must be at least 1 (got {f.nproc_per_node}).")
    if f.data_parallel is not None:
        need(f.data_parallel >= 1, f"trainer.fast_llm.data_parallel must be at least 1 (got {f.data_parallel}).")
    need(
        f.micro_batch_size >= cfg.model.max_model_len,
        f"trainer.fast_llm.micro_batch_size ({f.micro_batch_size} tokens) must hold a whole document of "
        f"model.max_model_len ({cfg.model.max_model_len}) tokens: Fast-LLM skips documents that do not fit.",
    )
    need(f.timeout_s > 0, f"trainer.fast_llm.timeout_s must be positive (got {f.timeout_s}).")
    need(0 <= f.broadcast_port < 65536, f"trainer.fast_llm.broadcast_port must be 0 (auto) or a port (got {f.broadcast_port}).")
    need(
        any("{config}" in arg for arg in f.command),
        f"trainer.fast_llm.command must pass the generated config file with a {{config}} placeholder (got {f.command}).",
    )
    names = (f.stream, f.consumer_group, f.events_stream)
    need(
        all(names) and f.stream != f.events_stream,
        "trainer.fast_llm.stream and trainer.fast_llm.events_stream must be two different non-empty names "
        f"(got {f.stream!r}, {f.events_stream!r}).",
    )
    need(bool(f.experiment_dir_name) and "/" not in f.experiment_dir_name,
         f"trainer.fast_llm.experiment_dir_name must be a plain folder name (got {f.experiment_dir_name!r}).")
    need(
        not _sharded_vllm(cfg.inference.extra_args),
        "trainer=fast_llm needs one vLLM worker per server: each server joins Fast-LLM's weight broadcast "
        "as one rank. Remove --tensor-parallel-size/--pipeline-parallel-size from inference.extra_args "
        "and use inference.num_servers for more servers.",
    )


def _sharded_vllm(extra_args) -> bool:
    """True when vLLM's extra arguments split a server over several workers (TP or PP > 1)."""
    args = [str(a) for a in extra_args]
    for i, arg in enumerate(args):
        for flag in ("--tensor-parallel-size", "--pipeline-parallel-size", "-tp", "-pp"):
            value = arg.split("=", 1)[1] if arg.startswith(flag + "=") else (args[i + 1] if arg == flag and i + 1 < len(args) else None)
            if value is not None and value.strip() not in ("", "1"):
                return True
    return False


def _validate_streams(cfg: RunConfig, need) -> None:
    from rlrun.streams.external import url_problems

    s = cfg.streams
    if s.url is None:
        need(s.password_file is None, "streams.password_file is the password of an external Redis: set streams.url too, or remove it.")
        return
    for problem in url_problems(s.url):
        need(False, problem + ".")
    need(
        cfg.trainer.backend != "fast_llm",
        "trainer=fast_llm needs the run's own Redis (it grants Fast-LLM's passwordless clients a restricted user "
        "of their own): unset streams.url.",
    )


def _validate_world(cfg: RunConfig, need) -> None:
    w = cfg.world
    if w.kind != "ray":
        return
    need(
        bool(w.address and w.address.strip()),
        "world.address must name the Ray cluster to join with world=ray: HOST:PORT of its head "
        "(as printed by `ray start --head`), or auto for the cluster this machine is part of.",
    )
    need(w.placement_timeout_s > 0, f"world.placement_timeout_s must be positive (got {w.placement_timeout_s}).")
    for role in ("redis", "vllm", "trainer", "actor"):
        place = getattr(w, role)
        need(
            place.cpus >= 0 and place.gpus >= 0 and all(v >= 0 for v in (place.resources or {}).values()),
            f"world.{role}: Ray resources cannot be negative (cpus={place.cpus}, gpus={place.gpus}, resources={place.resources}).",
        )
        need(
            place.local or bool(place.bundle()),
            f"world.{role} reserves no Ray resource, so Ray cannot place it: give it some "
            f"(world.{role}.cpus=1, world.{role}.gpus=1 or world.{role}.resources={{NAME: 1}}), "
            f"or run it on this machine with world.{role}.local=true.",
        )
