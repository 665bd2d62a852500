"""GRPO/GSPO losses against hand-computed values; gradients checked with autograd."""

import math

import pytest
import torch

from rlrun.trainer.losses import (
    LossOutput,
    completion_logprobs,
    grpo_loss,
    gspo_loss,
    policy_loss,
)

LN = math.log


def small_batch():
    """B=2, T=3. Row 0: 1 prompt token + 2 completion tokens with ratios 1.1, 1.5.
    Row 1: 1 prompt token, 1 completion token with ratio 0.5, 1 padding token.
    Prompt/padding positions hold junk that must not matter.
    old_logprobs = 0, so ratio = exp(logp)."""
    logprobs = torch.tensor([[5.0, LN(1.1), LN(1.5)], [-7.0, LN(0.5), 3.0]], requires_grad=True)
    old = torch.zeros(2, 3)
    adv = torch.tensor([2.0, -1.0])
    mask = torch.tensor([[0, 1, 1], [0, 1, 0]])
    return logprobs, old, adv, mask


EPS_LOW, EPS_HIGH = 0.2, 0.3  # clip range [0.8, 1.3]


def test_grpo_small_batch_value_clip_fraction_and_ratio():
    logprobs, old, adv, mask = small_batch()
    out = grpo_loss(logprobs, old, adv, mask, EPS_LOW, EPS_HIGH)
    # token (0,1): r=1.1, A=2:  min(2.2, 1.1*2=2.2) = 2.2        → -2.2 (not clipped)
    # token (0,2): r=1.5, A=2:  min(3.0, 1.3*2=2.6) = 2.6        → -2.6 (clipped)
    # token (1,1): r=0.5, A=-1: min(-0.5, 0.8*-1=-0.8) = -0.8    → +0.8 (clipped)
    # token mean over 3 completion tokens: (-2.2 - 2.6 + 0.8) / 3 = -4/3
    # (a per-sequence mean would give ((-2.2-2.6)/2 + 0.8)/2 = -0.8: the aggregation matters)
    assert out.loss.item() == pytest.approx(-4.0 / 3.0, abs=1e-6)
    assert out.clip_fraction == pytest.approx(2.0 / 3.0)
    assert out.mean_ratio == pytest.approx((1.1 + 1.5 + 0.5) / 3.0)  # 1.0333
    out.loss.backward()
    # d/dlogp of -r*A is -r*A (dr/dlogp = r)
    # token (0,1): -1.1*2 / 3 tokens = -0.73333; the clipped ones: 0
    expected = torch.tensor([[0.0, -2.2 / 3.0, 0.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(logprobs.grad, expected)


def test_gspo_small_batch_value_clip_fraction_and_ratio():
    logprobs, old, adv, mask = small_batch()
    out = gspo_loss(logprobs, old, adv, mask, EPS_LOW, EPS_HIGH)
    # row 0: s = exp((ln1.1 + ln1.5)/2) = sqrt(1.65) = 1.2845233 < 1.3, A=2
    #        → -2.5690465 (not clipped)
    # row 1: s = exp(ln0.5 / 1) = 0.5 < 0.8, A=-1: min(-0.5, -0.8) = -0.8 → +0.8 (clipped)
    # mean over 2 sequences: (-2.5690465 + 0.8) / 2 = -0.8845233
    s0 = math.sqrt(1.65)
    assert out.loss.item() == pytest.approx((-2.0 * s0 + 0.8) / 2.0, abs=1e-6)
    assert out.loss.item() == pytest.approx(-0.8845233, abs=1e-6)
    assert out.clip_fraction == pytest.approx(0.5)
    assert out.mean_ratio == pytest.approx((s0 + 0.5) / 2.0)  # 0.8922616
    out.loss.backward()
    # row 0: d(-A*s)/dlogp_t = -A*s/|y| = -2*1.2845233/2 = -1.2845233,
    #        then /2 sequences = -0.6422616
    g = -s0 / 2.0
    expected = torch.tensor([[0.0, g, g], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(logprobs.grad, expected)


def one_off_token_sequence():
    """One sequence of 10 completion tokens: ratio 1.5 on token 3, 1.0 elsewhere; A = +1."""
    logprobs = torch.zeros(1, 10)
    logprobs[0, 3] = LN(1.5)
    logprobs.requires_grad_(True)
    return logprobs, torch.zeros(1, 10), torch.tensor([1.0]), torch.ones(1, 10)


def test_grpo_clips_only_the_off_token():
    logprobs, old, adv, mask = one_off_token_sequence()
    out = grpo_loss(logprobs, old, adv, mask, clip_eps_low=0.2, clip_eps_high=0.28)
    # 9 tokens: -min(1*1, 1*1) = -1; token 3: -min(1.5, 1.28) = -1.28 → (-9 - 1.28) / 10 = -1.028
    assert out.loss.item() == pytest.approx(-1.028, abs=1e-6)
    assert out.clip_fraction == pytest.approx(0.1)  # 1 token of 10
    assert out.mean_ratio == pytest.approx((9 * 1.0 + 1.5) / 10)  # 1.05
    out.loss.backward()
    # unclipped tokens: -r*A/10 = -0.1; the clipped token gets no gradient
    expected = torch.full((1, 10), -0.1)
    expected[0, 3] = 0.0
    torch.testing.assert_close(logprobs.grad, expected)


def test_gspo_narrow_range_clips_the_whole_sequence():
    logprobs, old, adv, mask = one_off_token_sequence()
    out = gspo_loss(logprobs, old, adv, mask, clip_eps_low=3e-4, clip_eps_high=4e-4)
    # s = exp(ln1.5 / 10) = 1.5**0.1 = 1.0413797 > 1.0004 → -min(1.0413797, 1.0004) = -1.0004
    assert 1.5**0.1 == pytest.approx(1.0413797, abs=1e-7)
    assert out.loss.item() == pytest.approx(-1.0004, abs=1e-6)
    assert out.clip_fraction == 1.0  # the one sequence
    assert out.mean_ratio == pytest.approx(1.5**0.1)
    out.loss.backward()
    torch.testing.assert_close(logprobs.grad, torch.zeros(1, 10))  # no token gets a gradient


def test_gspo_wide_range_keeps_the_sequence_and_spreads_the_gradient():
    logprobs, old, adv, mask = one_off_token_sequence()
    out = gspo_loss(logprobs, old, adv, mask, clip_eps_low=0.2, clip_eps_high=0.28)
    # s = 1.0413797 < 1.28: unclipped, loss -1.0413797; every token (the off one too) gets -s/10
    s = 1.5**0.1
    assert out.loss.item() == pytest.approx(-s, abs=1e-6)
    assert out.clip_fraction == 0.0
    out.loss.backward()
    torch.testing.assert_close(logprobs.grad, torch.full((1, 10), -s / 10))


@pytest.mark.parametrize("algo", ["grpo", "gspo"])
def test_prompt_and_padding_do_not_matter(algo):
    logprobs, old, adv, mask = small_batch()
    ref = policy_loss(algo, logprobs, old, adv, mask, EPS_LOW, EPS_HIGH)
    # overwrite every masked position with extreme junk, in both logprobs and old_logprobs
    junk = torch.tensor([[40.0, 0.0, 0.0], [-float("inf"), 0.0, 1e4]])
    junk_old = torch.tensor([[-30.0, 0.0, 0.0], [float("nan"), 0.0, -1e4]])
    keep = mask.bool()
    logprobs2 = torch.where(keep, logprobs.detach(), junk).requires_grad_(True)
    old2 = torch.where(keep, old, junk_old)
    out = policy_loss(algo, logprobs2, old2, adv, mask, EPS_LOW, EPS_HIGH)
    assert out.loss.item() == pytest.approx(ref.loss.item(), abs=1e-6)
    assert out.clip_fraction == pytest.approx(ref.clip_fraction)
    assert out.mean_ratio == pytest.approx(ref.mean_ratio)
    out.loss.backward()
    assert torch.all(logprobs2.grad[~keep] == 0)
    assert torch.isfinite(logprobs2.grad).all()


def test_gspo_sequence_ratio_is_over_the_models_tokens_only():
    # A multi-turn sequence: model tokens (ratios 1.2, 0.9), an observation of 2 tokens (mask 0,
    # ratios that would dominate any mean), a model token (ratio 1.1). s = (1.2 * 0.9 * 1.1) ** (1/3)
    # = 1.0591, not the 5-token mean's exp((ln 1.188 + 50 + 20) / 5).
    logprobs = torch.tensor([[LN(1.2), LN(0.9), 50.0, 20.0, LN(1.1)]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0, 0, 1]])
    out = gspo_loss(logprobs, torch.zeros(1, 5), torch.tensor([1.0]), mask, 0.2, 0.28)
    s = (1.2 * 0.9 * 1.1) ** (1 / 3)
    assert out.mean_ratio == pytest.approx(s, rel=1e-6)
    assert out.loss.item() == pytest.approx(-s, rel=1e-6)  # unclipped: s < 1.28
    out.loss.backward()
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-s / 3, -s / 3, 0.0, 0.0, -s / 3]]))


@pytest.mark.parametrize("algo", ["grpo", "gspo"])
def test_ratio_one_gives_minus_mean_advantage(algo):
    # on-policy (logp == old): every ratio is 1, nothing clipped, loss = -mean(A) (equal lengths)
    logprobs = torch.full((3, 4), -1.7)
    adv = torch.tensor([1.0, -2.0, 4.0])
    out = policy_loss(algo, logprobs, logprobs.clone(), adv, torch.ones(3, 4), 0.2, 0.2)
    assert out.loss.item() == pytest.approx(-(1.0 - 2.0 + 4.0) / 3.0)  # -1.0
    assert out.clip_fraction == 0.0
    assert out.mean_ratio == pytest.approx(1.0)


def test_policy_loss_dispatches_and_rejects_unknown():
    logprobs, old, adv, mask = one_off_token_sequence()
    args = (logprobs, old, adv, mask, 3e-4, 4e-4)
    assert isinstance(policy_loss("grpo", *args), LossOutput)
    assert policy_loss("grpo", *args).loss.item() == pytest.approx(grpo_loss(*args).loss.item())
    assert policy_loss("gspo", *args).loss.item() == pytest.approx(-1.0004, abs=1e-6)
    # grpo with the same narrow range: token 3 capped at 1.0004 → (-9 - 1.0004)/10 = -1.00004
    assert policy_loss("grpo", *args).loss.item() == pytest.approx(-1.00004, abs=1e-6)
    with pytest.raises(ValueError, match="ppo"):
        policy_loss("ppo", *args)


def test_completion_logprobs_by_hand():
    # V=3, T=3 → 2 predictions. Position 0 logits uniform → log(1/3) for token ids[1] = 2.
    # Position 1 logits [0, ln2, 0] → probs [1/4, 1/2, 1/4]; next token ids[2] = 1 → log(1/2).
    logits = torch.tensor([[[0.0, 0.0, 0.0], [0.0, LN(2.0), 0.0], [9.0, 9.0, 9.0]]])
    ids = torch.tensor([[0, 2, 1]])
    out = completion_logprobs(logits, ids)
    assert out.shape == (1, 2)
    torch.testing.assert_close(out, torch.tensor([[LN(1 / 3), LN(0.5)]]))


def test_completion_logprobs_matches_log_softmax_gather():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, 11, generator=g, requires_grad=True)
    ids = torch.randint(0, 11, (3, 7), generator=g)
    ref = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    out = completion_logprobs(logits, ids)
    assert out.shape == (3, 6) and out.dtype == torch.float32
    torch.testing.assert_close(out, ref)
    out.sum().backward()  # differentiable
    assert logits.grad is not None
    assert logits.grad[:, -1].abs().sum() == 0  # the last position predicts nothing


def test_completion_logprobs_upcasts_bf16():
    logits = torch.zeros(1, 2, 4, dtype=torch.bfloat16)
    out = completion_logprobs(logits, torch.tensor([[0, 3]]))
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, torch.tensor([[LN(0.25)]]))


def test_completion_logprobs_is_the_same_in_chunks_of_any_size(monkeypatch):
    import rlrun.trainer.losses as losses

    g = torch.Generator().manual_seed(1)
    logits = torch.randn(5, 6, 7, generator=g)
    ids = torch.randint(0, 7, (5, 6), generator=g)
    whole = completion_logprobs(logits, ids)  # 5 x 5 x 7 elements: one chunk
    monkeypatch.setattr(losses, "LOGPROB_CHUNK_ELEMENTS", 2 * 5 * 7)  # two rows a chunk: 2 + 2 + 1
    torch.testing.assert_close(completion_logprobs(logits, ids), whole)
    monkeypatch.setattr(losses, "LOGPROB_CHUNK_ELEMENTS", 1)  # less than a row: still one row a chunk
    torch.testing.assert_close(completion_logprobs(logits, ids), whole)
    assert completion_logprobs(logits[:0], ids[:0]).shape == (0, 5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk_elements", [1 << 24, 3 * 11, 1])
def test_completion_logprobs_gradient_is_log_softmaxs_in_chunks_of_any_size(monkeypatch, dtype, chunk_elements):
    """The hand-written backward, (onehot - softmax) * grad per chunk, equals autograd's through
    log_softmax and gather, in the logits' own dtype; the last position gets no gradient."""
    import rlrun.trainer.losses as losses

    monkeypatch.setattr(losses, "LOGPROB_CHUNK_ELEMENTS", chunk_elements)  # one chunk; 3 positions; 1 position
    g = torch.Generator().manual_seed(2)
    logits = (3 * torch.randn(4, 6, 11, generator=g)).to(dtype).requires_grad_(True)
    ids = torch.randint(0, 11, (4, 6), generator=g)
    weights = torch.randn(4, 5, generator=g)
    reference = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    (expected,) = torch.autograd.grad((reference * weights).sum(), logits)
    out = completion_logprobs(logits, ids)
    torch.testing.assert_close(out, reference)
    (got,) = torch.autograd.grad((out * weights).sum(), logits)
    assert got.dtype == dtype
    torch.testing.assert_close(got, expected, atol=1e-6 if dtype == torch.float32 else 1e-2, rtol=0.0)
    assert got[:, -1].abs().sum() == 0
