"""One optimizer step (rlrun/trainer/step.py) computes logits only from the first position the loss
reads, and takes the step a forward over every position would: same loss, same gradients."""

from __future__ import annotations

import random

import pytest
import torch

from rlrun.config import compose
from rlrun.streams.rollouts import Sample
from rlrun.trainer.losses import policy_loss
from rlrun.trainer.parallel import Parallel, Ranks
from rlrun.trainer.step import collate, optimizer_step, scored_from


def test_scored_from_is_the_position_before_the_earliest_completion_token():
    mask = torch.tensor([[0, 0, 0, 1, 1, 0], [0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 1, 0]], dtype=torch.float32)
    assert scored_from(mask) == 1  # row 1's first completion token is at 2, predicted from 1
    assert scored_from(mask[[0, 2]]) == 2
    assert scored_from(torch.zeros(2, 5)) == 4  # nothing scored: only the last position, a loss of 0
    assert scored_from(torch.zeros(2, 1)) == 0


@pytest.fixture()
def model():
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(vocab_size=32, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, tie_word_embeddings=True, max_position_embeddings=64)  # fmt: skip
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).float()


def samples(prompt_lengths, seed=0):
    rng = random.Random(seed)
    out = []
    for i, n in enumerate(prompt_lengths):
        length = rng.randint(1, 6)
        completion = [rng.randrange(1, 32) for _ in range(length)]
        logprobs = [-rng.uniform(2.5, 4.5) for _ in range(length)]
        out.append(([rng.randrange(1, 32) for _ in range(n)], Sample(i, completion, logprobs, [0] * length, "stop", 0.0, rng.uniform(-1.5, 1.5))))
    return out


def whole_logits_step(model, batch, algo):
    """The loss and gradients of a forward over every position, log_softmax over the whole logits."""
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    logprobs = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, batch["input_ids"][:, 1:, None]).squeeze(-1)
    out = policy_loss(algo.name, logprobs, batch["old_logprobs"][:, 1:], batch["advantages"], batch["mask"][:, 1:],
                      algo.clip_eps_low, algo.clip_eps_high)  # fmt: skip
    out.loss.backward()
    return out.loss.item(), {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("algo", ["grpo", "gspo"])
@pytest.mark.parametrize("prompt_lengths", [(5, 5, 5, 5), (3, 6, 4, 2)])
def test_the_step_is_the_whole_logits_step_with_fewer_logits(model, algo, prompt_lengths):
    cfg, _ = compose([f"recipe=math_{algo}", "trainer.train_batch_size=4", "algo.group_size=2", "trainer.grad_clip=1e9"])
    batch_samples = samples(prompt_lengths)
    batch = collate(batch_samples, torch.device("cpu"))
    expected_loss, expected_grads = whole_logits_step(model, batch, cfg.algo)

    kept = []
    handle = model.register_forward_hook(lambda _m, _a, output: kept.append(output.logits.shape[1]))
    metrics = optimizer_step(model, torch.optim.SGD(model.parameters(), lr=0.0), batch_samples, cfg, Parallel(Ranks()), torch.device("cpu"))
    handle.remove()

    length = batch["input_ids"].shape[1]
    assert kept == [length - (min(prompt_lengths) - 1)]  # from the last token of the shortest prompt on
    assert metrics["loss"] == pytest.approx(expected_loss, rel=1e-6, abs=1e-7)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected_grads[name], atol=1e-6, rtol=1e-5, msg=name)
