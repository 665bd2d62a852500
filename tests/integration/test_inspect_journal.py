"""`rlrun inspect-checkpoint` reading the token journal from a real Redis (the run's own server)."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from rlrun.cli import inspection as ci
from rlrun.run import runlock
from rlrun.streams.server import connect
from tests.standalone_redis import managed_server
from tests.unit.test_inspect import invoke, make_run, resolved_yaml, write_hf  # noqa: F401 - resolved_yaml is a fixture

pytestmark = pytest.mark.timeout(120)



@pytest.fixture
def running_run(tmp_path, resolved_yaml):
    """A run being run (this test process owns it, as its supervisor would) with its Redis up;
    (the run, its server, its lock)."""
    run = make_run(tmp_path / "run", resolved_yaml)
    write_hf(run.checkpoint(2), 2, samples=20, version=3)
    with managed_server(run) as server, runlock.acquire(run) as lock:
        run.write_state(status="running", supervisor_pid=os.getpid())
        yield run, server, lock


def _fill_journal(client) -> None:
    from rlrun.journal.store import Append, Journal
    from rlrun.streams import names

    journal = Journal(client)
    opened = [journal.open_group(lambda c: c, lambda p: [1, 2], group_size=2, max_new_tokens=6, run="r") for _ in range(3)]
    first, second, third = (g.group_id for g in opened)
    journal.append_many([
        # first: both samples finished (then delivered)
        Append(first, 0, 0, [5], [-0.1], version=1, finish_reason="stop"),
        Append(first, 1, 0, [6], [-0.1], version=1, finish_reason="stop"),
        # second: one sample finished (2 tokens), one generating from an old policy (3 tokens)
        Append(second, 0, 0, [7, 8], [-0.2, -0.3], version=3, finish_reason="stop"),
        Append(second, 1, 0, [9, 9, 9], [-0.1] * 3, version=1),
        # third: one sample generating (1 token, fresh), one pending
        Append(third, 0, 0, [4], [-0.5], version=4),
    ])  # fmt: skip
    journal.deliver(first, names.GROUPS_STREAM, ["{}"])
    client.set(names.POLICY_VERSION, 4)


def test_journal_summary_counts_the_open_groups(running_run):
    _, server, _ = running_run
    client = connect(server.url, server.password)
    try:
        _fill_journal(client)
        summary = ci.journal_summary(client)
        bounded = ci.journal_summary(client, max_prefix_staleness=2)
    finally:
        client.close()
    assert summary["groups_awaiting_delivery"] == 2 and summary["groups_ready"] == 0
    assert summary["groups_delivered_markers"] == 1 and summary["prompt_cursor"] == 3
    assert (summary["samples_in_flight"], summary["samples_pending"], summary["samples_generating"]) == (3, 1, 2)
    assert summary["samples_finished"] == 1
    assert summary["tokens_saved"] == 2 + 3 + 1
    assert (summary["policy_version"], summary["max_prefix_lag"]) == (4, 3)
    assert summary["stale_prefixes"] is None  # no bound given
    assert (bounded["stale_prefixes"], bounded["stale_tokens"]) == (1, 3)  # version 1 < 4 - 2
    assert summary["corrupt_records"] == 0 and summary["groups_quarantined"] == 0


def test_cli_shows_the_journal_of_a_running_run(running_run):
    run, server, lock = running_run
    client = connect(server.url, server.password)
    try:
        _fill_journal(client)
    finally:
        client.close()
    data = json.loads(invoke(str(run.root), "--json").stdout)
    assert data["journal_note"] is None
    assert data["journal"]["samples_in_flight"] == 3 and data["journal"]["tokens_saved"] == 6
    bound = yaml.safe_load(run.config.read_text())["actor"].get("max_prefix_staleness")  # the run's bound, once it has one
    assert data["journal"]["max_prefix_staleness"] == bound
    if bound is not None:
        assert data["journal"]["stale_prefixes"] == (1 if 4 - 1 > bound else 0)

    table = invoke(str(run.root))
    assert table.exit_code == 0, table.output
    assert "samples in flight" in table.stdout and "tokens saved" in table.stdout

    # the same through an explicit URL (the run's password is used)
    explicit = json.loads(invoke(str(run.checkpoint(2)), "--json", "--redis-url", server.url).stdout)
    assert explicit["journal"]["groups_awaiting_delivery"] == 2

    # the supervisor gone: the journal is not read even though Redis still answers
    lock.release()
    data = json.loads(invoke(str(run.root), "--json").stdout)
    assert data["journal"] is None and data["journal_note"] == ci.REDIS_NOT_RUNNING


def test_redis_endpoint_is_read_from_the_runs_redis_conf(running_run):
    run, server, lock = running_run
    endpoint = ci.run_redis_endpoint(run)
    assert endpoint == ci.RedisEndpoint(server.url, server.password)


def test_with_two_actors_each_journal_is_shown_and_added_up(tmp_path):
    from rlrun.config import compose
    from rlrun.journal.store import Append, Journal
    from rlrun.streams import names

    _, text = compose(["recipe=math_gspo", "actor.num_actors=2", "inference.num_servers=2"])
    run = make_run(tmp_path / "run", text)
    write_hf(run.checkpoint(2), 2, samples=20, version=3)
    with managed_server(run) as server, runlock.acquire(run):
        run.write_state(status="running", supervisor_pid=os.getpid())
        client = connect(server.url, server.password)
        try:
            for k, opened in ((0, 1), (1, 3)):  # actor-0 one open group, actor-1 three
                journal = Journal(client, names.journal_prefix(names.actor_stream(k, 2)))
                for _ in range(opened):
                    g = journal.open_group(lambda c: c, lambda p: [1], group_size=2, max_new_tokens=4, run=f"r/a{k}")
                    journal.append_many([Append(g.group_id, 0, 0, [5, 6], [-0.1, -0.1], version=1)])
            client.set(names.POLICY_VERSION, 2)
        finally:
            client.close()
        data = json.loads(invoke(str(run.root), "--json").stdout)
        table = invoke(str(run.root))
    journal = data["journal"]
    assert journal["actors"]["actor-0"]["prompt_cursor"] == 1 and journal["actors"]["actor-1"]["prompt_cursor"] == 3
    assert journal["actors"]["actor-1"]["tokens_saved"] == 6
    assert journal["prompt_cursor"] == 4 and journal["groups_awaiting_delivery"] == 4 and journal["tokens_saved"] == 8
    assert journal["policy_version"] == 2 and journal["max_prefix_lag"] == 1
    assert table.exit_code == 0 and "journal per actor" in table.stdout and "actor-1" in table.stdout
