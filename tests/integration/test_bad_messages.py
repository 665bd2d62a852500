"""Malformed messages on rlrun's own streams, against a real Redis: the trainer's input
(`rlrun:groups`) and the actor's token journal (Fast-LLM's events: test_fast_llm_acl.py). Each bad
message is rejected, counted and logged with its id (or key); none raises, none stops the good
messages after it, none poisons a group. Plus the launcher's retry when a picked port is taken.
"""

from __future__ import annotations

import dataclasses
import json
import socket

import pytest

from rlrun.run import launch, plan
from rlrun.actor.ledger import JournalLedger
from rlrun.actor.loop import Actor
from rlrun.task.pool import scorer_for
from rlrun.task.tasks import load_task
from rlrun.config import compose
from rlrun.run.built import build
from rlrun.journal.store import KEY_PREFIX, Append
from rlrun.streams import names
from rlrun.streams.codec import encode
from rlrun.supervisor import RunVerdict

pytestmark = pytest.mark.timeout(120)


def group_key(group_id: str) -> str:
    return f"{KEY_PREFIX}group:{group_id}"


def log_key(group_id: str) -> str:
    return f"{KEY_PREFIX}log:{group_id}"


# --- the trainer's input stream -----------------------------------------------------------------


def group_message(group_id: str, size: int = 8, **change) -> dict:
    sample = {"index": 0, "completion_ids": [3, 4], "logprobs": [-0.5, -0.1], "versions": [0, 0],
              "finish_reason": "stop", "reward": 1.0, "advantage": 0.5}  # fmt: skip
    message = {"schema_version": 1, "group_id": group_id, "prompt_index": 0, "prompt_ids": [1, 2],
               "samples": [{**sample, "index": i} for i in range(size)]}  # fmt: skip
    for path, value in change.items():  # "samples.0.reward" -> message["samples"][0]["reward"]
        *parents, leaf = path.split(".")
        node = message
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        node[int(leaf) if leaf.isdigit() else leaf] = value
    return message


BAD_GROUPS = [
    ("not-json", {"data": "{not json"}),
    ("no-data-field", {"payload": json.dumps(group_message("g"))}),
    ("no-schema-version", {"data": json.dumps({k: v for k, v in group_message("g").items() if k != "schema_version"})}),
    ("unknown-schema-version", {"data": json.dumps({**group_message("g"), "schema_version": 7})}),
    ("missing-fields", {"data": encode({"group_id": "g"})}),
    ("wrong-group-size", {"data": encode(group_message("g", size=7))}),
    ("token-beyond-vocab", {"data": encode(group_message("g", **{"samples.0.completion_ids": [3, 99]}))}),
    ("negative-token", {"data": encode(group_message("g", **{"prompt_ids": [-1, 2]}))}),
    ("length-mismatch", {"data": encode(group_message("g", **{"samples.1.logprobs": [-0.5]}))}),
    ("logprob-not-a-number", {"data": encode(group_message("g", **{"samples.2.logprobs": ["x", -0.1]}))}),
    ("reward-null", {"data": encode(group_message("g", **{"samples.3.reward": None}))}),
    ("token-a-float", {"data": encode(group_message("g", **{"samples.4.completion_ids": [3.5, 4]}))}),
    ("empty-prompt", {"data": encode(group_message("g", **{"prompt_ids": []}))}),
    ("no-samples", {"data": encode(group_message("g", size=0))}),
]


def batch_reader(client, cfg):
    """The trainer's reader of its input as the trainer builds it (one rank, the base model: it
    reads each stream from its start), for a model of 32 tokens."""
    from rlrun.trainer.batches import BatchReader
    from rlrun.trainer.parallel import Parallel, Ranks
    from rlrun.trainer.stopping import Stopping

    reader = BatchReader(Stopping(client), Parallel(Ranks()), vocab_size=32, covered={}, heartbeat=lambda **_: None,
                         groups_per_step=cfg.groups_per_step, group_size=cfg.algo.group_size, num_actors=cfg.actor.num_actors)
    reader.rewind()  # as the trainer does first
    return reader


def test_trainer_rejects_counts_and_acks_every_malformed_group(client, caplog):
    cfg, _ = compose(["recipe=math_grpo", "trainer.train_batch_size=16"])  # 2 groups of 8 per step
    reader = batch_reader(client, cfg)
    bad_ids = [client.xadd(names.GROUPS_STREAM, fields) for _, fields in BAD_GROUPS[:7]]
    first = client.xadd(names.GROUPS_STREAM, {"data": encode(group_message("run/0"))})
    bad_ids += [client.xadd(names.GROUPS_STREAM, fields) for _, fields in BAD_GROUPS[7:]]
    second = client.xadd(names.GROUPS_STREAM, {"data": encode(group_message("run/1"))})

    groups = reader.take(step=1)

    assert [g.group_id for g in groups] == ["run/0", "run/1"]  # the good ones, untouched
    assert reader.bad_messages == len(BAD_GROUPS)
    # the bad ones are acked with the step's at its checkpoint too
    assert sorted(reader.unacked) == sorted((names.GROUPS_STREAM, i) for i in [*bad_ids, first, second])
    for message_id in bad_ids:
        assert f"rejected message {message_id} on {names.GROUPS_STREAM}" in caplog.text


def test_with_two_actors_the_trainer_reads_both_streams_and_acks_each_at_its_checkpoint(client, tmp_path):
    from transformers import AutoModelForCausalLM, Qwen2Config

    from rlrun.trainer.loop import Trainer

    config = Qwen2Config(vocab_size=32, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=1, num_key_value_heads=1, tie_word_embeddings=False)  # fmt: skip
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "model")
    cfg, resolved = compose(["recipe=math_grpo", "trainer.train_batch_size=32", "actor.num_actors=2", "inference.num_servers=2"])
    run_dir = launch.create_run(build(cfg), resolved, [], root=tmp_path / "run")
    trainer = Trainer(cfg, run_dir, client, str(tmp_path / "model"), vllm=None)  # its input path and checkpoints
    trainer.batches.rewind()  # as train() does first
    streams = names.groups_streams(2)
    sent = [(s, client.xadd(s, {"data": encode(group_message(f"run/a{k}/{c}"))})) for c in range(2) for k, s in enumerate(streams)]
    groups = trainer.batches.take(step=1)  # 4 groups a step: both actors' two
    assert sorted(g.group_id for g in groups) == ["run/a0/0", "run/a0/1", "run/a1/0", "run/a1/1"]
    assert sorted(trainer.batches.unacked) == sorted(sent)
    for stream in streams:  # read, not acked until a checkpoint covers them
        assert client.xpending(stream, names.TRAINER_GROUP)["pending"] == 2
    restarted = Trainer(cfg, run_dir, client, str(tmp_path / "model"), vllm=None)  # a restart reads them again
    restarted.batches.rewind()
    again = restarted.batches.take(step=1)
    assert sorted(g.group_id for g in again) == sorted(g.group_id for g in groups)
    trainer.save_checkpoint()
    for stream in streams:
        assert client.xpending(stream, names.TRAINER_GROUP)["pending"] == 0


# --- the token journal, replayed by a restarted actor -------------------------------------------


def _damage_log(entry: str):
    return lambda c, gid: c.rpush(log_key(gid), entry)


JOURNAL_DAMAGE = [
    ("log-not-json", _damage_log("{not json"), "log:", "the entry is ignored", [0, 1]),
    ("log-unknown-schema", _damage_log(json.dumps({"schema_version": 99, "kind": "append", "index": 0})), "log:",
     "that sample is generated again", [1]),
    ("log-unknown-kind", _damage_log(json.dumps({"schema_version": 1, "kind": "erase", "index": 1})), "log:",
     "that sample is generated again", [0]),
    ("log-bad-tokens", _damage_log(json.dumps({"schema_version": 1, "kind": "append", "index": 0, "offset": 3,
                                               "token_ids": ["a"], "logprobs": [0.0], "version": 0})), "log:",
     "that sample is generated again", [1]),
    ("log-names-no-sample", _damage_log(json.dumps({"schema_version": 1, "kind": "reset", "index": 5})), "log:",
     "the entry is ignored", [0, 1]),
    ("length-disagrees", lambda c, gid: c.hset(group_key(gid), "0:len", "99"), "log:", "that sample is generated again", [1]),
    ("header-not-json", lambda c, gid: c.hset(group_key(gid), "header", "nope"), "group:", "that group is quarantined", None),
    ("header-unknown-schema", lambda c, gid: c.hset(group_key(gid), "header", json.dumps({"schema_version": 2})), "group:",
     "that group is quarantined", None),
]  # fmt: skip


@pytest.mark.parametrize("name, damage, key_kind, consequence, kept", JOURNAL_DAMAGE, ids=[d[0] for d in JOURNAL_DAMAGE])
def test_a_restarted_actor_counts_and_logs_each_corrupt_journal_record(client, caplog, name, damage, key_kind, consequence, kept):
    cfg, _ = compose(["recipe=math_grpo"])
    ledger = JournalLedger(client)
    journal = ledger
    group = journal.open_group(lambda c: c, lambda p: [1, 2], group_size=2, max_new_tokens=8, run="run")
    journal.append_many([Append(group.group_id, 0, 0, [5, 6, 7], [-0.1, -0.2, -0.3], 0), Append(group.group_id, 1, 0, [8, 9], [-0.4, -0.5], 0)])
    journal.append_many([Append(group.group_id, 1, 2, [], [], 0, "stop")])
    damage(client, group.group_id)

    actor = Actor(cfg.actor, cfg.algo, client, None, None, ["http://127.0.0.1:1"], ledger, run_name="run", seed=cfg.run.seed,
                  trainer=build(cfg).backend.trainer_view(client), scorer=_scorer(cfg))  # what main() builds
    replayed = actor._replay_plan()

    assert actor.counters["journal_corrupt_records"] == 1
    line = next(r.getMessage() for r in caplog.records if "journal record" in r.getMessage())
    assert f"{KEY_PREFIX}{key_kind}{group.group_id}" in line and consequence in line
    if kept is None:
        assert replayed == [] and journal.quarantined() == [group.group_id]
        again = Actor(cfg.actor, cfg.algo, client, None, None, ["http://127.0.0.1:1"], JournalLedger(client), run_name="run", seed=cfg.run.seed,
                      trainer=build(cfg).backend.trainer_view(client), scorer=_scorer(cfg))
        assert again._replay_plan() == [] and again.counters["journal_corrupt_records"] == 0  # reported once
        assert client.exists(group_key(group.group_id))  # kept for a person to read
        return
    (live,) = replayed
    held = {s.index: s.completion_ids for s in live.samples if s.completion_ids}
    assert sorted(held) == kept  # undamaged samples keep their exact tokens; damaged ones start over
    assert held.get(0, [5, 6, 7]) == [5, 6, 7] and held.get(1, [8, 9]) == [8, 9]


def _restarted_actor(client, damage=None):
    """A group whose sample 0 holds 3 tokens and sample 1 is finished, damaged by `damage`, and
    the actor a restart builds over it, with its replayed groups."""
    cfg, _ = compose(["recipe=math_grpo"])
    ledger = JournalLedger(client)
    group = ledger.open_group(lambda c: c, lambda p: [1, 2], group_size=2, max_new_tokens=8, run="run")
    ledger.append_many([Append(group.group_id, 0, 0, [5, 6, 7], [-0.1, -0.2, -0.3], 0), Append(group.group_id, 1, 0, [8, 9], [-0.4, -0.5], 0)])
    ledger.append_many([Append(group.group_id, 1, 2, [], [], 0, "stop")])
    if damage is not None:
        damage(client, group.group_id)
    actor = Actor(cfg.actor, cfg.algo, client, None, None, ["http://127.0.0.1:1"], ledger, run_name="run", seed=cfg.run.seed, trainer=build(cfg).backend.trainer_view(client),
                  scorer=_scorer(cfg))
    return actor, actor._replay_plan(), group.group_id


def _scorer(cfg):
    """The run's scorer (its worker pool is started only by Actor.run, which these tests do not call)."""
    return scorer_for(load_task(cfg.dataset, cfg.run.seed).rewards, cfg.reward)


def test_a_replayed_finished_sample_is_not_recorded_again(client, caplog):
    actor, (live,), group_id = _restarted_actor(client, _damage_log("{not json"))
    entries = client.llen(log_key(group_id))

    actor._flush(live, live.samples)  # what every request's end does

    assert not [r for r in caplog.records if "refused" in r.getMessage()]
    assert client.llen(log_key(group_id)) == entries  # nothing was sent: the journal knew
    assert live.samples[1].finished and live.samples[1].completion_ids == [8, 9]


def test_a_refused_append_rereads_a_damaged_group_without_failing(client, caplog):
    actor, (live,), group_id = _restarted_actor(client, _damage_log("{not json"))
    sample = live.samples[0]
    sample.append([10, 11], [-0.6, -0.7], 0)
    sample.journaled = 1  # a view behind the journal's: its append is refused as a duplicate

    actor._flush(live, [sample])

    assert "journal refused an append" in caplog.text and "re-reading run/0" in caplog.text
    assert sample.completion_ids == [5, 6, 7] and sample.journaled == 3  # the journal's tokens
    assert actor.counters["tokens_regenerated"] == 2


def test_a_sample_that_reads_as_empty_on_a_reread_is_reset_in_the_journal(client):
    actor, (live,), group_id = _restarted_actor(client)
    client.hset(group_key(group_id), "0:len", "99")  # damaged after the replay
    sample = live.samples[0]
    sample.append([10], [-0.6], 0)

    actor._flush(live, [sample])  # refused (a gap), re-read: sample 0 is unreadable

    assert sample.completion_ids == [] and sample.journaled == 0
    sample.append([12, 13], [-0.1, -0.2], 0)
    actor._flush(live, [sample])  # generated again from the prompt: the journal takes it
    assert sample.journaled == 2
    assert actor.ledger.read_group(group_id)[0].samples[0].token_ids == [12, 13]


# --- a port taken between picking it and binding it ---------------------------------------------


def test_a_port_taken_at_start_is_retried_on_fresh_ports(tmp_path, monkeypatch):
    """Another program holds the port picked for Redis: the real server fails to bind it, the
    launcher sees "address already in use", records `port_taken` and starts again on new ports."""
    cfg, resolved = compose(["supervisor.redis.max_restarts=0", "supervisor.stop_grace_s=2"])
    built = build(cfg)
    run_dir = launch.create_run(built, resolved, [], root=tmp_path / "run")

    class RedisIsEnough(type(built.backend)):  # the run ends once Redis is up: what the launcher did is the point
        def completion_check(self, progress):
            return lambda exits: RunVerdict(True, "Redis is up")

    built = dataclasses.replace(built, backend=RedisIsEnough(cfg))
    real_pick, real_specs = launch.redis_server.pick_free_port, plan.build_specs
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        picks = iter([port])
        monkeypatch.setattr(launch.redis_server, "pick_free_port", lambda host: next(picks, None) or real_pick(host))
        monkeypatch.setattr(plan, "model_path", lambda model, build, **_: str(tmp_path / "model"))
        monkeypatch.setattr(plan, "build_specs", lambda *a, **k: [s for s in real_specs(*a, **k) if s.name == "redis"])
        assert launch.train(built, run_dir) == "Redis is up"
    recorded = [json.loads(line) for line in run_dir.events.read_text().splitlines()]
    assert [(e["process"], e["attempt"]) for e in recorded if e["event"] == "port_taken"] == [("redis", 1)]
    assert [e["process"] for e in recorded if e["event"] == "process_ready"] == ["redis"]  # once, on the new port
    assert any("Address already in use" in log.read_text() for log in run_dir.logs.rglob("redis*.log"))
    assert f"port {port}\n" not in run_dir.redis_conf.read_text()  # the second start used another port
    assert run_dir.read_state()["status"] == "finished"


# --- nobody without the password gets in --------------------------------------------------------


@pytest.mark.parametrize("password", [None, "not-the-password"], ids=["no-password", "wrong-password"])
def test_a_client_without_the_password_can_neither_read_nor_write(server, client, password):
    import redis

    client.xadd(names.GROUPS_STREAM, {"data": "kept"})
    client.hset(names.TRAINER_STATE, "step", "3")
    before = {key: client.type(key) for key in client.scan_iter("*")}
    intruder = redis.Redis.from_url(server.url, password=password, socket_timeout=2.0)
    attempts = [
        lambda: intruder.get(names.POLICY_VERSION), lambda: intruder.hgetall(names.TRAINER_STATE),
        lambda: intruder.xrange(names.GROUPS_STREAM), lambda: intruder.xread({names.GROUPS_STREAM: "0"}),
        lambda: intruder.keys("*"), lambda: intruder.set(names.POLICY_VERSION, 99),
        lambda: intruder.xadd(names.GROUPS_STREAM, {"data": "forged"}), lambda: intruder.delete(names.TRAINER_STATE),
    ]  # fmt: skip
    for attempt in attempts:
        with pytest.raises(redis.exceptions.AuthenticationError):
            attempt()
    assert {key: client.type(key) for key in client.scan_iter("*")} == before
    assert [fields for _id, fields in client.xrange(names.GROUPS_STREAM)] == [{"data": "kept"}]
    assert client.hgetall(names.TRAINER_STATE) == {"step": "3"}
