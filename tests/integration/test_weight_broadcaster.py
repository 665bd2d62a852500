"""The hf trainer's weight sender (rlrun/trainer/weight_broadcast.py) against the receiver every
vLLM worker runs (rlrun/weights/broadcast.py), over gloo on 127.0.0.1: what two
receivers get is, tensor for tensor, what was sent, twice in a row over one group; a group
formed again on the same store after a member was killed; and an update to a member that stopped
taking part (joined and never receives, or never joined) failed at trainer.weight_sync_timeout_s,
naming the update, instead of waiting on it."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time

import pytest
import torch

from rlrun.weights import broadcast
from rlrun.streams.server import pick_free_port
from rlrun.trainer.weight_broadcast import BroadcastSync, WeightBroadcaster, WeightSyncTimeout
from tests.processes import listening_sockets, off_loopback, report_from_child, report_to_parent

pytestmark = pytest.mark.timeout(120)

HOST = "127.0.0.1"


def weights(step: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return {
        "model.embed_tokens.weight": torch.randn(37, 16, generator=g),
        "model.layers.0.mlp.up_proj.weight": torch.randn(8, 16, generator=g).bfloat16(),
        "model.norm.weight": torch.ones(16) * step,
        "lm_head.weight": torch.randn(37, 16, generator=g).half(),
    }


def _receiver(port: int, rank: int, world_size: int, results, namespace: str = "", broadcasts: int = 2, delay_s: float = 0) -> None:
    try:
        time.sleep(delay_s)
        member = broadcast.join(HOST, port, rank, world_size, "gloo", 30, namespace=namespace)
        for _ in range(broadcasts):
            report_to_parent(results, (rank, {name: t for shard, name, t in broadcast.receive_weights(member) if shard == broadcast.WEIGHTS_SHARD}))
    except Exception as exc:  # noqa: BLE001 - reported to the test
        report_to_parent(results, (rank, f"{type(exc).__name__}: {exc}"))


def test_receivers_get_exactly_what_the_trainer_sends():
    ctx = multiprocessing.get_context("spawn")
    port = pick_free_port(HOST)
    results = ctx.Queue()
    children = [ctx.Process(target=_receiver, args=(port, r, 3, results), daemon=True) for r in (1, 2)]
    for child in children:
        child.start()
    sender = WeightBroadcaster(HOST, port, receivers=2, timeout_s=60)
    # The store (torch's own would listen on "::") and every gloo pair, on loopback only.
    sockets = listening_sockets([os.getpid(), *(child.pid for child in children)])
    assert (HOST, port) in sockets and off_loopback(sockets) == {}, sockets
    for step in (1, 2):
        sent = sender.send(weights(step))
        assert sent == sum(t.numel() * t.element_size() for t in weights(step).values())
        got = dict(report_from_child(results) for _ in children)
        for rank in (1, 2):
            assert not isinstance(got[rank], str), got[rank]
            assert list(got[rank]) == list(weights(step))
            for name, tensor in weights(step).items():
                assert got[rank][name].dtype == tensor.dtype and torch.equal(got[rank][name], tensor), (rank, name)
    for child in children:
        child.join(30)
        assert child.exitcode == 0


def test_a_group_formed_again_after_a_member_was_killed_does_not_read_its_keys():
    """What the hf trainer does when a vLLM server restarts: a new formation on the same store
    (torch shares one store server per port and process). The killed member's address is still
    in the store; the new member joins after rank 0 is already waiting: under the formation's
    own namespace rank 0 waits for it instead of dialling the dead one (a connect timeout).
    Whether the stale address is dialled depends on which side of the pair connects, so three
    formations follow the first: without namespaces about 4 in 5 of them time out."""
    ctx = multiprocessing.get_context("spawn")
    port = pick_free_port(HOST)
    store = broadcast.serve_store(HOST, port, 2, timeout_s=60)
    senders = []  # every earlier formation's sender stays referenced, as in a trainer that holds one
    for formation in range(1, 5):
        namespace = f"formation-{formation}/"
        results = ctx.Queue()  # one per member: a member killed while it still held a queue's write lock would block the next
        member = ctx.Process(target=_receiver, args=(port, 1, 2, results, namespace, 1, 0 if formation == 1 else 1.5), daemon=True)
        member.start()
        senders.append(WeightBroadcaster(HOST, port, receivers=1, timeout_s=30, namespace=namespace, store=store))
        senders[-1].send(weights(formation))
        _, got = report_from_child(results)
        assert not isinstance(got, str), f"formation {formation}: {got}"
        assert all(torch.equal(got[name], tensor) for name, tensor in weights(formation).items()), formation
        member.kill()  # after its broadcast: its address stays in the store
        member.join(30)


def test_torchs_own_store_listens_everywhere_and_lets_any_client_list_its_keys_ours_listens_on_the_host_only():
    """What rlrun/listen.py is for, measured on the installed torch: its TCPStore server
    ignores the host it is given, and a client that reaches it reads every key (so a key prefix is
    no secret); the store rlrun serves takes the same clients on loopback alone."""
    import datetime

    import torch.distributed as dist

    from rlrun.listen import serve_store

    theirs = dist.TCPStore(HOST, 0, 2, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=10))
    ours = serve_store(HOST, 0, 2, timeout_s=10)
    sockets = listening_sockets([os.getpid()])
    assert {ip for ip, port in sockets if port == theirs.port} <= {"::", "0.0.0.0"}  # every interface
    assert {ip for ip, port in sockets if port == ours.port} == {HOST}
    ours.set("run-1234/formation-1/key", "value")
    client = dist.TCPStore(HOST, ours.port, 2, is_master=False, timeout=datetime.timedelta(seconds=10))
    assert "run-1234/formation-1/key" in client.list_keys() and client.get("run-1234/formation-1/key") == b"value"


class StuckServer:
    """Stands in for VllmAdmin in front of one vLLM server whose weight-transfer engine joins the
    group in a thread (as vLLM's does) and then never receives: a hung server; `joins=False`: one
    whose join never happens."""

    URL = "http://127.0.0.1:1"

    def __init__(self, joins: bool) -> None:
        self.joins, self.members = joins, []

    def update(self, load, publish):  # VllmAdmin.update without the pause and resume
        down = load([self.URL])
        publish()
        return down

    def weight_version(self, url):
        return "default"

    def join_broadcast(self, url, host, port, rank, world_size, backend, timeout_s, namespace=""):
        if self.joins:
            join = lambda: self.members.append(broadcast.join(host, port, rank, world_size, backend, 30, namespace=namespace))  # noqa: E731
            threading.Thread(target=join, daemon=True).start()

    def load(self, url, update_info, version, timeout_s=None):
        threading.Event().wait(timeout_s)  # its /update_weights: a server that never receives never answers


@pytest.mark.parametrize("joins", [True, False], ids=["joined-never-receives", "never-joins"])
def test_an_update_to_a_member_that_stopped_taking_part_fails_at_the_timeout_naming_the_update(joins):
    server = StuckServer(joins)
    sync = BroadcastSync(server, HOST, pick_free_port(HOST), "gloo", timeout_s=2.0, prefix="run-x/")
    published, beats = [], []
    started = time.monotonic()
    with pytest.raises(WeightSyncTimeout) as failed:
        sync.update(weights(3), 3, lambda: published.append(3), lambda: beats.append(time.monotonic()))
    took = time.monotonic() - started
    assert 1.9 <= took < 8, took  # the timeout, not forever (nor the receivers' own 30 s)
    message = str(failed.value)
    assert f"the weight update to policy version 3 ({StuckServer.URL}) is stuck" in message, message
    assert "trainer.weight_sync_timeout_s=2" in message and "did not complete in 2 s" in message, message
    stuck_at = "sending model.embed_tokens.weight (1 of 4 tensors)" if joins else "forming the group"
    assert stuck_at in message, message
    assert published == [] and sync.membership is None and sync.sender is None  # nothing published, the group dropped
    assert beats  # the trainer's heartbeat went on meanwhile
    assert len(server.members) == (1 if joins else 0)
