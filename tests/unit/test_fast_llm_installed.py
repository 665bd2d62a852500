"""Reading the installed Fast-LLM: where the program sits in a launch command, which Python runs
it, and what of its validation output is shown to the user (rules only; the processes are
exercised in tests/integration/test_fast_llm_standin.py and test_fast_llm_broadcast.py)."""

from __future__ import annotations

import sys

from rlrun.backends.fast_llm.installed import program_argv, program_python, refusal_summary, store_host
from rlrun.backends.fast_llm.revisions import REVISIONS, candidates, named
from rlrun.config import compose

# What the real Fast-LLM (PR #520, d3d20226) printed for rlrun's old config, trimmed.
REAL_REFUSAL = """\
2026-12-01 03:53:44,143 Traceback (most recent call last):
fast_llm.config.NestedValidationError: Validation failed for field `model` of type `fast_llm.models.gpt.config.GPTModelConfig` in class fast_llm.models.gpt.config.GPTTrainerConfig:
  Validation failed for field `base_model` of type `GPTBaseModelConfig` in class GPTModelConfig:
    Validation failed for field `head` of type `LanguageModelHeadConfig` in class GPTBaseModelConfig:
      Validation failed for field `losses` of type `dict[str, LanguageModelLossConfig]` in class LanguageModelHeadConfig:
        Validation failed for field `losses[grpo]`:
          Unknown field `!!! policy_loss` in class fast_llm.layers.language_model.loss.config.LanguageModelGRPOLossConfig
          Unknown field `!!! temperature` in class fast_llm.layers.language_model.loss.config.LanguageModelGRPOLossConfig
"""


def test_the_program_is_what_torchrun_runs():
    argv = ["torchrun", "--nproc_per_node=2", "--no_python", "fast-llm", "train", "gpt", "--config", "f.yaml"]
    assert program_argv(argv) == ["fast-llm", "train", "gpt", "--config", "f.yaml"]
    assert program_argv(["/venv/bin/torchrun", "--no_python"]) == []
    spaced = ["torchrun", "--nproc_per_node", "2", "--master_port", "29501", "--no_python", "fast-llm", "train"]
    assert program_argv(spaced) == ["fast-llm", "train"]  # an option's separate value is not the program
    standin = [sys.executable, "tests/fast_llm_standin.py", "--config", "f.yaml"]
    assert program_argv(standin) == standin


# The same validation error for keys of `training`, as Fast-LLM's fast_llm/config.py writes it: a
# failure with a message; and an unexpected exception (its message, then the stack trace's last line).
TRAINING_REFUSAL = """\
Traceback (most recent call last):
  File "/fast-llm/fast_llm/engine/config_utils/runnable.py", line 87, in parse_and_run
fast_llm.config.NestedValidationError: Validation failed for field `training` of type `TrainingConfig` in class fast_llm.models.gpt.config.GPTTrainerConfig:
  Validation failed for field `checkpoint` of type `TrainingCheckpointConfig` in class TrainingConfig:
    Validation failed for field `interval` in class TrainingCheckpointConfig: \n
====================== stack trace ========================
Traceback (most recent call last):
  File "/fast-llm/fast_llm/config.py", line 412, in _validate_nested
    value = value if valid_fn is None else valid_fn(value)
AssertionError: -1 >= 0
===========================================================

  Validation failed for field `train_iters` of type `int` in class TrainingConfig: Unexpected type `str`
"""


def test_a_refusal_names_each_key_by_its_whole_path():
    assert refusal_summary(REAL_REFUSAL) == (
        "`model.base_model.head.losses[grpo].policy_loss`: unknown key (in LanguageModelGRPOLossConfig) | "
        "`model.base_model.head.losses[grpo].temperature`: unknown key (in LanguageModelGRPOLossConfig)"
    )
    # The summary used to keep the innermost line only: `training` (and `checkpoint`) were dropped.
    assert refusal_summary(TRAINING_REFUSAL) == (
        "`training.checkpoint.interval`: AssertionError: -1 >= 0 | `training.train_iters`: Unexpected type `str`"
    )
    assert refusal_summary("ValueError: Qwen2BaseModelConverter: HF config has unknown key 'head_dim'\n") == (
        "ValueError: Qwen2BaseModelConverter: HF config has unknown key 'head_dim'"
    )
    many = "\n".join(["fast_llm.config.NestedValidationError: Validation failed for field `run` of type `RunConfig` in class C:"]
                     + [f"  Unknown field `!!! k{i}` in class RunConfig" for i in range(8)])  # fmt: skip
    assert refusal_summary(many).endswith("`run.k5`: unknown key (in RunConfig) | (and 2 more)")


def test_the_python_of_a_script_is_read_from_its_first_line(tmp_path):
    script = tmp_path / "fast-llm"
    script.write_text(f"#!{sys.executable}\nprint('hi')\n")
    script.chmod(0o755)
    assert program_python([str(script), "train"]) == sys.executable
    script.write_text("#!/usr/bin/env python3\n")
    assert program_python([str(script)]).endswith("python3")
    script.write_text("#!/bin/sh\nexec python -m fast_llm\n")
    assert program_python([str(script)]) is None  # a shell wrapper: cannot be told
    assert program_python([sys.executable, "x.py"]) == sys.executable
    assert program_python(["no-such-program-anywhere"]) is None


def test_the_store_host_is_the_users_choice_or_the_trainer_without_torchrun():
    chosen, _ = compose(["trainer=fast_llm", "trainer.fast_llm.broadcast_store=rlrun"])
    assert store_host(chosen) == "rlrun"
    plain, _ = compose(["trainer=fast_llm", f"trainer.fast_llm.command=[{sys.executable},standin.py,--config,'{{config}}']"])
    assert store_host(plain) == "trainer"  # no elastic agent: rank 0 hosts in every torch


def test_auto_tries_every_revision_most_specific_first():
    assert candidates("auto") == REVISIONS
    assert REVISIONS[0].docs_per_step and not REVISIONS[-1].docs_per_step  # main's config is accepted by all
    assert candidates("main") == (named("main"),)
    assert all(r.checked_against for r in REVISIONS)
