"""trainer.overlap_weight_update: a step's weights go to vLLM in a thread while the next step
trains. What it must keep: the weights sent are those of the step (a copy, not the parameters the
next step changes), at most one update is in flight, and an update's failure is the trainer's."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch

from rlrun.trainer.main import Trainer


def trainer_with(hand_over) -> Trainer:
    trainer = Trainer.__new__(Trainer)  # the weight-update part only: no model, Redis or vLLM
    trainer.main, trainer._update, trainer.last_update_s = True, None, None
    trainer.param = torch.zeros(3)
    trainer.state = SimpleNamespace(policy_version=1, step=1)
    trainer.parallel = SimpleNamespace(full_state_dict=lambda model: {"w": trainer.param})
    trainer.model = None
    trainer._hand_over = hand_over
    return trainer


def test_the_update_runs_beside_the_next_step_and_sends_that_steps_weights():
    release, sent = threading.Event(), []

    def hand_over(weights, version, step):
        release.wait(10)
        sent.append((weights["w"].clone(), version, step))

    trainer = trainer_with(hand_over)
    trainer._push_weights(overlap=True)  # returns while vLLM is still being updated
    assert sent == [] and trainer._update is not None and not trainer._update.done()
    trainer.param.add_(5.0)  # the next optimizer step changes the parameters in place
    trainer.state = SimpleNamespace(policy_version=2, step=2)  # and the trainer's state
    release.set()
    trainer._finish_update()
    assert torch.equal(sent[0][0], torch.zeros(3)) and sent[0][1:] == (1, 1)  # step 1's weights, version and step
    assert trainer.last_update_s is not None and trainer._update is None


def test_a_second_update_waits_for_the_first():
    order, first_may_end = [], threading.Event()

    def hand_over(weights, version, step):
        order.append(("start", version))
        if version == 1:
            first_may_end.wait(10)
        order.append(("end", version))

    trainer = trainer_with(hand_over)
    trainer._push_weights(overlap=True)
    threading.Timer(0.2, first_may_end.set).start()
    trainer.state = SimpleNamespace(policy_version=2, step=2)
    trainer._push_weights(overlap=True)
    trainer._finish_update()
    assert order == [("start", 1), ("end", 1), ("start", 2), ("end", 2)]


def test_a_failed_update_fails_the_trainer_at_its_next_push():
    def hand_over(weights, version, step):
        raise RuntimeError("no vLLM server answers")

    trainer = trainer_with(hand_over)
    trainer._push_weights(overlap=True)
    with pytest.raises(RuntimeError, match="no vLLM server answers"):
        trainer._push_weights(overlap=True)


def test_without_overlap_the_step_waits_for_the_update():
    sent = []
    trainer = trainer_with(lambda weights, version, step: sent.append(version))
    trainer._push_weights(overlap=False)
    assert sent == [1] and trainer._update is None
