"""The trainer's logprob_diff_* metrics: |trainer log-prob - vLLM's| over the tokens vLLM sampled
with the very weights the trainer holds for the step, and over no others (a sample of another
version, or one spanning an update, would measure the policy's change, not a disagreement)."""

from __future__ import annotations

import pytest
import torch

from rlrun.config import compose
from rlrun.streams.rollouts import Sample
from rlrun.trainer.losses import completion_logprobs
from rlrun.trainer.parallel import Parallel, Ranks
from rlrun.trainer.step import optimizer_step

VERSION = 3  # the weights the trainer holds before the step


@pytest.fixture(scope="module")
def model():
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(vocab_size=32, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=1,
                         num_key_value_heads=1, tie_word_embeddings=True, max_position_embeddings=64)  # fmt: skip
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).float()


def own_logprobs(model, prompt: list[int], completion: list[int]) -> list[float]:
    with torch.no_grad():
        ids = torch.tensor([prompt + completion])
        return completion_logprobs(model(input_ids=ids).logits, ids)[0, len(prompt) - 1 :].tolist()


def step_metrics(model, samples) -> dict:
    cfg, _ = compose(["recipe=math_grpo", f"trainer.train_batch_size={len(samples)}", "algo.group_size=2"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.0)
    return optimizer_step(model, optimizer, samples, cfg, Parallel(Ranks()), torch.device("cpu"), policy_version=VERSION)


def sample(index: int, completion: list[int], logprobs: list[float], versions: list[int]) -> Sample:
    return Sample(index, completion, logprobs, versions, "stop", float(index % 2), 1.0 if index % 2 else -1.0)


def test_only_tokens_sampled_by_the_trainers_weights_are_compared(model):
    prompt, a, b = [1, 2, 3], [4, 5, 6, 7], [8, 9]
    exact_a, exact_b = own_logprobs(model, prompt, a), own_logprobs(model, prompt, b)
    samples = [
        (prompt, sample(0, a, exact_a, [VERSION] * 4)),  # vLLM agreed with the trainer
        (prompt, sample(1, b, [x + 0.25 for x in exact_b], [VERSION] * 2)),  # off by 0.25 on two tokens
        (prompt, sample(2, a, [x - 5.0 for x in exact_a], [VERSION - 1] * 4)),  # older weights: not compared
        (prompt, sample(3, a, [x - 5.0 for x in exact_a], [VERSION - 1, VERSION - 1, VERSION, VERSION])),  # spanning: not compared
    ]
    metrics = step_metrics(model, samples)
    assert metrics["logprob_diff_tokens"] == 6
    assert metrics["logprob_diff_max"] == pytest.approx(0.25, abs=1e-4)
    assert metrics["logprob_diff_mean"] == pytest.approx(2 * 0.25 / 6, abs=1e-4)


def test_no_token_of_the_current_weights_gives_no_figure(model):
    prompt, a = [1, 2], [3, 4, 5]
    samples = [(prompt, sample(i, a, own_logprobs(model, prompt, a), [VERSION + 1] * 3)) for i in range(2)]
    metrics = step_metrics(model, samples)
    assert (metrics["logprob_diff_mean"], metrics["logprob_diff_max"], metrics["logprob_diff_tokens"]) == (None, None, 0)
