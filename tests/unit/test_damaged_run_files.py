"""Damaged files of a run, read by `rlrun status`, `status --json`, `runs`, `logs` and `plot`
through the CLI: never an internal error; a run file that cannot be used is one message naming it
(exit 4), a damaged line is skipped, `runs` lists the other runs and notes the damaged one."""

from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlrun.cli.app import app
from rlrun.rundir import RunDir

T0 = 1000.0


def make_run(root: Path) -> RunDir:
    run = RunDir(root)
    run.create({"kind": "rlrun-run"})
    run.config.write_text("trainer:\n  max_train_steps: 10\n")
    log = run.logs / "launch-1" / "trainer.log"
    log.parent.mkdir(parents=True)
    log.write_text("the trainer's log\n")
    events = [
        {"time": T0, "event": "run_started", "launch": 1},
        {"time": T0 + 1, "event": "process_started", "process": "trainer", "pid": 7, "attempt": 0, "log": str(log)},
        {"time": T0 + 50, "event": "run_stopped", "status": "finished"},
    ]
    run.events.write_text("".join(json.dumps(e) + "\n" for e in events))
    records = [{"time": T0 + 10 + i, "step": i, "reward_mean": 0.5, "reward_std": 0.1, "samples": 8 * i, "tokens": 10, "step_time_s": 1.0} for i in range(1, 6)]
    run.metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
    run.write_state(status="finished")
    return run


def _append(path_of, text: str):
    return lambda run: path_of(run).write_text(path_of(run).read_text() + text)


def _replace_with_folder(path_of):
    def damage(run: RunDir) -> None:
        path_of(run).unlink()
        path_of(run).mkdir()

    return damage


STATE_DAMAGE = ["is damaged", "state.json", "move it aside"]
OK = 0
# (id, damage, {command: exit code}, fragments of the message where the code is 4). Commands:
# status, status --json, runs (of the parent), logs, plot.
DAMAGE = [
    ("state-not-json", lambda r: r.state.write_text("garbage{"), {"status": 4, "json": 4, "runs": OK, "logs": OK, "plot": OK}, STATE_DAMAGE),
    ("state-a-list", lambda r: r.state.write_text("[1, 2]"), {"status": 4, "json": 4, "runs": OK, "logs": OK, "plot": OK}, STATE_DAMAGE + ["not an object"]),
    ("state-a-folder", _replace_with_folder(lambda r: r.state), {"status": 4, "json": 4, "runs": OK, "logs": OK, "plot": OK}, STATE_DAMAGE),
    ("config-not-yaml", lambda r: r.config.write_text("trainer: [\n"), {"status": OK, "json": OK, "runs": OK, "logs": OK, "plot": OK}, []),
    ("events-wrong-types", _append(lambda r: r.events, json.dumps({"event": "process_started", "process": ["x"], "time": "soon", "pid": "p", "log": 5}) + "\n"),
     {"status": OK, "json": OK, "runs": OK, "logs": OK, "plot": OK}, []),
    ("events-reason-a-list", _append(lambda r: r.events, json.dumps({"event": "process_failed", "process": "trainer", "time": T0 + 2, "reason": ["x"]}) + "\n"),
     {"status": OK, "json": OK, "runs": OK, "logs": OK, "plot": OK}, []),
    ("events-nested-brackets", _append(lambda r: r.events, "[" * 200_000 + "\n"), {"status": OK, "json": OK, "runs": OK, "logs": OK, "plot": OK}, []),
    ("events-not-utf8", lambda r: r.events.write_bytes(b"\xff\xfe\x00\n" + r.events.read_bytes()), {"status": OK, "json": OK, "runs": OK, "logs": OK, "plot": OK}, []),
    ("events-nan-time", _append(lambda r: r.events, '{"event": "process_restarted", "process": "trainer", "time": NaN}\n'),
     {"status": OK, "json": OK, "runs": OK, "logs": OK, "plot": OK}, []),
    ("metrics-nan", _append(lambda r: r.metrics, '{"time": NaN, "step": 6, "reward_mean": NaN, "samples": NaN, "tokens": Infinity, "step_time_s": NaN}\n'),
     {"status": OK, "json": OK, "runs": OK, "logs": OK, "plot": OK}, []),
    ("metrics-nan-reward", _append(lambda r: r.metrics, '{"time": 1020.0, "step": 6, "reward_mean": NaN, "reward_std": NaN, "samples": 48, "tokens": 10}\n'),
     {"status": OK, "json": OK, "runs": OK, "logs": OK, "plot": OK}, []),
    ("metrics-wrong-types", _append(lambda r: r.metrics, '{"time": "x", "step": 7, "reward_mean": "a", "samples": "b"}\n'),
     {"status": OK, "json": OK, "runs": OK, "logs": OK, "plot": OK}, []),
]  # fmt: skip


def strict_json(text: str):
    """JSON as other programs read it: NaN and Infinity are not JSON."""
    return json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in the JSON output"))


@pytest.mark.parametrize("name, damage, codes, fragments", DAMAGE, ids=[d[0] for d in DAMAGE])
def test_a_damaged_run_file_is_a_message_or_is_skipped_never_an_internal_error(tmp_path, name, damage, codes, fragments):
    good = make_run(tmp_path / "runs" / "good")
    run = make_run(tmp_path / "runs" / "broken")
    damage(run)
    commands = {
        "status": ["status", str(run.root)], "json": ["status", str(run.root), "--json"], "runs": ["runs", str(tmp_path / "runs")],
        "logs": ["logs", str(run.root), "-c", "trainer"], "plot": ["plot", str(run.root), "--out", str(tmp_path / "plot.png")],
    }  # fmt: skip
    for command, args in commands.items():
        result = CliRunner().invoke(app, args)
        said = " ".join((result.stdout + result.stderr).split())
        assert result.exit_code == codes[command], f"{command}: {said[-2000:]}"
        assert "internal error" not in said and "Traceback" not in said, f"{command}: {said[-2000:]}"
        if result.exit_code == 4:
            for fragment in fragments:
                assert fragment in said, f"{command}: {fragment!r} not in {said}"
        elif command == "json":
            report = strict_json(result.stdout)
            assert report["progress"]["step"] in (5, 6, 7) and report["processes"][0]["name"] == "trainer"
        elif command == "runs":
            assert "good" in result.stdout
            damaged_state = codes["status"] == 4
            assert (" broken " in result.stdout) != damaged_state  # listed, or skipped with a note
            if damaged_state:
                assert f"skipped {run.root}" in said and "state.json" in said
        elif command == "logs":
            assert result.stdout == "the trainer's log\n"
        elif command == "plot":
            assert (tmp_path / "plot.png").stat().st_size > 1000
    runs = strict_json(CliRunner().invoke(app, ["runs", str(tmp_path / "runs"), "--json"]).stdout)
    assert sorted(Path(r["run_dir"]).name for r in runs) == ["broken", "good"] and good.is_run()


def test_status_of_a_run_with_a_5_mb_event_line(tmp_path):
    """Issue 26: > 60 s to draw a 5 MB failure reason in the table. Events are lines for people:
    a string field is cut at read time. Prints the time it took (no timed assertion)."""
    run = make_run(tmp_path / "run")
    huge = {"time": T0 + 2, "event": "process_failed", "process": "trainer", "reason": "x" * 5_000_000, "action": "restart"}
    run.events.write_text(run.events.read_text() + json.dumps(huge) + "\n")
    started = time.monotonic()
    result = CliRunner().invoke(app, ["status", str(run.root)])
    print(f"rlrun status with a 5 MB event line: {time.monotonic() - started:.2f} s")
    assert result.exit_code == 0, result.output
    assert len(result.output) < 20_000 and "(cut)" in "".join(result.output.split())


def test_the_plot_leaves_a_gap_where_a_reward_is_missing():
    from rlrun.cli.plot import band, smoothed

    values = [0.0, 1.0, math.nan, 1.0]
    assert smoothed(values, 2)[:2] == [0.0, 0.5] and smoothed(values, 2)[2:] == [1.0, 1.0]
    assert math.isnan(smoothed([math.nan], 3)[0])
    lower, upper = band([0.5, math.nan], [0.1, 0.1], 0.0, 1.0)
    assert lower[0] == pytest.approx(0.4) and math.isnan(lower[1]) and math.isnan(upper[1])


@pytest.fixture(autouse=True)
def _no_leftovers(tmp_path):
    yield
    shutil.rmtree(tmp_path, ignore_errors=True)
