"""The arithmetic dataset: which sums are generated, in which order, and how answers are scored."""

from __future__ import annotations

import pytest

from rlrun.task.arithmetic import Sum, arithmetic_problems
from rlrun.task.scorers import exact_answer
from rlrun.errors import ConfigError


def _pairs(problems: list[Sum]) -> set[tuple[int, int]]:
    out = set()
    for p in problems:
        left, right = p.prompt.removesuffix("=").split("+")
        out.add((int(left), int(right)))
    return out


def test_every_pair_once_when_asking_for_all_of_them():
    problems = arithmetic_problems(max_operand=9, num_problems=100, seed=0)
    assert len(problems) == 100
    assert _pairs(problems) == {(a, b) for a in range(10) for b in range(10)}


def test_asking_for_more_than_exist_gives_all_without_repeats():
    problems = arithmetic_problems(max_operand=2, num_problems=50, seed=0)
    assert len(problems) == 9
    assert _pairs(problems) == {(a, b) for a in range(3) for b in range(3)}


def test_sample_is_distinct_and_within_range():
    problems = arithmetic_problems(max_operand=99, num_problems=300, seed=5)
    pairs = _pairs(problems)
    assert len(problems) == 300
    assert len(pairs) == 300  # no repetition
    assert all(0 <= a <= 99 and 0 <= b <= 99 for a, b in pairs)


def test_prompt_and_answer_format():
    for p in arithmetic_problems(max_operand=12, num_problems=169, seed=1):
        left, right = p.prompt.removesuffix("=").split("+")
        assert p.prompt == f"{int(left)}+{int(right)}="
        assert p.answer == str(int(left) + int(right))


def test_same_seed_same_order_other_seed_other_order():
    a = arithmetic_problems(max_operand=9, num_problems=100, seed=3)
    assert a == arithmetic_problems(max_operand=9, num_problems=100, seed=3)
    b = arithmetic_problems(max_operand=9, num_problems=100, seed=4)
    assert a != b and set(a) == set(b)  # same problems, shuffled differently


def test_sample_depends_on_seed():
    a = arithmetic_problems(max_operand=50, num_problems=20, seed=0)
    b = arithmetic_problems(max_operand=50, num_problems=20, seed=1)
    assert _pairs(a) != _pairs(b)


def test_order_is_not_the_natural_enumeration():
    problems = arithmetic_problems(max_operand=9, num_problems=100, seed=0)
    natural = [f"{a}+{b}=" for a in range(10) for b in range(10)]
    assert [p.prompt for p in problems] != natural


@pytest.mark.parametrize("max_operand, num_problems", [(-1, 10), (9, 0)])
def test_invalid_arguments_are_config_errors(max_operand, num_problems):
    with pytest.raises(ConfigError):
        arithmetic_problems(max_operand=max_operand, num_problems=num_problems, seed=0)


@pytest.mark.parametrize(
    "completion, answer, reward",
    [
        ("7", "7", 1.0),
        (" 7\n", "7", 1.0),
        ("12", "12", 1.0),
        ("1", "12", 0.0),  # a prefix of the answer
        ("12", "1", 0.0),  # the answer followed by more digits
        ("17", "7", 0.0),
        ("7 ", "7", 1.0),
        ("7 7", "7", 0.0),
        ("", "0", 0.0),
        ("0", "0", 1.0),
        ("07", "7", 0.0),  # exact text, not numeric equality
        ("7+", "7", 0.0),
    ],
)
def test_exact_answer_reward(completion, answer, reward):
    assert exact_answer(completion, {"answer": answer}) == reward


def test_reward_is_a_float():
    assert isinstance(exact_answer("7", {"answer": "7"}), float)
    assert isinstance(exact_answer("8", {"answer": "7"}), float)


def test_problems_are_frozen():
    p = Sum(prompt="1+1=", answer="2")
    with pytest.raises(AttributeError):
        p.answer = "3"  # type: ignore[misc]


def test_module_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, rlrun.task.arithmetic; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_problem_index_is_a_fresh_seeded_permutation_per_pass():
    from rlrun.task.tasks import problem_index

    first = [problem_index(c, 10, seed=0) for c in range(10)]
    second = [problem_index(c, 10, seed=0) for c in range(10, 20)]
    assert sorted(first) == sorted(second) == list(range(10))  # every problem once per pass
    assert first != second  # a new order every pass
    assert first == [problem_index(c, 10, seed=0) for c in range(10)]  # same seed, same order
    assert first != [problem_index(c, 10, seed=1) for c in range(10)]
