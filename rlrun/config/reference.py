"""The configuration reference (docs/config-reference.md), generated from the typed config.

    python -m rlrun.entrypoints.config_reference > docs/config-reference.md

Every field of the schema with its type, its default, what `rlrun train` without overrides uses
where that differs, and the comment written after it in the source (read with `tokenize` and `ast`);
then, per config group option, which keys it changes. tests/unit/test_docs.py fails when stale.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import json
import tokenize
import types
import typing
from typing import Annotated, Any, Literal, Union

from rlrun.config import schema
from rlrun.config.bounds import range_of
from rlrun.config.compose import GROUPS, composed, conf_dir, group_options

COMMAND = "python -m rlrun.entrypoints.config_reference > docs/config-reference.md"  # how it is regenerated


@dataclasses.dataclass(frozen=True)
class SourceNotes:
    comments: dict[str, dict[str, str]]  # class name -> field -> trailing comment
    docstrings: dict[str, str]  # class name -> docstring


def source_notes() -> SourceNotes:
    """Each schema field's trailing comment (on the line its definition ends on), each class's docstring."""
    source = inspect.getsource(schema)
    line_comments: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            line_comments[token.start[0]] = token.string.lstrip("#").strip()
    comments: dict[str, dict[str, str]] = {}
    docstrings: dict[str, str] = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        docstrings[node.name] = ast.get_docstring(node) or ""
        fields = comments.setdefault(node.name, {})
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                assert item.end_lineno is not None  # ast.parse sets it
                fields[item.target.id] = line_comments.get(item.end_lineno, "")
    return SourceNotes(comments, docstrings)


def type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Annotated:  # a numeric key's range (rlrun/config/bounds.py)
        bounds = range_of(tp)
        return type_name(args[0]) + (f", {bounds.describe()}" if bounds is not None else "")
    if origin in (Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        name = " or ".join(type_name(a) for a in inner)
        return f"{name} or null" if type(None) in args else name
    if origin is Literal:
        return "one of " + ", ".join(json.dumps(a) if isinstance(a, str) else str(a) for a in args)
    if origin is list:
        return f"list of {type_name(args[0])}"
    if origin is dict:
        return "mapping"
    if tp is Any:
        return "any"
    return getattr(tp, "__name__", str(tp))


def value_text(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    if isinstance(value, str):
        return json.dumps(value) if value == "" else value
    return repr(value)


def schema_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def same(a: Any, b: Any) -> bool:
    """Equal as config values (3e-4 == 0.0003, 1 == 1.0, but not True == 1)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return a == b


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def default_groups() -> dict[str, str]:
    import yaml

    data = yaml.safe_load((conf_dir() / "config.yaml").read_text())
    choices = [entry for entry in data.get("defaults", []) if isinstance(entry, dict)]
    return {group: str(option) for entry in choices for group, option in entry.items()}


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(data, dict) or not data:
        return {prefix: data}
    out: dict[str, Any] = {}
    for key, value in data.items():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else key))
    return out


def render() -> str:
    notes = source_notes()
    data = composed([])  # composed, not validated: a group option alone may not be a valid run
    shipped = flatten(data)
    defaults = default_groups()
    lines = [
        "# Configuration reference",
        "",
        "Generated from the typed config (`rlrun/config/schema.py`) and `conf/` by",
        f"`{COMMAND}`; `tests/unit/test_docs.py` fails when this file is stale. Do not edit it by hand.",
        "",
        "Every key can be overridden on the command line (`rlrun train trainer.lr=1e-4`); an unknown key",
        "is an error that names the valid ones. **default** is the schema's default (used when a key is",
        "absent from the YAML); **`rlrun train`** is what a run without overrides uses (`conf/config.yaml`",
        "with its default groups), shown only where it differs. `rlrun train --dry-run` prints the",
        "whole resolved config of any command line.",
        "",
        "## Config groups",
        "",
        "| group | options | default |",
        "|---|---|---|",
    ]
    for group in GROUPS:
        lines.append(f"| `{group}` | {', '.join(group_options(group))} | {defaults.get(group, '')} |")
    lines.append("")
    lines += _section(schema.RunConfig, "", notes, shipped, title="Top level")
    lines += _changes(data, defaults)
    return "\n".join(lines).rstrip() + "\n"


def _section(cls: type, path: str, notes: SourceNotes, shipped: dict, title: str | None = None) -> list[str]:
    hints = typing.get_type_hints(cls, include_extras=True)
    fields = dataclasses.fields(cls)
    scalars = [f for f in fields if not dataclasses.is_dataclass(hints[f.name])]
    nested = [f for f in fields if dataclasses.is_dataclass(hints[f.name])]
    out = _heading(min(2 + path.count("."), 4), title or f"`{path}`", cls, notes)
    if scalars:
        out += ["| key | type | default | `rlrun train` | meaning |", "|---|---|---|---|---|"]
        for f in scalars:
            key = f"{path}.{f.name}" if path else f.name
            default = schema_default(f)
            used = shipped.get(key, dataclasses.MISSING)
            default_text = "required" if default is dataclasses.MISSING else f"`{value_text(default)}`"
            used_text = "" if used is dataclasses.MISSING or same(used, default) else f"`{value_text(used)}`"
            comment = notes.comments.get(cls.__name__, {}).get(f.name, "")
            out.append(
                f"| `{key}` | {cell(type_name(hints[f.name]))} | {cell(default_text)} | {cell(used_text)} | {cell(comment)} |"
            )
        out.append("")
    by_type: dict[type, list[dataclasses.Field]] = {}
    for f in nested:
        by_type.setdefault(hints[f.name], []).append(f)
    for tp, group in by_type.items():
        if len(group) == 1:
            f = group[0]
            out += _section(tp, f"{path}.{f.name}" if path else f.name, notes, shipped)
            continue
        # One dataclass used for several keys (supervisor.redis, .vllm, ...): rendered once.
        instances = {f.name: schema_default(f) for f in group}  # a key's own default may differ
        out += _shared_section(tp, path, instances, notes, shipped, notes.comments.get(cls.__name__, {}))
    return out


def _heading(level: int, title: str, cls: type, notes: SourceNotes) -> list[str]:
    doc = notes.docstrings.get(cls.__name__, "")
    return [f"{'#' * level} {title}", "", *([" ".join(doc.split()), ""] if doc else [])]


def _shared_section(
    cls: type, path: str, instances: dict, notes: SourceNotes, shipped: dict, parent: dict
) -> list[str]:
    hints = typing.get_type_hints(cls, include_extras=True)
    names = list(instances)
    where = f"{path}.<{'|'.join(names)}>" if path else f"<{'|'.join(names)}>"
    out = _heading(min(3 + path.count("."), 4), f"`{cell(where)}`", cls, notes)
    for name in names:
        if parent.get(name):
            out.append(f"- `{path}.{name}`: {parent[name]}")
    out += ["", "| key | type | default | `rlrun train` | meaning |", "|---|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        default = schema_default(f)
        own = {n: getattr(i, f.name) for n, i in instances.items() if dataclasses.is_dataclass(i)}
        exceptions = [f"{n}: `{value_text(v)}`" for n, v in own.items() if not same(v, default)]
        default_text = f"`{value_text(default)}`" + (f" ({', '.join(exceptions)})" if exceptions else "")
        used = [(n, shipped.get(f"{path}.{n}.{f.name}", dataclasses.MISSING)) for n in names]
        differing = [
            f"{n}: `{value_text(v)}`"
            for n, v in used
            if v is not dataclasses.MISSING and not same(v, own.get(n, default))
        ]
        comment = notes.comments.get(cls.__name__, {}).get(f.name, "")
        out.append(
            f"| `{cell(f.name)}` | {cell(type_name(hints[f.name]))} | {cell(default_text)} | "
            f"{cell(', '.join(differing))} | {cell(comment)} |"
        )
    out.append("")
    return out


def effective(data: dict) -> dict[str, Any]:
    """Every key of a composed config, schema defaults filled in for keys the YAML leaves out."""
    from rlrun.config.build import from_dict

    return flatten(dataclasses.asdict(from_dict(schema.RunConfig, data)))


def _changes(shipped: dict, defaults: dict[str, str]) -> list[str]:
    """Per group option other than the default one: the keys it changes, from → to."""
    base = effective(shipped)
    out = [
        "## What each group option changes",
        "",
        "Against `rlrun train` without overrides (composed, not validated: some options need others,",
        "e.g. `dataset=gsm8k` needs a real model).",
        "",
    ]
    for group in GROUPS:
        for option in group_options(group):
            if option == defaults.get(group):
                continue
            changed = effective(composed([f"{group}={option}"]))
            diffs = [(key, base.get(key), value) for key, value in changed.items() if not same(base.get(key), value)]
            out.append(f"### `{group}={option}`")
            out.append("")
            for key, before, after in diffs:
                out.append(f"- `{key}`: `{value_text(before)}` → `{value_text(after)}`")
            if not diffs:
                out.append("- (no change)")
            out.append("")
    return out
