"""The hf trainer's weight sender (rlrun/trainer/weight_broadcast.py) against the receiver every
vLLM worker runs (rlrun/backends/fast_llm/broadcast.py), over gloo on 127.0.0.1: what two
receivers get is, tensor for tensor, what was sent, twice in a row over one group."""

from __future__ import annotations

import multiprocessing

import pytest
import torch

from rlrun.backends.fast_llm import broadcast
from rlrun.streams.server import pick_free_port
from rlrun.trainer.weight_broadcast import WeightBroadcaster

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


def _receiver(port: int, rank: int, world_size: int, results) -> None:
    try:
        member = broadcast.join(HOST, port, rank, world_size, "gloo", 30)
        for _ in range(2):
            results.put((rank, {name: t for shard, name, t in broadcast.receive_weights(member) if shard == broadcast.WEIGHTS_SHARD}))
    except Exception as exc:  # noqa: BLE001 - reported to the test
        results.put((rank, f"{type(exc).__name__}: {exc}"))


def test_receivers_get_exactly_what_the_trainer_sends():
    ctx = multiprocessing.get_context("spawn")
    port = pick_free_port(HOST)
    results = ctx.Queue()
    children = [ctx.Process(target=_receiver, args=(port, r, 3, results), daemon=True) for r in (1, 2)]
    for child in children:
        child.start()
    sender = WeightBroadcaster(HOST, port, receivers=2, timeout_s=60)
    for step in (1, 2):
        sent = sender.send(weights(step))
        assert sent == sum(t.numel() * t.element_size() for t in weights(step).values())
        got = dict(results.get(timeout=60) for _ in children)
        for rank in (1, 2):
            assert not isinstance(got[rank], str), got[rank]
            assert list(got[rank]) == list(weights(step))
            for name, tensor in weights(step).items():
                assert got[rank][name].dtype == tensor.dtype and torch.equal(got[rank][name], tensor), (rank, name)
    for child in children:
        child.join(30)
        assert child.exitcode == 0
