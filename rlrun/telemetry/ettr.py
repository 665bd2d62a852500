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

import bisect
import math
from collections.abc import Callable
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


def split_wall_time(
    events: list[dict],
    records: list[dict],
    now: Optional[float] = None,
    since: Optional[float] = None,
    until: Optional[float] = None,
) -> TimeSplit:
    """Split the run's wall time; `now` ends a launch still running (default: its last record).
    `since`/`until` count only the time in [since, until) (RunningEttr sums a run in two parts)."""
    records = sorted((r for r in records if _is_step(r)), key=lambda r: r["time"])
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
    if since is not None or until is not None:
        low, high = since if since is not None else -math.inf, until if until is not None else math.inf
        intervals = [(max(start, low), min(end, high), label) for start, end, label in intervals]
        wall = sum(max(0.0, min(launch.end, high) - max(launch.start, low)) for launch in launches)
    else:
        wall = sum(launch.end - launch.start for launch in launches)
    return TimeSplit(wall, _sweep(intervals), failures)


CUT_MARGIN = 8  # step records kept after the cut: a step may begin before the record of the one before it
STALL_LOOKBACK_S = 60.0  # how far before a failure _onset looks for the stall that caused it


class RunningEttr:
    """The run's ETTR after each new step record, at a cost that does not grow with the run.

    The wall time before a cut (the time of a recent step record) is split once and kept as two
    sums; each step splits only what follows the cut (split_wall_time over the records and events
    since then, the launch holding the cut standing for what came before it in that launch). The
    cut moves forward only over what nothing can change any more. A new record or event that
    would change the time before the cut (dated before it, a step retaken from before it, a failure
    whose onset lies before it) makes it start again from `reload()`: every event and every step
    record so far, whose split is then split_wall_time's over the whole history.
    """

    def __init__(
        self, events: list[dict], records: list[dict], reload: Callable[[], tuple[list[dict], list[dict]]]
    ) -> None:
        self._reload = reload
        self.reloads = 0  # how many times the whole history was read again
        self._start(events, records)

    def add(self, events: list[dict], record: dict, now: Optional[float]) -> Optional[float]:
        """ETTR with the `events` appended since the last call and the new step `record`; `now`
        ends the launch still running, as in split_wall_time."""
        events = [e for e in events if _num(e.get("time")) is not None]
        if self._reaches_before_cut(events, record):
            self._restart()
        else:
            self._events += events
        if _is_step(record):
            self._records.append(record)
        split = split_wall_time(self._events, self._records, now=now, since=self._cut)
        if self._cut is not None and any(f.time < self._cut for f in split.failures):
            self._restart()  # a stall's onset before the cut
            self._records.append(record)
            split = split_wall_time(self._events, self._records, now=now)
        training, wall = self._training + split.seconds["training"], self._wall + split.wall_s
        if _is_step(record):
            self._advance(split.failures, record["step"], now)
        return training / wall if wall > 0 else None

    @property
    def held(self) -> int:
        """How many records and events it holds: those since the cut, not the run's."""
        return len(self._records) + len(self._events)

    def _start(self, events: list[dict], records: list[dict]) -> None:
        self._events = [e for e in events if _num(e.get("time")) is not None]
        self._records = [r for r in records if _is_step(r)]
        self._cut: Optional[float] = None
        self._training = self._wall = 0.0  # seconds before the cut
        self._max_step_before_cut: Optional[int] = None  # of the records begun before the cut

    def _restart(self) -> None:
        self.reloads += 1
        self._start(*self._reload())

    def _reaches_before_cut(self, events: list[dict], record: dict) -> bool:
        if self._cut is None:
            return False
        if any(e["time"] < self._cut for e in events):
            return True
        if not _is_step(record):
            return False
        return _begin(record) < self._cut or (
            self._max_step_before_cut is not None and record["step"] <= self._max_step_before_cut
        )

    def _advance(self, failures: list[FailureCost], newest_step: int, now: Optional[float]) -> None:
        """Move the cut to the latest record time that leaves CUT_MARGIN records after it and
        before which nothing can change: no step record begun before it is taken again by a later
        step (their steps are below the newest), no failure across it (begun before it, and still in
        recovery or recorded after it), and it lies in a launch (whose start stands for the events
        before the cut that are dropped: what those launches held before the cut is clipped away)."""
        if len(self._records) <= CUT_MARGIN:
            return
        records = sorted(self._records, key=lambda r: r["time"])
        launches = _launches(sorted(self._events, key=lambda e: e["time"]), records, now)
        by_begin = sorted(records, key=_begin)
        begins = [_begin(r) for r in by_begin]
        top_step: list[int] = []
        for r in by_begin:  # the highest step among the records begun before each
            top_step.append(max(r["step"], top_step[-1]) if top_step else r["step"])
        failed = [(e["time"], _onset(self._events, e)) for e in self._events if e.get("event") == "process_failed"]
        for record in reversed(records[: len(records) - CUT_MARGIN + 1]):
            cut = record["time"]
            if self._cut is not None and cut <= self._cut:
                return
            begun = bisect.bisect_left(begins, cut)
            highest = max(
                [s for s in (self._max_step_before_cut, top_step[begun - 1] if begun else None) if s is not None],
                default=None,
            )
            if highest is not None and highest >= newest_step:
                continue
            launch = next((launch for launch in launches if launch.start <= cut <= launch.end), None)
            if launch is None:
                continue
            if any(f.time < cut and (f.recovery_s is None or f.time + f.recovery_s > cut) for f in failures):
                continue
            if any(onset < cut <= t for t, onset in failed):  # a failure recorded after the cut, begun before it
                continue
            self._move_cut(cut, launch, records, highest, now)
            return

    def _move_cut(
        self, cut: float, launch: _Launch, records: list[dict], highest: Optional[int], now: Optional[float]
    ) -> None:
        part = split_wall_time(self._events, records, now=now, since=self._cut, until=cut)
        self._training += part.seconds["training"]
        self._wall += part.wall_s
        self._cut, self._max_step_before_cut = cut, highest
        start = {"time": launch.start, "event": "run_resumed" if launch.resumed else "run_started"}  # the launch so far
        kept = [
            e
            for e in self._events
            if e["time"] >= cut - STALL_LOOKBACK_S and not (e.get("event") == "process_failed" and e["time"] < cut)
        ]
        self._events = [start, *kept]
        self._records = [r for r in records if r["time"] >= cut]


def _is_step(record: dict) -> bool:
    return _num(record.get("time")) is not None and isinstance(record.get("step"), int)


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
    for earlier, later in zip(
        launches, launches[1:]
    ):  # a killed launch ends at its last record at most at the next start
        earlier.end = min(
            max([earlier.end, *[r["time"] for r in records if earlier.start <= r["time"] < later.start]]), later.start
        )
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
    return [
        (begin, begin + wait, "waiting"),
        (begin + wait, end - weights, "training"),
        (end - weights, end, "weights"),
    ]


def _failures(events: list[dict], records: list[dict], launches: list[_Launch]) -> list[FailureCost]:
    failed = sorted((e for e in events if e.get("event") == "process_failed"), key=lambda e: e["time"])
    times = [e["time"] for e in failed]
    retakes: dict[int, int] = {}
    seen: set[int] = set()
    for record in records:  # a step taken again counts against the last failure before it
        if record["step"] in seen:
            earlier = [i for i, t in enumerate(times) if t < record["time"]]
            if earlier:
                retakes[earlier[-1]] = retakes.get(earlier[-1], 0) + 1
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
                process=str(event.get("process", "?")),
                time=t,
                reason=str(event.get("reason", "")),
                recovery_s=round(after["time"] - t, 3) if after is not None else None,
                steps_retaken=retakes.get(i, 0),
                tokens_regenerated=delta("tokens_regenerated"),
                tokens_reused=delta("tokens_reused") + delta("tokens_kept_on_retry"),
            )
        )
    return costs


def _onset(events: list[dict], failed: dict) -> float:
    """When a failure began: a stall began `quiet_s` before the watchdog declared it."""
    stalls = [
        e
        for e in events
        if e.get("event") == "process_stalled"
        and e.get("process") == failed.get("process")
        and 0 <= failed["time"] - e["time"] < 60
    ]
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
