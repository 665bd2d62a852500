"""trainer.weight_transfer=broadcast: the key's validation, its port and role file, and one weight
update of `BroadcastSync` over httpx's mock transport with a recording stand-in for the sender:
which servers (re)join the group, when it is formed again, that a failure publishes nothing
and resumes every paused server, and that a forming that never returns is a timeout. The real broadcast into vLLM: tests/integration/test_vllm_weight_updates.py."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
import torch

from rlrun.config import compose
from rlrun.errors import ConfigError
from rlrun.inference.admin import VllmAdmin
from rlrun.parts.role_file import read_role_file
from rlrun.run.built import build
from rlrun.run.plan import build_plan
from rlrun.rundir import RunDir
from rlrun.trainer import weight_broadcast
from rlrun.trainer.parallel import collective_backend
from rlrun.trainer.weight_broadcast import BroadcastSync, Membership, WeightSyncTimeout, needs_new_group

A, B, C = "http://127.0.0.1:8001", "http://127.0.0.1:8002", "http://127.0.0.1:8003"


# --- the pure rule ---------------------------------------------------------------------------
def test_a_group_is_formed_when_there_is_none():
    assert needs_new_group(None, [A, B], {A: "default", B: "default"})


def test_the_same_members_all_serving_the_groups_last_broadcast_keep_it():
    assert not needs_new_group(Membership((A, B), "7"), [A, B], {A: "7", B: "7"})
    assert not needs_new_group(Membership((A, B)), [A, B], {A: "default", B: "3"})  # formed, nothing sent yet


def test_a_restarted_member_serves_another_label_and_the_group_is_formed_again():
    assert needs_new_group(Membership((A, B), "7"), [A, B], {A: "7", B: "default"})  # a fresh server
    assert needs_new_group(Membership((A, B), "7"), [A, B], {A: "7", B: "5"})  # loaded weights/current of v5 at start


def test_a_member_down_or_a_server_back_changes_the_members():
    assert needs_new_group(Membership((A, B), "7"), [A], {A: "7"})
    assert needs_new_group(Membership((A,), "7"), [A, B], {A: "7", B: "default"})


def test_gloo_on_cpu_nccl_on_gpus():
    assert [collective_backend(d) for d in ("cpu", "cuda", "cuda:1", "mps")] == ["gloo", "nccl", "nccl", "gloo"]


# --- the key ---------------------------------------------------------------------------------
def test_disk_is_the_default_and_broadcast_a_choice():
    assert compose([])[0].trainer.weight_transfer == "disk"
    assert compose(["trainer.weight_transfer=broadcast"])[0].trainer.weight_transfer == "broadcast"


def test_fast_llm_has_its_own_broadcast():
    with pytest.raises(ConfigError, match=r"trainer.weight_transfer=broadcast is the hf trainer.s choice: trainer=fast_llm always broadcasts"):
        compose(["trainer=fast_llm", "trainer.device=cpu", "trainer.weight_transfer=broadcast"])


def test_a_server_split_over_workers_cannot_join_as_one_rank():
    with pytest.raises(ConfigError, match="one vLLM worker per server.*trainer.weight_transfer=disk"):
        compose(["trainer.weight_transfer=broadcast", "inference.extra_args=[--tensor-parallel-size,2]"])


def test_broadcast_gets_a_port_on_the_inference_host_and_the_trainer_is_told(tmp_path):
    cfg, _ = compose(["trainer.weight_transfer=broadcast", "trainer.nproc_per_node=2", "trainer.gradient_accumulation_passes=2"])
    built = build(cfg)
    assert built.backend.broadcast_port(lambda host: 40123 if host == cfg.inference.host else 0) == 40123
    disk, _ = compose([])
    assert build(disk).backend.broadcast_port(lambda host: 40123) == 0
    run = RunDir(tmp_path)
    run.root.mkdir(exist_ok=True)
    run.config.write_text(json.dumps({"trainer": {"weight_transfer": "broadcast"}}))
    trainer = next(spec for spec in build_plan(built, run, preview=True).specs if spec.name == "trainer")
    trainer.before_start()
    role = read_role_file(run.role_file("trainer"))
    assert role.broadcast_host == "127.0.0.1" and role.broadcast_port == 0  # --dry-run: a placeholder port


# --- one update over the mock transport ------------------------------------------------------
class Servers:
    """Three vLLM servers behind httpx's mock transport, speaking vLLM's RL routes: each remembers
    the rank it was asked to join as and the weight version label it serves, and records the calls."""

    def __init__(self) -> None:
        self.label: dict[str, str] = {A: "default", B: "default", C: "default"}
        self.rank: dict[str, str | None] = {A: None, B: None, C: None}
        self.down: set[str] = set()
        self.fail_receive: set[str] = set()
        self.calls: list[tuple[str, str]] = []
        self.namespaces: list[tuple[str, str]] = []  # (server, the namespace it was asked to join under)

    def handle(self, request: httpx.Request) -> httpx.Response:
        server = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        if server in self.down:
            raise httpx.ConnectError("connection refused", request=request)
        path = request.url.path.lstrip("/")
        body = json.loads(request.content) if request.content else {}
        if path == "weight_info":
            self.calls.append((server, path))
            return httpx.Response(200, json={"weight_version": self.label[server]})
        if path == "init_weight_transfer_engine":
            info = body["init_info"]
            self.rank[server] = f"{info['rank']}/{info['world_size']}"
            self.namespaces.append((server, info["namespace"]))
            path += f":{self.rank[server]}"
        elif path == "update_weights" and server in self.fail_receive:
            self.calls.append((server, path))
            return httpx.Response(500, text="the group broke")
        elif path == "finish_weight_update":
            self.label[server] = body["weight_version"]
            path += f":{body['weight_version']}"
        self.calls.append((server, path))
        return httpx.Response(200, json={})

    def restart(self, server: str) -> None:
        self.label[server], self.rank[server] = "default", None

    def of(self, server: str) -> list[str]:
        return [call for who, call in self.calls if who == server]


class FakeSender:
    """Records what rank 0 would do: form a group of `receivers`, send state dicts."""

    formed: list[int] = []

    def __init__(self, host, port, receivers, transport="gloo", timeout_s=60.0, namespace="", store=None) -> None:
        assert store is not None  # every formation on the one store BroadcastSync serves
        FakeSender.formed.append(receivers)
        self.namespace = namespace
        self.sent: list[dict] = []
        self.activity = weight_broadcast.Activity()  # what the watchdog reads while a send takes long

    def send(self, weights) -> int:
        self.sent.append(weights)
        return sum(t.numel() * t.element_size() for t in weights.values())


@pytest.fixture
def sync(monkeypatch):
    servers = Servers()
    FakeSender.formed = []
    monkeypatch.setattr(weight_broadcast, "WeightBroadcaster", FakeSender)
    monkeypatch.setattr(weight_broadcast, "serve_store", lambda *args: object())
    admin = VllmAdmin([A, B, C], api_key="k", transport=httpx.MockTransport(servers.handle))
    sync = BroadcastSync(admin, "127.0.0.1", 40123)
    yield sync, servers
    sync.close()


WEIGHTS = {"w": torch.ones(4)}


def test_the_first_update_forms_the_group_and_each_server_receives_between_pause_and_resume(sync):
    sync, servers = sync
    published = []
    assert sync.update(WEIGHTS, 1, lambda: published.append(list(servers.calls))) == []
    assert FakeSender.formed == [3] and sync.sender.sent == [WEIGHTS]
    for rank, server in enumerate((A, B, C), start=1):
        assert servers.of(server) == ["pause", "weight_info", f"init_weight_transfer_engine:{rank}/4",
                                      "start_weight_update", "update_weights", "finish_weight_update:1", "resume"]  # fmt: skip
    assert [c for _, c in published[0]].count("resume") == 0  # published before any resume
    assert sync.membership.servers == (A, B, C) and sync.membership.label == "1"


def test_an_unchanged_group_is_reused(sync):
    sync, servers = sync
    sync.update(WEIGHTS, 1, lambda: None)
    sync.update(WEIGHTS, 2, lambda: None)
    assert FakeSender.formed == [3] and len(sync.sender.sent) == 2
    assert servers.of(A).count("init_weight_transfer_engine:1/4") == 1 and servers.label[A] == "2"


def test_a_server_down_is_left_out_and_the_group_formed_with_those_that_answer(sync):
    sync, servers = sync
    sync.update(WEIGHTS, 1, lambda: None)
    servers.down = {B}
    assert sync.update(WEIGHTS, 2, lambda: None) == [B]
    assert FakeSender.formed == [3, 2] and sync.membership.servers == (A, C)
    assert servers.of(C)[-6:] == ["weight_info", "init_weight_transfer_engine:2/3", "start_weight_update", "update_weights",
                                  "finish_weight_update:2", "resume"]  # fmt: skip


def test_a_restarted_server_is_back_in_a_new_group_and_gets_the_newest_weights(sync):
    sync, servers = sync
    sync.update(WEIGHTS, 1, lambda: None)
    servers.restart(B)  # a fresh process: in no group, serving weights labelled "default"
    newest = {"w": torch.full((4,), 2.0)}
    assert sync.update(newest, 2, lambda: None) == []
    assert FakeSender.formed == [3, 3] and sync.sender.sent == [newest]
    assert servers.of(B)[-5:] == ["init_weight_transfer_engine:2/4", "start_weight_update", "update_weights",
                                  "finish_weight_update:2", "resume"]  # fmt: skip
    assert servers.label == {A: "2", B: "2", C: "2"}
    # Each formation its own keys: none reads what B's killed process wrote in the first one.
    assert [ns for _, ns in servers.namespaces] == ["formation-1/"] * 3 + ["formation-2/"] * 3
    assert sync.sender.namespace == "formation-2/"


def test_a_failed_receive_publishes_nothing_resumes_everyone_and_the_next_update_forms_again(sync):
    sync, servers = sync
    sync.update(WEIGHTS, 1, lambda: None)
    servers.fail_receive = {C}
    published = []
    with pytest.raises(RuntimeError, match="weight broadcast of v2 .* failed"):
        sync.update(WEIGHTS, 2, lambda: published.append(True))
    assert published == [] and sync.membership is None
    assert all(servers.of(s)[-1] == "resume" for s in (A, B, C))
    assert servers.label[C] == "1"  # the failed server is not labelled with a version it did not load
    servers.fail_receive = set()
    sync.update(WEIGHTS, 2, lambda: published.append(True))
    assert published == [True] and FakeSender.formed == [3, 3]


class HangsForming(FakeSender):
    """A sender whose forming never returns and never raises: NCCL's blocking communicator init
    waits for a member that will not come, with no timeout of its own."""

    def __init__(self, *args, **kwargs) -> None:
        threading.Event().wait()


def test_forming_that_never_returns_is_a_weight_sync_timeout_all_the_same(sync, monkeypatch):
    sync, servers = sync
    monkeypatch.setattr(weight_broadcast, "WeightBroadcaster", HangsForming)
    sync.timeout_s = 0.5
    started = time.monotonic()
    with pytest.raises(WeightSyncTimeout, match=r"policy version 1 .* forming the group did not complete in 0.5 s"):
        sync.update(WEIGHTS, 1, lambda: pytest.fail("published a stuck update"))
    assert time.monotonic() - started < 5  # the watchdog, about once a second
    assert all(servers.of(s)[-1] == "resume" for s in (A, B, C))  # no server left paused


def test_no_server_answering_is_an_error_the_trainer_retries(sync):
    sync, servers = sync
    servers.down = {A, B, C}
    with pytest.raises(httpx.ConnectError, match="no vLLM server answers"):
        sync.update(WEIGHTS, 1, lambda: pytest.fail("published with no server"))
    assert FakeSender.formed == []


def test_a_broadcasting_trainer_writes_a_folder_for_cold_starts_only_when_one_is_due():
    from rlrun.trainer.weight_broadcast import disk_copy_due

    assert not disk_copy_due(3, 5, 20, [])
    assert disk_copy_due(3, 5, 20, [B])  # B is restarting: it loads weights/current at its start
    assert disk_copy_due(5, 5, 20, []) and disk_copy_due(10, 5, 20, [])  # every checkpoint
    assert disk_copy_due(20, 7, 20, [])  # the last step (its checkpoint)
