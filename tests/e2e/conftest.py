"""Helpers for end-to-end tests: run the real `rlrun` CLI and find what it left behind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

RUN_MARKERS = ("vllm.entrypoints", "valkey-server", "redis-server", "rlrun.trainer", "rlrun.actor", "rlrun train")


def our_processes(exclude: set[int]) -> list[str]:
    """Processes that look like a run's (vLLM, Redis, trainer, actor) and were not there before."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if proc.info["pid"] in exclude:
            continue
        cmd = " ".join(proc.info["cmdline"] or [])
        if any(marker in cmd for marker in RUN_MARKERS) and "pytest" not in cmd:
            found.append(f"{proc.info['pid']}: {cmd[:120]}")
    return found


def run_cli(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlrun", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture
def baseline_pids() -> set[int]:
    return {p.pid for p in psutil.process_iter()}
