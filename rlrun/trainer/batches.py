"""Each optimizer step's batch of whole groups: rank 0 reads them from the actors' streams
(`intake.GroupIntake`), rejects the malformed ones (counted, logged, acknowledged with the step's),
and every rank takes the same batch; what a checkpoint covers is acknowledged then.
"""

from __future__ import annotations

import json
import logging
from typing import Callable, Optional

from rlrun.streams import names
from rlrun.streams.codec import decode
from rlrun.streams.rollouts import Group, MalformedGroup
from rlrun.trainer.intake import GroupIntake, Position
from rlrun.trainer.parallel import Parallel
from rlrun.trainer.stopping import Stopping

log = logging.getLogger("rlrun.trainer")


class BatchReader:
    """`rewind` once (rank 0), then `take` each step's groups (every rank), `ack_covered` at each
    checkpoint. `covered`: the stream positions the loaded checkpoint covers ({}: the base model;
    None: a checkpoint written before positions were recorded). `heartbeat(waiting_for=...)` is
    called while it waits. Of the config it reads the step's size (groups per step,
    algo.group_size) and actor.num_actors (one stream each)."""

    def __init__(
        self,
        stopping: Stopping,
        parallel: Parallel,
        vocab_size: int,
        covered: Optional[dict[str, Position]],
        heartbeat: Callable[..., None],
        *,
        groups_per_step: int,
        group_size: int,
        num_actors: int,
    ) -> None:
        self.stopping, self.parallel, self.vocab_size, self.heartbeat = stopping, parallel, vocab_size, heartbeat
        self.groups_per_step, self.group_size = groups_per_step, group_size
        self.covered = covered
        self.main = parallel.ranks.is_main
        # One stream per actor, read one at a time: one XREADGROUP cannot span Redis Cluster slots.
        streams = names.groups_streams(num_actors)
        self.intake = GroupIntake(stopping.redis, streams, names.TRAINER_GROUP) if self.main else None
        self.bad_messages = 0
        # Acked once a checkpoint covers them (a restart finds its place from the checkpoint's positions).
        self.unacked: list[tuple[str, str]] = []  # (stream, message id); rank 0's only

    @property
    def positions(self) -> dict[str, Position]:
        """Where the steps taken so far stand in each stream (rank 0; {} on the others)."""
        return dict(self.intake.positions) if self.intake is not None else {}

    @property
    def _intake(self) -> GroupIntake:
        assert self.intake is not None, "only rank 0 reads the groups streams"
        return self.intake

    def rewind(self) -> dict[str, Position]:
        """Rank 0: the groups after what the loaded checkpoint covers are read again, none twice."""
        return self._intake.rewind(self.covered)

    def take(self, step: int) -> Optional[list[Group]]:
        """Step `step`'s groups on every rank (rank 0 reads them once); None on every rank when
        rank 0 was asked to stop while it waited for them."""
        groups, ids = self._read_batch(step) if self.main else ([], [])
        groups = self._shared(groups)
        self.unacked.extend(ids)
        return groups

    def ack_covered(self) -> None:
        """Acknowledge what a checkpoint now covers (rank 0)."""
        self.stopping.call(lambda: self._intake.ack(self.unacked))
        self.unacked = []

    def _read_batch(self, step: int) -> tuple[Optional[list[Group]], list[tuple[str, str]]]:
        """Block until one optimizer step's worth of whole groups has arrived (from any actor);
        (None, []) once asked to stop: what this batch read is given back (not covered by the
        positions a checkpoint records, so read again after a restart)."""
        import redis

        wanted = self.groups_per_step
        groups: list[Group] = []
        ids: list[tuple[str, str]] = []
        read_before = dict(self._intake.positions)

        def keep_waiting() -> bool:
            self.heartbeat(waiting_for=f"groups ({len(groups)} of {wanted} for step {step})")
            return not self.stopping.requested.is_set()

        while len(groups) < wanted:
            try:
                messages = self._intake.read(wanted - len(groups), keep_waiting)
            except redis.ConnectionError:
                if not self.stopping.soon():  # else Redis stopped with us (a SLURM job's cancel signals every process)
                    raise
                messages = []
            if not messages:  # asked to stop
                self._intake.positions = read_before
                return None, []
            for stream, message_id, fields in messages:
                ids.append((stream, message_id))
                try:
                    group = Group.from_dict(decode(fields.get("data", "")), vocab_size=self.vocab_size)
                    if len(group.samples) != self.group_size:
                        raise MalformedGroup(
                            f"group {group.group_id} has {len(group.samples)} samples, expected {self.group_size}"
                        )
                except (MalformedGroup, ValueError) as exc:
                    self.bad_messages += 1
                    log.warning("rejected message %s on %s: %s", message_id, stream, exc)
                    continue
                groups.append(group)
        return groups, ids

    def _shared(self, groups: Optional[list[Group]]) -> Optional[list[Group]]:
        """Rank 0's groups on every rank; None on every rank when rank 0 stops (the ranks decide
        together: each got SIGTERM, but at its own moment)."""
        if not self.parallel.ranks.distributed:
            return groups
        payload = json.dumps(None if groups is None else [g.to_dict() for g in groups]).encode() if self.main else None
        data = self.parallel.share(payload, self.heartbeat)
        if self.main:
            return groups
        shared = json.loads(data)
        return None if shared is None else [Group.from_dict(d) for d in shared]
