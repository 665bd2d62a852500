"""trainer.weight_transfer=broadcast: the key's validation, its port and role file, and one weight
update of `BroadcastSync` over httpx's mock transport with a recording stand-in for the sender:
which servers (re)join the group, when it is formed again, and that a failure publishes nothing
and resumes every paused server. The real broadcast into vLLM: tests/integration/test_vllm_weight_updates.py."""

from __future__ import annotations

import json

import httpx
import pytest
import torch

from rlrun.backends import backend_for
from rlrun.config import compose
from rlrun.errors import ConfigError
from rlrun.inference.admin import VllmAdmin
from rlrun.launch import plan_specs
from rlrun.role_file import read_role_file
from rlrun.rundir import RunDir
from rlrun.trainer import weight_broadcast
from rlrun.trainer.parallel import collective_backend
from rlrun.trainer.weight_broadcast import BroadcastSync, Membership, needs_new_group

A, B, C = "http://127.0.0.1:8001", "http://127.0.0.1:8002", "http://127.0.0.1:8003"


# --- the pure rule ---------------------------------------------------------------------------
def test_a_group_is_formed_when_there_is_none():
    assert needs_new_group(None, [A, B], {A: None, B: None})


def test_the_same_members_all_reporting_the_group_keep_it():
    assert not needs_new_group(Membership("g1", (A, B)), [A, B], {A: "g1", B: "g1"})


def test_a_restarted_member_reports_no_group_and_the_group_is_formed_again():
    assert needs_new_group(Membership("g1", (A, B)), [A, B], {A: "g1", B: None})
    assert needs_new_group(Membership("g1", (A, B)), [A, B], {A: "g1", B: "g0"})  # an older trainer's group


def test_a_member_down_or_a_server_back_changes_the_members():
    assert needs_new_group(Membership("g1", (A, B)), [A], {A: "g1"})
    assert needs_new_group(Membership("g1", (A,)), [A, B], {A: "g1", B: None})


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
    assert backend_for(cfg).broadcast_port(cfg, lambda host: 40123 if host == cfg.inference.host else 0) == 40123
    disk, _ = compose([])
    assert backend_for(disk).broadcast_port(disk, lambda host: 40123) == 0
    run = RunDir(tmp_path)
    run.root.mkdir(exist_ok=True)
    run.config.write_text(json.dumps({"trainer": {"weight_transfer": "broadcast"}}))
    trainer = next(spec for spec in plan_specs(cfg, run) if spec.name == "trainer")
    trainer.before_start()
    role = read_role_file(run.role_file("trainer"))
    assert role.broadcast_host == "127.0.0.1" and role.broadcast_port == 0  # --dry-run: a placeholder port


# --- one update over the mock transport ------------------------------------------------------
class Servers:
    """Three vLLM servers behind httpx's mock transport: each remembers the group it joined
    (`rlrun_broadcast_group`), and records the calls it gets."""

    def __init__(self) -> None:
        self.group: dict[str, str | None] = {A: None, B: None, C: None}
        self.down: set[str] = set()
        self.fail_receive: set[str] = set()
        self.calls: list[tuple[str, str]] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        server = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        if server in self.down:
            raise httpx.ConnectError("connection refused", request=request)
        path = request.url.path.lstrip("/")
        if path == "collective_rpc":
            body = json.loads(request.content)
            path = body["method"]
            if path == "rlrun_join_broadcast":
                self.group[server] = body["kwargs"]["group_id"]
                path += f":{body['kwargs']['rank']}/{body['kwargs']['world_size']}"
            elif path == "rlrun_receive_broadcast" and server in self.fail_receive:
                self.calls.append((server, path))
                return httpx.Response(500, text="the group broke")
            result = {"group_id": self.group[server]} if path == "rlrun_broadcast_group" else {"ok": True}
            self.calls.append((server, path))
            return httpx.Response(200, json={"results": [result]})
        self.calls.append((server, path))
        return httpx.Response(200, json={})

    def of(self, server: str) -> list[str]:
        return [call for who, call in self.calls if who == server]


class FakeSender:
    """Records what rank 0 would do: form a group of `receivers`, send state dicts."""

    formed: list[int] = []

    def __init__(self, host, port, receivers, transport="gloo", timeout_s=60.0) -> None:
        FakeSender.formed.append(receivers)
        self.sent: list[dict] = []

    def send(self, weights) -> int:
        self.sent.append(weights)
        return sum(t.numel() * t.element_size() for t in weights.values())


@pytest.fixture
def sync(monkeypatch):
    servers = Servers()
    FakeSender.formed = []
    monkeypatch.setattr(weight_broadcast, "WeightBroadcaster", FakeSender)
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
        assert servers.of(server) == ["pause", "rlrun_broadcast_group", f"rlrun_join_broadcast:{rank}/4",
                                      "rlrun_receive_broadcast", "reset_prefix_cache", "resume"]  # fmt: skip
    assert [c for _, c in published[0]].count("resume") == 0  # published before any resume
    assert sync.membership.servers == (A, B, C)


def test_an_unchanged_group_is_reused_and_every_broadcast_has_its_own_event(sync):
    sync, servers = sync
    sync.update(WEIGHTS, 1, lambda: None)
    sync.update(WEIGHTS, 2, lambda: None)
    assert FakeSender.formed == [3] and len(sync.sender.sent) == 2
    assert servers.of(A).count("rlrun_join_broadcast:1/4") == 1


def test_a_server_down_is_left_out_and_the_group_formed_with_those_that_answer(sync):
    sync, servers = sync
    sync.update(WEIGHTS, 1, lambda: None)
    servers.down = {B}
    assert sync.update(WEIGHTS, 2, lambda: None) == [B]
    assert FakeSender.formed == [3, 2] and sync.membership.servers == (A, C)
    assert servers.of(C)[-5:] == ["rlrun_broadcast_group", "rlrun_join_broadcast:2/3", "rlrun_receive_broadcast",
                                  "reset_prefix_cache", "resume"]  # fmt: skip


def test_a_restarted_server_is_back_in_a_new_group_and_gets_the_newest_weights(sync):
    sync, servers = sync
    sync.update(WEIGHTS, 1, lambda: None)
    servers.group[B] = None  # B restarted: a fresh process never asked to join
    newest = {"w": torch.full((4,), 2.0)}
    assert sync.update(newest, 2, lambda: None) == []
    assert FakeSender.formed == [3, 3] and sync.sender.sent == [newest]
    assert servers.of(B)[-4:] == ["rlrun_join_broadcast:2/4", "rlrun_receive_broadcast", "reset_prefix_cache", "resume"]
    assert len({servers.group[s] for s in (A, B, C)}) == 1  # all three in the new group


def test_a_failed_receive_publishes_nothing_resumes_everyone_and_the_next_update_forms_again(sync):
    sync, servers = sync
    sync.update(WEIGHTS, 1, lambda: None)
    servers.fail_receive = {C}
    published = []
    with pytest.raises(RuntimeError, match="weight broadcast of v2 .* failed"):
        sync.update(WEIGHTS, 2, lambda: published.append(True))
    assert published == [] and sync.membership is None
    assert all(servers.of(s)[-1] == "resume" for s in (A, B, C))
    assert not any(call == "reset_prefix_cache" for call in servers.of(A)[-3:])
    servers.fail_receive = set()
    sync.update(WEIGHTS, 2, lambda: published.append(True))
    assert published == [True] and FakeSender.formed == [3, 3]


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
