"""Each launch of a run (train, then every resume) logs into its own folder; `rlrun logs` reads the
newest launch unless told which."""

from __future__ import annotations

import json

import pytest

from rlrun.errors import RunDirError
from rlrun.rundir import RunDir
from rlrun.cli.status import latest_log


def test_each_launch_gets_the_next_folder_and_never_reuses_one(tmp_path):
    run = RunDir(tmp_path / "run")
    run.create({"kind": "rlrun-run"})
    first, second = run.for_new_launch(), run.for_new_launch()
    assert (first.launch, second.launch) == (1, 2)
    assert first.log("trainer") == run.logs / "launch-1" / "trainer.log"
    assert second.log("trainer", attempt=2) == run.logs / "launch-2" / "trainer.2.log"
    (run.logs / "launch-7").mkdir()  # whatever is there, the next one is after it
    assert run.for_new_launch().launch == 8 and run.launches() == [1, 2, 7, 8]
    assert RunDir(run.root).log("redis") == run.logs / "redis.log"  # no launch: tools and tests


def test_logs_default_to_the_newest_launch_and_can_name_one(tmp_path):
    run = RunDir(tmp_path / "run")
    run.create({"kind": "rlrun-run"})
    events = []
    for n in (1, 2):
        launched = run.for_new_launch()
        for attempt in range(n):  # launch 2 restarted its trainer once
            path = launched.log("trainer", attempt)
            path.write_text(f"launch {n} attempt {attempt}\n")
            events.append({"event": "process_restarted" if attempt else "process_started", "process": "trainer", "log": str(path)})
    run.events.write_text("".join(json.dumps(e) + "\n" for e in events))
    assert latest_log(run, "trainer").read_text() == "launch 2 attempt 1\n"
    assert latest_log(run, "trainer", launch=1).read_text() == "launch 1 attempt 0\n"
    assert latest_log(run, "trainer", launch=2).name == "trainer.1.log"
    with pytest.raises(RunDirError, match="has no launch 5. Launches: 1, 2"):
        latest_log(run, "trainer", launch=5)
    with pytest.raises(RunDirError, match="no log of 'actor' in launch 1"):
        latest_log(run, "actor", launch=1)


@pytest.mark.parametrize("how", ["copied", "moved"])
def test_logs_of_a_copied_or_moved_run_are_its_own(tmp_path, how):
    """Issue 26: events.jsonl records absolute log paths; `rlrun logs` of a copy printed the
    original's log. A recorded path is read in the run directory asked about."""
    import shutil

    from typer.testing import CliRunner

    from rlrun.cli.app import app
    from rlrun.cli.status import report

    run = RunDir(tmp_path / "first")
    run.create({"kind": "rlrun-run"})
    log = run.for_new_launch().log("trainer", 1)
    log.write_text("the first run's log\n")
    dump = run.diagnostics / "trainer-1-x.txt"
    events = [
        {"time": 1.0, "event": "process_started", "process": "trainer", "pid": 5, "log": str(log)},
        {"time": 2.0, "event": "stack_dump", "process": "trainer", "file": str(dump)},
    ]
    run.events.write_text("".join(json.dumps(e) + "\n" for e in events))
    other = RunDir(tmp_path / "second")
    (shutil.copytree if how == "copied" else shutil.move)(run.root, other.root)
    own = other.logs / "launch-1" / "trainer.1.log"
    own.write_text("the second run's log\n")
    assert latest_log(other, "trainer") == own
    printed = CliRunner().invoke(app, ["logs", str(other.root), "-c", "trainer"])
    assert printed.exit_code == 0 and printed.stdout == "the second run's log\n"
    (row,) = report(other)["processes"]
    assert (row["log"], row["last_dump"]) == (str(own), str(other.diagnostics / "trainer-1-x.txt"))
    assert other.here("logs/launch-1/trainer.log") == other.logs / "launch-1" / "trainer.log"  # relative: under it
