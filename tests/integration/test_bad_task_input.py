"""A researcher's own task, broken, through the real `rlrun train` (docs/your-task.md): each is
exit 2 with one message naming the file, row, column, key or function at fault, and nothing is
created: the run directory does not exist afterwards and the workspace is as it was.

The CLI runs in-process (typer's CliRunner), as in test_bad_input.py; nothing can start:
`launch.Supervisor` and the model build fail the test if they are ever reached.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlrun.cli.app import app
from tests.refusals import snapshot

pytestmark = pytest.mark.timeout(120)

ROWS = [{"prompt": f"{a}+{b}=", "answer": str(a + b), "level": a % 3} for a, b in zip(range(10), range(3, 13))]
GOOD_REWARD = "def score(completion, row, info):\n    return float(completion.strip() == row['answer'])\n"


def squash(text: str) -> str:
    """Without whitespace: rich wraps long messages, possibly inside a path."""
    return "".join(text.split())


class Task:
    """The test's workspace: the task's files, written on demand, and `run`, a run.dir not yet there."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.run = root / "run"

    def rows(self, rows: list[dict] = ROWS, name: str = "problems.jsonl") -> Path:
        path = self.root / name
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return path

    def text(self, name: str, content: str) -> Path:
        path = self.root / name
        path.write_text(textwrap.dedent(content))
        return path

    def refused(self, overrides: list[str], *fragments: str) -> str:
        before = snapshot(self.root)
        result = CliRunner().invoke(app, ["train", f"run.dir={self.run}", *overrides])
        output = result.stderr + result.stdout
        assert result.exit_code == 2, output
        for fragment in fragments:
            assert squash(fragment) in squash(result.stderr), f"{fragment!r} not in: {result.stderr}"
        assert "Traceback" not in output
        assert not self.run.exists(), "the run directory was created"
        assert snapshot(self.root) == before, "the workspace changed"
        return result.stderr


@pytest.fixture
def task(tmp_path) -> Task:
    (tmp_path / "work").mkdir()
    return Task(tmp_path / "work")


def files(task: Task, rows: Path | None = None, reward: Path | None = None, function: str = "score") -> list[str]:
    rows = rows or task.rows()
    reward = reward or task.text("my_reward.py", GOOD_REWARD)
    return ["dataset=files", f"dataset.train_files=[{rows}]", f"reward.functions=[{reward}:{function}]"]


def test_the_good_task_passes_the_same_preflight(task):
    """The inputs the refusals below break, unbroken: `--dry-run` (which runs the task's preflight) accepts them."""
    result = CliRunner().invoke(app, ["train", f"run.dir={task.run}", *files(task), "dataset.eval_fraction=0.2", "eval.every_steps=2", "--dry-run"])
    assert result.exit_code == 0, result.stderr + result.stdout
    assert not task.run.exists()


# --- the rows and the prompt ----------------------------------------------------------------------


def test_a_missing_prompt_column(task, nothing_starts):
    rows = task.rows([{"question": "2+3=", "answer": "5"}])
    task.refused(files(task, rows), f"{rows}, row 1: no column 'prompt'", "question, answer", "dataset.prompt_column")


def test_an_empty_file(task, nothing_starts):
    rows = task.text("problems.jsonl", "")
    task.refused(files(task, rows), f"{rows}: it holds no rows")


def test_an_unparseable_row(task, nothing_starts):
    rows = task.text("problems.jsonl", json.dumps(ROWS[0]) + "\n" + '{"prompt": "2+2=", "answer": 4\n')
    task.refused(files(task, rows), f"{rows}, line 2: not JSON")


def test_a_file_of_an_unknown_format(task, nothing_starts):
    rows = task.text("problems.txt", "2+3=\t5\n")
    task.refused(files(task, rows), f"{rows}: rlrun reads .jsonl, .parquet and .csv files", "not .txt")


def test_a_missing_train_file(task, nothing_starts):
    task.refused([*files(task)[:1], f"dataset.train_files=[{task.root}/nope.jsonl]", *files(task)[2:]], f"{task.root}/nope.jsonl: no such file or folder")


def test_a_template_naming_an_absent_column(task, nothing_starts):
    rows = task.rows()
    task.refused([*files(task, rows), 'dataset.prompt_template="Solve: {problem}"'],
                 f"{rows}, row 1: dataset.prompt_template names column 'problem'", "prompt, answer, level")  # fmt: skip


def test_chat_messages_without_the_chat_template(task, nothing_starts):
    rows = task.rows([{"prompt": [{"role": "user", "content": "2+3="}], "answer": "5"}, *ROWS[:3]])
    task.refused(files(task, rows), "the training rows are conversations (they hold chat messages)", "model.chat_template=true")


def test_a_system_prompt_without_the_chat_template(task, nothing_starts):
    task.refused([*files(task), "dataset.system_prompt=Think."], "conversations (dataset.system_prompt is set)", "model.chat_template=true")


def test_dataset_files_without_train_files(task, nothing_starts):
    reward = task.text("my_reward.py", GOOD_REWARD)
    task.refused(["dataset=files", f"reward.functions=[{reward}:score]"], "dataset=files needs dataset.train_files")


def test_dataset_files_without_a_reward(task, nothing_starts):
    task.refused(["dataset=files", f"dataset.train_files=[{task.rows()}]"], "dataset=files has no built-in reward", "reward.functions=")


# --- the held-out rows --------------------------------------------------------------------------------


def test_evaluation_asked_for_without_eval_rows(task, nothing_starts):
    task.refused([*files(task), "eval.every_steps=2"], "eval.every_steps is set but there is nothing to evaluate", "dataset.eval_fraction")


def test_an_eval_fraction_taking_every_row(task, nothing_starts):
    task.refused([*files(task), "dataset.eval_fraction=0.96"], "dataset.eval_fraction=0.96 of 10 rows leaves none to train on")


def test_several_greedy_samples_per_eval_prompt(task, nothing_starts):
    task.refused(
        [*files(task), "dataset.eval_fraction=0.2", "eval.every_steps=2", "eval.samples_per_prompt=4"],
        "eval.samples_per_prompt=4 with eval.temperature=0", "greedy samples of a prompt are all the same",
    )  # fmt: skip


def test_an_empty_eval_file(task, nothing_starts):
    empty = task.text("eval.jsonl", "\n")
    task.refused([*files(task), f"dataset.eval_files=[{empty}]", "eval.every_steps=2"], f"{empty}: it holds no rows")


# --- the rewards ----------------------------------------------------------------------------------------


def test_a_reward_module_that_is_not_installed(task, nothing_starts):
    task.refused([*files(task)[:2], "reward.functions=[no_such_reward_module:score]"],
                 "reward no_such_reward_module:score: cannot import module 'no_such_reward_module'")  # fmt: skip


def test_a_reward_file_without_the_function(task, nothing_starts):
    reward = task.text("my_reward.py", GOOD_REWARD)
    task.refused(files(task, reward=reward, function="correct"), f"reward {reward}:correct", "has no function 'correct'")


def test_a_reward_file_that_does_not_import(task, nothing_starts):
    reward = task.text("my_reward.py", "import no_such_verifier_package\n" + GOOD_REWARD)
    task.refused(files(task, reward=reward), f"importing {reward} raised ModuleNotFoundError", "no_such_verifier_package")


def test_a_reward_with_the_wrong_signature(task, nothing_starts):
    reward = task.text("my_reward.py", "def score(completion):\n    return 1.0\n")
    task.refused(files(task, reward=reward), f"reward {reward}:score: takes (completion)", "(completion, row, info)")


def test_a_reward_raising_on_the_first_row(task, nothing_starts):
    reward = task.text("my_reward.py", """
        def score(completion, row, info):
            return float(completion == row["solution"])
    """)  # fmt: skip
    task.refused(files(task, reward=reward), f"reward {reward}:score failed on the first training row", "KeyError: 'solution'", "my_reward.py:")


def test_a_reward_answering_something_that_is_not_a_number(task, nothing_starts):
    reward = task.text("my_reward.py", "def score(completion, row):\n    return 'correct'\n")
    task.refused(files(task, reward=reward), f"reward {reward}:score failed on the first training row", "not a number")


def test_a_weight_count_that_does_not_match(task, nothing_starts):
    task.refused([*files(task), "reward.weights=[1.0,0.5]"], "reward.weights has 2 values for 1 reward.functions")


def test_a_reward_ref_without_a_function(task, nothing_starts):
    reward = task.text("my_reward.py", GOOD_REWARD)
    task.refused([*files(task)[:2], f"reward.functions=[{reward}]"], f"reward.functions: '{reward}' is not module:function")


def test_a_file_that_is_not_utf8(task, nothing_starts):
    rows = task.root / "problems.jsonl"
    rows.write_bytes(b'{"prompt": "1+2=", "answer": "3"}\n' + '{"prompt": "café", "answer": "4"}\n'.encode("latin-1"))
    task.refused(files(task, rows), f"{rows}, line 2: not UTF-8 text")


def test_an_eval_split_of_a_file(task, nothing_starts):
    rows = task.rows()
    task.refused([*files(task, rows), "dataset.eval_split=test", "eval.every_steps=2"],
                 f"dataset.eval_split=test picks a split of a `datasets` folder or hub dataset, but {rows} is a file")  # fmt: skip


# --- the environment (several turns) --------------------------------------------------------------

GOOD_ENV = """
    TOOLS = [{"type": "function", "function": {"name": "add", "description": "a + b", "parameters": {}}}]
    NOT_TOOLS = ["add"]


    def step(messages, row, info):
        return {"done": True, "reward": float(row["answer"] in messages[-1]["content"])}


    def two(messages, row):
        return {"done": True}
"""


def environment(task: Task, function: str = "step") -> list[str]:
    """A run of several turns on the built-in task, its step from the workspace (the tiny model's
    max_model_len is 64: the conversation's 40 tokens fit)."""
    env = task.text("my_env.py", GOOD_ENV)
    return [f"environment.step={env}:{function}", "environment.max_total_tokens=40"]


def test_the_good_environment_passes_the_same_preflight(task):
    env = task.text("my_env.py", GOOD_ENV)
    evaluated = ["dataset.eval_fraction=0.2", "eval.every_steps=2"]  # conversations are evaluated too
    for extra in ([], evaluated, ["model=smollm2_135m", "model.chat_template=true", f"environment.tools={env}:TOOLS"]):
        result = CliRunner().invoke(app, ["train", f"run.dir={task.run}", *environment(task), *extra, "--dry-run"])
        assert result.exit_code == 0, result.stderr + result.stdout
    assert not task.run.exists()


@pytest.mark.parametrize(
    "case, fragments",
    [
        ("conversation longer than the model", ["environment.max_total_tokens (256) must be below model.max_model_len (64)"]),
        ("reward functions beside the step", ["environment.step gives the reward (its last step's answer): remove reward.functions."]),
        ("tools without a step", ["environment.tools without environment.step: the step runs the tools; set both."]),
        ("tools without a chat template", ["environment.tools are shown to the model through its chat template: set model.chat_template=true."]),
    ],
)
def test_an_environment_the_config_refuses(task, nothing_starts, case, fragments):
    env = task.text("my_env.py", GOOD_ENV)
    reward = task.text("my_reward.py", GOOD_REWARD)
    overrides = {
        "conversation longer than the model": [f"environment.step={env}:step"],
        "reward functions beside the step": [*environment(task), f"reward.functions=[{reward}:score]"],
        "tools without a step": ["model=smollm2_135m", "model.chat_template=true", f"environment.tools={env}:TOOLS"],
        "tools without a chat template": [*environment(task), f"environment.tools={env}:TOOLS"],
    }[case]
    task.refused(overrides, *fragments)


def test_an_environment_step_in_a_missing_file(task, nothing_starts):
    missing = task.root / "nope.py"
    task.refused([f"environment.step={missing}:step", "environment.max_total_tokens=40"], f"environment.step {missing}:step: no file {missing}.")


def test_an_environment_file_without_the_step_function(task, nothing_starts):
    env = task.text("my_env.py", GOOD_ENV)
    task.refused(environment(task, "respond"), f"environment.step {env}:respond: {env} has no function 'respond'.")


def test_an_environment_step_with_the_wrong_signature(task, nothing_starts):
    """Named as written: `:two:` is also an emoji code, which the console must not render."""
    env = task.text("my_env.py", GOOD_ENV)
    task.refused(environment(task, "two"), f"environment.step {env}:two: a step takes (messages, row, info)", "docs/your-task.md")


def test_environment_tools_that_are_not_tool_schemas(task, nothing_starts):
    env = task.text("my_env.py", GOOD_ENV)
    task.refused([*environment(task), "model=smollm2_135m", "model.chat_template=true", f"environment.tools={env}:NOT_TOOLS"],
                 f"environment.tools: {env}:NOT_TOOLS is not a list of tool schemas")  # fmt: skip
