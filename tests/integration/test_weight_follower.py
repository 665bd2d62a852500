"""The weight follower's rules on a real Redis (the vLLM side is a recorder here; the real
servers are in test_fast_llm_receiver.py and the Fast-LLM e2e run): when it joins, which
`weights_ready` events it loads, the order of its vLLM calls, and what survives its restart."""

from __future__ import annotations

import json

import pytest

from rlrun.backends.fast_llm.follower import WeightFollower, request_join, stream_id_after
from rlrun.config import compose
from rlrun.streams import names

pytestmark = pytest.mark.timeout(60)

EVENTS = "fast_llm_events"


class RecordingAdmin:
    """What the follower asks of the vLLM servers, in order; `fail_steps` receives raise."""

    urls = ["http://127.0.0.1:1", "http://127.0.0.1:2"]

    def __init__(self, fail_steps=(), down=()) -> None:
        self.calls: list[tuple] = []
        self.fail_steps = set(fail_steps)
        self.down = set(down)  # servers that cannot be reached

    def join(self, host, port, backend, timeout_s, servers=None):
        asked = [u for u in self.urls if servers is None or u in servers]
        self.calls.append(("join", host, port, backend, *asked))
        return [u for u in asked if u in self.down]

    def receive(self, event_id, step, while_waiting=lambda: None):
        self.calls.append(("receive", step))
        if step in self.fail_steps:
            raise RuntimeError(f"vLLM answered 500: the broadcast of {step} broke")
        return [{"step": step, "tensors": 27}] * len(self.urls)

    def pause(self):
        self.calls.append(("pause",))
        if self.down:
            raise RuntimeError(f"vLLM {sorted(self.down)[0]} answered 503")

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))

    def resume_answering(self):
        self.calls.append(("resume",))
        return []


def follower(client, admin) -> WeightFollower:
    cfg, _ = compose(["recipe=math_grpo", "trainer=fast_llm", "trainer.device=cpu"])
    return WeightFollower(cfg, client, admin, "127.0.0.1", 29555)


def weights_ready(client, step: int) -> str:
    return client.xadd(EVENTS, {"event": json.dumps({"type": "weights_ready", "step": step, "documents_seen": 64 * step})})


def test_it_joins_once_per_trainer_start_and_loads_each_broadcast_in_order(client):
    admin = RecordingAdmin()
    f = follower(client, admin)
    request_join(client, EVENTS)
    weights_ready(client, 0)
    weights_ready(client, 1)
    f.step()
    f.step()  # nothing new: no second join, nothing loaded twice
    assert admin.calls == [
        ("join", "127.0.0.1", 29555, "gloo", *RecordingAdmin.urls),
        ("pause",), ("receive", 0), ("reset_prefix_cache",), ("resume",),
        ("pause",), ("receive", 1), ("reset_prefix_cache",), ("resume",),
    ]  # fmt: skip
    assert client.get(names.POLICY_VERSION) == "1"
    assert client.hget(names.WEIGHTS_STATE, "broadcasts_loaded") == "2"


def test_events_of_an_earlier_trainer_are_skipped(client):
    weights_ready(client, 7)  # a trainer that is gone broadcast this
    admin = RecordingAdmin()
    f = follower(client, admin)
    requested = request_join(client, EVENTS)
    new = weights_ready(client, 3)
    f.step()
    assert stream_id_after(new, requested)
    assert [c for c in admin.calls if c[0] == "receive"] == [("receive", 3)]
    assert client.get(names.POLICY_VERSION) == "3"


def test_a_failed_broadcast_keeps_the_served_version_and_generation_resumes(client):
    admin = RecordingAdmin(fail_steps={2})
    f = follower(client, admin)
    request_join(client, EVENTS)
    weights_ready(client, 1)
    weights_ready(client, 2)
    f.step()
    assert client.get(names.POLICY_VERSION) == "1"  # what vLLM still serves
    assert admin.calls[-2:] == [("receive", 2), ("resume",)]  # never left paused
    state = client.hgetall(names.WEIGHTS_STATE)
    assert (state["broadcasts_loaded"], state["broadcasts_failed"]) == ("1", "1")


def test_a_restarted_follower_neither_repeats_an_event_nor_joins_again(client):
    request_join(client, EVENTS)
    weights_ready(client, 1)
    first = RecordingAdmin()
    follower(client, first).step()
    weights_ready(client, 2)

    second = RecordingAdmin()
    restarted = follower(client, second)  # same Redis: its progress is there
    restarted.step()
    assert second.calls == [("pause",), ("receive", 2), ("reset_prefix_cache",), ("resume",)]
    assert restarted.counters["broadcasts_loaded"] == 2  # counts go on across restarts

    request_join(client, EVENTS)  # the trainer is restarted: a new group to join
    restarted.step()
    assert second.calls[-1][0] == "join"


def test_malformed_events_are_passed_over(client):
    admin = RecordingAdmin()
    f = follower(client, admin)
    request_join(client, EVENTS)
    client.xadd(EVENTS, {"event": "{not json"})
    client.xadd(EVENTS, {"event": json.dumps({"type": "weights_ready"})})  # no step
    weights_ready(client, 4)
    f.step()
    assert [c for c in admin.calls if c[0] == "receive"] == [("receive", 4)]


def test_a_server_that_cannot_be_asked_to_join_is_asked_again_alone(client):
    admin = RecordingAdmin(down={RecordingAdmin.urls[1]})  # restarting
    f = follower(client, admin)
    request_join(client, EVENTS)
    f.step()
    assert client.hget(names.WEIGHTS_STATE, "joined") is None  # not every server is in yet
    admin.down.clear()
    f.step()
    assert [c[4:] for c in admin.calls if c[0] == "join"] == [tuple(RecordingAdmin.urls), (RecordingAdmin.urls[1],)]
    assert client.hget(names.WEIGHTS_STATE, "joined") == client.hget(names.WEIGHTS_STATE, "join_request")


def test_a_server_down_during_an_update_fails_that_update_only(client):
    admin = RecordingAdmin()
    f = follower(client, admin)
    request_join(client, EVENTS)
    f.step()
    admin.down.add(RecordingAdmin.urls[0])
    weights_ready(client, 1)
    f.step()  # does not raise: the follower keeps running
    assert admin.calls[-2:] == [("pause",), ("resume",)]
    assert client.hget(names.WEIGHTS_STATE, "broadcasts_failed") == "1" and client.get(names.POLICY_VERSION) is None
