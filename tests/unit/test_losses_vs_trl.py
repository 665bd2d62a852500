"""rlrun's GRPO and GSPO losses against TRL's GRPOTrainer on identical tensors (runs when TRL is
installed: `pip install 'rlrun[bench]'`; skipped, with the reason, otherwise).

TRL's loss is computed by TRL's own code: a real `GRPOTrainer` is built from a `GRPOConfig` with
the settings bench/vs_trl.py uses, and its `_compute_loss` is called with the per-token log-probs
of this file in place of a forward pass (the one method replaced is the one that runs the model).
Loss values and the gradients with respect to the log-probs must agree within 1e-6.

Notation: G sequences o_1..o_G, |o_i| completion tokens, r_{i,t} = exp(logp_{i,t} - old_{i,t}),
clip(x) = clip(x, 1 - eps_low, 1 + eps_high), A_i the advantage of sequence i.

What matches exactly (asserted below):
- GRPO = TRL `loss_type="dapo"` (its default) or `"bnpo"`, `importance_sampling_level="token"`:
      L = -(1 / sum_i |o_i|) * sum_i sum_t min(r_{i,t} A_i, clip(r_{i,t}) A_i)
  the token-level mean of DAPO (Yu et al. 2025, eq. 8), one optimizer step per batch.
- GSPO = TRL `loss_type="grpo"`, `importance_sampling_level="sequence"`:
      s_i = exp((1 / |o_i|) * sum_t (logp_{i,t} - old_{i,t})),
      L = -(1 / G) * sum_i min(s_i A_i, clip(s_i) A_i)
  (Zheng et al. 2025, eq. 5-7: one length-normalised ratio per sequence, mean over sequences).
- The clipped share: tokens (GRPO) / sequences (GSPO) where r > 1 + eps_high with A > 0 or
  r < 1 - eps_low with A < 0, as TRL's `clip_ratio/region_mean`.

Deliberate differences (written down, and asserted where a test can show them):
1. GRPO aggregation. The GRPO paper (Shao et al. 2024, eq. 3), TRL `loss_type="grpo"`, averages
   per sequence first: L = -(1/G) sum_i (1/|o_i|) sum_t min(...). rlrun uses the token mean
   above, so a token weighs the same in a long and a short answer (no length bias). Equal
   lengths give the same value; unequal lengths do not (test below).
2. GSPO with TRL's default `loss_type="dapo"` weighs each sequence's term by its length,
   sum_i |o_i| * l_i / sum_i |o_i|; the GSPO paper, TRL `"grpo"` and rlrun weigh sequences
   equally. bench/vs_trl.py therefore runs TRL's GSPO with `loss_type="grpo"`.
3. Advantages. rlrun: A_i = (R_i - mean) / (std_pop + 1e-6), std_pop = sqrt((1/G) sum (R - mean)^2).
   TRL (`scale_rewards="group"`): A_i = (R_i - mean) / (std_s + 1e-4), std_s with Bessel's
   correction = std_pop * sqrt(G / (G - 1)): TRL's advantages are ~3 % (G = 16) to ~7 % (G = 8)
   smaller, which acts like a slightly lower learning rate. Asserted below through TRL's `nanstd`.
4. Positions outside the mask. rlrun never computes a ratio there (torch.where), so junk (inf,
   NaN) in prompt/padding log-probs cannot reach the loss; TRL multiplies by the mask, so a NaN
   there would. The tensors compared here are finite everywhere, as a model's log-probs are.
5. A sequence with no completion token is left out of rlrun's GSPO mean; TRL counts it as 0 in
   the mean. vLLM always returns at least one token (end of sequence), so it does not occur.
"""

from __future__ import annotations

import math

import pytest
import torch
import trl  # noqa: F401 - in the `test` extra: this test always runs, never skips

from rlrun.rules.advantages import group_advantages
from rlrun.trainer.losses import grpo_loss, gspo_loss

TOL = 1e-6


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    """A tiny random Qwen2 with rlrun's character tokenizer and a one-prompt dataset: enough for
    GRPOTrainer to build; the model is never run (the log-probs are given)."""
    import warnings

    from datasets import Dataset
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlrun.models.tiny import build_tokenizer

    warnings.filterwarnings("ignore", message=".*vLLM.*")  # TRL warns about vLLM versions on import
    tokenizer = build_tokenizer(64)
    config = Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=1,
                         num_key_value_heads=1, max_position_embeddings=64, pad_token_id=0, eos_token_id=1, bos_token_id=2)  # fmt: skip
    return {"model": Qwen2ForCausalLM(config), "tokenizer": tokenizer, "dataset": Dataset.from_dict({"prompt": ["1+2="] * 8}),
            "out": tmp_path_factory.mktemp("trl")}  # fmt: skip


def trl_trainer(parts, **settings):
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(output_dir=str(parts["out"]), per_device_train_batch_size=4, num_generations=4, max_completion_length=4,
                      use_cpu=True, report_to=[], beta=0.0, save_strategy="no", **settings)  # fmt: skip
    trainer = GRPOTrainer(model=parts["model"], reward_funcs=lambda completions, **_: [0.0] * len(completions), args=args,
                          train_dataset=parts["dataset"], processing_class=parts["tokenizer"])  # fmt: skip
    trainer.current_gradient_accumulation_steps = 1  # one optimizer step per batch, as rlrun's trainer
    return trainer


def trl_loss(trainer, logprobs, old, advantages, mask):
    """TRL's `_compute_loss` on these tensors: its forward pass replaced by `logprobs`."""
    batch, length = logprobs.shape
    entropies = torch.zeros_like(logprobs)
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (logprobs, entropies, None)
    inputs = {
        "prompt_ids": torch.full((batch, 2), 5, dtype=torch.long),
        "prompt_mask": torch.ones(batch, 2, dtype=torch.long),
        "completion_ids": torch.full((batch, length), 7, dtype=torch.long),
        "completion_mask": mask.long(),
        "advantages": advantages,
        "old_per_token_logps": old,
        "num_items_in_batch": mask.sum(),
    }
    trainer.model.train()
    loss = trainer._compute_loss(trainer.model, inputs)
    return loss, trainer._metrics["train"]["clip_ratio/region_mean"][-1]


def batch(seed: int, spread: float, lengths=(5, 3, 1, 4, 2, 5)):
    """Six sequences of unequal lengths; log-probs off the old ones by ~`spread` (so some ratios
    fall outside the clip range), advantages of both signs."""
    g = torch.Generator().manual_seed(seed)
    batch_size, width = len(lengths), max(lengths)
    old = -torch.rand(batch_size, width, generator=g) * 3.0
    logprobs = (old + spread * torch.randn(batch_size, width, generator=g)).requires_grad_(True)
    mask = torch.tensor([[1.0] * n + [0.0] * (width - n) for n in lengths])
    advantages = torch.tensor([1.2, -0.7, 0.4, -1.5, 0.9, -0.3])
    return logprobs, old, advantages, mask


def both(rlrun_fn, trainer, seed, spread, eps, lengths=(5, 3, 1, 4, 2, 5)):
    logprobs, old, advantages, mask = batch(seed, spread, lengths)
    ours = rlrun_fn(logprobs, old, advantages, mask, *eps)
    (ours_grad,) = torch.autograd.grad(ours.loss, logprobs)
    theirs, clipped = trl_loss(trainer, logprobs, old, advantages, mask)
    (theirs_grad,) = torch.autograd.grad(theirs, logprobs)
    return ours, ours_grad, theirs, theirs_grad, clipped


@pytest.mark.parametrize("loss_type", ["dapo", "bnpo"])
@pytest.mark.parametrize("seed", [0, 1])
def test_grpo_matches_trl_token_level_mean(parts, loss_type, seed):
    trainer = trl_trainer(parts, loss_type=loss_type, importance_sampling_level="token", epsilon=0.2, epsilon_high=0.28)
    assert (trainer.epsilon_low, trainer.epsilon_high) == (0.2, 0.28)  # the config keys mean what bench/vs_trl.py assumes
    ours, ours_grad, theirs, theirs_grad, clipped = both(grpo_loss, trainer, seed, spread=0.3, eps=(0.2, 0.28))
    assert 0.0 < ours.clip_fraction < 1.0  # both clipped and unclipped tokens are exercised
    assert ours.loss.item() == pytest.approx(theirs.item(), abs=TOL)
    torch.testing.assert_close(ours_grad, theirs_grad, atol=TOL, rtol=0.0)
    assert ours.clip_fraction == pytest.approx(clipped, abs=TOL)


@pytest.mark.parametrize("seed", [0, 1])
def test_gspo_matches_trl_sequence_level_grpo_loss(parts, seed):
    trainer = trl_trainer(parts, loss_type="grpo", importance_sampling_level="sequence", epsilon=3e-4, epsilon_high=4e-4)
    ours, ours_grad, theirs, theirs_grad, clipped = both(gspo_loss, trainer, seed, spread=1.5e-3, eps=(3e-4, 4e-4))
    assert 0.0 < ours.clip_fraction < 1.0
    assert ours.loss.item() == pytest.approx(theirs.item(), abs=TOL)
    torch.testing.assert_close(ours_grad, theirs_grad, atol=TOL, rtol=0.0)
    assert ours.clip_fraction == pytest.approx(clipped, abs=TOL)


def test_gspo_with_a_wide_clip_range_matches_too(parts):
    """Nothing clipped: every token of every sequence gets -A_i s_i / (G |o_i|)."""
    trainer = trl_trainer(parts, loss_type="grpo", importance_sampling_level="sequence", epsilon=0.2, epsilon_high=0.28)
    ours, ours_grad, theirs, theirs_grad, _ = both(gspo_loss, trainer, 3, spread=0.01, eps=(0.2, 0.28))
    assert ours.clip_fraction == 0.0
    assert ours.loss.item() == pytest.approx(theirs.item(), abs=TOL)
    torch.testing.assert_close(ours_grad, theirs_grad, atol=TOL, rtol=0.0)


def test_difference_1_grpo_paper_sequence_mean_differs_unless_lengths_are_equal(parts):
    trainer = trl_trainer(parts, loss_type="grpo", importance_sampling_level="token", epsilon=0.2, epsilon_high=0.28)
    ours, _, theirs, _, _ = both(grpo_loss, trainer, 0, spread=0.3, eps=(0.2, 0.28))
    assert abs(ours.loss.item() - theirs.item()) > 1e-3  # unequal lengths: token mean != mean of sequence means
    ours, ours_grad, theirs, theirs_grad, _ = both(grpo_loss, trainer, 0, spread=0.3, eps=(0.2, 0.28), lengths=(4,) * 6)
    assert ours.loss.item() == pytest.approx(theirs.item(), abs=TOL)
    torch.testing.assert_close(ours_grad, theirs_grad, atol=TOL, rtol=0.0)


def test_difference_2_trl_default_dapo_weighs_gspo_sequences_by_length(parts):
    trainer = trl_trainer(parts, loss_type="dapo", importance_sampling_level="sequence", epsilon=3e-4, epsilon_high=4e-4)
    logprobs, old, advantages, mask = batch(0, 6e-4)
    theirs, _ = trl_loss(trainer, logprobs, old, advantages, mask)
    ours = gspo_loss(logprobs, old, advantages, mask, 3e-4, 4e-4)
    # rebuild TRL's value from rlrun's per-sequence terms weighted by length: sum |o_i| l_i / sum |o_i|
    lengths = mask.sum(1)
    s = torch.exp(((logprobs - old) * mask).sum(1) / lengths)
    per_seq = -torch.minimum(s * advantages, s.clamp(1 - 3e-4, 1 + 4e-4) * advantages)
    assert ours.loss.item() == pytest.approx(per_seq.mean().item(), abs=TOL)
    assert theirs.item() == pytest.approx(((per_seq * lengths).sum() / lengths.sum()).item(), abs=TOL)
    assert abs(ours.loss.item() - theirs.item()) > 1e-4


@pytest.mark.parametrize("rewards", [[1, 0, 0, 1, 1, 0, 0, 0], [0.0] * 15 + [1.0], [0.2, 0.9, 0.4, 0.4]])
def test_difference_3_advantages_population_std_vs_trls_bessel_std(rewards):
    from trl.trainer.utils import nanstd

    group = len(rewards)
    r = torch.tensor(rewards, dtype=torch.float64)
    trl_adv = (r - r.mean()) / (nanstd(r) + 1e-4)  # TRL, scale_rewards="group", one group
    ours = torch.tensor(group_advantages([float(x) for x in rewards], normalize_std=True), dtype=torch.float64)
    std_pop = math.sqrt(((r - r.mean()) ** 2).mean().item())
    assert nanstd(r).item() == pytest.approx(std_pop * math.sqrt(group / (group - 1)), rel=1e-6)  # its correction is float32
    expected = ours * (std_pop + 1e-6) / (std_pop * math.sqrt(group / (group - 1)) + 1e-4)
    torch.testing.assert_close(trl_adv, expected, atol=TOL, rtol=0.0)
