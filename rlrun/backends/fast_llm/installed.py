"""What the installed Fast-LLM is, asked of it before a run starts (preflight): which revision's
config it accepts (none: exit 2, never a crash loop), and who hosts the weight broadcast's TCP
store (it depends on its torch). Each answer costs one short process, remembered per rlrun process.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Literal, Optional

from rlrun.backends.fast_llm.config import LAUNCH_ENV, config_text, launch_argv
from rlrun.backends.fast_llm.launchable import torchrun_target
from rlrun.backends.fast_llm.revisions import REVISIONS, Revision, candidates
from rlrun.config.schema import RunConfig
from rlrun.errors import ConfigError

log = logging.getLogger(__name__)

VALIDATE_TIMEOUT_S = 300.0  # importing Fast-LLM and reading the pretrained model's config
PROBE_TIMEOUT_S = 120.0
StoreHost = Literal["trainer", "rlrun"]

_CONFIG = "{validated-config}"  # where the config file goes in the validation command
# Placeholders for what is only known at launch (ports): validation reads them, opens nothing.
_PLACEHOLDERS = dict(redis_host="127.0.0.1", redis_port=6379, broadcast_host="127.0.0.1", broadcast_port=29500)


def program_argv(argv: list[str]) -> list[str]:
    """The Fast-LLM program and its arguments inside a launch command: what torchrun runs when the
    command is `torchrun [options] --no_python PROGRAM ...`, else `argv`."""
    if runs_under_torchrun(argv):
        return torchrun_target(argv[1:])[0]
    return list(argv)


def runs_under_torchrun(argv: list[str]) -> bool:
    return bool(argv) and Path(argv[0]).name == "torchrun"


def choose_revision(cfg: RunConfig, model_path: str, experiment_dir: Path) -> Revision:
    """The revision whose config the installed Fast-LLM accepts (trainer.fast_llm.version, or the
    first of the table with `auto`); ConfigError (exit 2) with Fast-LLM's own words otherwise."""
    f = cfg.trainer.fast_llm
    refusals = []
    argv = tuple(program_argv(launch_argv(cfg, Path(_CONFIG))) + ["-v"])
    for revision in candidates(f.version):
        text = config_text(cfg, revision, experiment_dir=experiment_dir, model_path=model_path, **_PLACEHOLDERS)
        refusal = _refusal(argv, text)
        if refusal is None:
            log.info("Fast-LLM accepts the config of revision %s", revision.name)
            _refuse_broken(cfg, revision)
            return revision
        refusals.append((revision, refusal))
    tried = "; ".join(f"revision '{r.name}': {why}" for r, why in refusals)
    hint = (
        "Set trainer.fast_llm.version=auto to let rlrun find the revision, or install one of the "
        'revisions rlrun supports (docs/operations.md, "Fast-LLM")'
        if f.version != "auto"
        else 'Install one of the revisions rlrun supports (docs/operations.md, "Fast-LLM"), or fix the key '
        "through trainer.fast_llm.extra if it came from there"
    )
    raise ConfigError(f"Fast-LLM refuses the config rlrun generated for this run ({tried}). {hint}.")


def _refuse_broken(cfg: RunConfig, revision: Revision) -> None:
    """ConfigError when the run's loss is known to fail at this revision (a crash loop otherwise)."""
    for algo, what in revision.broken:
        if cfg.algo.name == algo:
            raise ConfigError(
                f"Fast-LLM revision '{revision.name}' ({revision.checked_against[0]}) accepts the config, but {what}. "
                f"Use recipe=math_grpo (algo.name=grpo) with it, or a revision where {algo} works "
                f"(trainer.fast_llm.version: {', '.join(r.name for r in REVISIONS if r is not revision)})."
            )


@functools.lru_cache(maxsize=16)
def _refusal(argv: tuple[str, ...], config_text: str) -> Optional[str]:
    """None when Fast-LLM's validate-only command `argv` accepts `config_text` (written to a
    temporary file named where `argv` says {_CONFIG}), else what it said was wrong."""
    with tempfile.TemporaryDirectory(prefix="rlrun-fast-llm-") as tmp:
        config = Path(tmp) / "fast_llm.yaml"
        config.write_text(config_text)
        try:
            done = subprocess.run(
                [arg.replace(_CONFIG, str(config)) for arg in argv],
                env={**os.environ, **LAUNCH_ENV},
                cwd=tmp,
                capture_output=True,
                text=True,
                timeout=VALIDATE_TIMEOUT_S,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            return f"its validation ({' '.join(argv)}) did not finish in {VALIDATE_TIMEOUT_S:.0f} s"
    if done.returncode == 0:
        return None
    return refusal_summary(done.stdout + done.stderr) or f"its validation exited {done.returncode}"


_ERROR = re.compile(r"\w*(?:Error|Exception): .*")
_FIELD = re.compile(r"(?P<kind>Validation failed for field|Unknown field) `(?:!!! )?(?P<name>[^`]+)`(?P<rest>.*)")


def refusal_summary(output: str, limit: int = 6) -> str:
    """What Fast-LLM's output says is wrong, each with the key's whole path: its validation error
    nests one `Validation failed for field` line per level, two spaces deeper each (fast_llm/config.py
    `_validate_nested`), down to `Unknown field` lines or a failure with its message (or, for an
    unexpected exception, a stack trace whose last error line says it). Else its last error line."""
    lines = output.splitlines()
    stack: list[tuple[int, str]] = []  # (indentation, field) of the enclosing levels
    leaves: list[str] = []
    for number, line in enumerate(lines):
        match = _FIELD.search(line)
        if match is None:
            continue
        before = line[: match.start()]
        indent = len(before) if not before.strip() else 0  # the first line follows the exception's name
        while stack and stack[-1][0] >= indent:
            stack.pop()
        name, rest = match.group("name"), match.group("rest")
        path = _key_path([field for _, field in stack] + [name])
        if match.group("kind") == "Unknown field":
            leaves.append(f"`{path}`: unknown key ({_short_class(rest)})")
            continue
        if rest.strip() == ":" or (
            " of type " in rest and rest.rstrip().endswith(":")
        ):  # a level: its failures follow, deeper
            stack.append((indent, name))
            continue
        message = rest.split(":", 1)[1].strip() if ":" in rest else ""
        if not message:  # an unexpected exception: the last error line of the stack trace that follows
            trace = next((i for i in range(number + 1, len(lines)) if _FIELD.search(lines[i])), len(lines))
            errors = [m.group(0) for m in map(_ERROR.search, lines[number + 1 : trace]) if m]
            message = errors[-1] if errors else "invalid"
        leaves.append(f"`{path}`: {message}")
    if leaves:
        return " | ".join(leaves[:limit]) + (f" | (and {len(leaves) - limit} more)" if len(leaves) > limit else "")
    errors = [m.group(0).strip() for m in map(_ERROR.search, lines) if m]
    return errors[-1] if errors else ""


def _key_path(fields: list[str]) -> str:
    """`model`, `losses`, `losses[grpo]`, `policy_loss` -> model.losses[grpo].policy_loss (a dict's
    entry is a level of its own in Fast-LLM's message, named after the dict)."""
    path: list[str] = []
    for field in fields:
        if path and field.startswith(path[-1] + "["):
            path[-1] = field
        else:
            path.append(field)
    return ".".join(path)


def _short_class(rest: str) -> str:
    """' in class fast_llm.x.y.LossConfig' -> 'in LossConfig'."""
    words = rest.split()
    return f"in {words[-1].rsplit('.', 1)[-1]}" if len(words) >= 3 and words[-2] == "class" else rest.strip()


# --- who hosts the broadcast's store ------------------------------------------------------------------

_STORE_PROBE = """
import datetime, os, socket, sys
import torch.distributed as dist
os.environ.update(TORCHELASTIC_USE_AGENT_STORE="True", TORCHELASTIC_RESTART_COUNT="0",
                  MASTER_ADDR="127.0.0.1", MASTER_PORT="1")
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
try:
    next(dist.rendezvous(f"tcp://127.0.0.1:{port}", 0, 1, timeout=datetime.timedelta(seconds=3)))
    print("rank0-hosts")
except Exception:
    print("rank0-waits")
"""


def store_host(cfg: RunConfig) -> StoreHost:
    """Who serves the broadcast's TCP store: `trainer` (Fast-LLM's rank 0) or `rlrun` (the
    weight follower). trainer.fast_llm.broadcast_store decides, or with `auto` the probe does."""
    chosen = cfg.trainer.fast_llm.broadcast_store
    if chosen != "auto":
        return chosen
    argv = launch_argv(cfg, Path("fast_llm.yaml"))
    if not runs_under_torchrun(argv):
        return "trainer"  # no elastic agent: rank 0 hosts in every torch
    python = program_python(program_argv(argv))
    if python is None:
        log.warning(
            "could not find the Python that runs Fast-LLM (%s) to ask its torch who hosts the weight broadcast's "
            "store; assuming Fast-LLM's rank 0 does (torch >= 2.14). Set trainer.fast_llm.broadcast_store=rlrun "
            "if Fast-LLM runs on torch <= 2.13.",
            " ".join(argv),
        )
        return "trainer"
    return _probe_store(python)


@functools.lru_cache(maxsize=4)
def _probe_store(python: str) -> StoreHost:
    try:
        done = subprocess.run(
            [python, "-c", _STORE_PROBE],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("the store probe in %s failed (%s); assuming Fast-LLM's rank 0 hosts the store", python, exc)
        return "trainer"
    answer = done.stdout.strip().splitlines()[-1:] or [""]
    if answer[0] == "rank0-waits":
        log.info("Fast-LLM's torch (%s) makes rank 0 a client under torchrun: rlrun hosts the broadcast store", python)
        return "rlrun"
    if answer[0] != "rank0-hosts":
        log.warning(
            "the store probe in %s said %r; assuming Fast-LLM's rank 0 hosts the store",
            python,
            (done.stdout + done.stderr)[-300:],
        )
    return "trainer"


def program_python(program: list[str]) -> Optional[str]:
    """The Python interpreter that runs `program` (a Python itself, or a script whose `#!` line
    names one), or None when that cannot be told."""
    if not program:
        return None
    path = shutil.which(program[0]) or (program[0] if os.access(program[0], os.X_OK) else None)
    if path is None:
        return None
    if Path(path).name.startswith("python"):
        return path
    try:
        with open(path, "rb") as file:
            first = file.readline(512).decode(errors="replace").strip()
    except OSError:
        return None
    if not first.startswith("#!"):
        return None
    words = first[2:].split()
    if words and Path(words[0]).name == "env":
        words = [w for w in words[1:] if not w.startswith("-")]
        words[:1] = [shutil.which(words[0]) or words[0]] if words else []
    return words[0] if words and Path(words[0]).name.startswith("python") else None
