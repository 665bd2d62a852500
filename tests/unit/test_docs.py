"""The docs say what the code does: the generated config reference is current, and every metrics
field the trainer writes is documented."""

from __future__ import annotations

import dataclasses
import difflib
import re
import typing
from pathlib import Path

from rlrun.config import schema
from rlrun.config.reference import COMMAND, render, source_notes
from rlrun.telemetry.metrics import FIELDS

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_the_config_reference_is_generated_from_the_current_code():
    expected = render()
    actual = (DOCS / "config-reference.md").read_text()
    if actual != expected:
        diff = "".join(difflib.unified_diff(actual.splitlines(True), expected.splitlines(True), "docs/config-reference.md", "generated", n=1))
        raise AssertionError(f"docs/config-reference.md is stale; regenerate it with `{COMMAND}`:\n{diff[:4000]}")


def test_every_config_key_is_in_the_reference_with_its_comment():
    text = (DOCS / "config-reference.md").read_text()
    notes = source_notes()

    def walk(cls, path):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            key = f"{path}.{f.name}" if path else f.name
            if dataclasses.is_dataclass(hints[f.name]):
                yield from walk(hints[f.name], key)
            else:
                yield cls.__name__, f.name, key

    keys = list(walk(schema.RunConfig, ""))
    assert len(keys) > 80
    for owner, name, key in keys:
        in_table = f"`{key}`" in text or (owner in ("RoleSupervision", "RolePlacement") and f"| `{name}` |" in text)
        assert in_table, f"{key} is missing from docs/config-reference.md"
        comment = notes.comments[owner][name]
        assert comment, f"{owner}.{name} in rlrun/config/schema.py has no comment: say what it means"
        assert comment.replace("|", "\\|") in text


def test_every_metrics_field_is_documented_in_operations_in_order():
    text = (DOCS / "operations.md").read_text()
    section = text.split("## Metrics", 1)[1].split("\n## ", 1)[0]
    documented = re.findall(r"^\| `(\w+)` \|", section, re.MULTILINE)
    assert documented == list(FIELDS), "docs/operations.md's metrics table and rlrun.telemetry.metrics.FIELDS differ"


def test_every_module_is_on_the_architecture_map():
    """docs/architecture.md names every module of rlrun/: by its path, or by its file name on a
    line that names its package's folder (`rlrun/actor/loop.py`, `ledger.py`)."""
    package = Path(__file__).resolve().parents[2] / "rlrun"
    lines = (DOCS / "architecture.md").read_text().splitlines()
    missing = []
    for path in sorted(package.rglob("*.py")):
        if path.name in ("__init__.py", "__main__.py"):
            continue
        full = f"rlrun/{path.relative_to(package)}"
        folder = f"rlrun/{path.parent.relative_to(package)}/".replace("rlrun/./", "rlrun/")
        named_in_folder = folder != "rlrun/" and any(folder in line and re.search(rf"[`/]{re.escape(path.name)}`", line) for line in lines)
        if not named_in_folder and not any(full in line for line in lines):
            missing.append(full)
    assert not missing, f"modules missing from docs/architecture.md: {missing}"
