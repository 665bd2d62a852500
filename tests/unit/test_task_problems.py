"""Rows become problems (rlrun/task/tasks.py): the prompt from a column, a template or chat
messages, a system prompt before it; the held-out rows split off by seed; every problem that cannot
be built is a TaskInputError (exit 2) naming the row and the column."""

from __future__ import annotations

import dataclasses
import json

import pytest

from rlrun.config.schema import DatasetConfig, RewardConfig
from rlrun.task.rewards import RewardSpec
from rlrun.task.tasks import PromptRule, held_out, load_task, problem

from tests.refusals import refusal as refused  # a TaskInputError is a ConfigError of exit 2

ROW = {"question": "What is 2+3?", "answer": "5", "topic": "sums"}


# --- the prompt ------------------------------------------------------------------------------


def test_the_prompt_from_a_column_and_the_row_untouched():
    made = problem(ROW, PromptRule(column="question"), "p.jsonl, row 1")
    assert made.prompt == "What is 2+3?"
    assert made.row == ROW and made.answer == "5" and made.source is None


def test_a_missing_prompt_column_is_named_with_the_columns_there_are():
    refused(lambda: problem(ROW, PromptRule(column="prompt"), "p.jsonl, row 4"),
            "p.jsonl, row 4: no column 'prompt'", "question, answer, topic", "dataset.prompt_column")  # fmt: skip


@pytest.mark.parametrize("value, fragment", [("  ", "column 'question' is empty"), (7, "holds int 7, not text"), ([], "holds list []")])
def test_a_prompt_cell_that_is_not_a_prompt(value, fragment):
    refused(lambda: problem({**ROW, "question": value}, PromptRule(column="question"), "row 2"), "row 2: ", fragment)


def test_a_template_over_the_columns():
    rule = PromptRule(template="[{topic}] {question} Answer with a number.")
    assert problem(ROW, rule, "row 1").prompt == "[sums] What is 2+3? Answer with a number."


def test_a_template_takes_literal_braces_doubled():
    assert problem(ROW, PromptRule(template="{{json}}: {answer}"), "row 1").prompt == "{json}: 5"


def test_a_template_naming_an_absent_column():
    refused(lambda: problem(ROW, PromptRule(template="Solve: {problem}"), "p.jsonl, row 3"),
            "p.jsonl, row 3: dataset.prompt_template names column 'problem'", "question, answer, topic")  # fmt: skip


@pytest.mark.parametrize("template, fragment", [("Solve: {}", "every {} must name a column"), ("Solve: {question", "is not a template")])
def test_a_template_that_is_not_one(template, fragment):
    refused(lambda: problem(ROW, PromptRule(template=template), "row 1"), fragment)


def test_chat_messages_in_the_prompt_column():
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3?", "name": "ignored"}]
    made = problem({"prompt": messages, "answer": "5"}, PromptRule(), "row 1")
    assert made.prompt == ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3?"})


@pytest.mark.parametrize(
    "bad",
    [{"role": "wizard", "content": "2+3?"}, {"role": "user"}, {"role": "user", "content": 5}, "2+3?"],
    ids=["unknown-role", "no-content", "content-not-text", "not-a-dict"],
)
def test_a_bad_message_is_refused(bad):
    messages = [{"role": "user", "content": "hi"}, bad]
    refused(lambda: problem({"prompt": messages}, PromptRule(), "row 6"), "row 6: column 'prompt' holds a list", repr(bad), "not a message")


def test_a_system_prompt_before_a_text_prompt():
    made = problem(ROW, PromptRule(column="question", system_prompt="Think step by step."), "row 1")
    assert made.prompt == ({"role": "system", "content": "Think step by step."}, {"role": "user", "content": "What is 2+3?"})


def test_a_system_prompt_before_messages_unless_they_have_their_own():
    user = [{"role": "user", "content": "2+3?"}]
    rule = PromptRule(system_prompt="Be brief.")
    assert problem({"prompt": user}, rule, "row 1").prompt == ({"role": "system", "content": "Be brief."}, *user)
    own = [{"role": "system", "content": "Be verbose."}, *user]
    assert problem({"prompt": own}, rule, "row 1").prompt == tuple(own)


def test_the_source_column():
    assert problem(ROW, PromptRule(column="question", source_column="topic"), "row 1").source == "sums"
    refused(lambda: problem(ROW, PromptRule(column="question", source_column="origin"), "row 2"),
            "row 2: no column 'origin' (dataset.source_column)")  # fmt: skip


# --- the held-out rows ---------------------------------------------------------------------------


ROWS = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(20)]


def test_held_out_is_disjoint_complete_and_keeps_the_file_order():
    train, evaluation = held_out(ROWS, 0.25, seed=3)
    assert len(evaluation) == 5 and len(train) == 15
    assert sorted(ROWS.index(r) for r in train + evaluation) == list(range(20))  # each row once, none lost
    for part in (train, evaluation):
        positions = [ROWS.index(r) for r in part]
        assert positions == sorted(positions)


def test_held_out_is_chosen_by_the_seed():
    assert held_out(ROWS, 0.25, seed=3) == held_out(ROWS, 0.25, seed=3)
    choices = {tuple(r["prompt"] for r in held_out(ROWS, 0.25, seed)[1]) for seed in range(5)}
    assert len(choices) > 1, "every seed held out the same rows"


def test_held_out_takes_at_least_one_row():
    train, evaluation = held_out(ROWS, 0.01, seed=0)
    assert len(evaluation) == 1 and len(train) == 19


@pytest.mark.parametrize("rows, fraction", [(ROWS, 1.0), (ROWS, 0.98), (ROWS[:1], 0.1), (ROWS[:2], 0.76)])
def test_held_out_refuses_to_take_every_row(rows, fraction):
    refused(lambda: held_out(rows, fraction, seed=0), f"dataset.eval_fraction={fraction} of {len(rows)} rows leaves none to train on")


# --- load_task: the files, the split, the rewards -------------------------------------------------


def files(tmp_path, rows=ROWS, name="p.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_load_task_holds_out_a_share_of_the_files(tmp_path):
    dataset = DatasetConfig(name="files", train_files=[files(tmp_path)], eval_fraction=0.25)
    task = load_task(dataset, seed=1, reward=RewardConfig(functions=["m.py:score"]))
    assert len(task.problems) == 15 and len(task.eval_problems) == 5
    assert {p.prompt for p in task.problems}.isdisjoint(p.prompt for p in task.eval_problems)
    assert [p.row for p in task.eval_problems] == held_out(ROWS, 0.25, 1)[1]
    assert task.rewards == [RewardSpec("m.py:score", 1.0)]


def test_load_task_reads_every_train_file_and_the_eval_files(tmp_path):
    first, second, evaluation = (files(tmp_path, ROWS[a:b], f"{a}.jsonl") for a, b in ((0, 3), (3, 5), (5, 7)))
    dataset = DatasetConfig(name="files", train_files=[first, second], eval_files=[evaluation], eval_fraction=0.5)
    task = load_task(dataset, seed=0, reward=RewardConfig(functions=["m:a", "m:b"], weights=[1.0, 0.5]))
    assert [p.prompt for p in task.problems] == [r["prompt"] for r in ROWS[:5]]  # eval_files win over eval_fraction
    assert [p.prompt for p in task.eval_problems] == [r["prompt"] for r in ROWS[5:7]]
    assert [(r.name, r.weight) for r in task.rewards] == [("a", 1.0), ("b", 0.5)]


def test_load_task_names_the_file_and_row_of_a_bad_prompt(tmp_path):
    path = files(tmp_path, [{"prompt": "1+1="}, {"question": "2+2="}])
    dataset = DatasetConfig(name="files", train_files=[path])
    refused(lambda: load_task(dataset, 0, RewardConfig(functions=["m:f"])), f"{path}, row 2: no column 'prompt'")


@pytest.mark.parametrize(
    "dataset, reward, fragment",
    [
        (DatasetConfig(name="files"), RewardConfig(functions=["m:f"]), "dataset=files needs dataset.train_files"),
        (DatasetConfig(name="files", train_files=["{p}"]), RewardConfig(), "dataset=files has no built-in reward"),
        (DatasetConfig(name="files", train_files=["{p}"], eval_fraction=1.0), RewardConfig(functions=["m:f"]), "leaves none to train on"),
        (DatasetConfig(name="files", train_files=["{p}"]), RewardConfig(functions=["m:f"], weights=[1.0, 2.0]), "reward.weights has 2 values for 1"),
    ],
    ids=["no-train-files", "no-reward", "eval-takes-all", "weights-count"],
)

def test_load_task_refuses(tmp_path, dataset, reward, fragment):
    path = files(tmp_path)
    fixed = dataclasses.replace(dataset, train_files=[f.format(p=path) for f in dataset.train_files])
    refused(lambda: load_task(fixed, 0, reward), fragment)


def test_load_task_refuses_an_eval_file_without_rows(tmp_path):
    empty = tmp_path / "eval.jsonl"
    empty.write_text("")
    dataset = DatasetConfig(name="files", train_files=[files(tmp_path)], eval_files=[str(empty)])
    refused(lambda: load_task(dataset, 0, RewardConfig(functions=["m:f"])), f"{empty}: it holds no rows")


def test_load_task_refuses_an_eval_split_of_a_file(tmp_path):
    path = files(tmp_path)
    dataset = DatasetConfig(name="files", train_files=[path], eval_split="test")
    refused(lambda: load_task(dataset, 0, RewardConfig(functions=["m:f"])),
            f"dataset.eval_split=test picks a split of a `datasets` folder or hub dataset, but {path} is a file", "dataset.eval_files")  # fmt: skip


def test_load_task_takes_the_eval_split_of_a_datasets_folder(tmp_path):
    import datasets

    splits = {"train": datasets.Dataset.from_list(ROWS[:6]), "test": datasets.Dataset.from_list(ROWS[6:8])}
    datasets.DatasetDict(splits).save_to_disk(str(tmp_path / "saved"))
    dataset = DatasetConfig(name="files", train_files=[str(tmp_path / "saved")], eval_split="test")
    task = load_task(dataset, 0, RewardConfig(functions=["m:f"]))
    assert [p.row for p in task.problems] == ROWS[:6] and [p.row for p in task.eval_problems] == ROWS[6:8]


def test_held_out_depends_on_the_positions_not_the_content():
    """held_out's choice depends on the rows' count and positions only, never their content."""
    other = [{"x": i} for i in range(20)]
    for seed in range(3):
        positions = [ROWS.index(r) for r in held_out(ROWS, 0.2, seed)[1]]
        assert positions == [other.index(r) for r in held_out(other, 0.2, seed)[1]]

