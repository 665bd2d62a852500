"""One optimizer step (rlrun/trainer/step.py) computes logits only from the first position the loss
reads, and takes the step a forward over every position would: same loss, same gradients."""

from __future__ import annotations

import dataclasses
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


# --- multi-turn samples: observation tokens (not sampled by the model) are never trained on --------


def conversations():
    """Two multi-turn samples whose completions both open with an observation: prompt 3, completion
    [obs obs m m obs obs m m] (versions 9 on the observations: the actor's filler); prompt 4,
    completion [obs m m m obs m]. Observation log-probs are 0.0, as the actor writes them."""
    a = Sample(0, [5, 6, 7, 8, 9, 10, 11, 12], [0.0, 0.0, -3.1, -2.7, 0.0, 0.0, -4.0, -3.3], [9, 9, 0, 0, 9, 9, 0, 0],
               "stop", 1.0, 1.2, observation_spans=[[0, 2], [4, 6]])  # fmt: skip
    b = Sample(1, [13, 14, 15, 16, 17, 18], [0.0, -2.9, -3.6, -3.0, 0.0, -4.2], [9, 0, 0, 0, 9, 0],
               "stop", 0.0, -0.8, observation_spans=[[0, 1], [4, 5]])  # fmt: skip
    return [([1, 2, 3], a), ([4, 3, 2, 1], b)]


def test_collate_masks_the_observations_and_ignores_their_versions():
    batch = collate(conversations(), torch.device("cpu"), policy_version=0)
    assert batch["mask"].tolist() == [
        [0, 0, 0, 0, 0, 1, 1, 0, 0, 1, 1],  # prompt 3, then the completion's own pattern
        [0, 0, 0, 0, 0, 1, 1, 1, 0, 1, 0],  # prompt 4, the completion, then padding
    ]
    # the observations carry version 9, yet every sampled token is version 0's
    assert batch["sampled_by_current"].tolist() == [1.0, 1.0]
    assert collate(conversations(), torch.device("cpu"), policy_version=9)["sampled_by_current"].tolist() == [0.0, 0.0]
    assert scored_from(batch["mask"]) == 4  # predicts the first sampled token (row 0's at 5), not an observation


def perturbing_logits(model, batch, positions, seed=1):
    """A forward hook that adds fixed noise to the logits at `positions` ((row, position) in
    input_ids), whether the step keeps every position's logits or only the last ones."""
    noise = torch.zeros(*batch["input_ids"].shape, model.config.vocab_size)
    generator = torch.Generator().manual_seed(seed)
    for row, position in positions:
        noise[row, position] = 5 * torch.randn(model.config.vocab_size, generator=generator)

    def hook(_module, _args, output):
        output.logits = output.logits + noise[:, noise.shape[1] - output.logits.shape[1] :]
        return output

    return model.register_forward_hook(hook)


def step(model, cfg, samples, positions=()):
    handle = perturbing_logits(model, collate(samples, torch.device("cpu")), positions)
    try:
        metrics = optimizer_step(model, torch.optim.SGD(model.parameters(), lr=0.0), samples, cfg, Parallel(Ranks()), torch.device("cpu"))
    finally:
        handle.remove()
    return metrics, {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("algo", ["grpo", "gspo"])
def test_the_step_over_conversations_is_the_whole_logits_step(model, algo):
    cfg, _ = compose([f"recipe=math_{algo}", "trainer.train_batch_size=2", "algo.group_size=2", "trainer.grad_clip=1e9"])
    expected_loss, expected_grads = whole_logits_step(model, collate(conversations(), torch.device("cpu")), cfg.algo)
    metrics, grads = step(model, cfg, conversations())
    assert metrics["loss"] == pytest.approx(expected_loss, rel=1e-6, abs=1e-7)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], atol=1e-6, rtol=1e-5, msg=name)
    assert metrics["logprob_diff_tokens"] == 4 + 4  # the sampled tokens only, not the 4 observations'


@pytest.mark.parametrize("algo", ["grpo", "gspo"])
def test_observation_logits_and_logprobs_change_nothing_a_sampled_tokens_do(model, algo):
    cfg, _ = compose([f"recipe=math_{algo}", "trainer.train_batch_size=2", "algo.group_size=2", "trainer.grad_clip=1e9"])
    reference, reference_grads = step(model, cfg, conversations())
    # the logits predicting each observation token (one position before it), and other behaviour log-probs there
    observed = [(0, 2), (0, 3), (0, 6), (0, 7), (1, 3), (1, 7)]
    changed = [(p, dataclasses.replace(s, logprobs=[lp - 7.5 if lp == 0.0 else lp for lp in s.logprobs])) for p, s in conversations()]
    metrics, grads = step(model, cfg, changed, observed)
    assert metrics["loss"] == pytest.approx(reference["loss"], rel=1e-6, abs=1e-7)
    assert metrics["mean_ratio"] == pytest.approx(reference["mean_ratio"], rel=1e-6)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, reference_grads[name], atol=1e-6, rtol=1e-5, msg=name)
    # the same noise on the logits predicting a sampled token (row 0's at 5), or its log-prob: both change the step
    assert step(model, cfg, conversations(), [(0, 4)])[0]["loss"] != pytest.approx(reference["loss"], rel=1e-3)
    (p, a), second = conversations()
    shifted = [(p, dataclasses.replace(a, logprobs=[a.logprobs[0], a.logprobs[1], a.logprobs[2] - 0.5, *a.logprobs[3:]])), second]
    assert step(model, cfg, shifted)[0]["loss"] != pytest.approx(reference["loss"], rel=1e-3)
