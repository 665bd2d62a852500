"""Property: for random sequences of tokens received, flushes (with duplicates, gaps and lost
acknowledgements), deliveries, policy updates and actor crashes, against a real Redis:

- no delivered group is lost and none is delivered twice (stream entries per group_id);
- after every crash, each kept prefix is exactly the tokens, logprobs and versions the journal
  acknowledged before it; a prefix is dropped only when it is stale;
- every group handed out reaches the stream exactly once in the end, holding what was generated.

The actor's journal calls go through the real `JournalLedger` (its runs split by policy version,
a finish carried by the last append) and the actor's own code: `flush` (a refusal re-read with
`SampleState.take_journal`), its sampling rules; only the model is fake (deterministic, never
repeated tokens). A crash drops the actor's memory and its ledger; a new ledger rebuilds it from
`load_open_groups` + `plan_replay` + `resume`, as the actor does.
"""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from rlrun.actor.ledger import JournalLedger, flush
from rlrun.actor.replay import resume
from rlrun.actor.sampling import SampleState, close_if_spent
from rlrun.journal.plan import Action, plan_replay
from rlrun.journal.store import NotFinished
from rlrun.rundir import RunDir
from rlrun.streams.names import journal_prefix
from rlrun.streams.server import connect
from tests.standalone_redis import managed_server

pytestmark = pytest.mark.timeout(600)

STALENESS = 1  # max_prefix_staleness
MAX_OPEN = 4
MAX_VERSION = 5
PICK = st.integers(0, 10**6)
STREAM = "test:groups:{prop}"  # hash-tagged, as every delivery stream: its journal shares its slot
PREFIX = journal_prefix(STREAM)


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    run = RunDir(tmp_path_factory.mktemp("journal-property") / "run")
    run.create({"name": "journal-property"})
    with managed_server(run) as srv:
        c = connect(srv.url, srv.password)
        yield c
        c.close()


def fake_token(n: int) -> tuple[int, float]:
    """The fake model's n-th token and its logprob (never repeated, floats with many digits)."""
    return 1000 + n, -math.log1p(n) / 3


def ghost(sample: SampleState, journaled: int, extra: int = 0, version: int = 0) -> SampleState:
    """A copy of `sample` that believes the journal holds `journaled` tokens (and has `extra` more):
    what a retried or misplaced flush looks like to the ledger."""
    copy = SampleState(sample.index, list(sample.completion_ids), list(sample.logprobs), list(sample.versions))
    pad = journaled + extra - len(copy.completion_ids)
    copy.append([1] * max(0, pad), [-1.0] * max(0, pad), version)
    copy.journaled = journaled
    return copy


def make_machine(client):
    class JournalMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.ledger = JournalLedger(client, PREFIX)
            self.version = 0
            self.generated = 0  # tokens the fake model produced so far
            # what the journal acknowledged: group_id -> per sample (tokens, logprobs, versions)
            self.truth: dict[str, list[tuple[list, list, list]]] = {}
            self.truth_finish: dict[str, list[str | None]] = {}
            self.budget: dict[str, int] = {}
            self.delivered: dict[str, str] = {}  # group_id -> the message published
            self.actor: dict[str, list[SampleState]] = {}  # the actor's memory: open groups it works on

        # --- helpers -------------------------------------------------------------------------
        def _pick(self, pick, want):
            found = [(g, s) for g, samples in sorted(self.actor.items()) for s in samples if want(g, s)]
            return found[pick % len(found)] if found else None

        def _generate(self, gid, sample, n):
            """The fake model's next `n` tokens for a sample (at most what its budget leaves)."""
            n = min(n, self.budget[gid] - len(sample.completion_ids))
            out = [fake_token(self.generated + k) for k in range(n)]
            self.generated += n
            return [t for t, _ in out], [lp for _, lp in out]

        def _acknowledged(self, gid, sample, length):
            """The journal took `sample`'s tokens up to `length` (and its finish, if any)."""
            t, lp, v = self.truth[gid][sample.index]
            assert length >= len(t)
            t += sample.completion_ids[len(t):length]
            lp += sample.logprobs[len(lp):length]
            v += sample.versions[len(v):length]
            if sample.finished:
                self.truth_finish[gid][sample.index] = sample.finish_reason

        def _flush(self, gid, samples):
            """As the actor flushes (`flush`); a refusal makes it re-read the journal."""
            for f in flush(self.ledger, gid, samples):
                if f.result.accepted:
                    assert f.result.length == len(f.sample.completion_ids)
                    self._acknowledged(gid, f.sample, f.result.length)
                else:  # only after a lost acknowledgement: the journal is ahead of the actor
                    assert f.result.reason in ("duplicate", "gap", "finished"), f.result
                    self._resync(gid, f.sample)
            self._check_journal(gid)

        def _resync(self, gid, sample):
            """The actor re-reads a sample it lost track of. The journal may hold more than the
            flushes it acknowledged (the refused flush's later runs, a lost answer's tokens), but
            only what this actor generated, in order: a prefix of its memory that extends
            what was acknowledged before."""
            record, problems = self.ledger.read_group(gid)
            assert record is not None and problems == []
            stored = next(s for s in record.samples if s.index == sample.index)
            known, n = self.truth[gid][sample.index], len(stored.token_ids)
            assert (stored.token_ids[: len(known[0])], stored.logprobs[: len(known[0])], stored.versions[: len(known[0])]) == known
            assert (stored.token_ids, stored.logprobs, stored.versions) == (sample.completion_ids[:n], sample.logprobs[:n], sample.versions[:n])
            self._acknowledged(gid, sample, n)
            self.truth_finish[gid][sample.index] = stored.finish_reason if stored.finished else None
            sample.take_journal(stored)
            assert (sample.completion_ids, sample.journaled, sample.finish_recorded) == (stored.token_ids, n, stored.finished)

        def _check_journal(self, gid):
            """The journal holds exactly what it acknowledged: tokens, logprobs, versions, finish."""
            record, problems = self.ledger.read_group(gid)
            assert record is not None and problems == []
            for stored in record.samples:
                assert (stored.token_ids, stored.logprobs, stored.versions) == self.truth[gid][stored.index]
                assert (stored.finish_reason if stored.finished else None) == self.truth_finish[gid][stored.index]

        def _check_plan(self, plan, live):
            """Check a group's plan, and the actor's group made of it, against what the journal
            acknowledged."""
            gid = plan.header.group_id
            assert [s.index for s in live.samples] == [s.index for s in plan.samples]
            for s, sample in zip(plan.samples, live.samples):
                truth_tokens, truth_lp, truth_v = self.truth[gid][s.index]
                assert sample.journaled == len(sample.completion_ids)
                if s.action == Action.RESTART:
                    if truth_tokens:  # a prefix is dropped only when its oldest token is stale
                        assert min(truth_v) < self.version - STALENESS
                        assert s.dropped_tokens == len(truth_tokens)
                    assert sample.completion_ids == [] and not sample.finished
                    continue
                # keep, continue: the prefix is exactly what was acknowledged
                if s.action != Action.KEEP and truth_v:  # and an unfinished one is not stale
                    assert min(truth_v) >= self.version - STALENESS
                assert (s.prefix_token_ids, s.prefix_logprobs, s.prefix_versions) == (truth_tokens, truth_lp, truth_v)
                assert (sample.completion_ids, sample.logprobs, sample.versions) == (truth_tokens, truth_lp, truth_v)
                if s.action == Action.KEEP:
                    assert s.finish_reason == sample.finish_reason == self.truth_finish[gid][s.index] is not None
                    assert sample.finish_recorded
                else:  # continued, or closed as "length" when its budget is spent (recorded by the next flush)
                    assert self.truth_finish[gid][s.index] is None and not sample.finish_recorded
                    assert sample.finish_reason == ("length" if len(truth_tokens) >= self.budget[gid] else None)

        def _forget(self, gid, index):
            self.truth[gid][index] = ([], [], [])
            self.truth_finish[gid][index] = None

        def _message(self, gid) -> str:
            samples = [[s.completion_ids, s.logprobs, s.versions, s.finish_reason] for s in self.actor[gid]]
            return json.dumps({"group_id": gid, "samples": samples})

        # --- rules ---------------------------------------------------------------------------
        @precondition(lambda self: len(self.actor) < MAX_OPEN)
        @rule(size=st.integers(1, 3), budget=st.integers(1, 8))
        def open_group(self, size, budget):
            group = self.ledger.open_next(lambda c: c, lambda p: [p, 7], size, budget, "prop")
            gid = group.group_id
            assert gid not in self.truth  # a prompt is never handed out twice
            assert group.cursor == len(self.truth)  # nor skipped
            self.truth[gid] = [([], [], []) for _ in range(size)]
            self.truth_finish[gid] = [None] * size
            self.budget[gid] = budget
            self.actor[gid] = [SampleState(i) for i in range(size)]

        @rule(pick=PICK, n=st.integers(0, 3), stop=st.sampled_from([False, False, False, True]), flush=st.booleans())
        def receive(self, pick, n, stop, flush):
            """Tokens of one sample arrive from the model (maybe its end alone); flushed now or later."""
            found = self._pick(pick, lambda g, s: not s.finished)
            if found is None:
                return
            gid, sample = found
            tokens, logprobs = self._generate(gid, sample, n)
            sample.append(tokens, logprobs, self.version)
            if stop and sample.completion_ids:
                sample.finish_reason = "stop"
            close_if_spent(sample, self.budget[gid])
            if flush:
                self._flush(gid, [sample])

        @precondition(lambda self: self.version < MAX_VERSION)
        @rule(pick=PICK, n=st.integers(1, 2), m=st.integers(1, 2))
        def update_between_flushes(self, pick, n, m):
            """A weight update lands while a sample's tokens wait for their flush: one flush holds
            tokens of two policy versions."""
            found = self._pick(pick, lambda g, s: not s.finished and self.budget[g] - len(s.completion_ids) >= 2)
            if found is None:
                return
            gid, sample = found
            sample.append(*self._generate(gid, sample, n), self.version)
            self.version += 1
            sample.append(*self._generate(gid, sample, m), self.version)
            close_if_spent(sample, self.budget[gid])
            self._flush(gid, [sample])

        @rule(pick=PICK)
        def finish_alone(self, pick):
            """The end of a sample arrives with no new token (its tokens are all journaled)."""
            found = self._pick(pick, lambda g, s: not s.finished and s.completion_ids and s.journaled == len(s.completion_ids))
            if found is None:
                return
            gid, sample = found
            sample.finish_reason = "stop"
            self._flush(gid, [sample])

        @rule(pick=PICK)
        def flush_group(self, pick):
            """Every unjournaled token and finish of a group in one round trip (maybe of several
            policy versions: the ledger splits them into runs)."""
            if self.actor:
                gid = sorted(self.actor)[pick % len(self.actor)]
                self._flush(gid, self.actor[gid])

        @rule(pick=PICK, n=st.integers(0, 2))
        def lost_acknowledgement(self, pick, n):
            """The journal stores a flush but its answer never reaches the actor: the actor's next
            flush sends those tokens again, is refused, and takes the journal's view."""
            found = self._pick(pick, lambda g, s: not s.finish_recorded and s.journaled == len(self.truth[g][s.index][0]))
            if found is None:
                return
            gid, sample = found
            sample.append(*self._generate(gid, sample, n), self.version)
            sent = ghost(sample, sample.journaled)
            if len(sent.completion_ids) > sent.journaled or sent.finished:
                [result] = self.ledger.append_samples(gid, [sent])
                assert result.accepted and result.length == len(sample.completion_ids)
                self._acknowledged(gid, sent, result.length)

        @rule(pick=PICK, back=st.integers(1, 3))
        def duplicate_append(self, pick, back):
            """A retried flush of tokens already stored is refused and changes nothing."""
            found = self._pick(pick, lambda g, s: 0 < s.journaled == len(s.completion_ids) == len(self.truth[g][s.index][0]))
            if found is None:
                return
            gid, sample = found
            [result] = self.ledger.append_samples(gid, [ghost(sample, max(0, sample.journaled - back))])
            assert not result.accepted
            assert result.reason == ("finished" if self.truth_finish[gid][sample.index] else "duplicate")

        @rule(pick=PICK, ahead=st.integers(1, 3))
        def gap_append(self, pick, ahead):
            """A flush that would leave a hole in a sample is refused."""
            found = self._pick(pick, lambda g, s: True)
            if found is None:
                return
            gid, sample = found
            truth_len = len(self.truth[gid][sample.index][0])
            [result] = self.ledger.append_samples(gid, [ghost(sample, truth_len + ahead, extra=1, version=self.version)])
            assert not result.accepted
            assert result.reason == ("finished" if self.truth_finish[gid][sample.index] else "gap")
            assert result.length == truth_len

        @rule(pick=PICK)
        def deliver(self, pick):
            ready = [g for g, samples in sorted(self.actor.items()) if all(s.finish_recorded for s in samples)]
            if not ready:
                return
            gid = ready[pick % len(ready)]
            for s in self.actor[gid]:
                assert (s.completion_ids, s.logprobs, s.versions) == self.truth[gid][s.index]
            message = self._message(gid)
            entry_id = self.ledger.deliver(gid, STREAM, [message])
            assert entry_id is not None and gid not in self.delivered
            self.delivered[gid] = message
            del self.actor[gid]

        @rule(pick=PICK)
        def deliver_unfinished(self, pick):
            waiting = [g for g in sorted(self.actor) if not all(self.truth_finish[g])]  # the journal has an unfinished sample
            if waiting:
                with pytest.raises(NotFinished):
                    self.ledger.deliver(waiting[pick % len(waiting)], STREAM, ["never"])

        @rule(pick=PICK)
        def deliver_again(self, pick):
            """A replay, or a stale actor, delivering a group the trainer already has."""
            if self.delivered:
                gid = sorted(self.delivered)[pick % len(self.delivered)]
                assert self.ledger.deliver(gid, STREAM, ["again"]) is None

        @precondition(lambda self: self.version < MAX_VERSION)
        @rule()
        def policy_update(self):
            self.version += 1

        @rule()
        def crash(self):
            """The actor dies: its memory (unflushed tokens included) is gone; a new ledger
            rebuilds it from the journal."""
            self.actor = {}
            self.ledger = JournalLedger(client, PREFIX)
            groups, corrupt = self.ledger.load_open_groups()
            assert corrupt == []
            plan = plan_replay(groups, current_version=self.version, max_prefix_staleness=STALENESS)
            # every group handed out and not delivered comes back, and nothing else
            assert [g.header.group_id for g in plan.groups] == [g for g in self.truth if g not in self.delivered]
            resumed = resume(plan)
            for group_plan, live in zip(plan.groups, resumed.groups, strict=True):
                self._check_plan(group_plan, live)
                self.actor[live.group_id] = live.samples
            for gid, index in resumed.resets:  # as the actor: the journal forgets restarted samples
                self.ledger.reset(gid, index)
                self._forget(gid, index)
            assert sorted(resumed.resets) == sorted((p.header.group_id, s.index) for p in plan.groups for s in p.samples if s.action == Action.RESTART)
            kept = [s for g in resumed.groups for s in g.samples]
            assert resumed.tokens_reused == sum(len(s.completion_ids) for s in kept)  # each kept token once
            assert resumed.samples_continued == sum(1 for s in kept if s.completion_ids and not s.finished)

        @invariant()
        def each_delivered_group_is_on_the_stream_once(self):
            assert client.xlen(STREAM) == len(self.delivered)

        # --- the end -------------------------------------------------------------------------
        def teardown(self) -> None:
            try:
                self._drain_and_check()
            finally:
                client.delete(*client.scan_iter(f"{PREFIX}*"), STREAM)

        def _drain_and_check(self):
            self.crash()
            for gid in list(self.actor):
                for sample in self.actor[gid]:
                    for _ in range(self.budget[gid] + 1):  # each flush is taken: 2 tokens, or the finish
                        if sample.finish_recorded:
                            break
                        tokens, logprobs = self._generate(gid, sample, 2)
                        sample.append(tokens, logprobs, self.version)
                        close_if_spent(sample, self.budget[gid])
                        self._flush(gid, [sample])
                    assert sample.finish_recorded, "the journal refuses a sample it holds all of"
                message = self._message(gid)
                assert self.ledger.deliver(gid, STREAM, [message]) is not None
                self.delivered[gid] = message
            entries = client.xrange(STREAM)
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
            assert self.ledger.load_open_groups() == ([], [])

    return JournalMachine


def test_no_group_is_lost_or_delivered_twice_and_prefixes_are_exact(client):
    run_state_machine_as_test(
        make_machine(client),
        settings=settings(
            max_examples=60,
            stateful_step_count=60,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
