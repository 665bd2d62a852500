"""Rewards as code (rlrun/task/rewards.py): which function a name means, which calling convention
it has (rlrun's per sample, TRL's per group), what it is called with, and which answers count as
rewards. Calls here run in-process; the worker pool is tests/integration/test_reward_pool.py."""

from __future__ import annotations

import math
import textwrap

import pytest

from rlrun.task.rewards import (
    GroupCall,
    RewardSpec,
    SampleInfo,
    call_reward,
    convention,
    load_function,
    reward_in_process,
    reward_specs,
)

from tests.refusals import refusal as refused  # a TaskInputError is a ConfigError of exit 2

ROW = {"prompt": "2+3=", "answer": "5", "completion": "a column named like TRL's argument", "level": 2}


def group(texts: list[str], prompt="2+3=", row=ROW, conversational=False, versions=None) -> GroupCall:
    versions = versions or [0] * len(texts)
    infos = [SampleInfo("stop" if i % 2 == 0 else "length", 10 + i, i, v) for i, v in enumerate(versions)]
    return GroupCall(prompt, row, texts, [[i, i + 1] for i in range(len(texts))], infos, conversational)


def reward_file(tmp_path, source: str, name: str = "my_reward.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return str(path)


# --- naming the rewards --------------------------------------------------------------------------


def test_reward_specs_weigh_each_function_one_by_default():
    assert reward_specs(["a.py:score", "pkg.mod:check"], []) == [RewardSpec("a.py:score", 1.0), RewardSpec("pkg.mod:check", 1.0)]
    specs = reward_specs(["a.py:score", "pkg.mod:check"], [1, 0.5])
    assert [(s.name, s.weight) for s in specs] == [("score", 1.0), ("check", 0.5)]


def test_reward_specs_refuse_a_weight_count_that_does_not_match():
    refused(lambda: reward_specs(["a:f", "b:g"], [1.0]), "reward.weights has 1 values for 2 reward.functions")


@pytest.mark.parametrize("ref", ["score", "my_reward.py", "m:", "m:not-a-name", "m:2f"])
def test_reward_specs_refuse_a_ref_without_a_function_name(ref):
    refused(lambda: reward_specs([ref], []), f"reward.functions: {ref!r} is not module:function")


# --- importing them ---------------------------------------------------------------------------------


def test_load_function_from_a_file_and_from_a_module(tmp_path):
    path = reward_file(tmp_path, "def score(completion, row):\n    return float(completion == row['answer'])\n")
    assert load_function(f"{path}:score")("5", ROW) == 1.0
    from rlrun.task.scorers import exact_answer

    assert load_function("rlrun.task.scorers:exact_answer") is exact_answer


def test_load_function_refuses_a_missing_file(tmp_path):
    refused(lambda: load_function(f"{tmp_path}/nope.py:score"), f"reward {tmp_path}/nope.py:score: no file {tmp_path}/nope.py")


def test_load_function_refuses_a_module_that_does_not_import():
    refused(lambda: load_function("no_such_module_for_rlrun:score"), "cannot import module 'no_such_module_for_rlrun'", "ModuleNotFoundError")


def test_load_function_refuses_a_file_that_raises_on_import(tmp_path):
    path = reward_file(tmp_path, "import json\nraise RuntimeError('no verifier here')\n")
    refused(lambda: load_function(f"{path}:score"), f"importing {path} raised RuntimeError: no verifier here")


@pytest.mark.parametrize("source", ["def other(completion, row):\n    return 1.0\n", "score = 3\n"], ids=["absent", "not-callable"])
def test_load_function_refuses_a_file_without_the_function(tmp_path, source):
    path = reward_file(tmp_path, source)
    refused(lambda: load_function(f"{path}:score"), f"reward {path}:score: {path} has no function 'score'")


def test_load_function_refuses_a_signature_it_cannot_call(tmp_path):
    path = reward_file(tmp_path, "def score(completion):\n    return 1.0\n")
    refused(lambda: load_function(f"{path}:score"), "takes (completion)", "(completion, row, info)", "TRL's (prompts, completions, **kwargs)")


# --- the calling convention --------------------------------------------------------------------------


def _two(completion, row): ...
def _three(completion, row, info): ...
def _optional_info(completion, row, info=None): ...
def _varargs(completion, *rest): ...
def _trl(prompts, completions, **kwargs): ...
def _trl_named(completions, answer): ...
async def _async_three(completion, row, info): ...
def _one(completion): ...
def _four(completion, row, info, extra): ...
def _none(): ...
def _keywords_only(*, completion, row): ...


@pytest.mark.parametrize(
    "function, expected",
    [(_two, "rlrun"), (_three, "rlrun"), (_optional_info, "rlrun"), (_varargs, "rlrun"), (_async_three, "rlrun"), (_trl, "trl"), (_trl_named, "trl")],
)

def test_convention(function, expected):
    assert convention(function, "f") == expected


@pytest.mark.parametrize("function", [_one, _four, _none, _keywords_only])
def test_a_signature_neither_convention_fits_is_refused(function):
    refused(lambda: convention(function, "m:f"), "reward m:f: takes (", "a reward takes (completion, row, info) or (completion, row)")


# --- rlrun's convention: once per sample ---------------------------------------------------------------


def test_rlrun_convention_two_parameters_get_the_text_and_the_row():
    seen = []

    def score(completion, row):
        seen.append((completion, row))
        return completion == row["answer"]

    assert call_reward(score, group(["5", "6", " 5"])) == [1.0, 0.0, 0.0]
    assert seen == [("5", ROW), ("6", ROW), (" 5", ROW)]


def test_rlrun_convention_three_parameters_get_each_samples_info():
    infos = []

    def score(completion, row, info):
        infos.append(info)
        return -1 if info.finish_reason == "length" else 0.5

    call = group(["a", "b", "c"], versions=[3, 4, 4])
    assert call_reward(score, call) == [0.5, -1.0, 0.5]
    assert infos == call.infos
    assert [(i.index, i.num_tokens, i.policy_version) for i in infos] == [(0, 10, 3), (1, 11, 4), (2, 12, 4)]


def test_rlrun_convention_a_dict_of_components_is_summed():
    assert call_reward(lambda completion, row: {"format": 0.25, "correct": 1, "nested": {"a": 0.5}}, group(["5"])) == [1.75]


@pytest.mark.parametrize("answer", ["1.0", None, [1.0], {"ok": "yes"}, float("nan"), math.inf], ids=repr)
def test_an_answer_that_is_not_a_finite_number_is_refused(answer):
    with pytest.raises(ValueError, match="returned .*not a (finite )?number"):
        call_reward(lambda completion, row: answer, group(["5"]))


def test_numpy_scalars_and_bools_are_numbers():
    np = pytest.importorskip("numpy")
    assert call_reward(lambda completion, row: np.float32(0.5), group(["5"])) == [0.5]
    assert call_reward(lambda completion, row: True, group(["5"])) == [1.0]


def test_what_the_reward_raises_reaches_the_caller():
    def score(completion, row):
        raise KeyError("solution")

    with pytest.raises(KeyError, match="solution"):
        call_reward(score, group(["5"]))


def test_an_async_rlrun_reward():
    async def score(completion, row, info):
        return float(completion == row["answer"]) + info.index

    assert call_reward(score, group(["5", "5"])) == [1.0, 2.0]


# --- TRL's convention: once per group ----------------------------------------------------------------


def test_trl_convention_a_list_per_group_with_the_columns_as_lists():
    calls = []

    def accuracy(prompts, completions, completion_ids, answer, level, **kwargs):
        calls.append(dict(prompts=prompts, completions=completions, completion_ids=completion_ids, answer=answer, level=level, **kwargs))
        return [float(c == a) for c, a in zip(completions, answer)]

    call = group(["5", "4", "5"], versions=[2, 3, 3])
    assert call_reward(accuracy, call) == [1.0, 0.0, 1.0]
    (seen,) = calls
    assert seen["prompts"] == ["2+3="] * 3 and seen["completions"] == ["5", "4", "5"]
    assert seen["completion_ids"] == [[0, 1], [1, 2], [2, 3]]
    assert seen["answer"] == ["5"] * 3 and seen["level"] == [2] * 3
    assert "prompt" not in seen and "completion" not in seen  # the row's own prompt/completion columns would clash with TRL's
    assert seen["trainer_state"].global_step == 3


def test_trl_convention_none_scores_nothing_for_that_sample():
    assert call_reward(lambda prompts, completions, **kw: [1, None, 0.5], group(["a", "b", "c"])) == [1.0, None, 0.5]


@pytest.mark.parametrize("answer", [[1.0, 0.0], [1.0, 0.0, 1.0, 0.0], 1.0, None], ids=["short", "long", "scalar", "none"])
def test_trl_convention_an_answer_that_is_not_one_reward_per_completion_is_refused(answer):
    with pytest.raises(ValueError, match="not a list of 3 rewards"):
        call_reward(lambda prompts, completions, **kw: answer, group(["a", "b", "c"]))


def test_trl_convention_a_non_number_in_the_list_is_refused():
    with pytest.raises(ValueError, match="not a number"):
        call_reward(lambda prompts, completions, **kw: [1.0, "1"], group(["a", "b"]))


def test_trl_convention_only_the_declared_parameters_without_kwargs():
    def accuracy(completions, answer):
        return [float(c == a) for c, a in zip(completions, answer)]

    assert call_reward(accuracy, group(["5", "4"])) == [1.0, 0.0]


def test_trl_convention_conversational_prompts_and_completions():
    messages = ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3?"})
    seen = {}

    def accuracy(prompts, completions, **kwargs):
        seen.update(prompts=prompts, completions=completions)
        return [float(c[0]["content"] == "5") for c in completions]

    assert call_reward(accuracy, group(["5", "4"], prompt=messages, conversational=True)) == [1.0, 0.0]
    assert seen["prompts"] == [list(messages)] * 2
    assert seen["completions"] == [[{"role": "assistant", "content": "5"}], [{"role": "assistant", "content": "4"}]]


def test_trl_convention_a_text_prompt_in_a_conversational_call_becomes_a_user_message():
    seen = {}

    def accuracy(prompts, completions):
        seen["prompts"] = prompts
        return [0.0] * len(completions)

    call_reward(accuracy, group(["5"], prompt="2+3=", conversational=True))
    assert seen["prompts"] == [[{"role": "user", "content": "2+3="}]]


def test_an_async_trl_reward():
    async def accuracy(prompts, completions, answer, **kwargs):
        return [float(c == a) for c, a in zip(completions, answer)]

    assert call_reward(accuracy, group(["5", "x"])) == [1.0, 0.0]


# --- in process, weighted ------------------------------------------------------------------------------


def test_reward_in_process_is_the_weighted_sum(tmp_path):
    path = reward_file(tmp_path, """
        def correct(completion, row):
            return float(completion.strip() == row["answer"])

        def short(prompts, completions, **kwargs):
            return [None if len(c) > 3 else 1.0 for c in completions]
    """)  # fmt: skip
    reward = reward_in_process(reward_specs([f"{path}:correct", f"{path}:short"], [1.0, 0.25]))
    assert reward("5", "2+3=", ROW) == 1.25
    assert reward("four", "2+3=", ROW) == 0.0  # short scored nothing (None): it adds 0
