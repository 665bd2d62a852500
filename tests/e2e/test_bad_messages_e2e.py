"""Malformed messages injected into every stream rlrun reads in one live tiny run: the trainer's
input (`rlrun:groups`) and the token journal (a corrupt entry in an open group's log, replayed by
an actor restarted after a SIGKILL). The run
still completes at exactly `max_train_steps`, and every bad message is counted where it is read.
The same run shows that no secret of the run leaks into a command line or a file, restarts included.
"""

from __future__ import annotations

import ast
import json
import re
import time
from pathlib import Path

import psutil
import pytest

from rlrun.journal.store import KEY_PREFIX
from rlrun.streams import names
from rlrun.streams.server import connect, redis_url
from rlrun.trainer.checkpoint import latest_complete, read_state

from .conftest import current_pid, leaked_secrets, left_behind, read_jsonl, start_rlrun, steps_done, wait_for

pytestmark = pytest.mark.e2e

STEPS = 6  # groups for several steps are still to come when the bad ones are injected after step 1
ARGS = [
    "recipe=math_grpo", f"trainer.max_train_steps={STEPS}", "trainer.train_batch_size=64", "trainer.checkpoint_every=100",
    "actor.max_new_tokens=24", "actor.min_new_tokens=16", "actor.journal_flush_tokens=1", "actor.max_concurrent_groups=8",
    "supervisor.stop_grace_s=5",
]  # fmt: skip

BAD_GROUPS = [
    {"data": "{not json"},
    {"payload": "no data field"},
    {"data": json.dumps({"schema_version": 1, "group_id": "forged", "prompt_index": 0, "prompt_ids": [1], "samples": []})},
]
BAD_LOG_ENTRIES = ["{not json", json.dumps({"schema_version": 99, "kind": "append", "index": 0})]


def redis_client(run_dir: Path):
    port = int(re.search(r"^port (\d+)$", (run_dir / "redis" / "redis.conf").read_text(), re.M).group(1))
    password = (run_dir / "secrets" / "redis.password").read_text().strip()
    return connect(redis_url("127.0.0.1", port), password, socket_timeout=5.0, reconnect_s=10.0)


def corrupt_an_open_group_then_kill_the_actor(run_dir: Path, client) -> str:
    """Freeze the actor (SIGSTOP: nothing is appended or delivered while we look), append corrupt
    entries to an open group's token log, and SIGKILL it; its restart replays that log."""
    actor = psutil.Process(current_pid(run_dir, "actor"))
    deadline = time.time() + 120
    while time.time() < deadline:
        actor.suspend()
        time.sleep(0.05)  # commands it sent before the stop are executed by now
        open_groups = client.zrange(KEY_PREFIX + "open", 0, -1)
        if open_groups:
            client.rpush(f"{KEY_PREFIX}log:{open_groups[0]}", *BAD_LOG_ENTRIES)
            if client.zscore(KEY_PREFIX + "open", open_groups[0]) is not None:
                actor.kill()
                return open_groups[0]
            # delivered (its log deleted) by a command the actor sent before the stop, run only
            # after our read: the push made a log of a closed group, which nothing replays
            client.delete(f"{KEY_PREFIX}log:{open_groups[0]}")
        actor.resume()
        time.sleep(0.05)
    raise AssertionError("no group was open while the actor was generating")


@pytest.fixture(scope="module")
def poisoned_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("bad-messages") / "run"
    proc = start_rlrun(run_dir, *ARGS)
    injected = {}
    try:
        wait_for(lambda: steps_done(run_dir) >= 1, 600, "step 1", proc)
        client = redis_client(run_dir)
        injected["groups"] = [client.xadd(names.GROUPS_STREAM, fields) for fields in BAD_GROUPS]
        injected["journal_group"] = corrupt_an_open_group_then_kill_the_actor(run_dir, client)
        injected["at_step"] = steps_done(run_dir)
        client.close()
        proc.wait(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    output = (run_dir.parent / "rlrun.out").read_text()
    return proc.returncode, run_dir, injected, left_behind(proc), output, sorted(proc.run_processes.cmdlines)


def test_the_run_completes_at_exactly_max_train_steps(poisoned_run):
    code, run_dir, injected, left, output, _ = poisoned_run
    assert code == 0, output[-4000:]
    assert injected["at_step"] < STEPS - 1, "injected too late to be read"
    assert [m["step"] for m in read_jsonl(run_dir / "metrics.jsonl")] == list(range(1, STEPS + 1))
    assert read_state(latest_complete(run_dir / "checkpoints")).step == STEPS
    assert left == []


def test_bad_groups_are_counted_by_the_trainer(poisoned_run):
    _, run_dir, injected, _, _, _ = poisoned_run
    assert read_jsonl(run_dir / "metrics.jsonl")[-1]["bad_messages"] == len(BAD_GROUPS)
    log = (run_dir / "logs" / "launch-1" / "trainer.log").read_text()
    for message_id in injected["groups"]:
        assert f"rejected message {message_id} on {names.GROUPS_STREAM}" in log


def test_corrupt_journal_entries_are_counted_by_the_restarted_actor(poisoned_run):
    _, run_dir, injected, _, _, _ = poisoned_run
    log = (run_dir / "logs" / "launch-1" / "actor.1.log").read_text()
    closing = [line for line in log.splitlines() if "actor stops (" in line][-1]
    counters = ast.literal_eval(closing.split("actor stops (", 1)[1].rstrip(")"))
    assert counters["journal_corrupt_records"] == len(BAD_LOG_ENTRIES)
    key = f"{KEY_PREFIX}log:{injected['journal_group']}"
    assert log.count(f"journal record {key} is unreadable") == len(BAD_LOG_ENTRIES)
    assert "journal refused" not in log  # the replay's view of every kept sample is the journal's


def test_no_secret_on_a_command_line_or_in_a_file_of_the_run(poisoned_run):
    _, run_dir, _, _, output, cmdlines = poisoned_run
    assert any("rlrun.entrypoints.actor" in " ".join(c) for c in cmdlines)  # the sampling saw the run
    assert leaked_secrets(run_dir, cmdlines, (output,)) == []
