"""dataset=reasoning_gym: problems from the reasoning-gym library, scored by its own verifier on the
answer extracted as `dataset.answer_format` says."""

from __future__ import annotations

import pytest

from rlrun.config import compose
from rlrun.task import scorers
from rlrun.task.reasoning_gym import INSTRUCTIONS, last_number, reasoning_gym_rows
from rlrun.task.tasks import load_task
from rlrun.errors import ConfigError

def reasoning_gym_task(task, task_args, num_problems, seed, answer_format):
    """(rows, reward) as the task builds them: rows from the library, scored by the built-in scorer."""
    rows = reasoning_gym_rows(task, task_args, num_problems, seed, answer_format)
    return [Row(r) for r in rows], lambda completion, row: scorers.reasoning_gym(completion, row)


class Row(dict):
    """A row read like the problem it was: .prompt, .answer, .scoring (the library's entry)."""

    prompt = property(lambda self: self["prompt"])
    answer = property(lambda self: self["answer"])
    scoring = property(lambda self: self["entry"])


SUMS = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("12 + 7 = 19.", "19"),
        ("The answer is -28", "-28"),
        ("1,000 apples, so 1,250", "1250"),
        ("3.5 then 2.25", "2.25"),
        ("no number here", None),
        ("", None),
    ],
)
def test_last_number_is_the_last_number_written(completion, expected):
    assert last_number(completion) == expected


def test_problems_are_the_librarys_with_the_instruction_and_its_answer():
    import reasoning_gym

    problems, _ = reasoning_gym_task("chain_sum", SUMS, 20, seed=3, answer_format="last_number")
    library = reasoning_gym.create_dataset("chain_sum", seed=3, size=20, **SUMS)
    assert len(problems) == 20
    for problem, entry in zip(problems, library):
        assert problem.prompt == f"{entry['question'].rstrip()}\n{INSTRUCTIONS['last_number']}"
        assert problem.answer == entry["answer"] and problem.scoring == entry


def test_same_seed_same_problems_other_seed_others():
    first, _ = reasoning_gym_task("chain_sum", SUMS, 30, seed=0, answer_format="last_number")
    again, _ = reasoning_gym_task("chain_sum", SUMS, 30, seed=0, answer_format="last_number")
    other, _ = reasoning_gym_task("chain_sum", SUMS, 30, seed=1, answer_format="last_number")
    assert [p.prompt for p in first] == [p.prompt for p in again]
    assert [p.prompt for p in first] != [p.prompt for p in other]


def test_the_librarys_scorer_rewards_the_extracted_answer_only():
    problems, reward = reasoning_gym_task("chain_sum", SUMS, 10, seed=0, answer_format="last_number")
    problem = problems[0]
    right, wrong = problem.answer, str(int(problem.answer) + 1)
    assert reward(f"So the sum is {right}.", problem) == 1.0
    assert reward(f"{right} + 1 = {wrong}", problem) == 0.0  # the last number counts, not any
    assert reward("I cannot say.", problem) == 0.0
    assert reward(right, problems[1]) == (1.0 if problems[1].answer == right else 0.0)  # scored against its own problem

    problems, reward = reasoning_gym_task("chain_sum", SUMS, 10, seed=0, answer_format="answer_tag")
    problem = problems[0]
    assert "<answer>" in problem.prompt
    assert reward(f"thinking 1 2 3 <answer>{right}</answer>", problem) == 1.0
    assert reward(f"the sum is {right}", problem) == 0.0  # no tag: no answer, as the library extracts it
    assert reward(f"<answer>{wrong}</answer>", problem) == 0.0


def test_a_task_with_its_own_scorer_uses_it():
    """leg_counting's answer is a number the library compares its own way; gsm_symbolic's scorer
    gives partial credit to near answers: the reward is whatever the library says."""
    import reasoning_gym

    problems, reward = reasoning_gym_task("gsm_symbolic", {}, 5, seed=0, answer_format="last_number")
    library = reasoning_gym.create_dataset("gsm_symbolic", seed=0, size=5)
    for problem, entry in zip(problems, library):
        assert reward(f"The result is {entry['answer']}", problem) == library.score_answer(entry["answer"], entry) == 1.0
        assert reward("The result is 0.5", problem) == library.score_answer("0.5", entry)


@pytest.mark.parametrize(
    "task, args, fragments",
    [
        (None, {}, ["dataset.task", "chain_sum"]),
        ("no_such_task", {}, ["dataset.task=no_such_task is not a reasoning-gym task", "chain_sum"]),
        ("chain_sum", {"colour": "blue"}, ["dataset.task_args", "chain_sum", "colour"]),
        ("chain_sum", {"min_terms": 3, "max_terms": 2}, ["dataset.task_args", "max_terms must be >= min_terms"]),
    ],
)
def test_a_task_that_does_not_exist_or_does_not_take_the_arguments_is_a_config_error(task, args, fragments):
    with pytest.raises(ConfigError) as info:
        reasoning_gym_task(task, args, 10, seed=0, answer_format="last_number")
    for fragment in fragments:
        assert fragment in str(info.value)


def test_dataset_reasoning_gym_composes_and_loads_as_a_task():
    cfg, _ = compose(["model=smollm2_135m", "dataset=reasoning_gym", "dataset.task=chain_sum", "dataset.num_problems=12"])
    task = load_task(cfg.dataset, cfg.run.seed)
    assert len(task.problems) == 12 and "<answer>" in task.problems[0].prompt  # the library's answer format by default
    assert [r.ref for r in task.rewards] == ["rlrun.task.scorers:reasoning_gym"]
    assert scorers.reasoning_gym(f"<answer>{task.problems[0].answer}</answer>", task.problems[0].row) == 1.0
    cfg, _ = compose(["recipe=smollm2_grpo"])
    task = load_task(cfg.dataset, cfg.run.seed)
    assert len(task.problems) == cfg.dataset.num_problems and cfg.dataset.task == "basic_arithmetic"
    assert scorers.reasoning_gym(task.problems[0].answer, task.problems[0].row) == 1.0


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        (["model=smollm2_135m", "dataset=reasoning_gym", "dataset.task=null"], "dataset=reasoning_gym needs dataset.task"),
        (["dataset.task=chain_sum"], "dataset.task has no effect here"),
        (["model=tiny", "model.chat_template=true"], "the tiny model has no chat template"),
    ],
)
def test_reasoning_gym_and_chat_settings_that_cannot_work_are_refused(overrides, fragment):
    with pytest.raises(ConfigError) as info:
        compose(overrides)
    assert fragment in str(info.value)
