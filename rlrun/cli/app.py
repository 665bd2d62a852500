"""The `rlrun` command line: parse, call one library function, render. Errors become messages
and documented exit codes here, and only here; tracebacks only with --debug.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rlrun.cli import plot as plotting
from rlrun.cli import status as run_status
from rlrun.errors import (
    ExitCode,
    Interrupted,
    ProcessFailed,
    RlrunError,
    RunDirError,
)
from rlrun.rundir import RunDir
from rlrun.telemetry.metrics import read_metrics

app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="Launch and supervise asynchronous GRPO/GSPO training runs."
)
# emoji=False: "my_env.py:two: ..." names a function, never the emoji :two:
console = Console(emoji=False)
err_console = Console(stderr=True, soft_wrap=True, emoji=False)  # messages stay whole lines (grep, logs)

OVERRIDES_HELP = "Hydra overrides, e.g. recipe=math_grpo trainer.max_train_steps=50 run.dir=runs/mine"


def _fail(exc: BaseException, debug: bool) -> None:
    if debug:
        err_console.print_exception()
    if isinstance(exc, RlrunError):
        err_console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)  # 'rlrun[cpu]' is not markup
        if isinstance(exc, ProcessFailed) and exc.log_tail:
            err_console.print(f"[dim]last lines of {escape(exc.process)}'s log:[/]", highlight=False)
            err_console.print(exc.log_tail, highlight=False, markup=False)  # the log as written, "[...]" included
        raise typer.Exit(int(exc.exit_code))
    err_console.print(
        f"[bold red]internal error:[/] {type(exc).__name__}: {escape(str(exc))}\nRerun with --debug for the traceback and report it."
    )
    raise typer.Exit(int(ExitCode.INTERNAL))


@contextmanager
def _errors(debug: bool, run: bool = False) -> Iterator[None]:
    """The one place errors become messages and exit codes; Ctrl-C (or SIGTERM) stops a `run`."""
    try:
        yield
    except typer.Exit:
        raise
    except KeyboardInterrupt as exc:
        if not run:
            _fail(exc, debug)
        err_console.print("[yellow]interrupted:[/] every process of the run was stopped. `rlrun resume` continues it.")
        raise typer.Exit(int(Interrupted.exit_code))
    except BaseException as exc:  # noqa: BLE001 - the one place errors become messages
        _fail(exc, debug)


def _supervise(built, run_dir, resumed: bool = False) -> None:
    """Run to the end under the live view, then report how it ended. SIGTERM (and, in a SLURM job,
    the signal before its time limit) stops the run in order; `StopSignals` says what each means."""
    from rlrun.cli.live import LiveView
    from rlrun.run import launch
    from rlrun.run.stop_signals import StopSignals

    stops = StopSignals.of(built, run_dir, os.environ)

    def stop(signum, frame) -> None:
        if stops.received_signal(signal.Signals(signum).name.removeprefix("SIG")):
            raise KeyboardInterrupt

    for name in stops.names:
        signal.signal(getattr(signal, f"SIG{name}"), stop)
    stops.started()
    try:
        with LiveView(console, live=built.cfg.supervisor.live_view) as view:
            reason = launch.train(built, run_dir, on_tick=view.update, resumed=resumed)
    except KeyboardInterrupt:
        if stops.job is None:
            raise
        for name in stops.names:  # a requeue signals the batch step: the job is ours to end
            signal.signal(getattr(signal, f"SIG{name}"), signal.SIG_IGN)
        outcome = stops.after_stop()
        err_console.print(f"[yellow]{outcome.status}:[/] {escape(outcome.message)}", highlight=False)
        raise typer.Exit(int(Interrupted.exit_code)) from None
    _report_end(built, run_dir, reason)


@app.command(context_settings={"allow_extra_args": False})
def train(
    overrides: Optional[list[str]] = typer.Argument(None, help=OVERRIDES_HELP),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print the resolved config and the processes; start nothing."
    ),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks."),
) -> None:
    """Compose the config, start Redis, vLLM, the trainer and the actor, and supervise them to the end."""
    from rlrun.cli.dry_run import print_dry_run
    from rlrun.config import compose
    from rlrun.run import launch
    from rlrun.run.built import build

    overrides = list(overrides or [])
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, format="%(name)s: %(message)s")
    with _errors(debug, run=True):
        cfg, resolved = compose(overrides)
        built = build(cfg)
        if dry_run:
            print_dry_run(console, launch.preview(built), resolved)
            return
        launch.refuse_outside_allocation(built)
        with launch.new_run(built, resolved, overrides) as run_dir:  # owned until it ends
            console.print(f"run directory: [bold]{run_dir.root}[/]")
            _supervise(built, run_dir)


@app.command(context_settings={"allow_extra_args": False})
def submit(
    overrides: Optional[list[str]] = typer.Argument(
        None, help=OVERRIDES_HELP + " world=slurm world.nodes=4 world.time=24:00:00"
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print the config, the batch script and where each process goes; submit nothing."
    ),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks."),
) -> None:
    """Submit the run as a SLURM batch job (world=slurm): create its run directory, write the batch
    script from the config, sbatch it and print the job id. The job requeues itself before its time
    limit; `rlrun status/logs RUN` watch it, `rlrun resume RUN` submits it again after a cancel."""
    from rlrun.cli.dry_run import print_dry_run
    from rlrun.config import compose
    from rlrun.run import launch
    from rlrun.run.built import build

    overrides = list(overrides or [])
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, format="%(name)s: %(message)s")
    with _errors(debug):
        cfg, resolved = compose(overrides)
        built = build(cfg)
        if cfg.world.kind != "slurm":
            from rlrun.errors import ConfigError

            raise ConfigError(
                "rlrun submit sends the run to SLURM: add world=slurm (and world.nodes=..., world.time=..., world.partition=...)."
            )
        if dry_run:
            print_dry_run(console, launch.preview(built), resolved)
            return
        run_dir, job = launch.submit(built, resolved, overrides)
    _print_submitted(run_dir, job)


def _print_submitted(run_dir, job: str) -> None:
    console.print(f"submitted SLURM job [bold]{job}[/]; run directory: [bold]{run_dir.root}[/]")
    console.print(
        f"watch it: rlrun status {run_dir.root}   rlrun logs {run_dir.root} -f   squeue -j {job}", highlight=False
    )


@app.command()
def resume(
    run_dir: Path = typer.Argument(..., help="The run directory to continue."),
    overrides: Optional[list[str]] = typer.Argument(None, help="Allowed: trainer.max_train_steps=N, supervisor.*=..."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks."),
) -> None:
    """Continue a stopped or crashed run: Redis from its AOF, the trainer from its last complete
    checkpoint, vLLM with the current weights, the actor from its token journal."""
    from rlrun.run import launch
    from rlrun.run import resume as resuming

    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, format="%(name)s: %(message)s")
    with _errors(debug, run=True):
        with resuming.owned(run_dir.resolve()):  # exit 4 at once if another rlrun runs it
            plan = resuming.plan_resume(run_dir.resolve(), list(overrides or []))
            for key, before, after in plan.changes:
                console.print(f"change: {key}: {before!r} -> {after!r}")
            if plan.already_finished:
                console.print(f"{run_dir} already finished; nothing to do.")
                return
            as_job = launch.outside_allocation(plan.built.cfg)  # a SLURM run continues as a job: submitted again
            if as_job:
                resuming.check_job_gone(plan.run_dir)
            resuming.apply(plan)
            if not as_job:
                console.print(f"{'starting' if plan.fresh else 'resuming'} run directory: [bold]{plan.run_dir.root}[/]")
                _supervise(plan.built, plan.run_dir, resumed=not plan.fresh)
                return
        _print_submitted(
            plan.run_dir, launch.submit_job(plan.built.cfg, plan.run_dir)
        )  # let go first: the job owns the run


@app.command()
def status(
    run_dir: Path = typer.Argument(..., help="A run directory."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document on stdout, for scripts."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks."),
) -> None:
    """Show the processes, progress, latest held-out evaluation and effective training time of a run."""
    from rlrun.cli.live import status_table

    run = RunDir(run_dir.resolve())
    with _errors(debug):
        if as_json:
            typer.echo(json.dumps(run_status.report(run), indent=2))
            return
        state, rows, last = run_status.load(run)
        split = run_status.time_split(run)
        smoothed = run_status.recent_reward(read_metrics(run.metrics))
        evaluated = run_status.latest_eval(run)
    console.print(f"run {run_dir}: [bold]{state.get('status', 'unknown')}[/]")
    if state.get("slurm_job_id"):
        console.print(
            f"SLURM job {state['slurm_job_id']}: {state.get('slurm_job_state') or 'no longer in the queue'}",
            highlight=False,
        )
    console.print(status_table(rows))
    _print_gpu_usage(*run_status.gpu_usage(run, rows))
    from rlrun.cli.render import eval_detail, reward_text

    if last:
        reward = reward_text(last.get("reward_mean"), *(smoothed or (None, 0)))
        console.print(
            f"step {last.get('step')}  samples {last.get('samples')}  reward {reward}  policy v{last.get('policy_version')}"
        )
    if evaluated:  # the held-out figures beside the training reward
        console.print(eval_detail(evaluated), highlight=False, markup=False)
    counts = run_status.recovery(last or {})
    if counts is not None:
        console.print(run_status.describe_recovery(counts), highlight=False, markup=False)
    failures = run_status.reward_failures(last or {})
    if failures:
        console.print(run_status.describe_reward_failures(failures), highlight=False, markup=False)
    console.print(run_status.describe_split(split), highlight=False, markup=False)


def _print_gpu_usage(placed: dict, note: str) -> None:
    """`rlrun status` of a run on GPUs: each process's GPUs, the memory it holds there, their use."""
    if not placed:
        return
    table = Table(title="GPUs")
    for column in ("process", "GPUs", "memory held", "GPU utilisation"):
        table.add_column(column)
    for name, used in placed.items():
        memory = "-" if used["memory_bytes"] is None else f"{used['memory_bytes'] / 2**30:.1f} GiB"
        busy = ", ".join(f"{gpu}: {pct}%" for gpu, pct in used["utilization"].items()) or "-"
        table.add_row(name, ",".join(used["gpus"]) or "none", memory, busy)
    console.print(table)
    if note:
        console.print(note, highlight=False, markup=False)


@app.command()
def runs(
    root: Path = typer.Argument(Path("runs"), help="The folder holding run directories (run.runs_root)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON list on stdout, for scripts."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks."),
) -> None:
    """List the runs under ROOT, newest first: state, step, reward, latest eval, ETTR, restarts and last event."""
    with _errors(debug):
        found = run_status.list_runs(root)
    if as_json:
        typer.echo(json.dumps(found, indent=2))
        return
    from rlrun.cli.render import EVAL_COLUMN, eval_text, reward_text

    damaged = [run for run in found if run["status"] == run_status.DAMAGED]
    found = [run for run in found if run["status"] != run_status.DAMAGED]
    table = Table(title=f"runs under {root}", expand=False)
    for column in ("run", "status", "step", "reward", EVAL_COLUMN, "ETTR", "restarts", "last event"):
        table.add_column(column, overflow="fold")
    for run in found:
        step = "-" if run["step"] is None else f"{run['step']}/{run.get('max_train_steps') or '?'}"
        last = run["last_event"] or {}
        event = " ".join(str(last[k]) for k in ("event", "process", "reason", "status") if last.get(k))
        ettr = "-" if run["ettr"] is None else f"{run['ettr']:.2f}"
        reward = reward_text(run["reward_mean"], run["reward_smoothed"], run["reward_smoothed_steps"])
        table.add_row(
            Path(run["run_dir"]).name,
            run["status"],
            step,
            reward,
            eval_text(run["eval"]),
            ettr,
            str(run["restarts"]),
            event or "-",
        )
    console.print(table if found else f"no {'other ' if damaged else ''}runs under {root}")
    for run in damaged:
        err_console.print(f"skipped {run['run_dir']}: {run['note']}", highlight=False, markup=False)


@app.command()
def logs(
    run_dir: Path = typer.Argument(..., help="A run directory."),
    process: str = typer.Option("trainer", "--process", "-c", help="redis, vllm-0, trainer or actor."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new lines (Ctrl-C to stop)."),
    launch: Optional[int] = typer.Option(
        None,
        "--launch",
        "-l",
        help="Which launch (1 = the first `rlrun train`, 2 = the first resume, ...); default the newest.",
    ),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks."),
) -> None:
    """Print a process's log (its latest start attempt, in the newest launch unless --launch)."""
    with _errors(debug):
        path = run_status.latest_log(RunDir(run_dir.resolve()), process, launch)
        try:
            with open(path, errors="replace") as handle:
                sys.stdout.write(handle.read())
                while follow:
                    line = handle.readline()
                    if line:
                        sys.stdout.write(line)
                        sys.stdout.flush()
                    else:
                        time.sleep(0.3)
        except KeyboardInterrupt:
            return
        except OSError as exc:
            raise RunDirError(f"cannot read the log of '{process}': {exc}") from None


@app.command("inspect-checkpoint")
def inspect_checkpoint(
    path: Path = typer.Argument(
        ..., help="A checkpoint directory (hf or Fast-LLM layout) or a run directory (its latest complete checkpoint)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document on stdout, for scripts."),
    redis_url: Optional[str] = typer.Option(
        None,
        "--redis-url",
        help="Read the token journal from this Redis (default: the run's own, while the run is running).",
    ),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks."),
) -> None:
    """Show a checkpoint: step, samples, policy version, completeness, config, files, and the run's token journal."""
    from rlrun.cli import inspection as checkpoint_inspect
    from rlrun.cli import render as cli_render

    logging.basicConfig(level=logging.DEBUG if debug else logging.ERROR, format="%(name)s: %(message)s")
    with _errors(debug):
        report = checkpoint_inspect.inspect_path(path)
        journal, note = checkpoint_inspect.read_journal(report, redis_url)
    if as_json:
        typer.echo(cli_render.checkpoint_json(report, journal, note))
    else:
        for item in cli_render.checkpoint_renderables(report, journal, note):
            console.print(item)
    if not report.complete:
        why = checkpoint_inspect.damaged_warning(report.damaged) if report.damaged else checkpoint_inspect.HALF_WRITTEN
        _fail(RunDirError(why), debug)


@app.command()
def export(
    run_dir: Path = typer.Argument(..., help="A run directory (running or finished)."),
    out_dir: Path = typer.Argument(..., help="A new (or empty) folder to write the Hugging Face model folder into."),
    step: Optional[int] = typer.Option(
        None, "--step", min=0, help="The checkpoint of this step (default: the newest complete one)."
    ),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks."),
) -> None:
    """Copy the run's newest complete checkpoint (or --step N) as a Hugging Face folder: weights,
    config, tokenizer and chat template, without the optimizer and trainer state."""
    from rlrun.cli import export as exporting

    with _errors(debug):
        result = exporting.export(run_dir, out_dir, step)
    for warning in result.warnings:
        err_console.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False)
    console.print(
        f"exported step {result.step} ({result.checkpoint}) to {result.path}: {len(result.files)} files",
        highlight=False,
        soft_wrap=True,
    )


@app.command("eval")
def eval_checkpoint(
    run_dir: Path = typer.Argument(..., help="A run directory (running or finished) whose task has held-out rows."),
    step: Optional[int] = typer.Option(
        None, "--step", "--checkpoint", min=0, help="The checkpoint of this step (default: the newest complete one)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the figures as JSON."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks."),
) -> None:
    """Evaluate a checkpoint on the run's held-out rows, as the run evaluates (a vLLM server of its own
    for the checkpoint), beside the run's own figure of that version."""
    from rlrun.cli import evaluate as evaluating

    with _errors(debug):
        result = evaluating.evaluate(run_dir, step)
    for warning in result.warnings:
        err_console.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False)
    if as_json:
        print(
            json.dumps(
                {
                    "checkpoint": str(result.checkpoint),
                    "version": result.version,
                    "figures": result.figures,
                    "in_run": result.in_run,
                }
            )
        )
        return
    k = result.figures["k"]
    table = Table(title=f"evaluation of {result.checkpoint} (policy version {result.version})")
    for column in ("", "prompts", "reward_mean", "pass@1", f"pass@{k}"):
        table.add_column(column)
    for label, figures in (("now", result.figures), ("in the run", result.in_run)):
        if figures is not None:
            table.add_row(
                label,
                str(figures["prompts"]),
                f"{figures['reward_mean']:.4f}",
                f"{figures['pass@1']:.4f}",
                f"{figures.get(f'pass@{k}', float('nan')):.4f}",
            )
    console.print(table)
    if result.in_run is None:
        console.print(f"the run recorded no evaluation of version {result.version}", highlight=False)


@app.command()
def plot(
    run_dir: Path = typer.Argument(..., help="A run directory (running or finished)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Where to write the PNG (default RUN_DIR/plot.png)."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks."),
) -> None:
    """Write a PNG of the run: reward (mean ± std) and throughput over steps, restarts marked."""
    with _errors(debug):
        result = plotting.plot_run(RunDir(run_dir.resolve()), out)
    console.print(
        f"plot: {result.path} ({result.steps} steps, {result.restarts} restarts, {result.failures} failures)",
        soft_wrap=True,
    )


def _report_end(built, run_dir, reason: str) -> None:
    """What a finished train/resume prints: why, the last step, the time split, where metrics and plot are."""
    console.print(f"[bold green]finished:[/] {reason}")
    records = read_metrics(run_dir.metrics)
    last = records[-1] if records else None
    if last:
        console.print(f"last step {last.get('step')}: reward {last.get('reward_mean')}, samples {last.get('samples')}")
    console.print(
        run_status.describe_split(run_status.time_split(run_dir)), highlight=False, markup=False, soft_wrap=True
    )

    elsewhere = built.backend.metrics_hint(run_dir)
    if elsewhere is not None:
        console.print(f"training metrics: {elsewhere}\nevents:  {run_dir.events}")
        return
    console.print(f"metrics: {run_dir.metrics}\nevents:  {run_dir.events}")
    try:
        console.print(f"plot:    {plotting.plot_run(run_dir).path}", soft_wrap=True)
    except Exception as exc:  # noqa: BLE001 - the run is done; a missing picture is not a failure
        err_console.print(f"[yellow]warning:[/] no plot written: {exc}", highlight=False)
