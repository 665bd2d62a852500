"""Can `trainer.fast_llm.command` start here? The program it finally runs, found through its wrappers.

A launch command is often wrapped (`env VAR=1 torchrun --no_python fast-llm ...`, `bash -c "..."`);
checking only `argv[0]` would pass a command whose real program is missing (exit 6 after every
restart failed). Each wrapper is peeled off and what it runs checked.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from rlrun.errors import EnvironmentProblem

# Wrappers that run the rest of the command line; the value: how many arguments their options take
# (options written `-n 5` need to know that `5` is not the program).
_WRAPPERS: dict[str, set[str]] = {
    "env": {"-u", "--unset", "-C", "--chdir", "-S", "--split-string"},
    "nice": {"-n", "--adjustment"},
    "nohup": set(),
    "setsid": set(),
    "stdbuf": {"-i", "-o", "-e"},
    "ionice": {"-c", "-n", "-p", "--class", "--classdata"},
    "taskset": set(),  # its mask is positional: handled below
    "numactl": {
        "-C",
        "-N",
        "-m",
        "-p",
        "-i",
        "--physcpubind",
        "--cpunodebind",
        "--membind",
        "--preferred",
        "--interleave",
    },
    "timeout": {"-s", "--signal", "-k", "--kill-after"},
    "time": {"-f", "--format", "-o", "--output"},
    "chrt": set(),
    "exec": {"-a"},  # the shell builtin (inside `bash -c`)
}
# Wrappers with one positional argument before the program (the duration, the CPU mask, the priority).
_POSITIONAL = {"timeout": 1, "taskset": 1, "chrt": 1}
_TORCHRUN_VALUED = {
    "--nproc_per_node",
    "--nproc-per-node",
    "--nnodes",
    "--node_rank",
    "--node-rank",
    "--master_addr",
    "--master-addr",
    "--master_port",
    "--master-port",
    "--rdzv_backend",
    "--rdzv-backend",
    "--rdzv_endpoint",
    "--rdzv-endpoint",
    "--rdzv_id",
    "--rdzv-id",
    "--rdzv_conf",
    "--rdzv-conf",
    "--max_restarts",
    "--max-restarts",
    "--monitor_interval",
    "--monitor-interval",
    "--start_method",
    "--start-method",
    "--role",
    "--log_dir",
    "--log-dir",
    "-r",
    "--redirects",
    "-t",
    "--tee",
    "--local_addr",
    "--local-addr",
    "--logs_specs",
    "--logs-specs",
    "--local-ranks-filter",
    "--local_ranks_filter",
}
_SHELLS = {"sh", "bash", "dash", "zsh"}
_SHELL_BUILTINS = {
    "cd",
    ".",
    "source",
    "export",
    "set",
    "ulimit",
    "umask",
    "eval",
    "trap",
    "unset",
    "shopt",
    "declare",
    ":",
    "module",
}


def missing(argv: list[str], python: str = sys.executable) -> list[str]:
    """What `argv` needs and this machine lacks (empty: it can start), one phrase each.
    `python`: the interpreter a bare `python` / `torchrun` would run (this one by default)."""
    if not argv:
        return ["an empty command"]
    program, rest = argv[0], argv[1:]
    name = Path(program).name
    lacking = [] if _resolve(program) is not None else [f"{program} (not found)"]
    if name in _WRAPPERS:
        inner = _after_wrapper(name, rest)
        return lacking + (missing(inner, python) if inner else [])
    if lacking and name != "torchrun":  # torchrun's own arguments still say what it would run
        return lacking
    if name in _SHELLS and len(rest) >= 2 and rest[0] == "-c":
        try:
            inner = shlex.split(rest[1])
        except ValueError:
            return []  # a script we cannot read: the shell decides
        inner = _skip_assignments(inner)
        if inner[:1] and inner[0] in _SHELL_BUILTINS:
            return []  # `cd dir && ...`, `source env.sh; ...`: what follows is the shell's business
        if inner[:1] == ["exec"]:  # a shell builtin: what it runs is the program
            inner = _after_wrapper("exec", inner[1:])
        return missing(inner, python) if inner else []
    if name == "torchrun":
        return lacking + _torchrun(rest, python)
    if name.startswith("python"):
        interpreter = str(_resolve(program))
        if len(rest) >= 3 and rest[0] == "-m" and rest[1] in ("torch.distributed.run", "torch.distributed.launch"):
            return _torchrun(rest[2:], interpreter)
        return _python(rest, interpreter)
    return []


def ensure_launchable(argv: list[str]) -> None:
    """EnvironmentProblem naming what is missing when `argv` cannot start Fast-LLM here (exit 3)."""
    lacking = missing(argv)
    if lacking:
        raise EnvironmentProblem(
            f"cannot start Fast-LLM: {', '.join(lacking)} (command: {' '.join(argv)}). Install Fast-LLM on "
            "a machine with GPUs or on CPU with trainer.device=cpu (from its source: pip install 'fast-llm[CORE,OPTIONAL]', see https://servicenow.github.io/Fast-LLM/), "
            "or fix trainer.fast_llm.command, or use trainer=hf."
        )


def _resolve(program: str) -> Path | None:
    if os.sep in program:
        path = Path(program)
        return path if path.is_file() and os.access(path, os.X_OK) else None
    found = shutil.which(program)
    return Path(found) if found else None


def _skip_assignments(argv: list[str]) -> list[str]:
    i = 0
    while i < len(argv) and "=" in argv[i] and not argv[i].startswith("-"):
        i += 1
    return argv[i:]


def _after_wrapper(name: str, rest: list[str]) -> list[str]:
    """The command a wrapper runs: its options (and for env, VAR=value) skipped."""
    valued, i = _WRAPPERS[name], 0
    while i < len(rest) and rest[i].startswith("-") and rest[i] != "--":
        i += 2 if rest[i] in valued else 1
    if i < len(rest) and rest[i] == "--":
        i += 1
    if name == "env":
        return _skip_assignments(rest[i:])
    return rest[i + _POSITIONAL.get(name, 0) :]


def torchrun_target(rest: list[str]) -> tuple[list[str], bool, bool]:
    """What torchrun (given its arguments `rest`) runs: (that command, --no_python, -m)."""
    no_python, module, i = False, False, 0
    while i < len(rest) and rest[i].startswith("-"):
        option = rest[i].split("=", 1)[0]
        if option in ("--no_python", "--no-python"):
            no_python = True
        elif option in ("-m", "--module"):
            module = True
        elif option in _TORCHRUN_VALUED and "=" not in rest[i]:
            i += 1
        i += 1
    return rest[i:], no_python, module


def _torchrun(rest: list[str], python: str) -> list[str]:
    command, no_python, module = torchrun_target(rest)
    if not command:
        return ["the program torchrun should run (none given)"]
    return missing(command, python) if no_python else _runnable(command[0], module, python)


def _python(rest: list[str], python: str) -> list[str]:
    i = 0
    while i < len(rest) and rest[i].startswith("-") and rest[i] not in ("-m", "-c", "-"):
        i += 2 if rest[i] in ("-W", "-X") else 1
    if i >= len(rest) or rest[i] in ("-c", "-"):
        return []
    if rest[i] == "-m" and i + 1 >= len(rest):
        return ["the module python -m should run (none given)"]
    return _runnable(rest[i + 1] if rest[i] == "-m" else rest[i], rest[i] == "-m", python)


def _runnable(target: str, module: bool, python: str) -> list[str]:
    """A Python module that `python` can import, or a script that exists."""
    if module:
        return [] if _importable(target, python) else [f"Python module {target} (not importable by {python})"]
    return [] if Path(target).is_file() else [f"the script {target} (no such file)"]


def _importable(module: str, python: str) -> bool:
    if Path(python).resolve() == Path(sys.executable).resolve():
        try:
            return importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            return False
    code = "import importlib.util, sys; sys.exit(importlib.util.find_spec(sys.argv[1]) is None)"
    try:
        return subprocess.run([python, "-c", code, module], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False
