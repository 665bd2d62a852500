"""A researcher's own task on the real stack: problems from a JSONL file written here, rewards from a
Python file written here (one that raises on some samples, one that sleeps past its timeout), a
held-out eval file evaluated every few versions. The run ends at the exact step, every version
asked for is evaluated once, at exactly that version (and `rlrun eval` of the last checkpoint gives
the same figures), and the failing rewards are counted while the actor runs on, never restarted
for them."""

from __future__ import annotations

import json
import textwrap

import pytest

from rlrun.task.evaluation import pass_at_k

from .conftest import read_jsonl, run_cli

pytestmark = pytest.mark.e2e

STEPS = 12
EVERY = 4
K = 4  # eval.samples_per_prompt at eval.temperature=1: each eval request is seeded, so `rlrun eval` agrees exactly
REWARDS = textwrap.dedent(
    """
    import time

    def exact(completion, row, info):
        return 1.0 if completion.strip() == row["answer"] else 0.0

    def flaky(completion, row, info):
        if info.num_tokens > 0 and info.index == 1 and row["id"] % 2 == 0:  # not on preflight's call (0 tokens)
            raise ValueError(f"flaky on row {row['id']}")
        return 0.0

    def slow(completion, row, info):
        if info.num_tokens > 0 and info.index == 3 and row["id"] % 10 == 0:  # one sample of a tenth of the groups
            time.sleep(30)  # far past reward.timeout_s: its worker is killed
        return 0.0
    """
)


def _rows(pairs, source):
    return [{"id": i, "question": f"{a}+{b}", "answer": str(a + b), "source": source} for i, (a, b) in pairs]


@pytest.fixture(scope="module")
def own_task_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("own-task")
    train = _rows(enumerate((a, b) for a in range(10) for b in range(10) if (a + b) % 7), "train")
    held = [(a, b) for a in range(10) for b in range(10) if (a + b) % 7 == 0][:8]
    evaluation = _rows(enumerate(held[:4]), "small") + _rows(enumerate(held[4:], start=4), "other")
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train))
    (folder / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evaluation))
    (folder / "rewards.py").write_text(REWARDS)
    run_dir = folder / "run"
    result = run_cli(
        ["train", "recipe=math_gspo", f"trainer.max_train_steps={STEPS}", f"run.dir={run_dir}", "supervisor.stop_grace_s=5",
         "dataset=files", f"dataset.train_files=[{folder / 'train.jsonl'}]", f"dataset.eval_files=[{folder / 'eval.jsonl'}]",
         "dataset.prompt_template='{question}='", "dataset.source_column=source",
         f"reward.functions=[{folder / 'rewards.py'}:exact,{folder / 'rewards.py'}:flaky,{folder / 'rewards.py'}:slow]",
         "reward.timeout_s=1", f"eval.every_steps={EVERY}", f"eval.samples_per_prompt={K}", "eval.temperature=1.0"],
        timeout=900,
    )  # fmt: skip
    return result, run_dir, evaluation


def test_the_run_ends_at_exactly_its_last_step(own_task_run):
    result, run_dir, _ = own_task_run
    assert result.returncode == 0, result.stderr[-3000:]
    steps = [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl") if r.get("kind", "step") == "step"]
    assert steps == list(range(1, STEPS + 1))
    assert result.left_behind == []


def test_every_version_asked_for_is_evaluated_once_with_figures_its_samples_give(own_task_run):
    _, run_dir, evaluation = own_task_run
    evals = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r.get("kind") == "eval"]
    assert [r["policy_version"] for r in evals] == list(range(0, STEPS + 1, EVERY))  # 0 (eval.at_start), 4, 8, 12
    for record in evals:
        correct = record["correct"]
        assert record["prompts"] == len(evaluation) == len(correct) and record["k"] == K
        assert record["pass@1"] == pytest.approx(sum(c / K for c in correct) / len(correct), abs=1e-6)
        assert record[f"pass@{K}"] == pytest.approx(sum(pass_at_k(K, c, K) for c in correct) / len(correct), abs=1e-6)
        assert record["pass@1"] <= record[f"pass@{K}"] and 0.0 <= record["reward_mean"] <= 1.0
        assert set(record["per_source"]) == {"small", "other"}
        assert record["per_source"]["small"]["correct"] == correct[:4] and record["per_source"]["other"]["correct"] == correct[4:]


def test_failing_rewards_are_counted_and_the_actor_is_never_restarted_for_them(own_task_run):
    result, run_dir, _ = own_task_run
    last = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r.get("kind", "step") == "step"][-1]
    assert last["reward_errors"].get("flaky", 0) > 0 and last["reward_timeouts"].get("slow", 0) > 0, last
    assert last["groups_dropped"] == 0  # reward.on_error=zero: every group trained on
    events = read_jsonl(run_dir / "events.jsonl")
    assert not [e for e in events if e.get("process", "").startswith("actor") and e.get("event") in ("process_failed", "process_restarted")]
    actor_log = "\n".join(p.read_text() for p in run_dir.glob("logs/launch-1/actor*.log"))
    assert actor_log.count("reward ") >= 2 and "ValueError: flaky on row" in actor_log  # each reward's first traceback
    assert actor_log.count("ValueError: flaky on row") == 1  # the first only; the counts say how many followed


def test_rlrun_eval_of_the_last_checkpoint_gives_the_runs_own_figures(own_task_run):
    result, run_dir, _ = own_task_run
    assert result.returncode == 0
    evaluated = run_cli(["eval", str(run_dir), "--step", str(STEPS), "--json"], timeout=300)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    report = json.loads(evaluated.stdout.strip().splitlines()[-1])
    assert report["version"] == STEPS and report["in_run"]["policy_version"] == STEPS
    for key in ("prompts", "k", "reward_mean", "pass@1", f"pass@{K}", "correct", "per_source"):
        assert report["figures"][key] == report["in_run"][key], key  # the same seeded samples: exactly the run's figures
    assert evaluated.left_behind == []
