"""The Fast-LLM ACL on a real server: passwordless Fast-LLM clients reach its streams only."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis

from rlrun.backends.fast_llm.acl import default_user_line
from rlrun.rundir import RunDir
from rlrun.streams.server import RLRUN_USER, write_server_config
from tests.standalone_redis import managed_server

pytestmark = pytest.mark.timeout(60)

STREAM, GROUP, EVENTS = "fast_llm_streaming", "fast_llm_group", "fast_llm_events"
PASSWORD = "s3cret-for-the-test"


@contextmanager
def acl_server(folder: Path) -> Iterator[int]:
    """The run's Redis configured as for a Fast-LLM run (the restricted passwordless `default`
    user beside rlrun's), with PASSWORD as the run's password; yields its port."""
    run = RunDir(folder)
    run.create({"name": "acl-test"})
    run.write_secret(run.redis_password, PASSWORD)
    with managed_server(run, default_user=default_user_line([STREAM], EVENTS)) as server:
        yield server.port


def fast_llm_client(port: int) -> redis.Redis:
    """A client the way Fast-LLM makes one: host and port, no password."""
    return redis.Redis(host="127.0.0.1", port=port)


def test_fast_llm_client_reads_and_writes_its_streams(tmp_path):
    with acl_server(tmp_path / "redis") as port:
        rlrun = redis.Redis(port=port, username=RLRUN_USER, password=PASSWORD)
        rlrun.xadd(STREAM, {"data": '{"tokens":[1,2,3]}'})
        fast_llm = fast_llm_client(port)
        assert fast_llm.ping()
        # what Fast-LLM's streaming dataset does (fast_llm/data/dataset/streaming.py, every revision)
        fast_llm.xgroup_create(name=STREAM, groupname=GROUP, id="0", mkstream=True)
        with pytest.raises(redis.ResponseError, match="BUSYGROUP"):
            fast_llm.xgroup_create(name=STREAM, groupname=GROUP, id="0", mkstream=True)
        got = fast_llm.xreadgroup(GROUP, "fast_llm_consumer_0", {STREAM: ">"}, count=1, block=100, noack=True)
        assert got[0][1][0][1] == {b"data": b'{"tokens":[1,2,3]}'}
        assert fast_llm.xgroup_createconsumer(STREAM, GROUP, "fast_llm_consumer_1") == 1
        # what its streaming callback does (fast_llm/engine/training/streaming.py)
        fast_llm.xadd(EVENTS, {"event": '{"type": "training_finished"}'})
        assert rlrun.xrange(EVENTS)[0][1] == {b"event": b'{"type": "training_finished"}'}
        assert rlrun.xlen(STREAM) == 1


# What the passwordless user must not do: inject or destroy training data, rewrite the consumer
# group, read or write anything but Fast-LLM's two streams, administer the server.
REFUSED = {
    "xadd-documents": lambda c: c.xadd(STREAM, {"data": '{"tokens":[6,6,6]}'}),
    "xdel-documents": lambda c: c.xdel(STREAM, "0-1"),
    "xtrim-documents": lambda c: c.xtrim(STREAM, maxlen=0),
    "xgroup-setid": lambda c: c.xgroup_setid(STREAM, GROUP, id="$"),
    "xgroup-destroy": lambda c: c.xgroup_destroy(STREAM, GROUP),
    "xgroup-delconsumer": lambda c: c.xgroup_delconsumer(STREAM, GROUP, "fast_llm_consumer_0"),
    "xack-documents": lambda c: c.xack(STREAM, GROUP, "0-1"),
    "xautoclaim-documents": lambda c: c.xautoclaim(STREAM, GROUP, "me", 0),
    "xrange-documents": lambda c: c.xrange(STREAM),
    "xread-documents": lambda c: c.xread({STREAM: "0"}),
    "xlen-documents": lambda c: c.xlen(STREAM),
    "xinfo-documents": lambda c: c.xinfo_stream(STREAM),
    "del-documents": lambda c: c.delete(STREAM),
    "xdel-events": lambda c: c.xdel(EVENTS, "0-1"),
    "xtrim-events": lambda c: c.xtrim(EVENTS, maxlen=0),
    "xrange-events": lambda c: c.xrange(EVENTS),
    "xreadgroup-events": lambda c: c.xreadgroup(GROUP, "x", {EVENTS: ">"}),
    "xgroup-create-events": lambda c: c.xgroup_create(EVENTS, "mine", id="0"),
    "del-events": lambda c: c.delete(EVENTS),
    "xadd-groups": lambda c: c.xadd("rlrun:groups", {"data": "x"}),
    "xrange-groups": lambda c: c.xrange("rlrun:groups"),
    "get": lambda c: c.get("rlrun:policy_version"),
    "set": lambda c: c.set("anything", "1"),
    "hgetall": lambda c: c.hgetall("rlrun:actor:state"),
    "hset-weights": lambda c: c.hset("rlrun:weights", "join_after", "0-0"),
    "keys": lambda c: c.keys("*"),
    "publish": lambda c: c.publish("chan", "x"),
    "acl-setuser": lambda c: c.acl_setuser("default", enabled=True, passwords=["+x"]),
    "config-set": lambda c: c.config_set("dir", "/tmp"),
    "flushall": lambda c: c.flushall(),
}


def refusals(fast_llm: redis.Redis) -> dict[str, str]:
    """Each REFUSED command sent by `fast_llm`: name → "refused", or what it answered instead."""
    out = {}
    for name, command in REFUSED.items():
        try:
            out[name] = f"answered {command(fast_llm)!r}"
        except redis.exceptions.NoPermissionError:
            out[name] = "refused"
        except redis.ResponseError as exc:  # e.g. a command renamed away answers "unknown command"
            out[name] = "refused" if "unknown command" in str(exc) else f"error {exc}"
    return out


def test_fast_llm_client_is_refused_everything_else(tmp_path):
    with acl_server(tmp_path / "redis") as port:
        rlrun = redis.Redis(port=port, username=RLRUN_USER, password=PASSWORD)
        rlrun.set("rlrun:policy_version", "3")
        first = rlrun.xadd(STREAM, {"data": "{}"})
        rlrun.xgroup_create(STREAM, GROUP, id="0")
        rlrun.xadd(EVENTS, {"event": '{"type": "weights_ready", "step": 0}'})
        assert refusals(fast_llm_client(port)) == dict.fromkeys(REFUSED, "refused")
        assert rlrun.get("rlrun:policy_version") == b"3" and [i for i, _ in rlrun.xrange(STREAM)] == [first]
        assert rlrun.xlen(EVENTS) == 1 and rlrun.xinfo_groups(STREAM)[0]["name"] == GROUP.encode()


def test_rlrun_user_with_password_can_do_everything(tmp_path):
    with acl_server(tmp_path / "redis") as port:
        rlrun = redis.Redis(port=port, username=RLRUN_USER, password=PASSWORD)
        rlrun.set("rlrun:policy_version", "4")
        rlrun.xadd("rlrun:groups", {"data": "{}"})
        rlrun.hset("rlrun:actor:state", mapping={"cursor": "1"})
        rlrun.xadd(STREAM, {"data": "{}"})
        rlrun.xgroup_create(STREAM, GROUP, id="0")
        rlrun.xgroup_destroy(STREAM, GROUP)
        assert rlrun.get("rlrun:policy_version") == b"4"
        assert sorted(rlrun.keys("*")) == [STREAM.encode(), b"rlrun:actor:state", b"rlrun:groups", b"rlrun:policy_version"]
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port, username=RLRUN_USER, password="wrong").ping()


def test_a_bare_password_logs_in_as_the_restricted_user(tmp_path):
    """Why rlrun's clients must name their user: AUTH <password> alone is the default user."""
    with acl_server(tmp_path / "redis") as port:
        bare = redis.Redis(port=port, password=PASSWORD)
        assert bare.ping()
        with pytest.raises(redis.exceptions.NoPermissionError):
            bare.get("rlrun:policy_version")


def test_the_server_config_keeps_the_password_out_and_acl_lines_refuse_glob_names(tmp_path):
    run = RunDir(tmp_path / "run")
    run.create({"name": "acl-test"})
    run.write_secret(run.redis_password, PASSWORD)
    write_server_config(run, 6379, "127.0.0.1", "everysec", default_user=default_user_line([STREAM], EVENTS))
    conf = run.redis_conf.read_text()
    assert PASSWORD not in conf
    assert (
        "user default reset on nopass resetchannels -@all +ping +client|setinfo "
        "(~fast_llm_streaming +xreadgroup +xgroup|create +xgroup|createconsumer) (~fast_llm_events +xadd)"
    ) in conf.splitlines()
    for bad in ("fast_llm_*", "a b", ""):
        with pytest.raises(ValueError):
            default_user_line([bad], EVENTS)
    with pytest.raises(ValueError):
        default_user_line([EVENTS], EVENTS)  # one stream cannot be both


# --- the run's own Redis, configured as `rlrun train trainer=fast_llm` configures it -----------


def weights_ready(step: int) -> dict:
    return {"event": json.dumps({"type": "weights_ready", "step": step, "documents_seen": 64 * step})}


FINISHED = {"event": json.dumps({"type": "training_finished"})}


def test_forged_events_change_neither_the_served_weights_nor_the_verdict(tmp_path):
    """On the run's live Redis (its ACL as launch writes it), a local process without the password
    is refused every command it could damage the run with; the events it may append, forged,
    are counted and ignored: the follower loads nothing for them, the verdict stays the same."""
    from rlrun.parts.progress import ProgressReader
    from rlrun.run.built import build
    from rlrun.backends.fast_llm.follower import WeightFollower, request_join
    from rlrun.config import compose
    from rlrun.streams import names
    from rlrun.streams.server import connect
    from rlrun.supervisor import EventLog

    from .test_weight_follower import RecordingAdmin

    cfg, _ = compose(["recipe=math_grpo", "trainer=fast_llm", "trainer.device=cpu", "trainer.max_train_steps=4"])
    backend = build(cfg).backend
    run = RunDir(tmp_path / "run")
    run.create({"name": "acl-test"})
    with managed_server(run, default_user=backend.redis_default_user()) as server:
        rlrun = connect(server.url, server.password)
        anyone = redis.Redis(host="127.0.0.1", port=server.port, decode_responses=True)  # as Fast-LLM connects
        assert refusals(anyone) == dict.fromkeys(REFUSED, "refused")

        admin = RecordingAdmin()
        follower = WeightFollower(cfg.trainer, rlrun, admin, "127.0.0.1", 29555, model_dtype=cfg.model.dtype)
        progress = ProgressReader(server.url, run, EventLog(run.events, clock=time.time), num_actors=cfg.actor.num_actors, max_train_steps=cfg.trainer.max_train_steps)
        verdict = backend.completion_check(progress)

        def outcome(trainer_exit):
            judged = verdict({"trainer": trainer_exit})
            return f"exit rejected: {judged.reason}" if judged.reject else (judged.finished, judged.reason)

        request_join(rlrun, EVENTS, start_step=0)  # the supervisor, before starting the trainer
        for step in (0, 1):  # the real trainer's announcements (also passwordless)
            anyone.xadd(EVENTS, weights_ready(step))
        follower.step()
        loaded = list(admin.routes())
        assert [c for c in loaded if c.startswith("finish")] == ["finish_weight_update:0", "finish_weight_update:1"]
        before = (outcome(None), outcome(0), outcome(1))

        forged = [weights_ready(4), weights_ready(0), weights_ready(1), {"event": '{"type": "reload_weights", "path": "/tmp/x"}'}]
        for fields in forged:
            anyone.xadd(EVENTS, fields)
        follower.step()
        assert admin.routes() == loaded  # no pause, no load: the served weights are the same
        assert rlrun.get(names.POLICY_VERSION) == "1"
        assert rlrun.hget(names.WEIGHTS_STATE, "events_rejected") == str(len(forged))
        assert (outcome(None), outcome(0), outcome(1)) == before
        assert progress.malformed_events == len(forged)  # counted by the supervisor too (events.jsonl)

        # A forged training_finished (it fits: the trainer did announce a step): still not done,
        # whatever the trainer's exit; the real trainer's steps go on being loaded.
        anyone.xadd(EVENTS, FINISHED)
        assert outcome(None)[0] is False and outcome(0).startswith("exit rejected")
        anyone.xadd(EVENTS, weights_ready(2))
        follower.step()
        assert admin.routes()[-3:] == ["update_weights", "finish_weight_update:2", "resume"]
        assert rlrun.get(names.POLICY_VERSION) == "2"
        events = [json.loads(line) for line in run.events.read_text().splitlines()]
        assert sum(e["event"] == "malformed_message" for e in events) == len(forged)
        rlrun.close()
