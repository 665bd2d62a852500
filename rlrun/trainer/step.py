"""One optimizer step of the hf trainer, on one rank or many: collate, forward, loss, backward, step.

The step's samples are cut into `gradient_accumulation_passes` micro-batches of
`train_batch_size`, in stream order; rank r takes the r-th contiguous share. Ranks average their
gradients, so each scales its passes by world_size / passes: 2 ranks take the 1-rank step.
"""

from __future__ import annotations

from rlrun.trainer.parallel import Parallel


def micro_batches(samples: list, per_pass: int, passes: int, rank: int, world_size: int) -> list[list]:
    """This rank's micro-batches: the rank-th contiguous share of the step's `passes`."""
    every = [samples[start : start + per_pass] for start in range(0, len(samples), per_pass)]
    if len(every) != passes or passes % world_size:
        raise ValueError(
            f"{len(samples)} samples in {per_pass}-sample passes are not {passes} passes split evenly over {world_size} ranks"
        )
    share = passes // world_size
    return every[rank * share : (rank + 1) * share]


def optimizer_step(model, optimizer, samples: list, cfg, parallel: Parallel, device, policy_version: int = 0) -> dict:
    """Take one optimizer step on `samples` ([(prompt_ids, Sample)], the whole step's, identical
    on every rank) with the weights of `policy_version`; returns the step's metrics (the same on
    every rank), among them how far the trainer's log-probs are from vLLM's on the tokens vLLM
    sampled with these very weights (`logprob_diff_*`: noise, unless the two disagree about them)."""
    import torch

    from rlrun.trainer.losses import completion_logprobs, policy_loss

    t, algo = cfg.trainer, cfg.algo
    world = parallel.ranks.world_size
    mine = micro_batches(samples, t.train_batch_size, t.gradient_accumulation_passes, parallel.ranks.rank, world)
    scale = world / t.gradient_accumulation_passes
    optimizer.zero_grad(set_to_none=True)
    loss_sum = clip_sum = ratio_sum = 0.0
    diff_sum = diff_count = diff_max = 0.0
    for i, part in enumerate(mine):
        batch = collate(part, device, policy_version)
        ids, first = batch["input_ids"], scored_from(batch["mask"])
        mask, old = batch["mask"][:, first + 1 :], batch["old_logprobs"][:, first + 1 :]
        with parallel.accumulating(model, sync=i == len(mine) - 1), parallel.autocast(t.mixed_precision):
            # Logits of the positions from `first` on only: the prompt's before them are never read.
            logits = model(
                input_ids=ids, attention_mask=batch["attention_mask"], logits_to_keep=ids.shape[1] - first
            ).logits
            logprobs = completion_logprobs(logits, ids[:, first:])
            out = policy_loss(
                algo.name, logprobs, old, batch["advantages"], mask, algo.clip_eps_low, algo.clip_eps_high
            )
            (out.loss * scale).backward()
        with torch.no_grad():
            same_weights = mask * batch["sampled_by_current"][:, None]
            diff = (logprobs.detach().float() - old).abs() * same_weights
            diff_sum += diff.sum().item()
            diff_count += same_weights.sum().item()
            diff_max = max(diff_max, diff.max().item() if diff.numel() else 0.0)
        loss_sum += out.loss.detach().item()
        clip_sum += out.clip_fraction
        ratio_sum += out.mean_ratio
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
    if hasattr(grad_norm, "full_tensor"):  # FSDP2: a DTensor, already reduced over the shards
        grad_norm = grad_norm.full_tensor()
    optimizer.step()
    loss_sum, clip_sum, ratio_sum, diff_sum, diff_count = parallel.sum(
        [loss_sum, clip_sum, ratio_sum, diff_sum, diff_count]
    )
    (diff_max,) = parallel.max([diff_max])
    passes = t.gradient_accumulation_passes
    return {
        "loss": loss_sum / passes,
        "clip_fraction": clip_sum / passes,
        "mean_ratio": ratio_sum / passes,
        "grad_norm": float(grad_norm),
        "logprob_diff_mean": diff_sum / diff_count if diff_count else None,
        "logprob_diff_max": diff_max if diff_count else None,
        "logprob_diff_tokens": int(diff_count),
    }


def scored_from(mask) -> int:
    """The first position whose next-token log-prob the loss reads: the one before the earliest
    scored token of the batch (`mask` [B, T]: a sampled token, never an observation); the last
    position when no token is scored."""
    scored = mask[:, 1:].any(dim=0).nonzero()
    return int(scored[0]) if len(scored) else mask.shape[1] - 1


def collate(samples, device, policy_version: int = 0) -> dict:
    """Pad prompt+completion sequences; mask and old log-probs are aligned with input_ids, the mask
    1 on the tokens the model sampled only (0 on prompt, observations, padding);
    `sampled_by_current` is 1 for a sample whose every sampled token vLLM sampled with
    `policy_version` (not one spanning an update: its later tokens saw keys and values the earlier
    weights computed; an observation's version says nothing about the weights, so it is skipped)."""
    import torch

    length = max(len(p) + len(s.completion_ids) for p, s in samples)
    n = len(samples)
    input_ids = torch.zeros((n, length), dtype=torch.long)
    attention = torch.zeros((n, length), dtype=torch.long)
    mask = torch.zeros((n, length), dtype=torch.float32)
    old = torch.zeros((n, length), dtype=torch.float32)
    advantages = torch.zeros(n, dtype=torch.float32)
    current = torch.zeros(n, dtype=torch.float32)
    for row, (prompt, sample) in enumerate(samples):
        seq = list(prompt) + list(sample.completion_ids)
        input_ids[row, : len(seq)] = torch.tensor(seq)
        attention[row, : len(seq)] = 1
        mask[row, len(prompt) : len(seq)] = 1.0
        for start, end in sample.observation_spans:  # not sampled: no loss, no ratio, no diff metric
            mask[row, len(prompt) + start : len(prompt) + end] = 0.0
        old[row, len(prompt) : len(seq)] = torch.tensor(sample.logprobs, dtype=torch.float32)
        advantages[row] = sample.advantage
        versions = sample.sampled(sample.versions)
        current[row] = float(bool(versions) and all(v == policy_version for v in versions))
    return {
        "input_ids": input_ids.to(device),
        "attention_mask": attention.to(device),
        "mask": mask.to(device),
        "old_logprobs": old.to(device),
        "advantages": advantages.to(device),
        "sampled_by_current": current.to(device),
    }
