"""Hydra composition, and the saved resolved config.

`compose(overrides)`: a validated `RunConfig` and the resolved YAML saved in the run directory;
`load_resolved` reads it back; `rlrun resume` changes it with `override_resolved`, in the same
override grammar as `rlrun train`.
"""

from __future__ import annotations

import copy
import re
import typing
from pathlib import Path
from typing import cast

import yaml

from rlrun.config.build import (
    from_dict,
    omegaconf_errors,
    to_plain,
    type_at,
    typed,
    unknown_key_message,
    unwrap_optional,
    validate,
)
from rlrun.config.problems import refuse
from rlrun.config.relevance import ignored_overrides, rule_for
from rlrun.config.schema import RunConfig
from rlrun.errors import ConfigError

GROUPS = ("recipe", "trainer", "inference", "streams", "model", "dataset", "world")


def conf_dir() -> Path:
    """The shipped `conf/` folder (next to the package in a source checkout)."""
    here = Path(__file__).resolve().parent
    for candidate in (here.parent.parent / "conf", here.parent / "conf"):
        if (candidate / "config.yaml").is_file():
            return candidate
    raise ConfigError(f"cannot find rlrun's conf/ folder near {here}; reinstall rlrun from its source tree.")


def group_options(group: str) -> list[str]:
    return sorted(p.stem for p in (conf_dir() / group).glob("*.yaml"))


def compose(overrides: list[str]) -> tuple[RunConfig, str]:
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    _check_group_choices(overrides)
    try:
        data = composed(overrides)
    except yaml.YAMLError as exc:  # a recipe (or any file of conf/) that is not YAML
        mark = getattr(exc, "problem_mark", None)
        where = f"{mark.name}, line {mark.line + 1}" if mark is not None else f"a file under {conf_dir()}"
        raise ConfigError(
            f"{where} is not valid YAML ({' '.join(str(getattr(exc, 'problem', None) or exc).split())}): fix that file, or "
            f"choose another option of its group."
        ) from None
    except UnicodeDecodeError as exc:
        chosen = ", ".join(o for o in overrides if o.split("=", 1)[0] in GROUPS) or "the default groups"
        raise ConfigError(
            f"a file of {conf_dir()} that {chosen} chose is not UTF-8 text ({exc.reason}): fix that file."
        ) from None
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        raise ConfigError(_explain(exc, overrides)) from None
    absolute_task_paths(data)
    cfg = config_from_data(data, source="the composed config")
    refuse(ignored_overrides(cfg, list(overrides)))
    return cfg, yaml.safe_dump(data, sort_keys=False)


def composed(overrides: list[str]) -> dict:
    """Hydra's composition of conf/ and `overrides` as plain data, not checked against the schema."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3", job_name="rlrun"):
        composition = hydra_compose(config_name="config", overrides=list(overrides))
        return cast(dict, OmegaConf.to_container(composition, resolve=True))  # a DictConfig's container is a dict


def absolute_task_paths(data: dict) -> None:
    """The task's files and reward files that exist here, made absolute in the saved config: every
    role, and `rlrun resume` from another directory, reads the same ones (hub names stay as given)."""

    def absolute(path: str) -> str:
        found = Path(path).expanduser()
        return str(found.resolve()) if found.exists() else path

    def absolute_ref(ref):
        where, _, name = ref.rpartition(":") if isinstance(ref, str) else ("", "", "")
        return f"{absolute(where)}:{name}" if where.endswith(".py") else ref

    dataset, reward, environment = data.get("dataset") or {}, data.get("reward") or {}, data.get("environment") or {}
    for key in ("train_files", "eval_files"):
        if isinstance(dataset.get(key), list):
            dataset[key] = [absolute(p) if isinstance(p, str) else p for p in dataset[key]]
    if isinstance(reward.get("functions"), list):
        reward["functions"] = [absolute_ref(ref) for ref in reward["functions"]]
    for key in ("step", "tools"):
        if environment.get(key):
            environment[key] = absolute_ref(environment[key])


def load_resolved(path: Path) -> RunConfig:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read the run's config {path}: {exc}") from None
    return config_from_data(data, source=str(path))


def config_from_data(data: object, source: str) -> RunConfig:
    """A resolved config already read (config.yaml, a role file) → the checked RunConfig."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source} holds no config mapping (got {type(data).__name__}).")
    cfg = from_dict(RunConfig, data)
    validate(cfg)
    return cfg


def _check_group_choices(overrides: list[str]) -> None:
    """Name the valid choices for `group=option` before Hydra gives its longer message."""
    for item in overrides:
        match = re.fullmatch(r"([+~]*)(\w+)=(.*)", item)
        if not match or match.group(2) not in GROUPS:
            continue
        group, option = match.group(2), match.group(3)
        choices = group_options(group)
        if option not in choices:
            raise ConfigError(
                f"unknown {group} '{option}' in '{item}'. Valid choices for {group}: "
                f"{', '.join(choices)}. Example: rlrun train {group}={choices[0] if choices else '...'}"
            )


def _explain(exc: Exception, overrides: list[str]) -> str:
    text = str(exc)
    found = re.search(r"Could not override '([\w.]+)'", text) or re.search(r"Key '(\w+)' is not in struct", text)
    if found is None:
        if "Could not find" in text or "Available options" in text:
            return "configuration error: " + " ".join(text.split())
        return f"invalid override ({', '.join(overrides) or 'none'}): {' '.join(text.split())}"
    key = found.group(1)
    # A real key that the chosen options leave out of the composed config (trainer.fast_llm.* with
    # trainer=hf, world.address with world=local): say why it does not apply, not "unknown".
    append = re.search(r"To append to your config use (.+)", text)
    mapping = _free_form_mapping(key)
    if append and mapping:  # new keys in a mapping of the user's own (dataset.task_args)
        return (
            f"invalid override: {key} adds keys to the mapping {mapping}, which Hydra does with a +: "
            f"{append.group(1)} (to replace the mapping instead, clear it first: ~{mapping} {append.group(1)})."
        )
    rule = rule_for(key) if type_at(key) is not None else None
    if rule is not None:
        return f"invalid configuration: {key} has no effect here: {rule[2]}."
    return unknown_key_message(key)


def _free_form_mapping(dotted: str) -> str | None:
    """The free-form mapping of the schema (a dict field: dataset.task_args) that `dotted` is or is inside."""
    parts = dotted.split(".")
    prefixes = (".".join(parts[:n]) for n in range(1, len(parts) + 1))
    return next((p for p in prefixes if typing.get_origin(unwrap_optional(type_at(p))) is dict), None)


def override_resolved(data: dict, overrides: list[str]) -> tuple[dict, list[tuple[str, object, object]]]:
    """Hydra's `key=value` overrides (train's grammar) applied to a saved resolved config: the new
    plain config (only the changed keys change) and the changes as (key, before, after)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType
    from hydra.errors import HydraException
    from omegaconf import Container, OmegaConf

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException as exc:
        raise ConfigError(f"invalid override ({', '.join(overrides)}): {' '.join(str(exc).split())}") from None
    node = typed(data)
    changes: list[tuple[str, object, object]] = []
    for override in parsed:
        if override.type is not OverrideType.CHANGE or override.package is not None or override.is_sweep_override():
            raise ConfigError(
                f"invalid override '{override.input_line}': only key=value changes an existing key here, "
                "e.g. trainer.max_train_steps=500."
            )
        key, value = override.key_or_group, override.value()
        with omegaconf_errors():
            before = OmegaConf.select(node, key, throw_on_missing=True)
            OmegaConf.update(node, key, value, merge=True)
        changes.append((key, OmegaConf.to_container(before) if isinstance(before, Container) else before, value))
    checked, new = to_plain(node), copy.deepcopy(data)
    for key, _before, _after in changes:
        *parents, leaf = key.split(".")
        source, target = checked, new
        for part in parents:
            source, target = source[part], target.setdefault(part, {})
        target[leaf] = source[leaf]  # as the schema converted it (3 → 3.0 for a float)
    return new, changes
