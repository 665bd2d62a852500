"""bench/trainer_step.py's parts: the old head it measures as the baseline computes what the new one
does (so the before/after figures compare equal work), TRL's inputs hold the same tokens as rlrun's
batch, and a step's timestamps become its phases."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from rlrun.streams.rollouts import Sample
from rlrun.trainer.losses import completion_logprobs
from rlrun.trainer.step import collate

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import trainer_step  # noqa: E402 - bench/ is not a package


def test_the_old_head_gives_the_new_heads_logprobs_and_gradients():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 7, 13, generator=g).to(torch.bfloat16).requires_grad_(True)
    ids = torch.randint(0, 13, (5, 7), generator=g)
    weights = torch.randn(5, 6, generator=g)
    old = trainer_step.old_completion_logprobs(logits, ids)
    (old_grad,) = torch.autograd.grad((old * weights).sum(), logits)
    new = completion_logprobs(logits, ids)
    (new_grad,) = torch.autograd.grad((new * weights).sum(), logits)
    torch.testing.assert_close(new, old)
    torch.testing.assert_close(new_grad, old_grad, atol=1e-2, rtol=0.0)


def test_trl_inputs_hold_the_batchs_tokens_prompts_left_completions_right():
    batch = [([5, 6, 7], Sample(0, [8, 9], [-0.5, -1.5], [0, 0], "stop", 1.0, 0.7)),
             ([5, 6], Sample(1, [10, 11, 12], [-1.0, -2.0, -3.0], [0, 0, 0], "stop", 0.0, -0.7))]  # fmt: skip
    inputs = trainer_step.trl_inputs(batch)
    assert inputs["prompt_ids"].tolist() == [[5, 6, 7], [0, 5, 6]] and inputs["prompt_mask"].tolist() == [[1, 1, 1], [0, 1, 1]]
    assert inputs["completion_ids"].tolist() == [[8, 9, 0], [10, 11, 12]]
    assert inputs["completion_mask"].tolist() == [[1, 1, 0], [1, 1, 1]]
    assert inputs["old_per_token_logps"].tolist() == [[-0.5, -1.5, 0.0], [-1.0, -2.0, -3.0]]
    assert inputs["advantages"].tolist() == pytest.approx([0.7, -0.7]) and int(inputs["num_items_in_batch"]) == 5
    ours = collate(batch, torch.device("cpu"))  # the same scored tokens and behaviour log-probs as rlrun's
    assert ours["mask"].sum().item() == 5 and sorted(ours["old_logprobs"][ours["mask"] > 0].tolist()) == sorted([-0.5, -1.5, -1.0, -2.0, -3.0])


def test_a_steps_timestamps_become_its_phases():
    marks = trainer_step.Marks()
    names = ["start", "backbone_start", "backbone_end", "head", "loss", "hidden_grad", "backward", "optimizer"]
    marks.t = {name: float(i * i) for i, name in enumerate(names)}
    phases = marks.phases()
    assert [phases[p] for p in trainer_step.PHASES] == [1.0, 3.0, 5.0, 7.0, 9.0, 11.0, 13.0] and phases["step"] == 49.0
    marks.t = {"start": 1.0, "optimizer": 3.5}  # optimizer_step end to end: the step alone
    assert marks.phases() == {"step": 2.5}
