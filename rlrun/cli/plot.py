"""`rlrun plot RUN_DIR`: one PNG of a run — reward over steps and over wall-clock seconds,
throughput over steps, restarts marked; with held-out evaluations (records of kind "eval"), their
pass@1 and mean reward over policy version and over wall-clock seconds, per source too.

Draws metrics.jsonl and events.jsonl with matplotlib's Agg canvas (no display, no pyplot state);
the pure parts are functions over plain data. A run with no metrics is refused (RunDirError);
the PNG is written through a temporary file, so a failure never leaves half a picture.
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

from rlrun.errors import EnvironmentProblem, RunDirError
from rlrun.rundir import RunDir
from rlrun.supervisor.events import read_events
from rlrun.telemetry.metrics import eval_records, final_records, read_metrics

SIZE_PX = (1000, 950)  # width, height of the PNG
SIZE_PX_EVAL = (1000, 1250)  # with the evaluation panels below the others
DPI = 100
MAX_LABELS = 12  # more markers than this are drawn without their process names
# Every task rlrun ships (arithmetic, gsm8k) scores an answer 1 (right) or 0 (wrong): a step's mean
# lies in [0, 1]. The ±std of such a reward is the spread of single samples, not an error bar, and
# mean ± std leaves [0, 1] whenever the mean is near an end; the band is drawn inside the range.
REWARD_RANGE = (0.0, 1.0)


@dataclass(frozen=True)
class Marker:
    """A supervisor event placed on the step axis."""

    step: float
    kind: str  # "restart" (a process restarted), "failure" (one not restarted), "resume" (rlrun resume)
    process: str
    time: float


@dataclass(frozen=True)
class PlotResult:
    path: Path
    steps: int
    restarts: int
    failures: int
    evaluations: int = 0  # evaluated policy versions drawn


@dataclass(frozen=True)
class EvalLine:
    """The figures of one evaluated set of prompts over the evaluated versions: every prompt (source
    None) or one source's. NaN: a figure (or a time) the record lacks, drawn as a gap."""

    source: str | None
    versions: list[int]
    times: list[float]
    pass_at_1: list[float]
    reward_mean: list[float]


def throughput(records: list[dict]) -> list[tuple[int, float, float]]:
    """(step, tokens/s, samples/s) per record, over the time since the previous one (a restart: a dip)."""
    out = []
    previous: dict | None = None
    for record in records:
        seconds = record["time"] - previous["time"] if previous is not None else 0.0
        if seconds <= 0:
            seconds = float(record.get("step_time_s") or 0.0)
        samples = record.get("samples", 0) - (previous.get("samples", 0) if previous is not None else 0)
        if previous is None and record["step"] > 1:  # a file that starts mid-run: samples is cumulative
            samples = 0
        if seconds > 0:
            out.append((record["step"], record.get("tokens", 0) / seconds, max(samples, 0) / seconds))
        previous = record
    return out


def step_at(time: float, records: list[dict]) -> float:
    """Where wall time `time` falls on the step axis of `records` (sorted by step), interpolated;
    before the first record, one step before it; after the last, the last step."""
    points = [(records[0]["step"] - 1, records[0]["time"] - float(records[0].get("step_time_s") or 0.0))]
    points += [(r["step"], r["time"]) for r in records]
    if time <= points[0][1]:
        return float(points[0][0])
    for (s0, t0), (s1, t1) in pairwise(points):
        if t0 <= time <= t1:
            return s0 + (s1 - s0) * ((time - t0) / (t1 - t0) if t1 > t0 else 1.0)
    return float(points[-1][0])


_MARKED: dict[object, str] = {"process_restarted": "restart", "run_resumed": "resume"}  # event → label


def markers(events: list[dict], records: list[dict]) -> list[Marker]:
    """Restarts, failures that were not restarted, and resumes, on the step axis of `records`."""
    out = []
    for event in events:
        kind = event.get("event")
        when = event.get("time")
        failed = kind == "process_failed" and event.get("action") != "restart"
        label = "failure" if failed else _MARKED.get(kind)
        if label is None or not isinstance(when, (int, float)):
            continue
        out.append(Marker(step_at(when, records), label, str(event.get("process", "")), float(when)))
    return out


def smoothed(values: list[float], window: int) -> list[float]:
    """Trailing mean over the last `window` values (fewer at the start): nothing from later steps.
    A missing value (NaN) is left out of the means it falls in; a window of them only is NaN."""
    if window < 1:
        raise ValueError(f"window must be 1 or more, got {window}")
    out, total, count = [], 0.0, 0
    for i, value in enumerate(values):
        if not math.isnan(value):
            total, count = total + value, count + 1
        if i >= window and not math.isnan(values[i - window]):
            total, count = total - values[i - window], count - 1
        out.append(total / count if count else math.nan)
    return out


def smoothing_window(points: int) -> int:
    """About a twentieth of the run, at least 5 points (1 for a run shorter than that)."""
    return max(5, points // 20) if points >= 5 else 1


def band(mean: list[float], std: list[float], low: float, high: float) -> tuple[list[float], list[float]]:
    """mean ± std per point, held inside [low, high] (the values the reward can take); NaN where the
    mean is missing (a gap)."""

    def held(value: float) -> float:
        return value if math.isnan(value) else min(high, max(low, value))

    return [held(m - s) for m, s in zip(mean, std)], [held(m + s) for m, s in zip(mean, std)]


def eval_lines(evals: Sequence[dict]) -> list[EvalLine]:
    """Every prompt's line, then one per source named in any record's `per_source` (sorted), over the
    versions of `evals` (one record per version, by version: `eval_records`)."""

    def number(value) -> float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return float(value) if ok else math.nan

    def line(source: str | None) -> EvalLine:
        parts = [r if source is None else (r.get("per_source") or {}).get(source) or {} for r in evals]
        return EvalLine(
            source,
            [r["policy_version"] for r in evals],
            [number(r.get("time")) for r in evals],
            [number(p.get("pass@1")) for p in parts],
            [number(p.get("reward_mean")) for p in parts],
        )

    sources = sorted({str(s) for r in evals if isinstance(r.get("per_source"), dict) for s in r["per_source"]})
    return [line(None)] + [line(s) for s in sources] if evals else []


def run_start(records: list[dict], events: list[dict]) -> float:
    """When the run began: its first supervisor event, else the start of its first recorded step."""
    first_step = records[0]["time"] - float(records[0].get("step_time_s") or 0.0)
    times = [e["time"] for e in events if isinstance(e.get("time"), (int, float))]
    return min([first_step, *times])


def plot_run(run_dir: RunDir, out: Path | None = None) -> PlotResult:
    """Write the run's plot to `out` (default `<run>/plot.png`)."""
    run_dir.require_run()
    records = [r for r in final_records(read_metrics(run_dir.metrics)) if isinstance(r.get("time"), (int, float))]
    if not records:
        raise RunDirError(
            f"{run_dir.root} has no metrics yet: {run_dir.metrics.name} is missing or empty (the trainer "
            f"writes one record per optimizer step). Nothing was written."
        )
    events = read_events(run_dir.events)
    marks = markers(events, records)
    evals = eval_records(run_dir.metrics)
    target = Path(out) if out is not None else run_dir.plot
    restarts = sum(1 for m in marks if m.kind == "restart")
    failures = sum(1 for m in marks if m.kind == "failure")
    title = f"{run_dir.root.name}: {records[-1]['step']} steps, {records[-1].get('samples', 0)} samples, {restarts} restart{'' if restarts == 1 else 's'}"
    if evals:
        title += f", {len(evals)} evaluation{'' if len(evals) == 1 else 's'}"
    fig = figure(records, marks, title, start=run_start(records, events), evals=evals)
    tmp = target.with_name(f".{target.name}.tmp")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(tmp, format="png", dpi=DPI)
        os.replace(tmp, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise RunDirError(
            f"cannot write the plot to {target}: {exc.strerror or exc}. Choose another path with --out."
        ) from None
    return PlotResult(path=target, steps=len(records), restarts=restarts, failures=failures, evaluations=len(evals))


def figure(records: list[dict], marks: list[Marker], title: str, start: float, evals: Sequence[dict] = ()):
    """Three panels, markers on each: reward over steps (±std) and over seconds since `start`, tokens/s;
    with `evals` (eval records, by version), two more below: their figures over policy version and
    over seconds since `start`."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise EnvironmentProblem(
            "rlrun plot needs matplotlib, which is not installed: pip install 'rlrun[plot]'."
        ) from None

    steps = [r["step"] for r in records]
    mean = [float(r.get("reward_mean", math.nan)) for r in records]  # missing (or NaN in the file): a gap
    std = [float(r.get("reward_std", 0.0)) for r in records]
    rates = throughput(records)
    window = smoothing_window(len(mean))
    smooth = smoothed(mean, window)
    seconds = [r["time"] - start for r in records]

    size = SIZE_PX_EVAL if evals else SIZE_PX
    fig = Figure(figsize=(size[0] / DPI, size[1] / DPI), dpi=DPI)
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(4 if evals else 3, 2)
    reward_ax, clock_ax, rate_ax = (fig.add_subplot(grid[row, :]) for row in range(3))
    rate_ax.sharex(reward_ax)
    fig.suptitle(title)
    fig.subplots_adjust(hspace=0.4)

    lower, upper = band(mean, std, *REWARD_RANGE)
    reward_ax.fill_between(steps, lower, upper, color="tab:blue", alpha=0.12, linewidth=0, label="± std (samples)")
    wall_clock = "wall-clock seconds since the run started (startup included)"
    panels = ((reward_ax, steps, "tab:blue", "optimizer step"), (clock_ax, seconds, "tab:purple", wall_clock))
    for ax, x, colour, xlabel in panels:
        ax.plot(x, mean, color=colour, linewidth=0.6, alpha=0.5, label="step mean")
        ax.plot(x, smooth, color=colour, linewidth=1.8, label=f"mean of the last {window} steps")
        ax.set_ylabel("reward")
        ax.set_xlabel(xlabel)
        ax.set_ylim(REWARD_RANGE[0] - 0.02, REWARD_RANGE[1] + 0.02)
        ax.grid(alpha=0.3)
    clock_ax.set_xlim(0.0, max(seconds[-1], 1.0))

    if rates:
        x = [s for s, _, _ in rates]
        tokens = [t for _, t, _ in rates]
        rate_ax.plot(x, tokens, color="tab:green", linewidth=0.6, alpha=0.5, label="tokens/s")
        if len(tokens) >= 5:
            window = max(3, len(tokens) // 20)
            median = [statistics.median(tokens[max(0, i - window + 1) : i + 1]) for i in range(len(tokens))]
            rate_ax.plot(x, median, color="tab:green", linewidth=1.5, label=f"median of {window}")
    rate_ax.set_ylabel("trained tokens / s")
    rate_ax.set_xlabel("optimizer step")
    rate_ax.grid(alpha=0.3)

    styles = {"restart": ("tab:orange", "--"), "failure": ("tab:red", "-"), "resume": ("tab:gray", "-.")}
    seen: set[str] = set()
    for mark in marks:
        color, style = styles[mark.kind]
        for ax in (reward_ax, rate_ax):
            label = mark.kind if (ax is reward_ax and mark.kind not in seen) else None
            ax.axvline(mark.step, color=color, linestyle=style, linewidth=1.0, alpha=0.8, label=label)
        clock_ax.axvline(mark.time - start, color=color, linestyle=style, linewidth=1.0, alpha=0.8)
        seen.add(mark.kind)
        if len(marks) <= MAX_LABELS and mark.process:
            reward_ax.annotate(
                mark.process,
                (mark.step, 1.0),
                xycoords=("data", "axes fraction"),
                rotation=90,
                fontsize=7,
                color=color,
                ha="right",
                va="top",
            )
    for ax in (reward_ax, clock_ax, rate_ax) if rates else (reward_ax, clock_ax):
        ax.legend(loc="lower right", fontsize=8)
    if evals:
        version_ax, eval_clock_ax = fig.add_subplot(grid[3, 0]), fig.add_subplot(grid[3, 1])
        fig.subplots_adjust(top=0.93)  # the taller figure: its title as close as without evaluations
        lines = eval_lines(list(evals))
        _eval_panels(version_ax, eval_clock_ax, lines, start)
        end = max([seconds[-1], 1.0, *(t - start for t in lines[0].times if not math.isnan(t))])
        for ax in (clock_ax, eval_clock_ax):  # the same seconds on both: an evaluation sits under its steps
            ax.set_xlim(0.0, end)
        for mark in marks:
            color, style = styles[mark.kind]
            version_ax.axvline(mark.step, color=color, linestyle=style, linewidth=1.0, alpha=0.8)
            eval_clock_ax.axvline(mark.time - start, color=color, linestyle=style, linewidth=1.0, alpha=0.8)
    return fig


def _eval_panels(version_ax, clock_ax, lines: list[EvalLine], start: float) -> None:
    """pass@1 (solid) and mean reward (dashed) of every line, over policy version and over seconds."""
    finite = [v for line in lines for v in (*line.pass_at_1, *line.reward_mean) if not math.isnan(v)]
    for i, line in enumerate(lines):
        colour = "black" if line.source is None else f"C{i - 1}"
        name = "all prompts" if line.source is None else line.source
        seconds = [t - start for t in line.times]
        for ax, x in ((version_ax, line.versions), (clock_ax, seconds)):
            ax.plot(x, line.pass_at_1, color=colour, marker="o", markersize=3, linewidth=1.5, label=f"{name}: pass@1")
            ax.plot(
                x,
                line.reward_mean,
                color=colour,
                marker="s",
                markersize=3,
                linewidth=1.0,
                linestyle="--",
                label=f"{name}: reward",
            )
    version_ax.set_xlabel("policy version (optimizer steps trained)")
    clock_ax.set_xlabel("wall-clock seconds since the run started")
    for ax in (version_ax, clock_ax):
        ax.set_title("held-out evaluation", fontsize=9)
        ax.set_ylabel("pass@1, reward")
        ax.set_ylim(min([REWARD_RANGE[0], *finite]) - 0.02, max([REWARD_RANGE[1], *finite]) + 0.02)
        ax.grid(alpha=0.3)
    version_ax.legend(loc="best", fontsize=7, ncol=2 if len(lines) > 2 else 1)
