"""Fast-LLM's weight broadcast over a real gloo group on 127.0.0.1: the stand-in's rank 0
(tests/fast_llm_standin.py, written from Fast-LLM's sources) sends, rlrun's receiver
(rlrun/weights/broadcast.py, what each vLLM worker runs) receives."""

from __future__ import annotations

import multiprocessing
import subprocess
import threading

import pytest
import torch

from rlrun.weights import broadcast
from rlrun.streams.server import pick_free_port
from tests.fast_llm_standin import Broadcaster, weights_at
from tests.processes import report_from_child, report_to_parent

pytestmark = pytest.mark.timeout(120)

HOST = "127.0.0.1"
PRETRAINED = {
    "model.embed_tokens.weight": torch.randn(37, 16, generator=torch.Generator().manual_seed(1)),
    "model.layers.0.self_attn.q_proj.weight": torch.randn(16, 16, generator=torch.Generator().manual_seed(2)),
    "model.norm.weight": torch.ones(16),
    "model.layers.0.mlp.up_proj.weight": torch.randn(8, 16, generator=torch.Generator().manual_seed(3)).bfloat16(),
    "lm_head.weight": torch.randn(37, 16, generator=torch.Generator().manual_seed(4)).half(),
}


def in_thread(fn):
    """Run `fn` in a thread; the returned `result()` joins it and re-raises what it raised."""
    outcome: dict = {}

    def target():
        try:
            outcome["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()

    def result():
        thread.join(60)
        assert not thread.is_alive(), "the thread is still blocked"
        if "error" in outcome:
            raise outcome["error"]
        return outcome.get("value")

    return result


def _receiver(port: int, rank: int, world_size: int, broadcasts: int, results) -> None:
    """A receiving rank in its own process (each rank of a TCP-store group needs one): join, then
    receive `broadcasts` broadcasts and put each (or the error met) on `results`."""
    try:
        member = broadcast.join(HOST, port, rank, world_size, "gloo", 30)
        for _ in range(broadcasts):
            report_to_parent(results, (rank, [(shard, name, t) for shard, name, t in broadcast.receive_weights(member)]))
    except Exception as exc:  # noqa: BLE001 - reported to the test
        report_to_parent(results, (rank, f"{type(exc).__name__}: {exc}"))


class Group:
    """The stand-in's rank 0 here, rlrun's receivers in child processes."""

    def __init__(self, receivers: int, broadcasts: int = 1) -> None:
        ctx = multiprocessing.get_context("spawn")
        port = pick_free_port(HOST)
        self.results = ctx.Queue()
        self.children = [ctx.Process(target=_receiver, args=(port, r, receivers + 1, broadcasts, self.results), daemon=True)
                         for r in range(1, receivers + 1)]  # fmt: skip
        for child in self.children:
            child.start()
        self.sender = Broadcaster(HOST, port, receivers, "gloo", timeout=60)  # blocks until all have joined

    def received(self) -> dict:
        """One broadcast's outcome per rank (a list of tensors, or the error's text)."""
        return dict(report_from_child(self.results) for _ in self.children)

    def close(self) -> None:
        for child in self.children:
            child.join(10)
            if child.is_alive():
                child.kill()


@pytest.fixture
def group_of():
    made = []

    def make(receivers: int, broadcasts: int = 1) -> Group:
        made.append(Group(receivers, broadcasts))
        return made[-1]

    yield make
    for group in made:
        group.close()


def test_every_receiver_gets_each_tensor_bit_for_bit_in_order(group_of):
    group = group_of(2)
    sent = weights_at(PRETRAINED, 3)
    group.sender.send(sent)
    outcomes = group.received()
    assert sorted(outcomes) == [1, 2]
    for received in outcomes.values():
        assert [(shard, name) for shard, name, _ in received] == [("weights", name) for name in sent]
        for _, name, tensor in received:
            assert tensor.dtype == sent[name].dtype and tensor.shape == sent[name].shape
            assert torch.equal(tensor, sent[name])


def test_consecutive_broadcasts_are_told_apart_by_their_end_marker(group_of):
    group = group_of(1, broadcasts=2)
    for step in (1, 2):
        group.sender.send(weights_at(PRETRAINED, step))
        (received,) = group.received().values()
        assert {name: t for _, name, t in received}.keys() == PRETRAINED.keys()
        assert torch.equal(dict((n, t) for _, n, t in received)["lm_head.weight"], weights_at(PRETRAINED, step)["lm_head.weight"])
    assert not torch.equal(weights_at(PRETRAINED, 1)["lm_head.weight"], weights_at(PRETRAINED, 2)["lm_head.weight"])


def test_a_header_naming_anything_but_a_size_or_dtype_is_refused(group_of):
    group = group_of(1)
    group.sender._broadcast_object(("weights", "x", torch.Size([1]), subprocess.Popen))  # a class, from the network
    (error,) = group.received().values()
    assert error.startswith("UnpicklingError") and "subprocess.Popen" in error


@pytest.mark.parametrize("header", [("weights", "x", torch.Size([2])), ("weights", 3, torch.Size([2]), torch.float32),
                                    ("weights", "x", torch.Size([2]), "float32"), "weights"])  # fmt: skip
def test_a_malformed_header_is_an_error_that_names_it(group_of, header):
    group = group_of(1)
    group.sender._broadcast_object(header)
    (error,) = group.received().values()
    assert error.startswith("ValueError") and "header" in error


def test_a_receiver_whose_trainer_never_comes_gives_up_after_its_timeout():
    with pytest.raises(torch.distributed.DistError, match="(?i)timed? ?out|connect"):  # DistNetworkError or DistStoreError
        broadcast.join(HOST, pick_free_port(HOST), 1, 2, "gloo", timeout_s=2)


def test_a_rank_outside_the_receivers_range_is_refused():
    with pytest.raises(ValueError, match="1..1"):
        broadcast.join(HOST, 1, 0, 2, "gloo", timeout_s=1)


SENDER_UNDER_TORCHRUN = """
import sys, torch
sys.path.insert(0, {root!r})
from tests.fast_llm_standin import Broadcaster
Broadcaster("127.0.0.1", {port}, 1, "gloo", timeout=60).send({{"w": torch.arange(6.0).reshape(2, 3)}})
"""


def test_under_torchrun_on_this_torch_rlrun_serves_the_store_and_the_weights_arrive(tmp_path):
    """torch 2.13 under torchrun makes rank 0 a client of the broadcast endpoint (it assumes the
    elastic agent serves it): the probe says so, rlrun serves the store, the weights arrive."""
    import os
    import sys
    from pathlib import Path

    from rlrun.backends.fast_llm.installed import _probe_store

    if torch.__version__ >= "2.14":
        pytest.skip(f"torch {torch.__version__} lets rank 0 host under torchrun; this is the <= 2.13 case")
    assert _probe_store(sys.executable) == "rlrun"
    port = pick_free_port(HOST)
    store = broadcast.serve_store(HOST, port, 2, timeout_s=60)
    results = multiprocessing.get_context("spawn").Queue()
    receiver = multiprocessing.get_context("spawn").Process(target=_receiver, args=(port, 1, 2, 1, results), daemon=True)
    receiver.start()
    torchrun = Path(sys.executable).parent / "torchrun"
    root = str(Path(__file__).resolve().parents[2])
    code = SENDER_UNDER_TORCHRUN.format(root=root, port=port)
    sender = subprocess.Popen([str(torchrun), "--nproc_per_node=1", "--no_python", sys.executable, "-c", code],
                              stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": root})  # fmt: skip
    rank, received = report_from_child(results, 90)
    _, err = sender.communicate(timeout=60)
    assert sender.returncode == 0, err[-2000:]
    receiver.join(10)
    assert rank == 1 and [(shard, name) for shard, name, _ in received] == [("weights", "w")]
    assert torch.equal(received[0][2], torch.arange(6.0).reshape(2, 3))
    del store
