"""`rlrun status --json` and `rlrun runs` on run directories written by hand: a finished run, a
live one (owned by this test process: it holds the run's lock) and something that is not a run."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlrun.run import runlock
from rlrun.cli.app import app
from rlrun.rundir import RunDir

RECOVERED = {"tokens_reused": 13, "samples_continued": 1, "tokens_kept_on_retry": 4, "samples_continued_on_retry": 2,
             "tokens_regenerated": 2, "prefixes_dropped_stale": 1}  # the actor's counters, as the trainer copies them  # fmt: skip
OWNED: list[runlock.RunLock] = []  # the live runs' locks, held by this process until it ends


def make_run(root: Path, name: str, *, status: str, steps: int, t0: float, failure: bool = False) -> RunDir:
    run_dir = RunDir(root / name)
    run_dir.create({"kind": "rlrun-run"})
    run_dir.config.write_text("trainer:\n  max_train_steps: 10\n")
    events = [{"time": t0, "event": "run_started"}, {"time": t0 + 1, "event": "process_started", "process": "actor", "pid": 7, "log": "logs/actor.log"}]
    if failure:
        events += [
            {"time": t0 + 12, "event": "process_stalled", "process": "actor", "pid": 7, "quiet_s": 11},
            {"time": t0 + 12.5, "event": "stack_dump", "process": "actor", "attempt": 0, "file": str(run_dir.diagnostics / "actor-0-x.txt")},
            {"time": t0 + 13, "event": "process_failed", "process": "actor", "reason": "stalled: no progress for 11 s", "action": "restart"},
            {"time": t0 + 14, "event": "process_restarted", "process": "actor", "pid": 8, "attempt": 1, "log": "logs/actor.1.log"},
        ]
    records = [{"time": t0 + 10 + 2 * i, "step": i, "step_time_s": 2, "wait_s": 0.5, "weights_s": 0.5, "reward_mean": 0.1 * i, "samples": 8 * i, **RECOVERED}
               for i in range(1, steps + 1)]  # fmt: skip
    if status != "running":
        events.append({"time": t0 + 12 + 2 * steps, "event": "run_stopped", "status": status})
        run_dir.write_state(status=status)
    else:
        run_dir.write_state(status="running", supervisor_pid=os.getpid())
        OWNED.append(runlock.acquire(run_dir))
    run_dir.events.write_text("".join(json.dumps(e) + "\n" for e in events))
    run_dir.metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
    return run_dir


def test_status_json_reports_processes_restarts_last_failure_progress_and_ettr(tmp_path):
    run_dir = make_run(tmp_path, "done", status="finished", steps=10, t0=1000.0, failure=True)
    result = CliRunner().invoke(app, ["status", str(run_dir.root), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["status"] == "finished" and report["live"] is False
    (actor,) = report["processes"]
    assert (actor["name"], actor["pid"], actor["restarts"], actor["state"]) == ("actor", 8, 1, "stopped")
    assert actor["last_dump"].endswith("actor-0-x.txt")
    assert report["restarts"] == 1 and report["last_failure"]["process"] == "actor"
    assert report["progress"] == {"step": 10, "max_train_steps": 10, "samples": 80, "reward_mean": 1.0, "reward_smoothed": pytest.approx(0.55),
                                  "reward_smoothed_steps": 10, "policy_version": None, "time": 1030.0, "eval": None}  # fmt: skip
    ettr = report["ettr"]
    assert ettr["wall_s"] == 32 and ettr["failures"][0]["recovery_s"] == 11.0  # quiet from 1001, step 1 recorded at 1012
    assert 0 < ettr["ettr"] < 1 and report["last_event"]["event"] == "run_stopped"
    assert report["recovery"] == RECOVERED


def test_status_text_shows_the_ettr_line_and_the_dump(tmp_path):
    run_dir = make_run(tmp_path, "done", status="finished", steps=3, t0=1000.0, failure=True)
    result = CliRunner().invoke(app, ["status", str(run_dir.root)])
    assert result.exit_code == 0, result.output
    cells = [line.split("│")[5] for line in result.output.splitlines() if line.count("│") == 7]
    failure = "".join("".join(cells).split())  # the "last failure" column, folded over lines
    assert "(stacks:" + str(run_dir.diagnostics / "actor-0-x.txt").replace(" ", "") + ")" in failure
    assert re.search(r"ETTR 0\.\d\d of 18 s: training", result.output) and "1 failure(s): actor recovered in 11.0 s" in result.output
    assert ("tokens kept: 13 from the journal at actor restarts (1 samples continued), 4 after failed requests "
            "(2 samples continued); 2 regenerated (1 stale prefixes dropped)") in " ".join(result.output.split())  # fmt: skip


def test_runs_lists_live_and_finished_runs_newest_first_and_skips_other_folders(tmp_path):
    make_run(tmp_path, "old", status="finished", steps=10, t0=1000.0)
    make_run(tmp_path, "live", status="running", steps=2, t0=2000.0)
    (tmp_path / "not-a-run").mkdir()
    os.utime(tmp_path / "old" / "events.jsonl", (1, 1))
    for name in ("metrics.jsonl", "state.json"):
        os.utime(tmp_path / "old" / name, (1, 1))
    result = CliRunner().invoke(app, ["runs", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    runs = json.loads(result.output)
    assert [Path(r["run_dir"]).name for r in runs] == ["live", "old"]
    live, old = runs
    assert (live["status"], live["step"], live["max_train_steps"]) == ("running", 2, 10)
    assert (old["status"], old["step"], old["reward_mean"]) == ("finished", 10, 1.0)
    assert live["ettr"] is not None and old["last_event"]["event"] == "run_stopped"
    table = CliRunner().invoke(app, ["runs", str(tmp_path)], env={"COLUMNS": "200"})
    assert table.exit_code == 0 and "live" in table.output and "2/10" in table.output and "run_stopped" in table.output


def test_runs_on_a_missing_folder_is_a_clear_error(tmp_path):
    result = CliRunner().invoke(app, ["runs", str(tmp_path / "nope")])
    assert result.exit_code != 0 and "is not a directory" in result.output


def test_a_failed_run_prints_its_log_tail_as_written_and_no_markup(capsys):
    """Issue 26: exit 5/6 printed "[dim]last lines of ...[/]" literally; the log's own brackets
    must stay as written."""
    import pytest
    import typer

    from rlrun.cli import app as cli
    from rlrun.errors import ProcessFailed, RestartsExhausted

    for error, code in ((ProcessFailed, 5), (RestartsExhausted, 6)):
        with pytest.raises(typer.Exit) as ended:
            cli._fail(error("process 'trainer' failed", process="trainer", log_tail="step [red]7[/] done\nlist[0] = 1"), debug=False)
        err = capsys.readouterr().err
        assert ended.value.exit_code == code
        assert "[dim]" not in err and "[/]" not in err.replace("[red]7[/]", "")
        assert "last lines of trainer's log:" in err and "step [red]7[/] done\nlist[0] = 1" in err


def test_a_fast_llm_run_reports_the_steps_and_documents_its_events_announced(tmp_path):
    """trainer=fast_llm writes no metrics.jsonl: status, status --json and runs read the step and
    documents of its weights_ready events, as the supervisor recorded them (trainer_step)."""
    run_dir = make_run(tmp_path, "fl", status="finished", steps=0, t0=1000.0)
    run_dir.metrics.unlink()
    announced = [{"time": 1010.0 + s, "event": "trainer_step", "step": s, "samples": 263 * s} for s in range(7)]
    announced.append({"time": 1017.0, "event": "trainer_step", "step": "7", "samples": [1]})  # damaged: skipped
    lines = run_dir.events.read_text().splitlines()
    run_dir.events.write_text("\n".join(lines[:-1] + [json.dumps(e) for e in announced] + lines[-1:]) + "\n")

    report = json.loads(CliRunner().invoke(app, ["status", str(run_dir.root), "--json"]).output)
    assert report["progress"] == {"step": 6, "max_train_steps": 10, "samples": 1578, "reward_mean": None, "reward_smoothed": None,
                                  "reward_smoothed_steps": 0, "policy_version": 6, "time": 1016.0, "eval": None}  # fmt: skip
    text = CliRunner().invoke(app, ["status", str(run_dir.root)]).output
    assert "step 6  samples 1578" in text
    (listed,) = json.loads(CliRunner().invoke(app, ["runs", str(tmp_path), "--json"]).output)
    assert (listed["step"], listed["max_train_steps"]) == (6, 10)
    table = CliRunner().invoke(app, ["runs", str(tmp_path)], env={"COLUMNS": "200"}).output
    assert "6/10" in table


def test_status_and_runs_show_the_mean_reward_of_the_last_10_steps_beside_the_last_step(tmp_path):
    """One step's mean is noisy: the last 10 steps' mean is shown first, the last step's after it. A
    retaken step counts once (its later record), and evaluation records are no steps."""
    run_dir = make_run(tmp_path, "noisy", status="finished", steps=12, t0=1000.0)  # rewards 0.1 .. 1.2
    extra = [
        {"time": 1030.0, "step": 11, "reward_mean": 0.0, "samples": 88},  # step 11 retaken after a restart: 0.0 counts, 1.1 not
        {"time": 1031.0, "step": 12, "reward_mean": 0.7, "samples": 96},
        {"time": 1032.0, "kind": "eval", "version": 12, "step": 12, "reward_mean": 0.05, "samples": 40},
    ]
    with open(run_dir.metrics, "a") as handle:
        handle.write("".join(json.dumps(r) + "\n" for r in extra))
    expected = (0.3 + 0.4 + 0.5 + 0.6 + 0.7 + 0.8 + 0.9 + 1.0 + 0.0 + 0.7) / 10  # steps 3..12, each as last written

    progress = json.loads(CliRunner().invoke(app, ["status", str(run_dir.root), "--json"]).output)["progress"]
    assert (progress["step"], progress["reward_mean"], progress["samples"]) == (12, 0.7, 96)  # the eval record is not the last step
    assert progress["reward_smoothed"] == pytest.approx(expected) and progress["reward_smoothed_steps"] == 10
    text = " ".join(CliRunner().invoke(app, ["status", str(run_dir.root)], env={"COLUMNS": "250"}).output.split())
    assert f"reward {expected:.3f} (mean of 10 steps; last 0.700)" in text
    (listed,) = json.loads(CliRunner().invoke(app, ["runs", str(tmp_path), "--json"]).output)
    assert listed["reward_smoothed"] == pytest.approx(expected) and listed["reward_mean"] == 0.7
    table = "".join(CliRunner().invoke(app, ["runs", str(tmp_path)], env={"COLUMNS": "250"}).output.split())
    assert f"{expected:.3f}(meanof10steps;last0.700)" in table


def test_a_short_run_averages_the_steps_it_has():
    from rlrun.cli.render import reward_text
    from rlrun.cli.status import recent_reward

    records = [{"step": 1, "reward_mean": 0.2}, {"step": 2}, {"step": 3, "reward_mean": 0.6}]  # step 2: no reward written
    assert recent_reward(records) == (pytest.approx(0.4), 2)
    assert recent_reward([]) is None and recent_reward([{"step": 1}]) is None
    assert reward_text(0.6, 0.4, 2) == "0.400 (mean of 2 steps; last 0.600)"
    assert reward_text(0.6, 0.6, 1) == "0.600" and reward_text(None, None, 0) == "-"


def write_evals(run_dir: RunDir, *records: dict) -> None:
    with open(run_dir.metrics, "a") as handle:
        handle.write("".join(json.dumps({"kind": "eval", "step": r["policy_version"], **r}) + "\n" for r in records))


def test_status_and_runs_show_the_latest_evaluation_beside_the_training_reward(tmp_path):
    """The newest evaluated version's pass@1 and mean reward; a version written again by a
    restarted trainer counts as last written, and a run without evaluations shows none."""
    run_dir = make_run(tmp_path, "evaluated", status="finished", steps=10, t0=1000.0)
    make_run(tmp_path, "plain", status="finished", steps=3, t0=3000.0)
    per_source = {"easy": {"prompts": 2, "k": 4, "reward_mean": 0.875, "pass@1": 0.875, "pass@4": 1.0, "correct": [4, 3]},
                  "hard": {"prompts": 1, "k": 4, "reward_mean": 0.25, "pass@1": 0.25, "pass@4": 1.0, "correct": [1]}}  # fmt: skip
    write_evals(
        run_dir,
        {"policy_version": 10, "prompts": 3, "k": 4, "reward_mean": 0.1, "pass@1": 0.1, "pass@4": 0.3, "time": 1031.0},
        {"policy_version": 5, "prompts": 3, "k": 4, "reward_mean": 0.2, "pass@1": 0.2, "pass@4": 0.5, "time": 1020.0},
        {"policy_version": 10, "prompts": 3, "k": 4, "reward_mean": 0.6667, "pass@1": 0.6667, "pass@4": 1.0, "correct": [4, 3, 1],
         "per_source": per_source, "eval_s": 1.5, "time": 1040.0},  # version 10 again, after a trainer restart
    )  # fmt: skip
    expected = {"policy_version": 10, "prompts": 3, "k": 4, "reward_mean": 0.6667, "pass@1": 0.6667, "pass@4": 1.0, "time": 1040.0,
                "per_source": {"easy": {"policy_version": None, "prompts": 2, "k": 4, "reward_mean": 0.875, "pass@1": 0.875, "pass@4": 1.0},
                               "hard": {"policy_version": None, "prompts": 1, "k": 4, "reward_mean": 0.25, "pass@1": 0.25, "pass@4": 1.0}}}  # fmt: skip

    report = json.loads(CliRunner().invoke(app, ["status", str(run_dir.root), "--json"]).output)
    assert report["progress"]["eval"] == expected
    assert report["progress"]["step"] == 10 and report["progress"]["reward_smoothed"] == pytest.approx(0.55)  # evals are no steps
    text = CliRunner().invoke(app, ["status", str(run_dir.root)], env={"COLUMNS": "250"}).output
    lines = text.splitlines()
    after_step = lines[next(i for i, line in enumerate(lines) if line.startswith("step 10 ")) + 1]
    assert after_step == "eval v10 (3 prompts x 4): pass@1 0.667, pass@4 1.000, reward 0.667"  # beside the training reward
    assert "  easy: pass@1 0.875, pass@4 1.000, reward 0.875" in text and "  hard: pass@1 0.250, pass@4 1.000, reward 0.250" in text
    assert "eval v" not in CliRunner().invoke(app, ["status", str(tmp_path / "plain")], env={"COLUMNS": "250"}).output

    listed = {Path(r["run_dir"]).name: r for r in json.loads(CliRunner().invoke(app, ["runs", str(tmp_path), "--json"]).output)}
    assert listed["evaluated"]["eval"] == expected and listed["plain"]["eval"] is None
    table = CliRunner().invoke(app, ["runs", str(tmp_path)], env={"COLUMNS": "250"}).output
    assert "eval pass@1 / reward" in table
    (row,) = [line for line in table.splitlines() if "evaluated" in line]
    assert "0.550 (mean of 10 steps; last 1.000)" in row and "0.667 / 0.667 (v10)" in row
    (plain,) = [line for line in table.splitlines() if "plain" in line]
    assert [cell.strip() for cell in plain.split("│")][5] == "-"  # its eval column


def test_a_damaged_eval_figure_shows_as_missing_not_as_a_crash():
    from rlrun.cli.render import eval_detail, eval_text
    from rlrun.cli.status import eval_figures

    figures = eval_figures({"kind": "eval", "policy_version": 4, "prompts": 2, "k": 1, "reward_mean": "NaN", "pass@1": float("nan"), "time": 9.0})
    assert figures == {"policy_version": 4, "prompts": 2, "k": 1, "reward_mean": None, "pass@1": None, "time": 9.0}
    assert eval_text(figures) == "- / - (v4)" and eval_text(None) == "-"
    assert eval_detail(figures) == "eval v4 (2 prompts x 1): pass@1 -, reward -"


def test_status_counts_each_rewards_failed_calls_and_the_groups_dropped(tmp_path):
    """The actor's per-reward counts, as the last step record carries them (issue 34): text and JSON."""
    run_dir = make_run(tmp_path, "flaky", status="finished", steps=3, t0=1000.0)
    last = {"time": 1020.0, "step": 4, "reward_mean": 0.5, "samples": 32, **RECOVERED, "groups_dropped": 2,
            "reward_errors": {"flaky": 7, "slow": 0}, "reward_timeouts": {"slow": 3}}  # fmt: skip
    with open(run_dir.metrics, "a") as handle:
        handle.write(json.dumps(last) + "\n")
    report = json.loads(CliRunner().invoke(app, ["status", str(run_dir.root), "--json"]).output)
    assert report["reward_failures"] == {"flaky": {"errors": 7, "timeouts": 0}, "slow": {"errors": 0, "timeouts": 3}, "groups_dropped": 2}
    text = " ".join(CliRunner().invoke(app, ["status", str(run_dir.root)], env={"COLUMNS": "250"}).output.split())
    assert "flaky 7 raised; slow 3 timed out; 2 group(s) dropped" in text
    quiet = make_run(tmp_path, "quiet", status="finished", steps=3, t0=1000.0)  # nothing failed: no line
    assert json.loads(CliRunner().invoke(app, ["status", str(quiet.root), "--json"]).output)["reward_failures"] == {}
    assert "reward failures" not in CliRunner().invoke(app, ["status", str(quiet.root)], env={"COLUMNS": "250"}).output
