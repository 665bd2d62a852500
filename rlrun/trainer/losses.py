"""Policy-gradient losses: GRPO and GSPO as a thin pair over one shared clipped surrogate.

Owns the maths only (log-probs, importance ratios against vLLM's, the clipped surrogate and its
aggregation); knows nothing about batching, optimizers or Redis. No completion token at all gives
a loss of 0 that is still part of the graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class LossOutput:
    loss: Tensor  # scalar to call backward() on
    clip_fraction: float  # share of tokens (grpo) / sequences (gspo) whose gradient the clip zeroed
    mean_ratio: float  # mean importance ratio over the same tokens (grpo) or sequences (gspo)


def clipped_surrogate(
    ratio: Tensor, advantages: Tensor, clip_eps_low: float, clip_eps_high: float
) -> tuple[Tensor, Tensor]:
    """Per-element loss -min(r·A, clip(r, 1-eps_low, 1+eps_high)·A), and where the clip zeroes the
    gradient (r > 1+eps_high with A > 0, or r < 1-eps_low with A < 0)."""
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_eps_low, 1.0 + clip_eps_high) * advantages
    loss = -torch.minimum(unclipped, clipped)
    with torch.no_grad():
        is_clipped = ((advantages > 0) & (ratio > 1.0 + clip_eps_high)) | (
            (advantages < 0) & (ratio < 1.0 - clip_eps_low)
        )
    return loss, is_clipped


def grpo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps_low: float,
    clip_eps_high: float,
) -> LossOutput:
    """GRPO: token ratio exp(logp_t - old_t), clipped surrogate, mean over all scored tokens of
    the batch (DAPO's token mean: every token weighs the same). logprobs, old_logprobs, mask [B, T];
    advantages [B]; tokens of mask 0 (prompt, observations, padding) count neither in the value nor
    the gradient."""
    m, log_ratio = _masked_log_ratio(logprobs, old_logprobs, mask)
    ratio = torch.exp(log_ratio)
    per_token, is_clipped = clipped_surrogate(ratio, advantages[:, None], clip_eps_low, clip_eps_high)
    return _weighted_mean(per_token, ratio, is_clipped, m)


def gspo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps_low: float,
    clip_eps_high: float,
) -> LossOutput:
    """GSPO (Zheng et al. 2025): sequence ratio s_i = exp(mean_t (logp_t - old_t)) over sequence
    i's tokens of mask 1 (the ones the model sampled: observations excluded), clipped surrogate per
    sequence, mean over the sequences that have any."""
    m, log_ratio = _masked_log_ratio(logprobs, old_logprobs, mask)
    lengths = m.sum(dim=1)
    seq_ratio = torch.exp(log_ratio.sum(dim=1) / lengths.clamp(min=1.0))
    per_seq, is_clipped = clipped_surrogate(seq_ratio, advantages, clip_eps_low, clip_eps_high)
    return _weighted_mean(per_seq, seq_ratio, is_clipped, (lengths > 0).to(logprobs.dtype))


def _masked_log_ratio(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """The mask as weights, and logp - old where it is set (0 elsewhere: padding never counts)."""
    m = mask.to(logprobs.dtype)
    return m, torch.where(m > 0, logprobs - old_logprobs, torch.zeros_like(logprobs))


def _weighted_mean(per: Tensor, ratio: Tensor, is_clipped: Tensor, weight: Tensor) -> LossOutput:
    """The loss, clip fraction and mean ratio over the elements of weight 1 (tokens or sequences)."""
    denom = weight.sum().clamp(min=1.0)
    loss = (per * weight).sum() / denom
    with torch.no_grad():
        clip_fraction = float((is_clipped & (weight > 0)).sum() / denom)
        mean_ratio = float((ratio * weight).sum() / denom)
    return LossOutput(loss=loss, clip_fraction=clip_fraction, mean_ratio=mean_ratio)


def policy_loss(
    algo: str,
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps_low: float,
    clip_eps_high: float,
) -> LossOutput:
    """The loss of `algo` ("grpo" or "gspo"); ValueError for any other name."""
    losses = {"grpo": grpo_loss, "gspo": gspo_loss}
    if algo not in losses:
        raise ValueError(f"unknown policy loss '{algo}': expected one of {', '.join(losses)}.")
    return losses[algo](logprobs, old_logprobs, advantages, mask, clip_eps_low, clip_eps_high)


# Positions whose float32 log-softmax is computed at once: at most this many elements (64 MiB):
# 341 positions of a 49k vocabulary, 110 of a 152k one, the whole batch of the tiny demo model.
LOGPROB_CHUNK_ELEMENTS = 1 << 24


def completion_logprobs(logits: Tensor, input_ids: Tensor) -> Tensor:
    """out[b, t] = log p(input_ids[b, t+1] | logits[b, t]): [B, T, V], [B, T] → [B, T-1] float32,
    LOGPROB_CHUNK_ELEMENTS at a time (never the whole float32 [B, T, V], forward or backward)."""
    batch, length, vocab = logits.shape
    if batch == 0:
        return logits.new_zeros((0, max(length - 1, 0)), dtype=torch.float32)
    # The last position predicts nothing: it is scored against token 0 and dropped (its gradient is 0).
    targets = torch.nn.functional.pad(input_ids[:, 1:], (0, 1))
    scored = _TokenLogprobs.apply(logits.reshape(batch * length, vocab), targets.reshape(-1))
    return scored.view(batch, length)[:, :-1]


class _TokenLogprobs(torch.autograd.Function):
    """log p(targets[i] | logits[i]) for [N, V] logits and [N] targets, in chunks of positions.

    Autograd over slices of the logits would give each chunk's backward a zero gradient of the
    whole logits to copy its part into; here the backward writes each chunk's gradient,
    (onehot - softmax) * grad, into one gradient of the logits' shape and dtype."""

    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor) -> Tensor:
        rows, vocab = logits.shape
        per_chunk = max(1, LOGPROB_CHUNK_ELEMENTS // max(1, vocab))
        out = torch.empty(rows, dtype=torch.float32, device=logits.device)
        lse = torch.empty_like(out)
        for start in range(0, rows, per_chunk):
            part = logits[start : start + per_chunk].float()
            lse[start : start + per_chunk] = torch.logsumexp(part, dim=-1)
            picked = part.gather(-1, targets[start : start + per_chunk, None]).squeeze(-1)
            out[start : start + per_chunk] = picked - lse[start : start + per_chunk]
        ctx.save_for_backward(logits, targets, lse)
        ctx.per_chunk = per_chunk
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor, None]:
        logits, targets, lse = ctx.saved_tensors
        grad = torch.empty_like(logits)
        for start in range(0, logits.shape[0], ctx.per_chunk):
            end = start + ctx.per_chunk
            g = grad_out[start:end, None].float()
            part = (logits[start:end].float() - lse[start:end, None]).exp_().mul_(-g)  # a new tensor: logits kept
            grad[start:end] = part.scatter_add_(-1, targets[start:end, None], g)
        return grad, None
