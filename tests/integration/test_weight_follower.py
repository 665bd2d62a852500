"""The weight follower's rules on a real Redis (the vLLM side is a recorder here; the real
servers are in test_fast_llm_receiver.py and the Fast-LLM e2e run): when it joins, which
`weights_ready` events it loads, the order of its vLLM calls, and what survives its restart."""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from rlrun.backends.fast_llm.follower import VllmBroadcastAdmin, WeightFollower, request_join, stream_id_after
from rlrun.config import compose
from rlrun.streams import names

pytestmark = pytest.mark.timeout(60)

EVENTS = "fast_llm_events"


class RecordingAdmin(VllmBroadcastAdmin):
    """The follower's real admin over httpx's mock transport: every vLLM route it calls, per server,
    in order (`pause`, `start_weight_update`, `update_weights`, `finish_weight_update:<label>`, ...);
    the loads numbered in `fail_loads` (1 = the first) answer 500; servers in `down` refuse."""

    urls = ["http://127.0.0.1:1", "http://127.0.0.1:2"]

    def __init__(self, fail_loads=(), down=()) -> None:
        super().__init__(self.urls, receive_timeout_s=5, api_key="k")
        self._client = httpx.Client(transport=httpx.MockTransport(self._handle))
        self.fail_loads, self.down = set(fail_loads), set(down)
        self.calls: dict[str, list[str]] = {url: [] for url in self.urls}
        self.loads = 0
        self._lock = threading.Lock()

    def _handle(self, request: httpx.Request) -> httpx.Response:
        server = f"http://{request.url.host}:{request.url.port}"
        if server in self.down:
            raise httpx.ConnectError("connection refused", request=request)
        route, body = request.url.path.lstrip("/"), json.loads(request.content) if request.content else {}
        with self._lock:
            if route == "init_weight_transfer_engine":
                info = body["init_info"]
                route += f":{info['host']}:{info['port']}:{info['backend']}:{info['rank']}/{info['world_size']}"
            elif route == "finish_weight_update":
                route += f":{body['weight_version']}"
            elif route == "update_weights" and server == self.urls[0]:
                self.loads += 1
            self.calls[server].append(route)
            if route == "update_weights" and self.loads in self.fail_loads:
                return httpx.Response(500, text="the broadcast broke")
        return httpx.Response(200, json={})

    def routes(self, server: int = 0) -> list[str]:
        return self.calls[self.urls[server]]


LOADED = ["pause", "start_weight_update", "update_weights"]  # + finish_weight_update:<step>, resume


def follower(client, admin) -> WeightFollower:
    cfg, _ = compose(["recipe=math_grpo", "trainer=fast_llm", "trainer.device=cpu"])
    return WeightFollower(cfg.trainer, client, admin, "127.0.0.1", 29555, model_dtype=cfg.model.dtype)


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
    for rank, server in enumerate(RecordingAdmin.urls, start=1):  # requests in flight kept (pause?mode=keep)
        assert admin.calls[server] == [
            f"init_weight_transfer_engine:127.0.0.1:29555:gloo:{rank}/3",
            *LOADED, "finish_weight_update:0", "resume",
            *LOADED, "finish_weight_update:1", "resume",
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
    assert [c for c in admin.routes() if c.startswith("finish")] == ["finish_weight_update:3"]
    assert client.get(names.POLICY_VERSION) == "3"


def test_a_failed_broadcast_keeps_the_served_version_and_generation_resumes(client):
    admin = RecordingAdmin(fail_loads={2})
    f = follower(client, admin)
    request_join(client, EVENTS)
    weights_ready(client, 1)
    weights_ready(client, 2)
    f.step()
    assert client.get(names.POLICY_VERSION) == "1"  # what vLLM still serves
    assert admin.routes()[-2:] == ["update_weights", "resume"]  # never left paused, the failed load not labelled
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
    assert second.routes() == [*LOADED, "finish_weight_update:2", "resume"]
    assert restarted.counters["broadcasts_loaded"] == 2  # counts go on across restarts

    request_join(client, EVENTS)  # the trainer is restarted: a new group to join
    restarted.step()
    assert second.routes()[-1].startswith("init_weight_transfer_engine")


def test_malformed_events_are_passed_over(client):
    admin = RecordingAdmin()
    f = follower(client, admin)
    request_join(client, EVENTS)
    client.xadd(EVENTS, {"event": "{not json"})
    client.xadd(EVENTS, {"event": json.dumps({"type": "weights_ready"})})  # no step
    weights_ready(client, 4)
    f.step()
    assert [c for c in admin.routes() if c.startswith("finish")] == ["finish_weight_update:4"]


def test_a_server_that_cannot_be_asked_to_join_is_asked_again_alone(client):
    admin = RecordingAdmin(down={RecordingAdmin.urls[1]})  # restarting
    f = follower(client, admin)
    request_join(client, EVENTS)
    f.step()
    assert client.hget(names.WEIGHTS_STATE, "joined") is None  # not every server is in yet
    admin.down.clear()
    f.step()
    joins = [[c for c in admin.routes(k) if c.startswith("init")] for k in (0, 1)]
    assert [len(j) for j in joins] == [1, 1]  # the first asked once, the second asked again alone
    assert client.hget(names.WEIGHTS_STATE, "joined") == client.hget(names.WEIGHTS_STATE, "join_request")


def test_a_server_down_during_an_update_fails_that_update_only(client):
    admin = RecordingAdmin()
    f = follower(client, admin)
    request_join(client, EVENTS)
    f.step()
    admin.down.add(RecordingAdmin.urls[0])
    weights_ready(client, 1)
    f.step()  # does not raise: the follower keeps running
    assert admin.routes(1)[-2:] == ["pause", "resume"]  # asked to receive nothing alone: resumed at once
    assert client.hget(names.WEIGHTS_STATE, "broadcasts_failed") == "1" and client.get(names.POLICY_VERSION) is None


def test_the_trainer_is_ready_at_a_weights_ready_newer_than_the_stream_held_at_its_start(server, client, tmp_path):
    """Told by the stream's own ids, never by our clock: a Redis whose clock is an hour ahead of
    ours (an external one) holds a gone trainer's weights_ready with an id "in our future"."""
    from rlrun.backends.fast_llm.backend import trainer_spec
    from rlrun.parts.role_parts import Endpoints, RedisProbe
    from rlrun.supervisor import EventLog

    cfg, _ = compose(["recipe=math_grpo", "trainer=fast_llm", "trainer.device=cpu"])
    stream = cfg.trainer.fast_llm.events_stream
    endpoints = Endpoints(server.url, server.port, ["http://127.0.0.1:2"], broadcast_port=3)
    spec = trainer_spec(cfg, server.run_dir, endpoints, "m", RedisProbe(server.url, server.run_dir), EventLog(None))
    seconds, _ = client.time()
    hour_ahead_ms = (seconds + 3600) * 1000
    ready = {"event": json.dumps({"type": "weights_ready", "step": 0, "documents_seen": 0})}
    client.xadd(stream, ready, id=f"{hour_ahead_ms}-*")  # the gone trainer's
    assert spec.ready(4242) is False
    client.xadd(stream, ready, id=f"{hour_ahead_ms + 1000}-*")  # this attempt's
    assert spec.ready(4242) is True
