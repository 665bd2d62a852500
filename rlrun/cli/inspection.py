"""What `rlrun inspect-checkpoint` reads: one checkpoint, its run's config, and the token journal.

`inspect_path` takes a checkpoint of any backend's layout or a run directory (then the checkpoint
a resume would load) and returns plain data: a half-written checkpoint is reported, not refused.
It never prints and never loads weights (only names, sizes, metadata); `rlrun.cli.render` renders.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional
from urllib.parse import urlsplit

import redis

from rlrun.backends import HALF, CheckpointLayout, checkpoint_layouts
from rlrun.config.compose import load_resolved
from rlrun.errors import ConfigError, EnvironmentProblem, RunDirError
from rlrun.journal.plan import plan_replay
from rlrun.journal.store import KEY_PREFIX, Journal
from rlrun.run import runlock
from rlrun.run.built import BuiltRun, build
from rlrun.rundir import MARKER, RunDir
from rlrun.streams import names
from rlrun.streams.external import process_url
from rlrun.streams.names import actor_name
from rlrun.streams.server import connect, ping, redis_url

OK_MARKER = "ok"  # every backend writes it last: its mtime is when the checkpoint was finished

HALF_WRITTEN = "half-written checkpoint (no ok marker): it will be skipped on resume"
REDIS_NOT_RUNNING = "Redis not running (start the run with `rlrun resume` to see it)"
NO_RUN_FOR_JOURNAL = "no run directory around this checkpoint (pass --redis-url to read a journal)"

_RUN_SEARCH_DEPTH = 6  # parent folders searched for rlrun-run.json above a checkpoint
_EXPECTED = (
    "expected an hf checkpoint directory (checkpoints/step_NNNNNN/ with trainer_state.json), a "
    "Fast-LLM checkpoint directory (checkpoint/<step>/ with metadata.yaml), or a run directory "
    f"(with {MARKER})"
)


@dataclass(frozen=True)
class FileEntry:
    name: str  # relative to the checkpoint directory
    size: int  # bytes


@dataclass(frozen=True)
class ConfigSummary:
    """The part of the run's resolved config that says what a checkpoint was trained for."""

    recipe: str
    algo: str
    model: str
    trainer_backend: str
    max_train_steps: int
    samples_per_step: int


@dataclass(frozen=True)
class CheckpointReport:
    path: str  # the checkpoint directory (absolute)
    layout: str  # the backend whose checkpoint this is: "hf" | "fast_llm"
    step: Optional[int]  # optimizer steps taken (hf: trainer_state; fast_llm: completed_steps)
    samples_processed: Optional[int]  # hf only
    documents_seen: Optional[int]  # fast_llm only (when its metadata records it)
    policy_version: Optional[int]  # hf only: the version vLLM serves after this step
    written_at: Optional[float]  # unix time
    written_at_source: str  # "trainer_state.json" or the file whose mtime was used
    complete: bool  # a resume would load it, by its trainer's own rule: `ok` marker there and nothing damaged
    run_dir: Optional[str]  # the run directory holding the checkpoint, if any
    selected_from_run: bool  # PATH was a run directory and this is its latest complete checkpoint
    skipped_half_written: list[str]  # run directory only: newer half-written checkpoints skipped
    skipped_damaged: list[str]  # run directory only: newer damaged checkpoints skipped ("name: why"), as resume does
    config: Optional[ConfigSummary]  # from the run's config.yaml
    config_hash: Optional[str]  # sha256[:12] of the run's config.yaml
    checkpoint_config_hash: Optional[str]  # hf: the hash recorded in trainer_state.json
    files: list[FileEntry]
    warnings: list[str] = field(default_factory=list)
    damaged: Optional[str] = None  # complete (`ok` there) but damaged: what a resume skips it for

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["total_bytes"] = self.total_bytes
        when = None if self.written_at is None else time.gmtime(self.written_at)
        data["written_at_iso"] = None if when is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", when)
        return data


def inspect_path(path: Path) -> CheckpointReport:
    """The report for a checkpoint directory, or for a run directory's latest complete one."""
    path = Path(path).expanduser().absolute()
    if not path.exists():
        raise RunDirError(f"{path} does not exist: {_EXPECTED}.")
    if not path.is_dir():
        raise RunDirError(f"{path} is a file, not a directory: {_EXPECTED}.")
    run = RunDir(path)
    if run.is_run():
        chosen, skipped, damaged = latest_in_run(run)
        if chosen is None and damaged:
            raise RunDirError(
                f"the run directory {path} holds no usable checkpoint: every complete one is damaged "
                f"({'; '.join(damaged)}), so resuming it is refused."
            )
        if chosen is None:
            half = f" ({len(skipped)} half-written one(s) skipped: {', '.join(skipped)})" if skipped else ""
            raise RunDirError(
                f"the run directory {path} holds no complete checkpoint yet{half}: resuming it "
                f"starts the trainer from the base model."
            )
        return _read_checkpoint(chosen, selected_from_run=True, skipped=skipped, damaged=damaged)
    if layout_of(path) is None:
        raise RunDirError(f"{path} is not a checkpoint: {_EXPECTED}.{_hint(path)}")
    return _read_checkpoint(path, selected_from_run=False, skipped=[], damaged=[])


def layout_of(path: Path) -> Optional[CheckpointLayout]:
    """The backend layout `path` belongs to (half-written too), or None when it looks like none."""
    return next((layout for layout in checkpoint_layouts() if layout.looks_like(path)), None)


def latest_in_run(run: RunDir) -> tuple[Optional[Path], list[str], list[str]]:
    """(the checkpoint a resume loads, newer half-written ones, newer damaged ones with why), by each
    backend's own rule, so a damaged checkpoint is skipped here exactly as resume skips it."""
    candidates = [c for layout in checkpoint_layouts() for c in layout.candidates(run)]
    half: list[str] = []
    damaged: list[str] = []
    for candidate in sorted(candidates, key=lambda c: (c.step, str(c.path)), reverse=True):
        name = str(candidate.path.relative_to(run.root))
        if candidate.skipped_because is None:
            return candidate.path, half, damaged
        if candidate.skipped_because == HALF:
            half.append(name)
        else:
            damaged.append(f"{name}: {candidate.skipped_because}")
    return None, half, damaged


def _hint(path: Path) -> str:
    """Point at checkpoints below a folder that is not one itself."""
    inside = sorted(p for p in path.glob("step_*") if p.is_dir()) or sorted(
        (p for p in path.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name)
    )
    if (path / "checkpoints").is_dir() or (path / "checkpoint").is_dir():
        return " It holds a checkpoint folder: give one checkpoint inside it, or the run directory."
    if inside:
        return f" It holds checkpoints: give one of them, e.g. {inside[-1]}."
    return ""


def _read_checkpoint(
    path: Path, *, selected_from_run: bool, skipped: list[str], damaged: list[str]
) -> CheckpointReport:
    layout = layout_of(path)
    assert layout is not None  # inspect_path checked
    warnings: list[str] = []
    why = layout.problem(path)  # the trainer's own rule, as for a run directory's checkpoints
    complete, damage = why is None, (why if why not in (None, HALF) else None)
    if why == HALF:
        warnings.append(HALF_WRITTEN)
    elif damage:
        warnings.append(damaged_warning(damage))
    fields = layout.read_fields(path, warnings)
    # the run directory a checkpoint sits in: the nearest parent holding rlrun-run.json
    run = next((RunDir(p) for p in list(path.parents)[:_RUN_SEARCH_DEPTH] if RunDir(p).is_run()), None)
    config_hash = run.config_hash() if run is not None and run.config.is_file() else None
    if run is not None and config_hash is None:
        warnings.append(f"the run directory {run.root} has no {run.config.name}")
    cfg = _config(run, warnings)
    config = (
        None
        if cfg is None
        else ConfigSummary(
            cfg.recipe,
            cfg.algo.name,
            cfg.model.name,
            cfg.trainer.backend,
            cfg.trainer.max_train_steps,
            cfg.trainer.samples_per_step,
        )
    )
    recorded = fields.get("checkpoint_config_hash")
    if recorded and config_hash and recorded != config_hash:
        warnings.append(
            f"the run's config.yaml changed since this checkpoint's run started (checkpoint "
            f"{recorded}, config.yaml now {config_hash})"
        )
    written_at, source = fields.pop("written_at", None), fields.pop("written_at_source", "")
    if written_at is None:
        written_at, source = _mtime(path)
    return CheckpointReport(
        path=str(path),
        layout=layout.name,
        step=fields.get("step"),
        samples_processed=fields.get("samples_processed"),
        documents_seen=fields.get("documents_seen"),
        policy_version=fields.get("policy_version"),
        written_at=written_at,
        written_at_source=source,
        complete=complete,
        run_dir=None if run is None else str(run.root),
        selected_from_run=selected_from_run,
        skipped_half_written=list(skipped),
        skipped_damaged=list(damaged),
        config=config,
        config_hash=config_hash,
        checkpoint_config_hash=recorded or None,
        files=list_files(path),
        warnings=warnings,
        damaged=damage,
    )


def damaged_warning(why: str) -> str:
    return f"damaged checkpoint ({why}): a resume skips it and loads an older one"


def _mtime(path: Path) -> tuple[Optional[float], str]:
    """When the checkpoint was finished: its `ok` marker's mtime, else its newest file's."""
    ok = path / OK_MARKER
    if ok.is_file():
        return ok.stat().st_mtime, f"mtime of {ok.name}"
    newest = max((p for p in path.rglob("*") if p.is_file()), key=lambda p: p.stat().st_mtime, default=None)
    if newest is None:
        return path.stat().st_mtime, "mtime of the folder"
    return newest.stat().st_mtime, f"mtime of {newest.relative_to(path)}"


def list_files(path: Path) -> list[FileEntry]:
    """Every file below the checkpoint, by relative name (links are not followed)."""
    items = sorted(p for p in path.rglob("*") if p.is_file() and not p.is_symlink())
    return [FileEntry(str(item.relative_to(path)), item.stat().st_size) for item in items]


def journal_summary(client, *, prefix: str = KEY_PREFIX, max_prefix_staleness: Optional[int] = None) -> dict:
    """What the journal on `client` holds now. `tokens_saved`: what a restart reuses at most; `stale_*`:
    what a replay now would drop (None without a bound or a policy version); `max_prefix_lag`: the
    largest policy_version - oldest token's version of an unfinished prefix."""
    journal = Journal(client, prefix)
    loaded = journal.load_open_groups()
    raw_version = client.get(names.POLICY_VERSION)
    version = int(raw_version) if raw_version is not None and str(raw_version).isdigit() else None
    states = {"pending": 0, "generating": 0, "finished": 0}
    tokens = 0
    lags = []
    for group in loaded.groups:
        for sample in group.samples:
            states[sample.state] = states.get(sample.state, 0) + 1
            tokens += len(sample.token_ids)
            if version is not None and not sample.finished and sample.versions:
                lags.append(version - min(sample.versions))
    stale_prefixes = stale_tokens = None
    if version is not None and max_prefix_staleness is not None:
        counters = plan_replay(
            loaded.groups, current_version=version, max_prefix_staleness=max_prefix_staleness
        ).counters
        stale_prefixes, stale_tokens = counters.prefixes_dropped_stale, counters.tokens_dropped_stale
    return {
        "prompt_cursor": journal.cursor(),
        "policy_version": version,
        "groups_awaiting_delivery": len(loaded.groups),
        "groups_ready": sum(all(s.finished for s in g.samples) for g in loaded.groups),
        "groups_delivered_markers": int(client.zcard(journal.key("delivered"))),
        "samples_in_flight": states["pending"] + states["generating"],
        "samples_pending": states["pending"],
        "samples_generating": states["generating"],
        "samples_finished": states["finished"],
        "tokens_saved": tokens,
        "max_prefix_lag": max(lags) if lags else None,
        "max_prefix_staleness": max_prefix_staleness,
        "stale_prefixes": stale_prefixes,
        "stale_tokens": stale_tokens,
        "corrupt_records": len(loaded.corrupt),
        "groups_quarantined": len(journal.quarantined()),
    }


@dataclass(frozen=True)
class RedisEndpoint:
    url: str  # without the password
    password: Optional[str]


def _config(run: Optional[RunDir], warnings: Optional[list[str]] = None):
    """The run's resolved config, or None when it has none that can be read (said in `warnings`)."""
    if run is None or not run.config.is_file():
        return None
    try:
        return load_resolved(run.config)
    except ConfigError as exc:
        if warnings is not None:
            warnings.append(f"cannot summarise the run's config: {exc}")
        return None


def run_redis_endpoint(run: RunDir) -> Optional[RedisEndpoint]:
    """The run's Redis: its config's streams.url, else its own (redis.conf's bind and port)."""
    cfg = _config(run)
    password = run.read_redis_password()
    if cfg is not None and cfg.streams.url is not None:
        return RedisEndpoint(process_url(cfg.streams.url, password is not None), password)
    try:
        lines = run.redis_conf.read_text().splitlines()
    except OSError:
        return None
    settings = {}
    for line in lines:
        key, _, value = line.strip().partition(" ")
        if key in ("bind", "port") and value:
            settings[key] = value.split()[0].strip('"')
    if not settings.get("port", "").isdigit():
        return None
    return RedisEndpoint(redis_url(settings.get("bind", "127.0.0.1"), int(settings["port"])), password)


def journal_prefixes_of(built: Optional[BuiltRun]) -> list[tuple[str, str]]:
    """(actor name, its journal's key prefix) per actor; the one default actor without a config."""
    if built is None:
        return [("actor", KEY_PREFIX)]
    k_all = built.cfg.actor.num_actors
    return [  # a view touches Redis only when asked
        (actor_name(k, k_all), names.journal_prefix(built.backend.trainer_view(None, k).stream)) for k in range(k_all)
    ]


def combined_summary(per_actor: dict[str, dict]) -> dict:
    """One actor: its summary. Several: their counts added up, each one's own under `actors`."""
    if len(per_actor) == 1:
        return next(iter(per_actor.values()))
    summaries = list(per_actor.values())
    total: dict = {}
    for key, first in summaries[0].items():
        values = [s.get(key) for s in summaries]
        if key in ("policy_version", "max_prefix_staleness"):
            total[key] = first
        elif key == "max_prefix_lag":
            total[key] = max((v for v in values if v is not None), default=None)
        else:
            total[key] = None if any(v is None for v in values) else sum(values)
    return {**total, "actors": per_actor}


def read_journal(report: CheckpointReport, redis_url: Optional[str] = None) -> tuple[Optional[dict], Optional[str]]:
    """(journal summary, None) or (None, why not): from `redis_url`, else the run's Redis while it runs."""
    run = RunDir(Path(report.run_dir)) if report.run_dir else None
    endpoint: Optional[RedisEndpoint]
    if redis_url:
        try:
            has_password = bool(urlsplit(redis_url).password)
        except ValueError as exc:
            raise EnvironmentProblem(
                f"--redis-url {redis_url!r} is not a URL ({exc}); use e.g. redis://127.0.0.1:6379/0"
            ) from None
        password = None if has_password or run is None else run.read_redis_password()
        endpoint = RedisEndpoint(redis_url, password)
    else:
        if run is None:
            return None, NO_RUN_FOR_JOURNAL
        endpoint = run_redis_endpoint(run) if runlock.holder(run) is not None else None
        if endpoint is None or not ping(endpoint.url, endpoint.password):
            return None, REDIS_NOT_RUNNING
    cfg = _config(run)
    bound = None if cfg is None else cfg.actor.max_prefix_staleness
    try:
        with connect(
            endpoint.url, endpoint.password, socket_timeout=5.0, reconnect_s=0, client_name="rlrun-inspect"
        ) as client:
            per_actor = {
                name: journal_summary(client, prefix=prefix, max_prefix_staleness=bound)
                for name, prefix in journal_prefixes_of(None if cfg is None else build(cfg))
            }
        return combined_summary(per_actor), None
    except (redis.RedisError, OSError, ValueError) as exc:
        if redis_url:
            raise EnvironmentProblem(f"cannot read the token journal from {endpoint.url}: {exc}") from None
        return None, f"Redis did not answer ({exc}); {REDIS_NOT_RUNNING}"
