"""The token journal against a real Redis: idempotent appends, exactly-once delivery, the prompt
cursor, survival across Redis restarts (AOF), corrupt records, trimming."""

from __future__ import annotations


import pytest

from rlrun.actor.replay import resume
from rlrun.journal.plan import plan_replay
from rlrun.journal.records import GroupRecord, SampleRecord
from rlrun.journal.store import Append, Journal, NotFinished, UnknownGroup, WriteResult
from tests.waiting import aof_written, wait_until


def finish(journal: Journal, group_id: str, index: int, reason: str, expected_length: int) -> WriteResult:
    """Mark a sample finished (no tokens) if it holds `expected_length` tokens, as the actor's flush does."""
    (result,) = journal.append_many([Append(group_id, index, expected_length, [], [], 0, reason)])
    return result


pytestmark = pytest.mark.timeout(120)

STREAM = "rlrun:groups"


@pytest.fixture
def journal(client):
    return Journal(client)


def append(journal: Journal, *args, **kwargs) -> WriteResult:
    """One append, through the batch path the actor uses."""
    return journal.append_many([Append(*args, **kwargs)])[0]


def read(journal: Journal, group_id: str) -> GroupRecord | None:
    """One open group, which must read back without problems."""
    group, problems = journal.read_group(group_id)
    assert problems == []
    return group


def _open(journal: Journal, size=2, budget=8, run="run"):
    return journal.open_group(lambda c: 100 + c, lambda p: [p, p + 1], group_size=size, max_new_tokens=budget, run=run)


def _dump(client) -> dict:
    """Every key of the journal with its full contents."""
    out = {}
    for key in sorted(client.scan_iter("*")):
        kind = client.type(key)
        if kind == "string":
            out[key] = client.get(key)
        elif kind == "hash":
            out[key] = client.hgetall(key)
        elif kind == "list":
            out[key] = client.lrange(key, 0, -1)
        elif kind == "zset":
            out[key] = client.zrange(key, 0, -1, withscores=True)
        elif kind == "stream":
            out[key] = client.xrange(key)
    return out


# --- opening groups and the cursor ---------------------------------------------------------------


def test_open_group_hands_out_consecutive_cursors_and_stores_the_group(journal):
    assert journal.cursor() == 0
    first, second = _open(journal), _open(journal, size=3)
    assert (first.group_id, first.cursor, first.prompt_index, first.prompt_ids) == ("run/0", 0, 100, [100, 101])
    assert (second.group_id, second.cursor, second.group_size) == ("run/1", 1, 3)
    assert journal.cursor() == 2
    loaded, corrupt = journal.load_open_groups()
    assert corrupt == [] and loaded == [first, second]
    assert all(s.state == "pending" and s.token_ids == [] for s in loaded[1].samples)


def test_open_group_refuses_to_advance_when_another_writer_moved_the_cursor(journal, client):
    calls = []

    def prompt_index_for(cursor):
        calls.append(cursor)
        if len(calls) == 1:
            client.incr(journal.key("cursor"))  # another writer opens a group meanwhile
        return cursor

    group = journal.open_group(prompt_index_for, lambda p: [p], group_size=1, max_new_tokens=2, run="run")
    assert calls == [0, 1] and group.cursor == 1 and journal.cursor() == 2


def test_a_cursor_hint_opens_at_the_hinted_cursor_and_a_stale_one_costs_one_try(journal, caplog):
    journal.open_group(lambda c: c, lambda p: [p], group_size=1, max_new_tokens=2, run="run")
    hinted = journal.open_group(lambda c: c, lambda p: [p], group_size=1, max_new_tokens=2, run="run", cursor_hint=1)
    assert hinted.cursor == 1
    calls = []
    stale = journal.open_group(lambda c: calls.append(c) or c, lambda p: [p], group_size=1, max_new_tokens=2,
                               run="run", cursor_hint=0)  # fmt: skip
    assert calls == [0, 2] and stale.cursor == 2 and journal.cursor() == 3
    assert read(journal, "run/0").prompt_index == 0  # the stale try changed nothing
    assert "moved" not in caplog.text  # a stale hint is not reported as another writer


def test_the_actor_ledger_follows_the_cursor_itself_and_recovers_from_a_second_writer(client):
    from rlrun.actor.ledger import JournalLedger

    first, second = JournalLedger(client), JournalLedger(client)
    opened = [first.open_next(lambda c: c, lambda p: [p], 1, 2, "run").cursor for _ in range(3)]
    assert opened == [0, 1, 2] and first._cursor == 3
    assert second.open_next(lambda c: c, lambda p: [p], 1, 2, "run").cursor == 3  # its hint (0) was stale
    assert second._cursor == 4 and first.cursor() == 4


def test_cursor_persists_across_a_restart(server, journal):
    for _ in range(3):
        _open(journal)
    server.restart()
    assert journal.cursor() == 3  # the client reconnects on its own
    assert _open(journal).group_id == "run/3"


# --- appends -------------------------------------------------------------------------------------


def test_append_is_idempotent_duplicates_and_gaps_are_rejected(journal):
    g = _open(journal).group_id
    ok = append(journal, g, 0, 0, [1, 2], [-0.5, -0.25], version=3)
    assert (ok.accepted, ok.length, ok.reason) == (True, 2, "ok")
    again = append(journal, g, 0, 0, [1, 2], [-0.5, -0.25], version=3)  # a retried append
    assert (again.accepted, again.length, again.reason) == (False, 2, "duplicate")
    gap = append(journal, g, 0, 5, [9], [-1.0], version=3)
    assert (gap.accepted, gap.length, gap.reason) == (False, 2, "gap")
    stale = append(journal, g, 0, 1, [2, 7], [-0.25, -1.0], version=3)  # overlaps what is stored
    assert (stale.accepted, stale.reason) == (False, "duplicate")
    assert append(journal, g, 0, 2, [3], [-0.125], version=4).length == 3
    sample = read(journal, g).samples[0]
    assert sample == SampleRecord(g, 0, "generating", [1, 2, 3], [-0.5, -0.25, -0.125], [3, 3, 4])
    assert read(journal, g).samples[1].state == "pending"


def test_a_batch_of_appends_is_one_call_each_judged_on_its_own(journal, client):
    g1, g2 = _open(journal).group_id, _open(journal).group_id
    results = journal.append_many(
        [
            Append(g1, 0, 0, [1], [-1.0], 0),
            Append(g1, 0, 1, [2], [-2.0], 0),  # chains on the one before
            Append(g2, 1, 0, [5], [-5.0], 1),
            Append(g1, 1, 4, [6], [-6.0], 1),  # a gap: rejected, the rest still apply
            Append(g1, 0, 1, [2], [-2.0], 0),  # a duplicate inside the batch
            Append(g1, 0, 2, [], [], 0),  # nothing to add: accepted, nothing stored
        ]
    )
    assert [(r.reason, r.length) for r in results] == [("ok", 1), ("ok", 2), ("ok", 1), ("gap", 0), ("duplicate", 2), ("ok", 2)]
    groups = {g.group_id: g for g in journal.load_open_groups().groups}
    assert groups[g1].samples[0].token_ids == [1, 2] and groups[g1].samples[1].token_ids == []
    assert groups[g2].samples[1].logprobs == [-5.0]
    assert client.llen(journal.key(f"log:{g1}")) == 2


def test_appends_to_unknown_groups_and_samples_are_rejected(journal):
    g = _open(journal, size=2).group_id
    assert append(journal, "run/99", 0, 0, [1], [-1.0], 0).reason == "unknown"
    assert append(journal, g, 2, 0, [1], [-1.0], 0).reason == "unknown"
    with pytest.raises(ValueError, match="2 token ids but 1 logprobs"):
        append(journal, g, 0, 0, [1, 2], [-1.0], 0)


def test_logprobs_are_kept_bit_for_bit(journal):
    g = _open(journal, size=1).group_id
    logprobs = [-1 / 3, -2.220446049250313e-16, -123.456789012345678, -0.0, -1e-300]
    append(journal, g, 0, 0, [1, 2, 3, 4, 5], logprobs, 0)
    assert read(journal, g).samples[0].logprobs == logprobs


# --- finishing and delivering ------------------------------------------------------------------


def test_finish_checks_the_length_and_is_idempotent(journal):
    g = _open(journal).group_id
    append(journal, g, 0, 0, [1, 2], [-1.0, -2.0], 0)
    assert finish(journal, g, 0, "stop", expected_length=1).reason == "duplicate"  # the sample holds 2
    assert finish(journal, g, 0, "stop", expected_length=3).reason == "gap"
    assert finish(journal, g, 0, "stop", expected_length=2).accepted
    assert finish(journal, g, 0, "stop", expected_length=2).accepted  # a retry
    assert finish(journal, g, 0, "length", expected_length=2).reason == "finished"
    assert append(journal, g, 0, 2, [3], [-3.0], 0).reason == "finished"
    with pytest.raises(ValueError, match="abort"):
        finish(journal, g, 1, "abort", expected_length=0)
    sample = read(journal, g).samples[0]
    assert (sample.state, sample.finish_reason, sample.token_ids) == ("finished", "stop", [1, 2])


def _finish_all(journal, group, tokens=2):
    for s in group.samples:
        append(journal, group.group_id, s.index, 0, list(range(tokens)), [-0.5] * tokens, 0)
        finish(journal, group.group_id, s.index, "stop", tokens)


def test_deliver_publishes_exactly_once_and_trims_the_tokens(journal, client):
    group = _open(journal)
    _finish_all(journal, group)
    entry_id = journal.deliver(group.group_id, STREAM, ['{"group":"run/0"}'])
    assert entry_id is not None
    assert journal.deliver(group.group_id, STREAM, ['{"group":"run/0"}']) is None
    assert client.xrange(STREAM) == [(entry_id, {"data": '{"group":"run/0"}'})]
    # the group message holds everything: only a small marker stays
    marker = client.hgetall(journal.key(f"group:{group.group_id}"))
    assert marker == {"state": "delivered", "cursor": "0", "stream_id": entry_id}
    assert not client.exists(journal.key(f"log:{group.group_id}"))
    assert journal.load_open_groups() == ([], []) and read(journal, group.group_id) is None
    # a delivered group takes no more writes
    assert append(journal, group.group_id, 0, 2, [1], [-1.0], 0).reason == "delivered"
    assert finish(journal, group.group_id, 0, "stop", 2).reason == "delivered"


def test_deliver_refuses_a_group_with_unfinished_samples(journal, client):
    group = _open(journal, size=3)
    append(journal, group.group_id, 0, 0, [1], [-1.0], 0)
    finish(journal, group.group_id, 0, "stop", 1)
    append(journal, group.group_id, 2, 0, [1], [-1.0], 0)
    with pytest.raises(NotFinished, match="samples 1,2 are not finished"):
        journal.deliver(group.group_id, STREAM, ["{}"])
    assert not client.exists(STREAM)
    assert read(journal, group.group_id) is not None  # still open
    with pytest.raises(UnknownGroup):
        journal.deliver("run/42", STREAM, ["{}"])


def test_reset_drops_a_sample_so_it_can_be_generated_again(journal):
    group = _open(journal)
    g = group.group_id
    append(journal, g, 0, 0, [1, 2, 3], [-1.0] * 3, 0)
    append(journal, g, 1, 0, [7], [-7.0], 0)
    journal.reset(g, 0)
    assert append(journal, g, 0, 3, [4], [-1.0], 1).reason == "gap"
    assert append(journal, g, 0, 0, [5], [-5.0], 1).accepted
    loaded = read(journal, g)
    assert loaded.samples[0] == SampleRecord(g, 0, "generating", [5], [-5.0], [1])
    assert loaded.samples[1].token_ids == [7]
    with pytest.raises(UnknownGroup):
        journal.reset(g, 5)


# --- persistence -------------------------------------------------------------------------------


def _busy_journal(journal):
    """A journal with a delivered group, a group in flight and one untouched."""
    delivered, in_flight, untouched = _open(journal), _open(journal, size=3), _open(journal)
    _finish_all(journal, delivered)
    journal.deliver(delivered.group_id, STREAM, ["{}"])
    g = in_flight.group_id
    journal.append_many([Append(g, 0, 0, [1, 2], [-0.5, -1 / 3], 0), Append(g, 1, 0, [4], [-0.75], 0)])
    append(journal, g, 0, 2, [3], [-2.0], 1)
    finish(journal, g, 1, "stop", 1)
    return untouched


@pytest.mark.parametrize("how", ["clean", "kill"])
def test_journal_contents_are_identical_after_a_redis_restart_from_the_aof(server, journal, client, how):
    _busy_journal(journal)
    before, loaded_before = _dump(client), journal.load_open_groups()
    assert len(loaded_before.groups) == 2
    if how == "kill":
        wait_until(lambda: aof_written(client), what="the AOF to hold the journal")
        server.kill()
    server.restart()
    assert _dump(client) == before
    assert journal.load_open_groups() == loaded_before
    assert journal.cursor() == 3
    # the scripts were flushed with the restart; the journal reloads them on its own
    assert append(journal, loaded_before.groups[0].group_id, 0, 3, [9], [-9.0], 2).accepted


def test_replay_plan_from_a_loaded_journal(journal):
    _busy_journal(journal)
    plan = plan_replay(journal.load_open_groups().groups, current_version=1, max_prefix_staleness=1)
    in_flight = plan.groups[0]
    assert [(s.action, len(s.prefix_token_ids)) for s in in_flight.samples] == [("continue", 3), ("keep", 1), ("restart", 0)]
    assert in_flight.samples[0].prefix_logprobs == [-0.5, -1 / 3, -2.0]
    assert in_flight.samples[0].prefix_versions == [0, 0, 1]
    assert resume(plan).tokens_reused == 4  # what the actor counts as kept from the journal


# --- corrupt records ---------------------------------------------------------------------------


def test_corrupt_records_are_reported_and_their_samples_restarted(journal, client):
    broken_header, broken_log, fine = _open(journal), _open(journal), _open(journal)
    client.hset(journal.key(f"group:{broken_header.group_id}"), "header", "not json")
    append(journal, broken_log.group_id, 0, 0, [1, 2], [-1.0, -2.0], 0)
    append(journal, broken_log.group_id, 1, 0, [3], [-3.0], 0)
    entry = '{"schema_version":7,"kind":"append","index":0}'
    client.lset(journal.key(f"log:{broken_log.group_id}"), 0, entry)
    append(journal, fine.group_id, 0, 0, [5], [-5.0], 0)

    groups, corrupt = journal.load_open_groups()
    assert [g.group_id for g in groups] == [broken_log.group_id, fine.group_id]
    assert groups[0].samples[0] == SampleRecord(broken_log.group_id, 0, "pending")
    assert groups[0].samples[1].token_ids == [3]
    assert groups[1].samples[0].token_ids == [5]
    keys = [key for key, _ in corrupt]
    assert keys == [journal.key(f"group:{broken_header.group_id}"), journal.key(f"log:{broken_log.group_id}")]
    assert "not JSON" in corrupt[0][1] and "unknown schema_version 7" in corrupt[1][1]
    group, problems = journal.read_group(broken_log.group_id)  # one group alone reads the same
    assert problems == [corrupt[1][1]] and problems[0].startswith("sample 0:")
    assert group.samples[0] == SampleRecord(broken_log.group_id, 0, "pending")

    # the plan restarts the corrupt sample; a reset clears it in the journal
    plan = plan_replay(groups, current_version=0, max_prefix_staleness=0)
    assert plan.groups[0].samples[0].action == "restart"
    journal.reset(broken_log.group_id, 0)
    assert append(journal, broken_log.group_id, 0, 0, [8], [-8.0], 0).accepted
    assert read(journal, broken_log.group_id).samples[0].token_ids == [8]


# --- trimming ----------------------------------------------------------------------------------


def test_trim_delivered_keeps_the_markers_of_the_last_cursors(journal, client):
    groups = [_open(journal, size=1) for _ in range(6)]
    for group in groups[:5]:
        _finish_all(journal, group)
        journal.deliver(group.group_id, STREAM, [group.group_id])
    assert journal.trim_delivered(keep_last=3) == 3  # cursor 6: markers of cursors 0, 1, 2 go
    assert client.zrange(journal.key("delivered"), 0, -1) == ["run/3", "run/4"]
    marked = [client.hget(journal.key(f"group:{g.group_id}"), "stream_id") is not None for g in groups]
    assert marked == [False] * 3 + [True] * 2 + [False]
    assert not client.exists(journal.key("group:run/0"))
    assert client.zrange(journal.key("open"), 0, -1) == ["run/5"]  # an open group is never trimmed
    assert journal.load_open_groups().groups[0].group_id == "run/5"
    assert journal.trim_delivered(keep_last=3) == 0
    assert journal.trim_delivered(keep_last=0) == 2
    assert client.xlen(STREAM) == 5  # trimming touches the journal, never the trainer's stream
    with pytest.raises(UnknownGroup):  # a trimmed group can still never be published again
        journal.deliver("run/0", STREAM, ["again"])
    assert client.xlen(STREAM) == 5


def test_a_journal_needs_a_client_that_decodes_responses(server):
    import redis

    raw = redis.Redis.from_url(server.url, password=server.password)
    with pytest.raises(ValueError, match="decode_responses"):
        Journal(raw)
    raw.close()


def test_an_append_can_finish_its_sample_in_the_same_call(journal):
    g = _open(journal)
    results = journal.append_many(
        [
            Append(g.group_id, 0, 0, [5, 6], [-0.5, -0.25], version=3, finish_reason="stop"),
            Append(g.group_id, 1, 0, [7], [-1.0], version=3),  # not finished yet
        ]
    )
    assert [(r.accepted, r.length) for r in results] == [(True, 2), (True, 1)]
    stored = read(journal, g.group_id)
    assert stored.samples[0].finished and stored.samples[0].finish_reason == "stop"
    assert stored.samples[1].state == "generating"
    # a finished sample takes no more tokens; a zero-token append can finish the other one
    assert append(journal, g.group_id, 0, 2, [8], [-0.1], 3).reason == "finished"
    (done,) = journal.append_many([Append(g.group_id, 1, 1, [], [], 3, finish_reason="length")])
    assert done.accepted and read(journal, g.group_id).samples[1].finish_reason == "length"
    with pytest.raises(ValueError, match="does not end a sample"):
        journal.append_many([Append(g.group_id, 1, 1, [], [], 3, finish_reason="abort")])


def test_repeating_a_finish_in_an_append_is_accepted_another_reason_is_not(journal):
    g = _open(journal)
    journal.append_many([Append(g.group_id, 0, 0, [5, 6], [-0.5, -0.25], version=3, finish_reason="stop")])
    (again,) = journal.append_many([Append(g.group_id, 0, 2, [], [], 3, finish_reason="stop")])
    assert (again.accepted, again.length) == (True, 2)  # a retry after a lost reply
    (other,) = journal.append_many([Append(g.group_id, 0, 2, [], [], 3, finish_reason="length")])
    assert (other.accepted, other.reason) == (False, "finished")
    (elsewhere,) = journal.append_many([Append(g.group_id, 0, 1, [], [], 3, finish_reason="stop")])
    assert (elsewhere.accepted, elsewhere.reason) == (False, "finished")
    assert read(journal, g.group_id).samples[0].finish_reason == "stop"


def test_a_finish_that_relabels_is_logged_even_without_tokens_and_one_that_does_not_is_not(journal, client):
    """vLLM's spans arrive with a sample's last chunk: the versions of tokens journaled before are
    rewritten by the entry that records the finish, kept in the log like any append."""
    g = _open(journal)
    journal.append_many([Append(g.group_id, 0, 0, [5, 6, 7], [-0.5] * 3, 4), Append(g.group_id, 1, 0, [8], [-0.5], 4)])
    log = f"{journal.prefix}log:{g.group_id}"
    before = client.llen(log)
    journal.append_many([Append(g.group_id, 0, 3, [], [], 0, "length", relabel=[[0, 1, 4], [1, 3, 5]]),
                         Append(g.group_id, 1, 1, [], [], 0, "stop")])  # fmt: skip
    assert client.llen(log) == before + 1  # the relabelling finish only
    stored = read(journal, g.group_id)
    assert stored.samples[0].versions == [4, 5, 5] and stored.samples[0].finished
    assert stored.samples[1].versions == [4] and stored.samples[1].finish_reason == "stop"


# --- conversations (environment.step) -----------------------------------------------------------

TOOL = {"role": "tool", "content": "5", "name": "add", "truncated": False}


def test_a_turns_end_without_tokens_is_logged_and_read_back(journal, client):
    """A turn whose budget was spent ends with no new tokens: the entry saying so is kept anyway."""
    g = _open(journal).group_id
    log = f"{journal.prefix}log:{g}"
    (tokens,) = journal.append_many([Append(g, 0, 0, [5, 6], [-0.5, -0.25], 3, turn_end="stop")])
    before = client.llen(log)
    (ended,) = journal.append_many([Append(g, 1, 0, [], [], 0, turn_end="length")])
    assert (tokens.accepted, tokens.length) == (True, 2) and (ended.accepted, ended.length) == (True, 0)
    assert client.llen(log) == before + 1, "an entry saying a turn ended was dropped for having no tokens"
    stored = read(journal, g)
    assert stored.samples[0].turn_ends == [[2, "stop"]] and stored.samples[0].state == "generating"
    assert stored.samples[1].turn_ends == [[0, "length"]] and stored.samples[1].token_ids == []
    with pytest.raises(ValueError, match="does not end a turn"):
        journal.append_many([Append(g, 0, 2, [], [], 0, turn_end="abort")])


def test_an_observation_then_a_done_step_without_tokens_reads_back_finished_with_its_reward(journal, client):
    g = _open(journal).group_id
    journal.append_many([Append(g, 0, 0, [1, 2, 3], [-0.5] * 3, 4, turn_end="stop")])
    (observed,) = journal.append_many([Append(g, 0, 3, [50, 51], [0.0, 0.0], 4, observation=TOOL)])
    journal.append_many([Append(g, 0, 5, [7], [-0.125], 5, turn_end="stop")])
    done = Append(g, 0, 6, [], [], 0, finish_reason="stop", observation={"done": True, "reward": 1.0})
    (finished,) = journal.append_many([done])
    assert (observed.accepted, observed.length) == (True, 5) and (finished.accepted, finished.length) == (True, 6)
    sample = read(journal, g).samples[0]
    assert sample.finished and sample.finish_reason == "stop"
    assert sample.token_ids == [1, 2, 3, 50, 51, 7] and sample.versions == [4, 4, 4, 4, 4, 5]
    assert sample.turn_ends == [[3, "stop"], [6, "stop"]]
    assert sample.observations == [{**TOOL, "start": 3, "end": 5}, {"done": True, "reward": 1.0, "start": 6, "end": 6}]
    log = f"{journal.prefix}log:{g}"
    before = client.llen(log)
    (again,) = journal.append_many([done])  # a retry after a lost reply
    assert again.accepted and client.llen(log) == before, "a retried last step was logged twice"
    (resumed,) = resume(plan_replay([read(journal, g)], current_version=9, max_prefix_staleness=0, conversations=True),
                        conversations=True).groups[0].samples[:1]  # fmt: skip
    assert resumed.finished and resumed.reward == 1.0 and not resumed.step_due


def test_the_ledger_journals_an_observation_after_the_turns_tokens_are_flushed(client):
    from rlrun.actor.ledger import JournalLedger, flush
    from rlrun.actor.sampling import SampleState

    ledger = JournalLedger(client)
    g = ledger.open_next(lambda c: c, lambda p: [p], 1, 40, "run").group_id
    sample = SampleState(0)
    sample.append([1, 2, 3], [-0.5, -0.25, -0.125], 4)
    sample.end_turn("stop")
    (flushed,) = flush(ledger, g, [sample])
    assert flushed.result.accepted and sample.journaled == 3 and sample.turn_end_recorded
    assert flush(ledger, g, [sample]) == [], "a recorded turn end was journaled again"
    sample.observe([50, 51], dict(TOOL))
    result = ledger.append_observation(g, sample)
    assert (result.accepted, result.length) == (True, 5)
    stored = read(ledger, g).samples[0]
    assert stored.token_ids == [1, 2, 3, 50, 51] and stored.logprobs[3:] == [0.0, 0.0] and stored.versions == [4] * 5
    assert stored.turn_ends == [[3, "stop"]] and stored.observations == [{**TOOL, "start": 3, "end": 5}]
    # the next turn, and the last step: the conversation ends with its reward, no tokens
    sample.journaled = result.length
    sample.append([7], [-0.5], 5)
    sample.end_turn("length")
    flush(ledger, g, [sample])
    sample.observations.append({"done": True, "reward": 0.5, "start": 6, "end": 6})
    sample.finish_reason = "length"
    assert ledger.append_observation(g, sample, finish="length").accepted
    stored = read(ledger, g).samples[0]
    assert stored.finish_reason == "length" and stored.turn_ends == [[3, "stop"], [6, "length"]]
    assert stored.observations[-1] == {"done": True, "reward": 0.5, "start": 6, "end": 6}
    again = SampleState(0)
    again.take_journal(stored)
    assert again.reward == 0.5 and again.observation_spans == [[3, 5]] and again.completion_ids == sample.completion_ids
