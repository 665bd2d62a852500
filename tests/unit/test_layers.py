"""The layers of rlrun/ hold: no module imports from a layer above its own.

How the layers are counted: every module of rlrun/ is read with `ast` (never imported), and every
`import rlrun...` / `from rlrun... import ...` in it is an edge, wherever it sits: at the top, inside
a function, under `TYPE_CHECKING`. `from rlrun.cli import app` is an edge to the submodule
`rlrun.cli.app` when there is one, else to the package (`rlrun.config`'s `RunConfig` is an edge to
`rlrun/config/__init__.py`). An edge is one (importer, imported) pair of modules, counted once
however many names or lines make it. A module's layer is its package's (the first folder under
rlrun/; a module at the top, `errors` or `rundir`, is its own name), placed in LAYERS below; an
edge climbs when the imported module's layer is above the importer's. Modules of one layer may
import each other.

Counted so (issue 27, the regrouping): 21 edges of 375 climbed on main's layout (the 23 modules
at the top of rlrun/ given the layer of the folder they moved to), 17 of 369 after the moves (the
weight broadcast out of backends/, the test-only Redis helpers out of the package); 16 of 409 once
the roles' mains became rlrun/entrypoints/ and the trainer was split; 11 of 406 once the run is
built once (rlrun/run/built.py: the backend bound in one place and handed down; the backend's and
the model's own config checks asked by preflight); none once the network helpers sit at the
bottom (rlrun/listen.py), actor names with the other per-actor names (streams/names.py), and the
SLURM, vLLM-argument and external-Redis checks are asked by preflight too. KNOWN_CLIMBS is where
a climb would have to be listed, with its reason; it can only shrink.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "rlrun"

# Bottom to top. The order is the code's: each layer imports only from the layers before it (and
# from itself), except KNOWN_CLIMBS.
LAYERS: list[set[str]] = [
    {"rlrun", "errors", "rundir", "listen"},  # the package, its errors, the run directory's paths, where sockets listen: every layer reads them
    {"config"},  # the typed config
    {"rules", "streams", "journal", "models", "task", "telemetry"},  # pure rules, Redis streams and journal, models, tasks, records
    {"supervisor"},  # starting, watching, restarting and stopping processes (knows no role)
    {"parts"},  # what the run's processes are built and watched with: role files, spec parts, sockets, progress
    {"inference", "weights"},  # the vLLM server rlrun starts; the weight broadcast into it
    {"actor", "trainer"},  # the two roles rlrun writes
    {"backends"},  # everything about one trainer: its processes, completion, checkpoints
    {"cluster"},  # where a process runs (local, Ray, SLURM): spawners that start the roles' processes
    {"run"},  # the run's lifecycle: preflight, launch, resume, its roles, its lock
    {"cli", "__main__", "entrypoints"},  # the command line; the roles' thin entry points (issue 27)
]

# (importer, imported) pairs that climb today, each with why; the test fails once one is gone, so
# this list can only shrink.
KNOWN_CLIMBS: dict[tuple[str, str], str] = {
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported_modules(name: str, path: Path) -> set[str]:
    """The rlrun modules `name` imports, at any level of its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in MODULES else source for a in node.names]
        else:
            continue
        for target in targets:
            if target != "rlrun" and not target.startswith("rlrun."):
                continue
            while target not in MODULES and "." in target:  # `import rlrun.a.b.C`: the module that holds it
                target = target.rpartition(".")[0]
            if target != name:
                found.add(target)
    return found


def layer(name: str) -> int:
    parts = name.split(".")
    key = parts[1] if len(parts) > 1 else parts[0]
    for index, members in enumerate(LAYERS):
        if key in members:
            return index
    raise AssertionError(f"{name}: its package {key!r} has no place in LAYERS (tests/unit/test_layers.py); add it where it belongs")


EDGES = {(name, target) for name, path in MODULES.items() for target in imported_modules(name, path)}


def climbs() -> set[tuple[str, str]]:
    return {(a, b) for a, b in EDGES if layer(b) > layer(a)}


def test_every_module_has_a_layer():
    for name in MODULES:
        layer(name)


def test_no_module_imports_from_a_layer_above_its_own():
    new = sorted(climbs() - KNOWN_CLIMBS.keys())
    assert not new, "imports that climb the layers (LAYERS in tests/unit/test_layers.py):\n" + "\n".join(
        f"  {a} (layer {layer(a)}) imports {b} (layer {layer(b)})" for a, b in new
    )


def test_the_known_climbs_are_still_there_so_the_list_only_shrinks():
    gone = sorted(KNOWN_CLIMBS.keys() - climbs())
    assert not gone, "no longer climbing: remove them from KNOWN_CLIMBS in tests/unit/test_layers.py:\n" + "\n".join(
        f"  {a} -> {b}" for a, b in gone
    )


def test_the_import_graph_is_read_from_every_kind_of_import():
    # the reader itself, on forms the package uses: a function-level import, a TYPE_CHECKING one,
    # a name from a package's __init__ and a submodule named in `from package import module`
    assert ("rlrun.parts.sockets", "rlrun.streams.server") in EDGES  # inside a function
    assert ("rlrun.backends", "rlrun.parts.progress") in EDGES  # under TYPE_CHECKING
    assert ("rlrun.run.built", "rlrun.config") in EDGES  # RunConfig from config/__init__.py
    assert ("rlrun.run.launch", "rlrun.run.preflight") in EDGES  # `from rlrun.run import preflight, runlock`
