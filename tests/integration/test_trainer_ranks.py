"""Two trainer ranks take the same optimizer step as one (rlrun/trainer/step.py, parallel.py).

One batch of groups, one step, GRPO and GSPO, FSDP2 and DDP over gloo on loopback, with the
trainer's fused AdamW: the 2-rank loss, clip fraction, grad norm and updated weights equal the
1-rank ones. Tolerance: 1e-5
relative on the scalars, 2e-6 absolute on the weights (lr 1e-3: one Adam step moves a weight by
about 1e-3, so a wrong normalisation, a rank that skipped its share or a missing gradient
average moves them by ~1e-3 and fails by three orders of magnitude).
"""

from __future__ import annotations

import random
import socket

import pytest
import torch

from rlrun.config import compose
from rlrun.streams.rollouts import Group, Sample

CASES = [(algo, sharding) for algo in ("grpo", "gspo") for sharding in ("fsdp2", "ddp")]
GROUP_SIZE = 4


def overrides(algo: str) -> list[str]:
    # 4 passes of 8 samples (2 groups each): 2 passes per rank.
    return [f"recipe=math_{algo}", f"algo.group_size={GROUP_SIZE}", "trainer.train_batch_size=8",
            "trainer.gradient_accumulation_passes=4", "trainer.lr=1e-3", "trainer.grad_clip=100.0"]  # fmt: skip


def groups(seed: int = 0) -> list[Group]:
    """8 groups of varied lengths; behaviour log-probs off the model's, so ratios are not 1."""
    rng = random.Random(seed)
    out = []
    for g in range(8):
        prompt = [rng.randrange(1, 32) for _ in range(rng.randint(2, 6))]
        samples = []
        for i in range(GROUP_SIZE):
            n = rng.randint(1, 7)
            samples.append(Sample(i, [rng.randrange(1, 32) for _ in range(n)], [-rng.uniform(2.5, 4.5) for _ in range(n)],
                                  [0] * n, "stop", float(i % 2), rng.uniform(-1.5, 1.5)))  # fmt: skip
        out.append(Group(f"run/{g}", g, prompt, samples))
    return out


def one_step(model_path: str, algo: str, parallel, extra: tuple[str, ...] = ()) -> tuple[dict, dict]:
    from transformers import AutoModelForCausalLM

    from rlrun.trainer.loop import adamw
    from rlrun.trainer.step import optimizer_step

    cfg, _ = compose([*overrides(algo), *extra])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    model.train()
    wrapped = parallel.wrap(model, cfg.trainer.mixed_precision, cfg.trainer.activation_checkpointing)
    optimizer = adamw(wrapped.parameters(), cfg.trainer)  # as the trainer builds it: fused, over DTensors with FSDP2
    assert optimizer.defaults["fused"]
    samples = [(g.prompt_ids, s) for g in groups() for s in g.samples]
    metrics = optimizer_step(wrapped, optimizer, samples, cfg, parallel, torch.device("cpu"))
    return metrics, parallel.full_state_dict(wrapped)


def rank_main(rank: int, port: int, model_path: str, out: str) -> None:
    from rlrun.trainer.parallel import Parallel, Ranks

    results = {}
    ranks = Ranks(rank=rank, world_size=2, master_addr="127.0.0.1", master_port=port)
    parallels = []
    for algo, sharding in CASES:
        parallel = Parallel(ranks, sharding)
        parallels.append(parallel)
        assert parallel.sharding == sharding
        results[(algo, sharding)] = one_step(model_path, algo, parallel)
    if rank == 0:
        torch.save(results, out)
    parallels[0].close()


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> str:
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(vocab_size=32, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=1,
                         num_key_value_heads=1, tie_word_embeddings=False, max_position_embeddings=64)  # fmt: skip
    torch.manual_seed(1)
    path = tmp_path_factory.mktemp("model") / "m"
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def two_ranks(model_path, tmp_path_factory) -> dict:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = str(tmp_path_factory.mktemp("ranks") / "results.pt")
    # spawn, not fork: a fork of a process whose torch thread pool already ran (any earlier test in
    # the same pytest process) deadlocks in the children's first matmul
    mp.start_processes(rank_main, args=(port, model_path, out), nprocs=2, join=True, start_method="spawn")
    return torch.load(out, weights_only=False)


@pytest.mark.parametrize("algo,sharding", CASES)
def test_two_ranks_take_the_one_rank_step(algo, sharding, model_path, two_ranks):
    from rlrun.trainer.parallel import Parallel, Ranks

    one_metrics, one_weights = one_step(model_path, algo, Parallel(Ranks()))
    two_metrics, two_weights = two_ranks[(algo, sharding)]
    for key in ("loss", "clip_fraction", "mean_ratio", "grad_norm", "logprob_diff_mean", "logprob_diff_max", "logprob_diff_tokens"):
        assert two_metrics[key] == pytest.approx(one_metrics[key], rel=1e-5, abs=1e-7), key
    assert one_metrics["loss"] != 0.0 and one_metrics["mean_ratio"] != pytest.approx(1.0, abs=1e-3)
    assert set(two_weights) == set(one_weights)
    worst = max((two_weights[k] - one_weights[k]).abs().max().item() for k in one_weights)
    assert worst < 2e-6, f"2-rank weights differ from 1-rank by {worst}"


def test_the_step_moved_the_weights(model_path):
    """The comparison above means something: one step moves the weights by ~lr, far above the tolerance."""
    from transformers import AutoModelForCausalLM

    from rlrun.trainer.parallel import Parallel, Ranks

    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).state_dict()
    _, after = one_step(model_path, "grpo", Parallel(Ranks()))
    moved = max((after[k] - base[k]).abs().max().item() for k in base)
    assert moved > 5e-4


def test_a_rank_takes_its_contiguous_share_of_the_passes():
    from rlrun.trainer.step import micro_batches

    samples = list(range(16))
    assert micro_batches(samples, 4, 4, 0, 2) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert micro_batches(samples, 4, 4, 1, 2) == [[8, 9, 10, 11], [12, 13, 14, 15]]
    assert micro_batches(samples, 4, 4, 0, 1) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    with pytest.raises(ValueError):
        micro_batches(samples, 4, 4, 0, 3)


def test_activation_checkpointing_recomputes_the_same_step(model_path):
    from rlrun.trainer.parallel import Parallel, Ranks

    plain_metrics, plain = one_step(model_path, "gspo", Parallel(Ranks()))
    ckpt_metrics, ckpt = one_step(model_path, "gspo", Parallel(Ranks()), ("trainer.activation_checkpointing=true",))
    assert ckpt_metrics["loss"] == pytest.approx(plain_metrics["loss"], rel=1e-6)
    assert max((ckpt[k] - plain[k]).abs().max().item() for k in plain) < 1e-6


def test_bf16_mixed_precision_takes_nearly_the_fp32_step_and_keeps_fp32_weights(model_path):
    from rlrun.trainer.parallel import Parallel, Ranks

    fp32_metrics, fp32 = one_step(model_path, "grpo", Parallel(Ranks()))
    bf16_metrics, bf16 = one_step(model_path, "grpo", Parallel(Ranks()), ("trainer.mixed_precision=bf16",))
    assert {t.dtype for t in bf16.values()} == {torch.float32}  # master weights stay fp32
    assert bf16_metrics["loss"] == pytest.approx(fp32_metrics["loss"], rel=0.05, abs=1e-3)
    assert bf16_metrics["loss"] != fp32_metrics["loss"]  # it did compute in bf16
