"""The trainer's AdamW (rlrun/trainer/loop.py `adamw`): fused where torch has the kernel, with the
steps of torch's default AdamW; torch's default where it has none; and still fused after loading
an optimizer state written by an AdamW that was not (a checkpoint from before)."""

from __future__ import annotations

import copy

import torch

from rlrun.config.schema import TrainerConfig
from rlrun.trainer.loop import adamw, keep_kernel

T = TrainerConfig(lr=1e-2, betas=[0.9, 0.99], weight_decay=0.1)


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def steps(net: torch.nn.Module, optimizer, n: int) -> None:
    g = torch.Generator().manual_seed(1)
    for _ in range(n):
        optimizer.zero_grad()
        net(torch.randn(5, 8, generator=g)).square().mean().backward()
        optimizer.step()


def plain(net: torch.nn.Module):
    return torch.optim.AdamW(net.parameters(), lr=T.lr, betas=tuple(T.betas), weight_decay=T.weight_decay)


def test_on_cpu_it_is_fused_and_takes_the_default_adamws_steps():
    fused_net, plain_net = model(), model()
    optimizer = adamw(fused_net.parameters(), T)
    assert optimizer.defaults["fused"] is True and optimizer.defaults["lr"] == 1e-2 and optimizer.defaults["weight_decay"] == 0.1
    steps(fused_net, optimizer, 5)
    steps(plain_net, plain(plain_net), 5)
    moved = max((p - q).abs().max().item() for p, q in zip(plain_net.parameters(), model().parameters()))
    worst = max((p - q).abs().max().item() for p, q in zip(fused_net.parameters(), plain_net.parameters()))
    assert moved > 1e-2 and worst < 1e-6, (moved, worst)  # five steps of lr 1e-2 move weights ~4 orders more


def test_where_torch_has_no_fused_kernel_it_is_the_default():
    on_meta = [torch.nn.Parameter(torch.empty(3, device="meta"))]  # a device without the fused kernel
    optimizer = adamw(on_meta, T)
    assert not optimizer.defaults["fused"] and optimizer.param_groups[0]["params"] == on_meta
    complex_net = torch.nn.Linear(2, 2, dtype=torch.complex64)  # no fused kernel for complex parameters
    optimizer = adamw(complex_net.parameters(), T)
    assert not optimizer.defaults["fused"]
    complex_net(torch.ones(1, 2, dtype=torch.complex64)).abs().sum().backward()
    optimizer.step()  # fused, torch would refuse it here


def test_a_state_written_unfused_is_loaded_and_the_optimizer_stays_fused():
    before_net, resumed_net, plain_net = model(), model(), model()
    written = plain(before_net)
    steps(before_net, written, 3)  # a checkpoint written before AdamW was fused
    resumed_net.load_state_dict(before_net.state_dict())
    plain_net.load_state_dict(before_net.state_dict())
    optimizer, reference = adamw(resumed_net.parameters(), T), plain(plain_net)
    optimizer.load_state_dict(copy.deepcopy(written.state_dict()))  # (a load keeps the tensors it is given)
    reference.load_state_dict(copy.deepcopy(written.state_dict()))
    assert not optimizer.param_groups[0]["fused"]  # what torch's load leaves
    keep_kernel(optimizer, fused=True)
    assert optimizer.param_groups[0]["fused"] is True
    steps(resumed_net, optimizer, 2)
    steps(plain_net, reference, 2)
    worst = max((p - q).abs().max().item() for p, q in zip(resumed_net.parameters(), plain_net.parameters()))
    assert worst < 1e-6 and all(optimizer.state[p]["step"].item() == 5 for p in resumed_net.parameters())
