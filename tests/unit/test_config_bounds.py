"""Every numeric key's range comes from its annotation in the schema (rlrun/config/bounds.py): no
numeric key without one, the rule as a pure function, and the check over a whole RunConfig."""

from __future__ import annotations

import dataclasses
import math

import pytest

from rlrun.config import compose, schema
from rlrun.config.bounds import INT64_MAX, MAX_SECONDS, Range, numeric_keys, problems, range_of
from rlrun.config.build import validate
from rlrun.errors import ConfigError
from rlrun.inference.server import extra_args_problems


def test_every_numeric_key_of_the_schema_has_a_range():
    """A new int or float key without a Range fails here: its bounds are declared where it is."""
    keys = numeric_keys(schema.RunConfig)
    assert len(keys) > 50 and "trainer.betas[]" in [k for k, _ in keys] and "world.vllm.resources[]" in [k for k, _ in keys]
    missing = [key for key, annotation in keys if range_of(annotation) is None]
    assert not missing, f"numeric keys without a Range in rlrun/config/schema.py: {missing}"


@pytest.mark.parametrize(
    "bounds, admitted, refused, said",
    [
        (Range(1, INT64_MAX), [1, 7, INT64_MAX], [0, -3, INT64_MAX + 1], "at least 1"),
        (Range(0, INT64_MAX), [0, 5], [-1], "0 or more"),
        (Range(0, open_low=True), [1e-12, 3.0], [0.0, -1.0], "greater than 0"),
        (Range(0, MAX_SECONDS, open_low=True), [0.5, MAX_SECONDS], [0.0, MAX_SECONDS * 2], "greater than 0"),
        (Range(0, 1, open_low=True), [1e-9, 1.0], [0.0, 1.01], "in (0, 1]"),
        (Range(0, 1, open_high=True), [0.0, 0.99], [1.0, -0.1], "in [0, 1)"),
        (Range(0, 65535), [0, 65535], [-1, 65536], "in [0, 65535]"),
    ],
)
def test_a_range_admits_and_describes(bounds, admitted, refused, said):
    assert all(bounds.admits(v) for v in admitted) and not any(bounds.admits(v) for v in refused)
    assert bounds.describe() == said


def _with(cfg, key: str, value):
    """`cfg` with the dotted `key` set to `value` (frozen dataclasses rebuilt on the way down)."""
    head, _, rest = key.partition(".")
    if not rest:
        return dataclasses.replace(cfg, **{head: value})
    return dataclasses.replace(cfg, **{head: _with(getattr(cfg, head), rest, value)})


@pytest.mark.parametrize(
    "key, value, said",
    [
        ("trainer.lr", math.inf, "trainer.lr must be a finite number (got inf)."),
        ("trainer.lr", 0.0, "trainer.lr must be greater than 0 (got 0)."),
        ("trainer.weight_decay", math.nan, "trainer.weight_decay must be a finite number (got nan)."),
        ("trainer.max_train_steps", 0, "trainer.max_train_steps must be at least 1 (got 0)."),
        ("trainer.max_train_steps", 10**30, f"trainer.max_train_steps must be at most {INT64_MAX} (got {10**30})."),
        ("trainer.betas", [0.9, 1.5], "trainer.betas[1] must be in [0, 1) (got 1.5)."),
        ("algo.group_size", 1, "algo.group_size must be at least 2: advantages compare the samples of a group (got 1)."),
        ("supervisor.trainer.max_restarts", -1, "supervisor.trainer.max_restarts must be 0 or more (got -1)."),
        ("supervisor.poll_interval_s", 1e300, f"supervisor.poll_interval_s must be at most {int(MAX_SECONDS)} (got 1e+300)."),
        ("trainer.fast_llm.broadcast_port", 70000, "trainer.fast_llm.broadcast_port must be in [0, 65535]: 0 picks a free port (got 70000)."),
        ("trainer.fast_llm.docs_per_step", 0, "trainer.fast_llm.docs_per_step must be at least 1 (got 0)."),
        ("world.vllm.resources", {"node": -1.0}, "world.vllm.resources.node must be 0 or more (got -1)."),
        ("run.dir", "/runs/a\nb", "run.dir holds a control character (a newline, a tab, ...): '/runs/a\\nb'. Give it on one line."),
        ("inference.extra_args", ["--x\tY"], "inference.extra_args[0] holds a control character"),
    ],
)
def test_a_value_out_of_its_range_is_named_by_its_key(key, value, said):
    cfg, _ = compose([])
    assert problems(cfg) == []
    found = problems(_with(cfg, key, value))
    assert len(found) == 1 and found[0].startswith(said), found
    with pytest.raises(ConfigError, match="invalid configuration: " + key.split(".")[0]):
        validate(_with(cfg, key, value))


def test_an_optional_count_left_unset_is_fine_and_free_form_values_are_not_checked():
    cfg, _ = compose(["trainer=fast_llm", "trainer.device=cpu"])
    assert cfg.trainer.fast_llm.docs_per_step is None
    extra = _with(cfg, "trainer.fast_llm.extra", {"note": "a\nb", "lr": -1.0})  # Fast-LLM's own YAML: Fast-LLM checks it
    assert problems(extra) == []


@pytest.mark.parametrize(
    "args, flag",
    [
        (["--host", "0.0.0.0"], "--host"),
        (["--host=0.0.0.0"], "--host"),
        (["--hos", "0.0.0.0"], "--host"),  # argparse takes a unique prefix
        (["--api_key", "x"], "--api-key"),  # vLLM's parser takes underscores
        (["--middleware", "x.Y"], "--middleware"),
        (["--uds", "/tmp/s"], "--uds"),
        (["--grpc-port", "5"], "--grpc-port"),
        (["--config", "serve.yaml"], "--config"),
        (["--weight-transfer-config.backend", "nccl"], "--weight-transfer-config"),
        (["--max-model-len", "9"], "--max-model-len"),
        (["-tp", "2"], "--tensor-parallel-size"),  # vLLM's short alias: a server's GPUs are placed by inference.tensor_parallel_size
        (["-tp=2"], "--tensor-parallel-size"),
    ],
)
def test_extra_args_cannot_set_what_rlrun_sets(args, flag):
    (problem,) = extra_args_problems(args)
    assert f"(vLLM's {flag})" in problem and "Remove it from inference.extra_args" in problem


def test_extra_args_that_rlrun_does_not_set_pass():
    assert extra_args_problems(["--max-num-seqs", "4", "--tokenizer-mode", "auto", "-pp", "2", "--", "x"]) == []
