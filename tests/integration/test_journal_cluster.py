"""The token journal and rlrun's other Redis users on a real Redis Cluster: three valkey servers
on loopback, started and joined by the test, every node asking for a password.

What must hold there: `connect` notices the cluster and hands out redis-py's cluster client; every
journal script (open, append, finish, reset, deliver) runs, because the keys it touches (the
delivery stream included) share one hash tag; journals of different actors land on different
nodes; the trainer's consumer-group reads, the supervisor's probes and the external-Redis claim
work unchanged."""

from __future__ import annotations

import pytest
from redis.cluster import key_slot

from rlrun.errors import EnvironmentProblem
from rlrun.journal.plan import plan_replay
from rlrun.journal.store import Append, Journal
from rlrun.journal.store import KEY_PREFIX
from rlrun.run.roles import RedisProbe
from rlrun.rundir import RunDir
from rlrun.streams import external, names
from rlrun.streams.server import connect
from tests.redis_cluster import local_cluster, slot_ranges

pytestmark = pytest.mark.timeout(120)

PASSWORD = "cluster-secret-for-tests"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with local_cluster(tmp_path_factory.mktemp("cluster"), PASSWORD, nodes=3) as c:
        yield c


@pytest.fixture
def client(cluster):
    c = connect(cluster.url, PASSWORD, reconnect_s=2)
    yield c
    for k in range(3):  # FLUSHALL is for one node only on a cluster: clean each node
        node = cluster.node(k)
        for key in node.scan_iter("*"):
            node.delete(key)
        node.close()
    c.close()


def _holders(cluster, pattern: str) -> dict[int, list[str]]:
    """node index -> the keys matching `pattern` it holds."""
    out = {}
    for k in range(3):
        node = cluster.node(k)
        keys = sorted(node.scan_iter(pattern))
        node.close()
        if keys:
            out[k] = keys
    return out


def _node_of(key: str) -> int:
    slot = key_slot(key.encode())
    return next(k for k, (first, last) in enumerate(slot_ranges(3)) if first <= slot <= last)


def _one_group_through(journal: Journal, stream: str, run: str = "run") -> str:
    group = journal.open_group(lambda c: 7 + c, lambda p: [p, p + 1], group_size=2, max_new_tokens=4, run=run)
    results = journal.append_many([
        Append(group.group_id, 0, 0, [1, 2], [-0.1, -0.2], 0, finish_reason="stop"),
        Append(group.group_id, 1, 0, [3], [-0.3], 0),
    ])  # fmt: skip
    assert [r.reason for r in results] == ["ok", "ok"]
    journal.reset(group.group_id, 1)
    assert journal.append_many([Append(group.group_id, 1, 0, [4, 5, 6], [-0.4] * 3, 1)])[0].accepted
    assert journal.append_many([Append(group.group_id, 1, 3, [], [], 0, "length")])[0].accepted
    loaded = journal.load_open_groups()
    assert loaded.corrupt == [] and [g.group_id for g in loaded.groups] == [group.group_id]
    assert [s.token_ids for s in loaded.groups[0].samples] == [[1, 2], [4, 5, 6]]
    assert plan_replay(loaded.groups, current_version=1, max_prefix_staleness=1).groups[0].header.group_id == group.group_id
    assert journal.deliver(group.group_id, stream, ["payload"]) is not None
    assert journal.deliver(group.group_id, stream, ["payload"]) is None  # never twice
    return group.group_id


def test_connect_hands_out_the_cluster_client(cluster, client):
    from redis.cluster import RedisCluster

    assert isinstance(client, RedisCluster)
    assert len(client.get_nodes()) == 3


def test_the_journal_works_on_a_cluster_and_its_keys_share_one_node(cluster, client):
    journal = Journal(client)
    group_id = _one_group_through(journal, names.GROUPS_STREAM)
    assert client.xrange(names.GROUPS_STREAM)[0][1] == {"data": "payload"}
    assert journal.cursor() == 1 and journal.read_group(group_id) == (None, [])
    holders = _holders(cluster, "*")
    assert list(holders) == [_node_of(names.GROUPS_STREAM)], holders  # journal + stream: one slot
    assert set(holders[_node_of(names.GROUPS_STREAM)]) == {
        names.GROUPS_STREAM, f"{KEY_PREFIX}cursor", f"{KEY_PREFIX}delivered", f"{KEY_PREFIX}group:{group_id}",
    }  # fmt: skip
    assert journal.trim_delivered(keep_last=0) == 1  # a transaction over group keys and the delivered set
    assert f"{KEY_PREFIX}group:{group_id}" not in _holders(cluster, "*")[_node_of(names.GROUPS_STREAM)]


def test_the_journals_of_several_actors_spread_over_the_nodes(cluster, client):
    streams = [f"{names.GROUPS_STREAM}:{{a{k}}}" for k in range(6)]
    for k, stream in enumerate(streams):
        _one_group_through(Journal(client, names.journal_prefix(stream)), stream, run=f"run-a{k}")
    holders = _holders(cluster, f"{names.JOURNAL_BASE}*")
    expected = {_node_of(stream) for stream in streams}
    assert set(holders) == expected and len(expected) == 3  # a0..a5 reach all three nodes
    for stream in streams:  # each journal sits with its stream
        node = _node_of(stream)
        tag = names.hash_tag(stream)
        assert f"{names.JOURNAL_BASE}{{{tag}}}:cursor" in holders[node]


def test_keys_that_would_leave_the_slot_are_refused_before_they_reach_the_server(client):
    with pytest.raises(ValueError, match="no hash tag"):
        Journal(client, "rlrun:journal:")
    journal = Journal(client, names.journal_prefix("rlrun:groups:{a1}"))
    journal.open_group(lambda c: c, lambda p: [p], group_size=1, max_new_tokens=2, run="run")
    with pytest.raises(ValueError, match="is not in the slot of journal"):
        journal.deliver("run/0", names.GROUPS_STREAM, ["x"])


def test_the_trainers_consumer_group_and_the_supervisors_probes_work(cluster, client, tmp_path):
    client.xgroup_create(names.GROUPS_STREAM, names.TRAINER_GROUP, id="0", mkstream=True)
    client.xadd(names.GROUPS_STREAM, {"data": "g"})
    reply = client.xreadgroup(names.TRAINER_GROUP, "trainer", {names.GROUPS_STREAM: ">"}, count=10, block=100)
    (stream, entries), = reply
    assert stream == names.GROUPS_STREAM and entries[0][1] == {"data": "g"}
    assert client.xack(names.GROUPS_STREAM, names.TRAINER_GROUP, entries[0][0]) == 1
    client.hset(names.TRAINER_STATE, mapping={"pid": 42, "heartbeat": 9e9})
    run = RunDir(tmp_path / "run")
    run.create({"name": "cluster-probe"})
    run.secrets.mkdir(exist_ok=True)
    run.write_secret(run.redis_password, PASSWORD)
    probe = RedisProbe(cluster.url, run)
    assert probe.ping() and probe.heartbeat(names.TRAINER_STATE, 42)


def test_a_run_claims_the_cluster_and_a_database_number_is_refused(cluster, client):
    external.check_and_claim(cluster.url, PASSWORD, "/runs/a", claim=True)
    assert client.get(external.OWNER_KEY) == "/runs/a"
    with pytest.raises(EnvironmentProblem, match="holds another run's keys"):
        external.check_and_claim(cluster.url, PASSWORD, "/runs/b", claim=False)
    with pytest.raises(EnvironmentProblem, match="database 0 only"):
        connect(cluster.url.rsplit("/", 1)[0] + "/3", PASSWORD, reconnect_s=0)
