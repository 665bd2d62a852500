"""`rlrun plot`: reward and throughput over steps as a PNG, restarts placed on the step axis."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlrun.cli.app import app
from rlrun.errors import RunDirError
from rlrun.cli.plot import SIZE_PX, Marker, band, markers, plot_run, run_start, smoothed, smoothing_window, step_at, throughput
from rlrun.rundir import RunDir

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
T0 = 1_800_000_000.0


def make_run(root: Path, steps: int = 12, events: list[dict] | None = None) -> RunDir:
    run_dir = RunDir(root)
    run_dir.create({"kind": "rlrun-run", "recipe": "math_gspo"})
    lines = []
    for step in range(1, steps + 1):
        lines.append({"step": step, "samples": 256 * step, "reward_mean": 0.2 + 0.03 * step, "reward_std": 0.4,
                      "tokens": 600 + step, "time": T0 + 2.0 * step, "step_time_s": 2.0})  # fmt: skip
    run_dir.metrics.write_text("".join(json.dumps(r) + "\n" for r in lines))
    if events is not None:
        run_dir.events.write_text("".join(json.dumps(e) + "\n" for e in events))
    return run_dir


def flat(text: str) -> str:
    return " ".join(text.split())  # rich wraps long lines


def check_png(path: Path) -> None:
    import matplotlib.image

    assert path.read_bytes()[:8] == PNG_SIGNATURE
    height, width = matplotlib.image.imread(path).shape[:2]
    assert (width, height) == SIZE_PX


def test_plot_of_a_run_with_restarts_is_a_valid_png_of_the_stated_size(tmp_path):
    events = [
        {"time": T0 + 0.5, "event": "process_started", "process": "redis"},
        {"time": T0 + 7.0, "event": "process_failed", "process": "vllm-0", "action": "restart", "reason": "killed"},
        {"time": T0 + 9.0, "event": "process_restarted", "process": "vllm-0"},
        {"time": T0 + 15.0, "event": "process_failed", "process": "actor", "action": "restart"},
        {"time": T0 + 16.0, "event": "process_restarted", "process": "actor"},
        {"time": T0 + 20.0, "event": "run_resumed"},
    ]
    run_dir = make_run(tmp_path / "run", events=events)
    result = plot_run(run_dir)
    assert result.path == run_dir.root / "plot.png"
    assert (result.steps, result.restarts, result.failures) == (12, 2, 0)
    check_png(result.path)
    assert not list(run_dir.root.glob(".*.tmp"))


def test_the_cli_writes_where_told_and_says_where(tmp_path):
    run_dir = make_run(tmp_path / "run")
    out = tmp_path / "pictures" / "run.png"
    result = CliRunner().invoke(app, ["plot", str(run_dir.root), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert f"plot: {out} (12 steps, 0 restarts, 0 failures)" in result.output
    check_png(out)
    assert not run_dir.plot.exists()


def test_a_run_with_no_metrics_exits_4_says_so_and_writes_nothing(tmp_path):
    run_dir = RunDir(tmp_path / "run")
    run_dir.create({"kind": "rlrun-run"})
    before = sorted(p.name for p in run_dir.root.iterdir())
    result = CliRunner().invoke(app, ["plot", str(run_dir.root)])
    assert result.exit_code == 4
    assert "no metrics" in flat(result.output)
    assert sorted(p.name for p in run_dir.root.iterdir()) == before
    run_dir.metrics.write_text('{"step": 1, "reward_m')  # only a line cut short by a crash
    assert CliRunner().invoke(app, ["plot", str(run_dir.root)]).exit_code == 4
    assert not run_dir.plot.exists()


def test_a_directory_that_is_not_a_run_exits_4(tmp_path):
    result = CliRunner().invoke(app, ["plot", str(tmp_path)])
    assert result.exit_code == 4 and "not an rlrun run directory" in flat(result.output)


def test_an_unwritable_output_is_a_run_dir_error_and_leaves_nothing(tmp_path):
    run_dir = make_run(tmp_path / "run")
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(RunDirError, match="cannot write the plot"):
        plot_run(run_dir, blocker / "plot.png")  # its parent is a file


def records(*pairs: tuple[int, float]) -> list[dict]:
    return [{"step": s, "time": t, "tokens": 100, "samples": 10 * s, "step_time_s": 4.0} for s, t in pairs]


def test_events_are_placed_between_the_steps_they_happened_between():
    recs = records((1, 110.0), (2, 120.0), (3, 140.0))
    assert step_at(130.0, recs) == 2.5
    assert step_at(108.0, recs) == 0.5  # during step 1 (which started at 110 - 4)
    assert step_at(50.0, recs) == 0.0  # before the first step
    assert step_at(500.0, recs) == 3.0  # after the last


def test_restarts_final_failures_and_resumes_are_marked_other_events_are_not():
    recs = records((1, 110.0), (2, 120.0))
    events = [
        {"time": 115.0, "event": "process_failed", "process": "trainer", "action": "restart"},  # followed by a restart
        {"time": 116.0, "event": "process_restarted", "process": "trainer"},
        {"time": 118.0, "event": "process_failed", "process": "vllm-0", "action": "give_up"},
        {"time": 119.0, "event": "run_resumed"},
        {"time": 119.5, "event": "process_ready", "process": "vllm-0"},
        {"event": "process_restarted", "process": "actor"},  # no time: cannot be placed
    ]
    assert markers(events, recs) == [
        Marker(1.6, "restart", "trainer", 116.0),
        Marker(1.8, "failure", "vllm-0", 118.0),
        Marker(1.9, "resume", "", 119.0),
    ]


def test_throughput_is_tokens_over_the_time_since_the_previous_record():
    recs = records((1, 110.0), (2, 120.0), (3, 145.0))
    assert throughput(recs) == [(1, 25.0, 2.5), (2, 10.0, 1.0), (3, 4.0, 0.4)]


def test_smoothed_is_a_trailing_mean_that_never_looks_ahead():
    values = [0.0, 1.0, 0.0, 1.0, 1.0, 1.0]
    assert smoothed(values, 3) == pytest.approx([0.0, 0.5, 1 / 3, 2 / 3, 2 / 3, 1.0])
    assert smoothed(values, 1) == values
    # changing a later value leaves every earlier point as it was
    assert smoothed(values[:4] + [0.0, 0.0], 3)[:4] == smoothed(values, 3)[:4]
    with pytest.raises(ValueError):
        smoothed(values, 0)


def test_smoothing_window_is_a_twentieth_of_the_run_at_least_five():
    assert [smoothing_window(n) for n in (1, 4, 5, 99, 100, 300)] == [1, 1, 5, 5, 5, 15]


def test_the_band_of_a_0_1_reward_stays_inside_0_1():
    # a Bernoulli reward near an end: mean 0.9, std 0.3 -> 0.6 .. 1.2 unclipped
    lower, upper = band([0.9, 0.1, 0.5], [0.3, 0.3, 0.5], 0.0, 1.0)
    assert lower == pytest.approx([0.6, 0.0, 0.0])
    assert upper == pytest.approx([1.0, 0.4, 1.0])


def test_run_start_is_the_first_supervisor_event_else_the_first_steps_start():
    recs = records((1, 110.0), (2, 120.0))  # step 1 took 4 s: started at 106
    assert run_start(recs, []) == 106.0
    assert run_start(recs, [{"time": 60.0, "event": "process_started"}, {"time": 150.0, "event": "run_stopped"}]) == 60.0
    assert run_start(recs, [{"event": "no time"}]) == 106.0


def test_the_figure_has_a_wall_clock_panel_and_its_band_stays_in_0_1():
    from rlrun.cli.plot import figure

    recs = [{"step": s, "time": T0 + 2.0 * s, "step_time_s": 2.0, "tokens": 10, "samples": 256 * s,
             "reward_mean": 0.95, "reward_std": 0.3} for s in range(1, 11)]  # fmt: skip
    fig = figure(recs, [], "t", start=T0 - 28.0)  # 30 s of startup before step 1 ended at T0 + 2
    reward_ax, clock_ax, rate_ax = fig.axes
    assert "wall-clock seconds" in clock_ax.get_xlabel()
    assert clock_ax.get_xlim() == (0.0, 48.0)  # last record at T0 + 20, 48 s after the start
    seconds = clock_ax.get_lines()[0].get_xdata()
    assert list(seconds) == [30.0 + 2.0 * k for k in range(10)]
    band_paths = reward_ax.collections[0].get_paths()[0].vertices
    assert band_paths[:, 1].max() <= 1.0 and band_paths[:, 1].min() >= 0.65 - 1e-9  # 0.95 ± 0.3, held at 1
    assert rate_ax.get_xlabel() == "optimizer step"


def write_evals(run_dir: RunDir, *records: dict) -> None:
    with open(run_dir.metrics, "a") as handle:
        handle.write("".join(json.dumps({"kind": "eval", "step": r["policy_version"], "k": 1, **r}) + "\n" for r in records))


def test_a_run_with_evaluations_gets_eval_panels_over_version_and_seconds_one_line_per_source(tmp_path):
    from rlrun.cli.plot import SIZE_PX_EVAL, figure

    run_dir = make_run(tmp_path / "run", events=[{"time": T0 - 8.0, "event": "run_started"}])  # steps end at T0 + 2, 4, ..., 24
    by_source = lambda easy, hard: {"easy": {"pass@1": easy, "reward_mean": easy}, "hard": {"pass@1": hard, "reward_mean": hard / 2}}  # noqa: E731
    write_evals(
        run_dir,
        {"policy_version": 0, "prompts": 4, "pass@1": 0.25, "reward_mean": 0.3, "per_source": by_source(0.5, 0.0), "time": T0 + 1.0},
        {"policy_version": 6, "prompts": 4, "pass@1": 0.5, "reward_mean": 0.55, "per_source": by_source(0.75, 0.25), "time": T0 + 14.0},
        {"policy_version": 12, "prompts": 4, "pass@1": 0.75, "reward_mean": 0.8, "per_source": by_source(1.0, 0.5), "time": T0 + 30.0},
        {"policy_version": 6, "prompts": 4, "pass@1": 0.5, "reward_mean": 0.6, "per_source": by_source(0.75, 0.25), "time": T0 + 16.0},  # rewritten after a restart
    )  # fmt: skip
    result = plot_run(run_dir)
    assert (result.steps, result.evaluations) == (12, 3)
    import matplotlib.image

    assert matplotlib.image.imread(result.path).shape[:2] == (SIZE_PX_EVAL[1], SIZE_PX_EVAL[0])

    from rlrun.telemetry.metrics import eval_records, final_records, read_metrics

    recs = final_records(read_metrics(run_dir.metrics))
    fig = figure(recs, [], "t", start=T0 - 8.0, evals=eval_records(run_dir.metrics))
    reward_ax, clock_ax, rate_ax, version_ax, eval_clock_ax = fig.axes
    drawn = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in version_ax.get_lines()}
    assert drawn == {
        "all prompts: pass@1": ([0, 6, 12], [0.25, 0.5, 0.75]), "all prompts: reward": ([0, 6, 12], [0.3, 0.6, 0.8]),
        "easy: pass@1": ([0, 6, 12], [0.5, 0.75, 1.0]), "easy: reward": ([0, 6, 12], [0.5, 0.75, 1.0]),
        "hard: pass@1": ([0, 6, 12], [0.0, 0.25, 0.5]), "hard: reward": ([0, 6, 12], [0.0, 0.125, 0.25]),
    }  # fmt: skip
    seconds = {line.get_label(): list(line.get_xdata()) for line in eval_clock_ax.get_lines()}
    assert seconds["all prompts: pass@1"] == seconds["hard: reward"] == [9.0, 24.0, 38.0]  # since the run started, T0 - 8
    assert "policy version" in version_ax.get_xlabel() and "wall-clock seconds" in eval_clock_ax.get_xlabel()
    assert clock_ax.get_xlim() == eval_clock_ax.get_xlim() == (0.0, 38.0)  # the last evaluation, after the last step (32 s)


def test_a_run_without_evaluations_keeps_three_panels_and_its_size(tmp_path):
    run_dir = make_run(tmp_path / "run")
    assert plot_run(run_dir).evaluations == 0
    check_png(run_dir.plot)
