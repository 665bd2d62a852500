"""Rewards off the event loop: `reward.workers` processes (`rlrun/entrypoints/reward_worker.py`)
run the calls, and `Scorer` turns a group's calls into its rewards under the failure policy.

A call that runs past `reward.timeout_s` has its worker killed (a hung or sleeping function cannot
be interrupted in place) and a new one started; a worker that dies under a call (a segfault, an
out-of-memory kill) is replaced and the call given once to another. Neither ever stops the actor:
the failure is counted per reward, its first traceback logged, and the sample scored by
`reward.on_error`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import pickle
import struct
import sys
from dataclasses import dataclass, field, replace
from typing import Any

from rlrun.task.environment import StepCall
from rlrun.task.rewards import GroupCall, RewardSpec
from rlrun.task.rows import TaskInputError

log = logging.getLogger("rlrun.task")

HEADER = struct.Struct(">I")  # the worker's frames: a length, then a pickle
WORKER_MODULE = "rlrun.entrypoints.reward_worker"


class CallFailed(Exception):
    """A reward call raised (`kind` "error", with its traceback) or ran out of time ("timeout"); a
    step that must not run twice lost its worker under it ("interrupted")."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind, self.detail = kind, detail


class WorkerDied(Exception):
    pass


class _Worker:
    def __init__(self, process: asyncio.subprocess.Process, conventions: list[str]) -> None:
        self.process, self.conventions = process, conventions

    async def call(self, call_id: int, index: int, call: GroupCall | StepCall) -> Any:
        data = pickle.dumps((call_id, index, call))
        stdin, stdout = self.process.stdin, self.process.stdout
        assert stdin is not None and stdout is not None  # started with pipes
        try:
            stdin.write(HEADER.pack(len(data)) + data)
            await stdin.drain()
            header = await stdout.readexactly(HEADER.size)
            answer = pickle.loads(await stdout.readexactly(HEADER.unpack(header)[0]))
        except (asyncio.IncompleteReadError, ConnectionError, BrokenPipeError) as exc:
            raise WorkerDied(f"the reward worker (pid {self.process.pid}) died: {exc}") from None
        _, status, value = answer
        if status == "error":
            raise CallFailed("error", value)
        return value

    async def kill(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
        await self.process.wait()


class RewardPool:
    """`size` worker processes, each holding every reward function of `refs` (with `environment`,
    every step function: then `conventions` says for each whether it may be run again)."""

    def __init__(self, refs: list[str], size: int, timeout_s: float, environment: bool = False) -> None:
        self.refs, self.size, self.timeout_s, self.environment = refs, size, timeout_s, environment
        self.conventions: list = []
        self._idle: asyncio.Queue[_Worker] = asyncio.Queue()
        self._all: set[_Worker] = set()
        self._ids = itertools.count()
        self._spawning: set[asyncio.Task] = set()
        self._closed = False

    async def start(self) -> None:
        """Start every worker; TaskInputError when the functions no longer import (preflight checked them).
        No functions (an environment gives the rewards): no workers."""
        if not self.refs:
            return
        workers = await asyncio.gather(*(self._spawn() for _ in range(self.size)))
        self.conventions = workers[0].conventions
        for worker in workers:
            self._idle.put_nowait(worker)

    async def _spawn(self) -> _Worker:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            WORKER_MODULE,
            *(["--environment"] if self.environment else []),
            *self.refs,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )  # its stderr is the actor's: the functions' prints and tracebacks land in the actor's log
        assert process.stdout is not None  # started with pipes
        worker = _Worker(process, [])
        self._all.add(worker)
        try:
            header = await process.stdout.readexactly(HEADER.size)
            status, value = pickle.loads(await process.stdout.readexactly(HEADER.unpack(header)[0]))
        except asyncio.IncompleteReadError:
            await worker.kill()
            raise TaskInputError(
                f"a reward worker exited before it loaded {', '.join(self.refs)}: see the log above."
            ) from None
        if status != "ready":
            await worker.kill()
            raise TaskInputError(value)
        worker.conventions = value
        return worker

    async def call(self, index: int, call: GroupCall | StepCall) -> Any:
        """Reward `index` on `call`; CallFailed when it raised or timed out, after one more try on
        another worker when the first died under it."""
        for attempt in (1, 2):
            if self._closed:
                raise CallFailed("error", "the reward pool is closed (the actor is stopping)")
            worker = await self._idle.get()
            try:
                answer = await asyncio.wait_for(worker.call(next(self._ids), index, call), self.timeout_s)
            except asyncio.TimeoutError:
                self._replace(worker)
                setting = "environment.timeout_s" if self.environment else "reward.timeout_s"
                raise CallFailed("timeout", f"no answer within {setting}={self.timeout_s:g} s") from None
            except WorkerDied as exc:
                self._replace(worker)
                if self.environment and not self.conventions[index]:  # its step must not run twice
                    raise CallFailed("interrupted", f"{exc}; the step says it must not be run again") from None
                if attempt == 2:
                    raise CallFailed("error", str(exc)) from None
                log.warning("%s; the call goes to another worker", exc)
                continue
            except CallFailed:
                self._idle.put_nowait(worker)
                raise
            except BaseException:  # cancelled (the actor stops): the worker may be mid-call
                self._replace(worker)
                raise
            self._idle.put_nowait(worker)
            return answer
        raise AssertionError("unreachable")

    def _replace(self, worker: _Worker) -> None:
        """Kill `worker` and start another in its place, in the background."""

        async def replace_it() -> None:
            await worker.kill()
            self._all.discard(worker)
            if not self._closed:
                self._idle.put_nowait(await self._spawn())

        task = asyncio.ensure_future(replace_it())
        self._spawning.add(task)
        task.add_done_callback(self._spawning.discard)

    async def close(self) -> None:
        self._closed = True
        for task in list(self._spawning):
            task.cancel()
        for worker in list(self._all):
            if worker.process.stdin is not None and not worker.process.stdin.is_closing():
                worker.process.stdin.close()
            await worker.kill()
        self._all.clear()


@dataclass
class GroupScore:
    rewards: list[float] | None  # None: the group is dropped (reward.on_error=drop_group)
    failures: list[tuple[str, str]] = field(default_factory=list)  # (reward name, "error" | "timeout") per failed call


class Scorer:
    """A group's rewards: every reward called on it (rlrun's once per sample, TRL's once per group),
    weighted and summed; failures counted per reward (`counters`) and scored by `on_error`."""

    def __init__(self, specs: list[RewardSpec], pool: RewardPool, on_error: str) -> None:
        self.specs, self.pool, self.on_error = specs, pool, on_error
        self.counters: dict[str, int] = {}
        self._logged: set[str] = set()

    async def score(self, call: GroupCall) -> GroupScore:
        per_reward = await asyncio.gather(*(self._one(i, call) for i in range(len(self.specs))))
        failures = [f for _, fs in per_reward for f in fs]
        if failures and self.on_error == "drop_group":
            return GroupScore(None, failures)
        totals = [0.0] * len(call.texts)
        for spec, (values, _) in zip(self.specs, per_reward):
            for i, value in enumerate(values):
                totals[i] += spec.weight * (value or 0.0)  # None (scored nothing) and failures add 0
        return GroupScore(totals, failures)

    async def _one(self, index: int, call: GroupCall) -> tuple[list[float | None], list[tuple[str, str]]]:
        spec = self.specs[index]
        if self.pool.conventions[index] == "trl":
            parts = [call]
        else:  # once per sample: one that fails costs only its own sample
            parts = [
                replace(call, texts=[t], completion_ids=[c], infos=[i])
                for t, c, i in zip(call.texts, call.completion_ids, call.infos)
            ]
        outcomes = await asyncio.gather(*(self.pool.call(index, part) for part in parts), return_exceptions=True)
        values: list[float | None] = []
        failures = []
        for part, outcome in zip(parts, outcomes):
            if isinstance(outcome, CallFailed):
                failures.append((spec.name, outcome.kind))
                self._count(spec, outcome)
                values.extend([None] * len(part.texts))
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                values.extend(outcome)
        return values, failures

    def _count(self, spec: RewardSpec, failure: CallFailed) -> None:
        key = f"reward_{'timeouts' if failure.kind == 'timeout' else 'errors'}.{spec.name}"
        self.counters[key] = self.counters.get(key, 0) + 1
        if key not in self._logged:  # the first of each kind per reward; the counts say how many followed
            self._logged.add(key)
            log.error(
                "reward %s failed (%s; scored by reward.on_error=%s, counted in %s):\n%s",
                spec.ref,
                failure.kind,
                self.on_error,
                key,
                failure.detail,
            )


def scorer_for(task_rewards: list[RewardSpec], reward_cfg) -> Scorer:
    """The run's scorer over its worker pool (started by the actor's `run`, in its event loop)."""
    return Scorer(
        task_rewards,
        RewardPool([r.ref for r in task_rewards], reward_cfg.workers, reward_cfg.timeout_s),
        reward_cfg.on_error,
    )
