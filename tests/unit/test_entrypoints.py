"""rlrun's own role processes start from `rlrun.entrypoints.<role>`: the run's specs name those
modules, and each, started as a module the way a spec starts it, reads its role file and turns
one it cannot use into exit 2 (never retried) with one message and no traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rlrun.config import compose
from rlrun.errors import ExitCode
from rlrun.run.built import build
from rlrun.run.plan import build_plan
from rlrun.rundir import RunDir


def rlrun_modules(cfg, tmp_path) -> dict[str, str]:
    """Each process started as `python -m rlrun...`: its name and module (after any wrapper)."""
    out = {}
    for spec in build_plan(build(cfg), RunDir(tmp_path), preview=True).specs:
        starts = [i for i, arg in enumerate(spec.argv[:-1]) if arg == "-m" and spec.argv[i + 1].startswith("rlrun.")]
        if starts:
            out[spec.name] = spec.argv[starts[-1] + 1]  # a rank group wraps the trainer's own command
    return out


def test_the_runs_role_processes_start_from_their_entry_points(tmp_path):
    cfg, _ = compose(["actor.num_actors=2", "inference.num_servers=2", "trainer.nproc_per_node=2", "trainer.gradient_accumulation_passes=2"])
    assert rlrun_modules(cfg, tmp_path) == {
        "trainer": "rlrun.entrypoints.trainer", "actor-0": "rlrun.entrypoints.actor", "actor-1": "rlrun.entrypoints.actor",
    }  # fmt: skip
    fast_llm, _ = compose(["trainer=fast_llm", "trainer.device=cpu"])  # Fast-LLM itself is not ours: its weight follower is
    assert rlrun_modules(fast_llm, tmp_path) == {"weights": "rlrun.entrypoints.weights", "actor": "rlrun.entrypoints.actor"}


@pytest.mark.parametrize("role", ["actor", "trainer", "weights"])
def test_a_role_file_that_cannot_be_used_exits_2_with_one_message(role, tmp_path):
    bad = tmp_path / f"{role}.yaml"
    bad.write_text("format: 0\n")
    proc = subprocess.run([sys.executable, "-m", f"rlrun.entrypoints.{role}", str(bad)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == int(ExitCode.USAGE), proc.stderr[-2000:]
    assert f"{bad} is not an rlrun role file" in proc.stderr and "Traceback" not in proc.stderr


# A role whose loop is inside a synchronous stretch (a group delivered, then audited) when SIGTERM
# comes: it prints "delivered", waits without yielding to the loop until the test says it has sent
# SIGTERM (the file argv[1] exists: the signal came inside the stretch, however late), prints
# "audited", then waits.
ASYNC_ROLE = """
import asyncio, os, signal, sys, time
from rlrun.entrypoints import die_of, run_until_sigterm

async def role():
    print("delivered", flush=True)
    while not os.path.exists(sys.argv[1]):  # SIGTERM arrives here
        time.sleep(0.01)
    print("audited", flush=True)
    await asyncio.sleep(600)

stopped = run_until_sigterm(role())
print("closed", stopped, flush=True)  # what the entry point closes before it dies
die_of(signal.SIGTERM)
"""


def test_sigterm_stops_an_async_role_between_two_waits_and_it_dies_of_sigterm(tmp_path):
    import signal

    sent = tmp_path / "sigterm-sent"
    child = subprocess.Popen([sys.executable, "-c", ASYNC_ROLE, str(sent)], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "delivered"
    child.send_signal(signal.SIGTERM)  # inside the synchronous stretch
    sent.touch()
    rest, _ = child.communicate(timeout=30)
    assert rest.split("\n")[:2] == ["audited", "closed True"]  # the stretch finished, then the role closed
    assert child.returncode == -signal.SIGTERM  # the supervisor still reads "killed by SIGTERM"
