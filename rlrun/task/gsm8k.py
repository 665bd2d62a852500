"""GSM8K through the `datasets` library, scored with math-verify (`rlrun.task.scorers:math_verify`,
real-model runs): the answer is asked for in \\boxed{}; the reference is the number after '####'
in GSM8K's solution.
"""

from __future__ import annotations

from rlrun.errors import EnvironmentProblem

PROMPT = "Solve the problem. Put the final answer in \\boxed{{}}.\nProblem: {question}\nSolution:"


def gsm8k_rows(path: str, config: str | None, split: str) -> list[dict]:
    try:
        import datasets
    except ImportError:
        raise EnvironmentProblem("dataset=gsm8k needs the `datasets` package: pip install 'rlrun[gpu]'.") from None
    try:
        rows = datasets.load_dataset(path, config, split=split)
    except Exception as exc:  # datasets raises many types; all mean "cannot load it"
        raise EnvironmentProblem(
            f"cannot load dataset {path!r} (config {config!r}, split {split!r}): {exc}. Check dataset.hf_path, "
            f"dataset.hf_config and dataset.split, or point dataset.hf_path at a local copy."
        ) from None
    return [
        {**row, "prompt": PROMPT.format(question=row["question"]), "answer": row["answer"].split("####")[-1].strip()}
        for row in rows
    ]
