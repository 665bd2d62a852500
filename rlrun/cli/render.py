"""How the CLI shows what `rlrun.cli.inspection` returns: rich renderables (rich imported when
something is rendered) and JSON documents. It reads and decides nothing.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:  # `rlrun runs` and `status` render without the checkpoint inspector's imports (redis, Hydra)
    from rich.console import JustifyMethod

    from rlrun.cli.inspection import CheckpointReport


def human_size(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB"):
        if value < 1024:
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def reward_text(last: Optional[float], smoothed: Optional[float], steps: int) -> str:
    """A run's training reward for `runs` and `status`: the mean over its last `steps` steps, then
    the last step's own ('0.840 (mean of 10 steps; last 0.590)'); '-' when none."""
    if smoothed is None or steps < 1:
        return "-" if last is None else f"{last:.3f}"
    if steps == 1:
        return f"{smoothed:.3f}"
    tail = "" if last is None else f"; last {last:.3f}"
    return f"{smoothed:.3f} (mean of {steps} steps{tail})"


EVAL_COLUMN = "eval pass@1 / reward"


def eval_text(figures: Optional[dict]) -> str:
    """A run's latest held-out evaluation (`rlrun.cli.status.eval_figures`) in `runs`' column
    EVAL_COLUMN: pass@1 / mean reward (version), '0.625 / 0.590 (v50)'; '-' when none."""
    if not figures:
        return "-"

    def number(value: Optional[float]) -> str:
        return "-" if value is None else f"{value:.3f}"

    return f"{number(figures.get('pass@1'))} / {number(figures.get('reward_mean'))} (v{_text(figures.get('policy_version'))})"


def eval_detail(figures: dict) -> str:
    """`rlrun status`'s eval line: 'eval v50 (2 prompts x 4): pass@1 0.625, pass@4 1.000, reward
    0.625', then a line per source ('  easy: ...') when the evaluation has sources."""

    def numbers(part: dict) -> str:
        shown = [(key, part.get(key)) for key in part if key.startswith("pass@")] + [
            ("reward", part.get("reward_mean"))
        ]
        return ", ".join(f"{name} {'-' if value is None else format(value, '.3f')}" for name, value in shown)

    lines = [
        f"eval v{_text(figures.get('policy_version'))} ({_text(figures.get('prompts'))} prompts x {_text(figures.get('k'))}): {numbers(figures)}"
    ]
    lines += [f"  {source}: {numbers(part)}" for source, part in (figures.get("per_source") or {}).items()]
    return "\n".join(lines)


def checkpoint_renderables(report: CheckpointReport, journal: Optional[dict], journal_note: Optional[str]) -> list:
    """The tables `rlrun inspect-checkpoint` prints, in order."""
    from rich.markup import escape
    from rich.table import Table

    out: list = []
    if report.selected_from_run:
        out.append(
            f"run directory {escape(str(report.run_dir))}: latest complete checkpoint is [bold]{escape(report.path)}[/]"
        )
        for skipped in report.skipped_half_written:
            out.append(f"[yellow]skipped half-written checkpoint {escape(skipped)} (no ok marker)[/]")
        for damaged in report.skipped_damaged:
            out.append(f"[yellow]skipped damaged checkpoint {escape(damaged)}[/]")

    main = _fields("checkpoint", [])
    main.add_row("path", escape(report.path))
    main.add_row("layout", report.layout)
    main.add_row("step", _text(report.step))
    for label, value in (
        ("samples processed", report.samples_processed),
        ("policy version", report.policy_version),
        ("documents seen", report.documents_seen),
    ):
        if value is not None:
            main.add_row(label, _text(value))
    when = (
        "-" if report.written_at is None else time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(report.written_at))
    )
    main.add_row("written", f"{when} ({report.written_at_source})")
    if report.complete:
        main.add_row("complete", "yes (ok marker, nothing damaged)")
    elif report.damaged:
        main.add_row("complete", f"[bold red]NO: damaged: {escape(report.damaged)}[/]")
    else:
        main.add_row("complete", "[bold red]NO: half-written, no ok marker[/]")
    main.add_row("run directory", escape(report.run_dir) if report.run_dir else "- (not inside a run directory)")
    if report.config_hash or report.checkpoint_config_hash:
        recorded = (
            f" (recorded in checkpoint: {report.checkpoint_config_hash})" if report.checkpoint_config_hash else ""
        )
        main.add_row("config hash", f"{report.config_hash or '-'}{recorded}")
    out.append(main)

    if report.config is not None:
        config = [(name, escape(str(value))) for name, value in asdict(report.config).items()]
        out.append(_fields("config", config))

    files = Table(title=f"files ({len(report.files)}, {human_size(report.total_bytes)})", title_justify="left")
    files.add_column("file", overflow="fold")
    files.add_column("size", justify="right")
    for entry in report.files:
        files.add_row(escape(entry.name), human_size(entry.size))
    out.append(files)

    if journal is not None:
        rows = [(name, _text(value)) for name, value in journal.items() if name != "actors"]
        out.append(_fields("journal", rows, "right"))
        if journal.get("actors"):  # actor.num_actors > 1: the same, per actor
            per = Table(title="journal per actor", title_justify="left")
            per.add_column("field", style="bold")
            actors = journal["actors"]
            for actor in actors:
                per.add_column(escape(actor), justify="right")
            for name in next(iter(actors.values())):
                per.add_row(name.replace("_", " "), *(_text(actors[a].get(name)) for a in actors))
            out.append(per)
    else:
        out.append(f"journal: {escape(journal_note or '')}")
    for warning in report.warnings:
        out.append(f"[yellow]warning:[/] {escape(warning)}")
    return out


def _text(value: Any) -> str:
    return "-" if value is None else str(value)


def _fields(title: str, rows: list[tuple[str, str]], justify: JustifyMethod = "left"):
    """A two-column table of named values (`some_name` shown as "some name")."""
    from rich.table import Table

    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold", justify=justify)
    for name, value in rows:
        table.add_row(name.replace("_", " "), value)
    return table


def checkpoint_json(report: CheckpointReport, journal: Optional[dict], journal_note: Optional[str]) -> str:
    """The one JSON document `--json` prints."""
    return json.dumps({**report.to_dict(), "journal": journal, "journal_note": journal_note}, indent=2)
