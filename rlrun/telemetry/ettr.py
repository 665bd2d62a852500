"""Effective training time: where a run's wall time went, and what each failure cost.

A pure function of `events.jsonl` and `metrics.jsonl` read back as dicts (no files, no clock: a
live run passes `now`). The buckets are docs/operations.md's; the rules behind them:

- training / waiting / weights: a step's `step_time_s`, less / as its `wait_s` / its `weights_s`;
- recovery: from a failure (for a stall, from when the process went quiet) to the end of the
  first step after it; a step recorded again later (its work was lost); a resumed launch's start;
- start_stop: a fresh launch's start to its first step, its last step to its stop; other: the rest.

Where they overlap, recovery wins, then start_stop, then a step's own parts. ETTR = training / wall.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Optional

BUCKETS = ("training", "waiting", "weights", "recovery", "start_stop", "other")
PRECEDENCE = ("recovery", "start_stop", "waiting", "weights", "training")  # highest first; "other" fills gaps
LAUNCH_STARTS = ("run_started", "run_resumed")


@dataclass(frozen=True)
class FailureCost:
    """What one failure cost: the time until training was back, and the work done again."""

    process: str
    time: float  # Unix time of the failure
    reason: str
    recovery_s: Optional[float]  # failure → end of the first step after it; None: no step since
    steps_retaken: int  # steps recorded before the failure and taken again after it
    tokens_regenerated: int  # the actor's count of tokens generated again, across the recovery
    tokens_reused: int  # tokens the actor kept instead of generating them again, across the recovery:
    # from the journal at its restart (tokens_reused) and after failed requests (tokens_kept_on_retry)


@dataclass(frozen=True)
class TimeSplit:
    wall_s: float
    seconds: dict[str, float]  # one entry per BUCKETS name; they add up to wall_s
    failures: list[FailureCost] = field(default_factory=list)

    @property
    def ettr(self) -> Optional[float]:
        return self.seconds["training"] / self.wall_s if self.wall_s > 0 else None

    def to_dict(self) -> dict:
        return {
            "wall_s": round(self.wall_s, 2),
            "ettr": round(self.ettr, 4) if self.ettr is not None else None,
            "seconds": {name: round(value, 2) for name, value in self.seconds.items()},
            "failures": [asdict(f) for f in self.failures],
            "steps_retaken": sum(f.steps_retaken for f in self.failures),
            "tokens_regenerated": sum(f.tokens_regenerated for f in self.failures),
        }


@dataclass
class _Launch:
    start: float
    end: float
    resumed: bool
    stopped: bool = False  # ended by run_stopped (not still running, not killed)


def split_wall_time(events: list[dict], records: list[dict], now: Optional[float] = None) -> TimeSplit:
    """Split the run's wall time; `now` ends a launch still running (default: its last record)."""
    records = sorted((r for r in records if _num(r.get("time")) is not None and isinstance(r.get("step"), int)), key=lambda r: r["time"])
    events = [e for e in events if _num(e.get("time")) is not None]
    launches = _launches(events, records, now)
    if not launches or not records:  # no step records (none yet, or trainer=fast_llm): nothing to split
        return TimeSplit(0.0, {name: 0.0 for name in BUCKETS})
    intervals: list[tuple[float, float, str]] = []
    last_index = {r["step"]: i for i, r in enumerate(records)}
    retaken = {i for i, r in enumerate(records) if last_index[r["step"]] != i}  # taken again later
    for launch in launches:
        intervals.append((launch.start, launch.end, "other"))
        steps = [(i, r) for i, r in enumerate(records) if launch.start <= r["time"] <= launch.end]
        if not steps:
            intervals.append((launch.start, launch.end, "recovery" if launch.resumed else "start_stop"))
            continue
        first_begin = _begin(steps[0][1])
        intervals.append((launch.start, max(launch.start, first_begin), "recovery" if launch.resumed else "start_stop"))
        if launch.stopped or launch is not launches[-1]:  # a live run's last stretch is not its stop
            intervals.append((steps[-1][1]["time"], launch.end, "start_stop"))
        for i, record in steps:
            intervals += _step_parts(record, lost=i in retaken)
    failures = _failures(events, records, launches)
    for f in failures:
        end = f.time + f.recovery_s if f.recovery_s is not None else _launch_of(launches, f.time).end
        intervals.append((f.time, end, "recovery"))
    seconds = _sweep(intervals)
    wall = sum(launch.end - launch.start for launch in launches)
    return TimeSplit(wall, seconds, failures)


def _num(value) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _launches(events: list[dict], records: list[dict], now: Optional[float]) -> list[_Launch]:
    """[start, end] of each launch: from run_started/run_resumed (or the first event after a
    stop) to run_stopped; a launch without run_stopped ends at `now` if it is the last, else at
    its last record or event (its rlrun was killed)."""
    launches: list[_Launch] = []
    current: Optional[_Launch] = None
    last_seen = None
    for event in sorted(events, key=lambda e: e["time"]):
        kind, t = event.get("event"), event["time"]
        if current is not None and kind in LAUNCH_STARTS and last_seen is not None:
            current.end = last_seen  # a new launch without a stop of the previous one
            launches.append(current)
            current = None
        if current is None:
            current = _Launch(t, t, resumed=kind == "run_resumed" or bool(launches))
        last_seen = t
        if kind == "run_stopped":
            current.end, current.stopped = t, True
            launches.append(current)
            current = None
    if current is not None:
        in_it = [r["time"] for r in records if r["time"] >= current.start]
        current.end = max([last_seen or current.start, *in_it])
        if now is not None:
            current.end = max(current.end, now)
        launches.append(current)
    for earlier, later in zip(launches, launches[1:]):  # a killed launch ends at its last record at most at the next start
        earlier.end = min(max([earlier.end, *[r["time"] for r in records if earlier.start <= r["time"] < later.start]]), later.start)
    return launches


def _launch_of(launches: list[_Launch], t: float) -> _Launch:
    return next((launch for launch in launches if launch.start <= t <= launch.end), launches[-1])


def _begin(record: dict) -> float:
    return record["time"] - (_num(record.get("step_time_s")) or 0.0)


def _step_parts(record: dict, lost: bool) -> list[tuple[float, float, str]]:
    end, begin = record["time"], _begin(record)
    if lost:
        return [(begin, end, "recovery")]
    wait = min(_num(record.get("wait_s")) or 0.0, end - begin)
    weights = min(_num(record.get("weights_s")) or 0.0, end - begin - wait)
    return [(begin, begin + wait, "waiting"), (begin + wait, end - weights, "training"), (end - weights, end, "weights")]


def _failures(events: list[dict], records: list[dict], launches: list[_Launch]) -> list[FailureCost]:
    failed = sorted((e for e in events if e.get("event") == "process_failed"), key=lambda e: e["time"])
    times = [e["time"] for e in failed]
    retakes: dict[int, int] = {}
    seen: set[int] = set()
    for record in records:  # a step taken again counts against the last failure before it
        if record["step"] in seen:
            before = [i for i, t in enumerate(times) if t < record["time"]]
            if before:
                retakes[before[-1]] = retakes.get(before[-1], 0) + 1
        seen.add(record["step"])
    costs = []
    for i, event in enumerate(failed):
        t = _onset(events, event)
        launch = _launch_of(launches, t)
        after = next((r for r in records if r["time"] > t and r["time"] <= launch.end), None)
        before = next((r for r in reversed(records) if r["time"] <= t), None)

        def delta(key: str) -> int:
            if after is None:
                return 0
            return max(0, int(after.get(key) or 0) - int((before or {}).get(key) or 0))

        costs.append(
            FailureCost(
                process=str(event.get("process", "?")), time=t, reason=str(event.get("reason", "")),
                recovery_s=round(after["time"] - t, 3) if after is not None else None,
                steps_retaken=retakes.get(i, 0), tokens_regenerated=delta("tokens_regenerated"), tokens_reused=delta("tokens_reused") + delta("tokens_kept_on_retry"),
            )  # fmt: skip
        )
    return costs


def _onset(events: list[dict], failed: dict) -> float:
    """When a failure began: a stall began `quiet_s` before the watchdog declared it."""
    stalls = [
        e for e in events
        if e.get("event") == "process_stalled" and e.get("process") == failed.get("process") and 0 <= failed["time"] - e["time"] < 60
    ]  # fmt: skip
    if stalls and _num(stalls[-1].get("quiet_s")) is not None:
        return stalls[-1]["time"] - float(stalls[-1]["quiet_s"])
    return failed["time"]


def _sweep(intervals: list[tuple[float, float, str]]) -> dict[str, float]:
    """Seconds per label over the union of the intervals, each instant given to its highest label."""
    points: list[tuple[float, int, str]] = []
    for start, end, label in intervals:
        if end > start:
            points += [(start, 1, label), (end, -1, label)]
    points.sort(key=lambda p: p[0])
    seconds = {name: 0.0 for name in BUCKETS}
    active = {name: 0 for name in BUCKETS}
    previous = None
    for t, delta, label in points:
        if previous is not None and t > previous:
            top = next((name for name in PRECEDENCE if active[name] > 0), "other" if active["other"] > 0 else None)
            if top is not None:
                seconds[top] += t - previous
        active[label] += delta
        previous = t
    return seconds
