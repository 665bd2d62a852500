"""What a person sees of a run's processes: the live table of `rlrun train` on a terminal (plain
lines otherwise), and `rlrun status`'s table, drawn from the run's recorded events."""

from __future__ import annotations

import time
from typing import Optional

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.progress_bar import ProgressBar
from rich.table import Table

from rlrun.parts.progress import Progress
from rlrun.supervisor import ProcessStatus

COLOURS = {
    "ready": "green",
    "starting": "yellow",
    "backoff": "yellow",
    "failed": "red",
    "stalled": "red",
    "exited": "cyan",
    "stopped": "dim",
}


def _state(state: str) -> str:
    return f"[{COLOURS.get(state, 'white')}]{state}[/]"


def process_table(processes: list[ProcessStatus], now: Optional[float] = None) -> Table:
    now = time.monotonic() if now is None else now
    table = Table(title="rlrun processes", expand=False)
    for column in ("process", "pid", "state", "uptime", "restarts", "last sign of life", "log"):
        table.add_column(column)
    for p in processes:
        running = p.started_at is not None and p.state.value in ("starting", "ready")
        uptime = f"{now - p.started_at:.0f}s" if running and p.started_at is not None else "-"
        restarts = f"{p.tracker.restarts_used(now)}/{p.spec.restart.max_restarts}" if p.spec.restart.restart else "off"
        alive = f"{now - p.last_alive:.0f}s ago" if running and p.last_alive is not None else "-"
        table.add_row(p.name, str(p.pid or "-"), _state(p.state.value), uptime, restarts, alive, str(p.log_path))
    return table


def status_table(rows) -> Table:
    """The same table for `rlrun status`, from the run's recorded events."""
    table = Table(title="rlrun processes", expand=False)
    for column in ("process", "pid", "state", "restarts", "last failure", "log"):
        table.add_column(column, overflow="fold")
    for row in rows:
        failure = row.last_failure + (f" (stacks: {row.last_dump})" if row.last_dump else "")
        # Recorded text is shown as written, never as markup (a reason may hold "[...]").
        table.add_row(
            escape(row.name),
            str(row.pid or "-"),
            _state(row.state),
            str(row.restarts),
            escape(failure or "-"),
            escape(row.log),
        )
    return table


def progress_line(progress: Progress) -> str:
    reward = f"{progress.reward_mean:.3f}" if progress.reward_mean is not None else "-"
    return (
        f"step {progress.step}/{progress.max_train_steps}  samples {progress.samples}  "
        f"reward {reward}  policy v{progress.policy_version}  groups {progress.groups_published}"
    )


class LiveView:
    """A rich Live display on a terminal (supervisor.live_view); a line per change otherwise."""

    def __init__(self, console: Console, live: bool = True) -> None:
        self.console = console
        self.live = live
        self._live: Optional[Live] = None
        self._last_line = ""
        self._last_states: dict[str, str] = {}

    def __enter__(self) -> "LiveView":
        if self.live and self.console.is_terminal:
            self._live = Live(console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)

    def update(self, processes: list[ProcessStatus], progress: Progress) -> None:
        if self._live is not None:
            bar = ProgressBar(total=max(progress.max_train_steps, 1), completed=progress.step, width=50)
            self._live.update(Group(process_table(processes), bar, progress_line(progress)))
            return
        for p in processes:
            if self._last_states.get(p.name) != p.state.value:
                line = f"[process] {p.name} {p.state.value} pid={p.pid or '-'}"
                self.console.print(line, highlight=False, markup=False)
        self._last_states = {p.name: p.state.value for p in processes}
        line = progress_line(progress)
        if line != self._last_line and progress.step > 0:
            self.console.print(f"[train] {line}", highlight=False, markup=False)
            self._last_line = line
