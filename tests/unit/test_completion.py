"""Completion rules per trainer backend, over plain observations (no processes)."""

import pytest

from rlrun.rules.completion import (
    HfTarget,
    TrainerObservation,
    Verdict,
    fast_llm_finished,
    hf_finished,
)

# 10 steps × 16 samples per step (8 per pass × 2 passes) = 160 samples
HF = HfTarget(max_train_steps=10, samples_per_step=16)


def obs(samples, exit_code, done=False, step=10, seen=False, ckpt=None, ready=None):
    return TrainerObservation(
        samples_processed=samples,
        trainer_exit_code=exit_code,
        training_done=done,
        last_step=step,
        training_finished_seen=seen,
        last_checkpoint_step=ckpt,
        last_weights_ready_step=ready,
    )


def test_hf_samples_target_is_steps_times_the_configs_samples_per_step():
    from rlrun.config import compose

    cfg, _ = compose(["trainer.max_train_steps=10", "trainer.train_batch_size=32", "trainer.gradient_accumulation_passes=2"])
    target = HfTarget(cfg.trainer.max_train_steps, cfg.trainer.samples_per_step)
    assert target.samples_target == 640  # 10 * 32 * 2: the config's definition, not one of its own


def test_hf_one_sample_short_is_not_finished():
    v = hf_finished(HF, obs(159, 0, step=9))
    assert v == Verdict(False, "trainer exited 0 after 159 of 160 samples, without training_done")


def test_hf_at_target_with_exit_0_is_finished():
    v = hf_finished(HF, obs(160, 0))
    assert v.finished
    assert "160 of 160" in v.reason


def test_hf_at_target_while_still_running_is_not_finished():
    v = hf_finished(HF, obs(160, None))
    assert not v.finished
    assert "running" in v.reason


def test_hf_at_target_after_a_crash_is_not_finished():
    v = hf_finished(HF, obs(200, 1))
    assert not v.finished
    assert "code 1" in v.reason


def test_hf_training_done_with_exit_0_is_finished_before_the_count():
    v = hf_finished(HF, obs(100, 0, done=True, step=6))
    assert v.finished
    assert "training_done" in v.reason


def test_hf_training_done_while_running_is_not_finished():
    assert not hf_finished(HF, obs(100, None, done=True)).finished


# Fast-LLM overshoot: train_iters 400, docs_per_step 1024, but ~1043 documents consumed per step.
TRAIN_ITERS, DOCS_PER_STEP, OBSERVED_DOCS_PER_STEP = 400, 1024, 1043


def test_fast_llm_overshoot_does_not_finish_early():
    # the sample-counting rule's target: 400 * 1024 * 1 = 409_600 documents;
    # at 1043 docs/step it is crossed at step ceil(409_600 / 1043) = ceil(392.7) = 393
    naive = HfTarget(TRAIN_ITERS, DOCS_PER_STEP)
    assert naive.samples_target == 409_600
    at_393 = obs(393 * OBSERVED_DOCS_PER_STEP, None, step=393, ready=393)
    assert not fast_llm_finished(TRAIN_ITERS, at_393).finished
    # the trainer stopped there and said training_finished (as it does after SIGTERM), exit 0
    stopped = obs(393 * OBSERVED_DOCS_PER_STEP, 0, step=393, seen=True, ckpt=350, ready=393)
    stopped_a_step_earlier = obs(392 * OBSERVED_DOCS_PER_STEP, 0, step=392, seen=True, ckpt=350, ready=392)
    assert hf_finished(naive, stopped).finished and not hf_finished(naive, stopped_a_step_earlier).finished  # counting would stop here
    v = fast_llm_finished(TRAIN_ITERS, stopped)
    assert not v.finished
    assert v.reason == "interrupted at step 393 of 400"


def test_fast_llm_training_finished_after_interrupt_is_not_finished():
    o = obs(120 * 1043, 0, step=120, seen=True, ckpt=100, ready=120)
    v = fast_llm_finished(TRAIN_ITERS, o)
    assert not v.finished
    assert v.reason == "interrupted at step 120 of 400"


def test_fast_llm_finished_at_train_iters_with_exit_0():
    o = obs(400 * 1043, 0, step=400, seen=True, ckpt=400, ready=400)
    v = fast_llm_finished(TRAIN_ITERS, o)
    assert v.finished
    assert "400 of 400" in v.reason


@pytest.mark.parametrize(
    "checkpoint, weights_ready",
    [(400, None), (None, 400), (400, 399), (350, 400)],
)
def test_fast_llm_checkpoint_or_weights_ready_at_train_iters_suffices(checkpoint, weights_ready):
    o = obs(0, 0, step=400, seen=True, ckpt=checkpoint, ready=weights_ready)
    assert fast_llm_finished(TRAIN_ITERS, o).finished


@pytest.mark.parametrize(
    "exit_code, seen, word",
    [
        (None, True, "running"),
        (1, True, "code 1"),
        (-15, True, "code -15"),
        (0, False, "training_finished"),
    ],
)
def test_fast_llm_at_train_iters_needs_exit_0_and_the_event(exit_code, seen, word):
    o = obs(0, exit_code, step=400, seen=seen, ckpt=400, ready=400)
    v = fast_llm_finished(TRAIN_ITERS, o)
    assert not v.finished
    assert word in v.reason


def test_fast_llm_without_step_reports_uses_last_step():
    o = obs(0, 0, step=7, seen=True)
    assert fast_llm_finished(TRAIN_ITERS, o) == Verdict(False, "interrupted at step 7 of 400")


def test_the_fast_llm_rule_ignores_the_sample_count_the_hf_rule_accepts():
    many = obs(10**9, 0, step=10)
    assert hf_finished(HF, many).finished
    assert not fast_llm_finished(400, many).finished
