"""Property: for random sequences of appends (with duplicates, gaps and lost acknowledgements),
finishes, deliveries, policy updates and actor crashes, against a real Redis:

- no delivered group is lost and none is delivered twice (stream entries per group_id);
- after every crash, each kept prefix is exactly the tokens, logprobs and versions the journal
  acknowledged before it; a prefix is dropped only when it is stale;
- every group handed out reaches the stream exactly once in the end, holding what was generated.

The actor is simulated: its in-memory state is dropped at a crash and rebuilt from
`load_open_groups` + `plan_replay`; a fake model generates deterministic, never repeated tokens.
"""

from __future__ import annotations

import json
import math
import uuid
from collections import Counter
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from rlrun.journal import Action, Append, Journal, NotFinished, plan_replay
from rlrun.rundir import RunDir
from rlrun.streams.server import connect
from rlrun.streams.standalone import managed_server

pytestmark = pytest.mark.timeout(600)

STALENESS = 1  # max_prefix_staleness
MAX_OPEN = 4
MAX_VERSION = 5
PICK = st.integers(0, 10**6)


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    run = RunDir(tmp_path_factory.mktemp("journal-property") / "run")
    run.create({"name": "journal-property"})
    with managed_server(run) as srv:
        c = connect(srv.url, srv.password)
        yield c
        c.close()


@dataclass
class ActorSample:
    """What the simulated actor holds for one sample (lost at a crash)."""

    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish: str | None = None


@dataclass
class ActorGroup:
    budget: int
    samples: list[ActorSample]


def fake_token(n: int) -> tuple[int, float]:
    """The fake model's n-th token and its logprob (never repeated, floats with many digits)."""
    return 1000 + n, -math.log1p(n) / 3


def make_machine(client):
    class JournalMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            ns = uuid.uuid4().hex
            self.prefix = f"rlrun:journal:{ns}:"
            self.stream = f"test:{ns}:groups"
            self.journal = Journal(client, prefix=self.prefix)
            self.version = 0
            self.generated = 0  # tokens the fake model produced so far
            # what the journal acknowledged: group_id -> per sample (tokens, logprobs, versions)
            self.truth: dict[str, list[tuple[list, list, list]]] = {}
            self.truth_finish: dict[str, list[str | None]] = {}
            self.budget: dict[str, int] = {}
            self.delivered: dict[str, str] = {}  # group_id -> the message published
            self.actor: dict[str, ActorGroup] = {}  # the actor's memory: open groups it works on

        # --- helpers -------------------------------------------------------------------------
        def _candidates(self, want):
            return [(g, i) for g, group in sorted(self.actor.items()) for i, s in enumerate(group.samples) if want(group, s)]

        def _pick(self, pick, want):
            found = self._candidates(want)
            return found[pick % len(found)] if found else None

        def _append(self, gid, i, offset, tokens, logprobs, version):
            return self.journal.append_many([Append(gid, i, offset, tokens, logprobs, version)])[0]

        def _record(self, gid, i, tokens, logprobs, version):
            t, lp, v = self.truth[gid][i]
            t += tokens
            lp += logprobs
            v += [version] * len(tokens)

        def _generate(self, gid, i, n):
            """The fake model's next `n` tokens for a sample (at most what its budget leaves)."""
            n = min(n, self.budget[gid] - len(self.truth[gid][i][0]))
            out = [fake_token(self.generated + k) for k in range(n)]
            self.generated += n
            return [t for t, _ in out], [lp for _, lp in out]

        def _apply(self, gid, i, tokens, logprobs):
            sample = self.actor[gid].samples[i]
            sample.tokens += tokens
            sample.logprobs += logprobs
            sample.versions += [self.version] * len(tokens)

        def _close_if_spent(self, gid, i):
            sample = self.actor[gid].samples[i]
            if sample.finish is None and len(sample.tokens) >= self.actor[gid].budget:
                result = self.journal.finish(gid, i, "length", len(sample.tokens))
                assert result.accepted, result
                sample.finish = "length"
                self.truth_finish[gid][i] = "length"

        def _resync(self, gid):
            """The actor lost track of a group (a rejected append): read it back and replan it."""
            record, problems = self.journal.read_group(gid)
            assert record is not None and problems == []
            self._adopt(plan_replay([record], current_version=self.version, max_prefix_staleness=STALENESS).groups[0])

        def _adopt(self, plan):
            """Check a group's plan against what the journal acknowledged, and act on it."""
            gid = plan.group_id
            assert plan.max_new_tokens == self.budget[gid]
            group = ActorGroup(plan.max_new_tokens, [])
            for s in plan.samples:
                truth_tokens, truth_lp, truth_v = self.truth[gid][s.index]
                if s.action == Action.RESTART:
                    if truth_tokens:  # a prefix is dropped only when its oldest token is stale
                        assert min(truth_v) < self.version - STALENESS
                        assert s.dropped_tokens == len(truth_tokens)
                    self.journal.reset(gid, s.index)
                    self.truth[gid][s.index] = ([], [], [])
                    self.truth_finish[gid][s.index] = None
                    group.samples.append(ActorSample())
                    continue
                # keep, continue, finish_length: the prefix is exactly what was acknowledged
                if s.action != Action.KEEP and truth_v:  # and an unfinished one is not stale
                    assert min(truth_v) >= self.version - STALENESS
                assert s.prefix_token_ids == truth_tokens
                assert s.prefix_logprobs == truth_lp
                assert s.prefix_versions == truth_v
                if s.action == Action.KEEP:
                    assert s.finish_reason == self.truth_finish[gid][s.index] is not None
                else:
                    assert self.truth_finish[gid][s.index] is None
                sample = ActorSample(list(truth_tokens), list(truth_lp), list(truth_v), s.finish_reason)
                group.samples.append(sample)
                if s.action == Action.FINISH_LENGTH:
                    assert len(truth_tokens) >= plan.max_new_tokens
                    result = self.journal.finish(gid, s.index, "length", len(truth_tokens))
                    assert result.accepted, result
                    self.truth_finish[gid][s.index] = "length"
            self.actor[gid] = group

        def _message(self, gid) -> str:
            group = self.actor[gid]
            return json.dumps(
                {"group_id": gid, "samples": [[s.tokens, s.logprobs, s.versions, s.finish] for s in group.samples]}
            )

        # --- rules ---------------------------------------------------------------------------
        @precondition(lambda self: len(self.actor) < MAX_OPEN)
        @rule(size=st.integers(1, 3), budget=st.integers(1, 8))
        def open_group(self, size, budget):
            group = self.journal.open_group(lambda c: c, lambda p: [p, 7], group_size=size, max_new_tokens=budget, run="prop")
            gid = group.group_id
            assert gid not in self.truth  # a prompt is never handed out twice
            assert group.cursor == len(self.truth)  # nor skipped
            self.truth[gid] = [([], [], []) for _ in range(size)]
            self.truth_finish[gid] = [None] * size
            self.budget[gid] = budget
            self.actor[gid] = ActorGroup(budget, [ActorSample() for _ in range(size)])

        @rule(pick=PICK, n=st.integers(1, 3), stop=st.sampled_from([False, False, False, True]))
        def generate(self, pick, n, stop):
            found = self._pick(pick, lambda g, s: s.finish is None)
            if found is None:
                return
            gid, i = found
            sample = self.actor[gid].samples[i]
            tokens, logprobs = self._generate(gid, i, n)
            result = self._append(gid, i, len(sample.tokens), tokens, logprobs, self.version)
            if not result.accepted:  # only after a lost acknowledgement
                assert result.reason == "duplicate" and result.length > len(sample.tokens)
                self._resync(gid)
                return
            self._record(gid, i, tokens, logprobs, self.version)
            self._apply(gid, i, tokens, logprobs)
            assert result.length == len(sample.tokens)
            if stop and sample.tokens:
                assert self.journal.finish(gid, i, "stop", len(sample.tokens)).accepted
                sample.finish = self.truth_finish[gid][i] = "stop"
            self._close_if_spent(gid, i)

        @rule(picks=st.lists(PICK, min_size=1, max_size=3), n=st.integers(1, 2))
        def generate_batch(self, picks, n):
            """Several samples' tokens in one call, in two chained chunks per sample."""
            appends, chosen = [], []
            for pick in picks:
                found = self._pick(pick, lambda g, s: s.finish is None)
                if found is None or found in chosen:
                    continue
                chosen.append(found)
                gid, i = found
                offset = len(self.actor[gid].samples[i].tokens)
                tokens, logprobs = self._generate(gid, i, 2 * n)
                for lo in (0, n):
                    if tokens[lo:lo + n]:
                        appends.append(Append(gid, i, offset + lo, tokens[lo:lo + n], logprobs[lo:lo + n], self.version))
            results = self.journal.append_many(appends)
            lost_track = set()
            for item, result in zip(appends, results):
                if result.accepted:  # the journal holds it, whatever the actor makes of it
                    self._record(item.group_id, item.index, list(item.token_ids), list(item.logprobs), item.version)
                else:  # only after a lost acknowledgement
                    assert result.reason in ("duplicate", "gap"), result
                    lost_track.add(item.group_id)
            for item in appends:
                if item.group_id not in lost_track:
                    self._apply(item.group_id, item.index, list(item.token_ids), list(item.logprobs))
            for gid in sorted(lost_track):
                self._resync(gid)
            for gid, i in chosen:
                if self.actor[gid].samples[i].finish is None:
                    self._close_if_spent(gid, i)

        @rule(pick=PICK)
        def lost_acknowledgement(self, pick):
            """The journal stores an append but the actor never hears back."""
            found = self._pick(pick, lambda g, s: s.finish is None)
            if found is None:
                return
            gid, i = found
            tokens, logprobs = self._generate(gid, i, 1)
            if tokens:
                stored = len(self.truth[gid][i][0])  # what the journal holds, maybe ahead of the actor
                assert self._append(gid, i, stored, tokens, logprobs, self.version).accepted
                self._record(gid, i, tokens, logprobs, self.version)

        @rule(pick=PICK, back=st.integers(1, 3))
        def duplicate_append(self, pick, back):
            """A retried append of tokens already stored is rejected and changes nothing."""
            found = self._pick(pick, lambda g, s: s.tokens)
            if found is None:
                return
            gid, i = found
            sample = self.actor[gid].samples[i]
            offset = max(0, len(sample.tokens) - back)
            result = self._append(gid, i, offset, sample.tokens[offset:], sample.logprobs[offset:], self.version)
            assert not result.accepted
            assert result.reason == ("finished" if sample.finish else "duplicate")

        @rule(pick=PICK, ahead=st.integers(1, 3))
        def gap_append(self, pick, ahead):
            found = self._pick(pick, lambda g, s: True)
            if found is None:
                return
            gid, i = found
            sample = self.actor[gid].samples[i]
            truth_len = len(self.truth[gid][i][0])
            result = self._append(gid, i, truth_len + ahead, [1], [-1.0], self.version)
            assert not result.accepted
            assert result.reason == ("finished" if sample.finish else "gap")
            assert result.length == truth_len

        @rule(pick=PICK)
        def deliver(self, pick):
            ready = [g for g, group in sorted(self.actor.items()) if all(s.finish for s in group.samples)]
            if not ready:
                return
            gid = ready[pick % len(ready)]
            for i, s in enumerate(self.actor[gid].samples):
                assert (s.tokens, s.logprobs, s.versions) == self.truth[gid][i]
            message = self._message(gid)
            entry_id = self.journal.deliver(gid, self.stream, message)
            assert entry_id is not None and gid not in self.delivered
            self.delivered[gid] = message
            del self.actor[gid]

        @rule(pick=PICK)
        def deliver_unfinished(self, pick):
            waiting = [g for g, group in sorted(self.actor.items()) if not all(s.finish for s in group.samples)]
            if not waiting:
                return
            with pytest.raises(NotFinished):
                self.journal.deliver(waiting[pick % len(waiting)], self.stream, "never")

        @rule(pick=PICK)
        def deliver_again(self, pick):
            """A replay, or a stale actor, delivering a group the trainer already has."""
            if not self.delivered:
                return
            gid = sorted(self.delivered)[pick % len(self.delivered)]
            assert self.journal.deliver(gid, self.stream, "again") is None

        @precondition(lambda self: self.version < MAX_VERSION)
        @rule()
        def policy_update(self):
            self.version += 1

        @rule()
        def crash(self):
            """The actor dies: its memory is gone; it rebuilds from the journal."""
            self.actor = {}
            groups, corrupt = self.journal.load_open_groups()
            assert corrupt == []
            plan = plan_replay(groups, current_version=self.version, max_prefix_staleness=STALENESS)
            # every group handed out and not delivered comes back, and nothing else
            assert [g.group_id for g in plan.groups] == [g for g in self.truth if g not in self.delivered]
            for group_plan in plan.groups:
                self._adopt(group_plan)

        @invariant()
        def each_delivered_group_is_on_the_stream_once(self):
            assert client.xlen(self.stream) == len(self.delivered)

        # --- the end -------------------------------------------------------------------------
        def teardown(self) -> None:
            try:
                self._drain_and_check()
            finally:
                keys = list(client.scan_iter(f"{self.prefix}*")) + [self.stream]
                client.delete(*keys)

        def _drain_and_check(self):
            self.crash()
            for gid in list(self.actor):
                for i, sample in enumerate(self.actor[gid].samples):
                    while sample.finish is None:
                        tokens, logprobs = self._generate(gid, i, 2)
                        assert self._append(gid, i, len(sample.tokens), tokens, logprobs, self.version).accepted
                        self._record(gid, i, tokens, logprobs, self.version)
                        self._apply(gid, i, tokens, logprobs)
                        self._close_if_spent(gid, i)
                message = self._message(gid)
                assert self.journal.deliver(gid, self.stream, message) is not None
                self.delivered[gid] = message
            entries = client.xrange(self.stream)
            per_group = Counter(json.loads(data["data"])["group_id"] for _, data in entries)
            assert per_group == Counter(self.truth.keys())  # every group exactly once
            assert {json.loads(d["data"])["group_id"]: d["data"] for _, d in entries} == self.delivered
            for gid, message in self.delivered.items():
                samples = json.loads(message)["samples"]
                for i, (tokens, logprobs, versions, finish) in enumerate(samples):
                    assert (tokens, logprobs, versions) == self.truth[gid][i]
                    assert finish == self.truth_finish[gid][i]
                    assert len(tokens) <= self.budget[gid]
                    assert finish == "stop" or len(tokens) == self.budget[gid]
            assert self.journal.load_open_groups().groups == []

    return JournalMachine


def test_no_group_is_lost_or_delivered_twice_and_prefixes_are_exact(client):
    run_state_machine_as_test(
        make_machine(client),
        settings=settings(
            max_examples=40,
            stateful_step_count=60,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
