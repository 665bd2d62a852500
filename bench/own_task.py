"""A task given as files, learned and evaluated on held-out rows: what a researcher's own task gets.

    python bench/own_task.py [--steps 80] [--every 10] [--eval-prompts 50] [--no-baseline] [hydra overrides...]

It exports reasoning-gym rows (recipe=smollm2_grpo's one-digit sums) to `train.jsonl` (900 rows) and
a disjoint `eval.jsonl` (100 rows), writes a 6-line reward file (the completion's last number is
the answer), and trains SmolLM2-135M on them with `rlrun train recipe=smollm2_grpo dataset=files
... eval.every_steps=EVERY`. Then it runs `rlrun eval` on the last checkpoint, and (unless
--no-baseline) the same run without evaluation, to price it.

Prints: the training reward and the eval pass@1 over steps and seconds; `rlrun eval`'s figure of
the last checkpoint beside the run's own; samples per second from the first step to the last with
and without evaluation. It asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from learning_curve import final_steps, read_jsonl, run

INSTRUCTION = "Answer with the number only."  # recipe=smollm2_grpo's answer_format=last_number
TASK_ARGS = dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1, operators=["+"], allow_parentheses=False, allow_negation=False)
REWARD = '''import re

def correct(completion, row):
    numbers = re.findall(r"-?\\d+", completion.replace(",", ""))
    return 1.0 if numbers and numbers[-1] == str(row["answer"]) else 0.0
'''


def export_rows(folder: Path, seed: int = 0) -> tuple[Path, Path]:
    """900 training and 100 held-out rows of reasoning-gym's basic_arithmetic, as JSONL."""
    import reasoning_gym

    entries = list(reasoning_gym.create_dataset("basic_arithmetic", seed=seed, size=1000, **TASK_ARGS))
    rows = [{"prompt": f"{e['question'].rstrip()}\n{INSTRUCTION}", "answer": str(e["answer"]), "id": i} for i, e in enumerate(entries)]
    train, held = folder / "train.jsonl", folder / "eval.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows[:900]))
    held.write_text("".join(json.dumps(r) + "\n" for r in rows[900:]))
    return train, held


def overrides(folder: Path, train: Path, held: Path, steps: int, every: int, prompts: int) -> list[str]:
    return [
        "recipe=smollm2_grpo", "dataset=files", "~dataset.task", "~dataset.task_args", "~dataset.answer_format",
        f"dataset.train_files=[{train}]", f"dataset.eval_files=[{held}]", f"reward.functions=[{folder / 'reward.py'}:correct]",
        f"trainer.max_train_steps={steps}", f"eval.every_steps={every}", f"eval.max_prompts={prompts}",
    ]  # fmt: skip


def samples_per_s(run_dir: Path) -> float:
    steps = final_steps(read_jsonl(run_dir / "metrics.jsonl"))
    return (steps[-1]["samples"] - steps[0]["samples"]) / (steps[-1]["time"] - steps[0]["time"])


def report(run_dir: Path, window: int = 10) -> None:
    records = read_jsonl(run_dir / "metrics.jsonl")
    steps = final_steps(records)
    evals = {r["policy_version"]: r for r in records if r.get("kind") == "eval"}
    t0 = next(e["time"] for e in read_jsonl(run_dir / "events.jsonl") if e.get("event") == "run_started")
    print("step   t (s)  train reward (mean of last 10 steps)   eval pass@1 (version, t s)")
    for version in sorted(evals):
        part = [r for r in steps if version - window < r["step"] <= version]
        train = f"{statistics.fmean(r['reward_mean'] for r in part):.3f}" if part else "  -  "
        at = part[-1]["time"] - t0 if part else evals[version]["time"] - t0
        e = evals[version]
        print(f"{version:>4} {at:7.0f}  {train:>36}   {e['pass@1']:.3f} (v{version}, {e['time'] - t0:.0f} s, {e['prompts']} prompts, {e['eval_s']:.1f} s to sample)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--eval-prompts", type=int, default=50)
    parser.add_argument("--no-baseline", action="store_true", help="skip the run without evaluation")
    parser.add_argument("extra", nargs="*", help="more Hydra overrides for both runs")
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="rlrun-bench-own-task-"))
    (folder / "reward.py").write_text(REWARD)
    train, held = export_rows(folder)
    chosen = overrides(folder, train, held, args.steps, args.every, args.eval_prompts) + args.extra
    print(f"rlrun train {' '.join(chosen)}", flush=True)
    with_eval = folder / "with-eval" / "run"
    with_eval.parent.mkdir()
    code, wall, _ = run(with_eval, chosen)
    print(f"with evaluation: exit {code} after {wall:.0f} s; {samples_per_s(with_eval):.2f} samples/s from the first step to the last")
    report(with_eval)
    evaluated = subprocess.run([sys.executable, "-m", "rlrun", "eval", str(with_eval), "--json"], capture_output=True, text=True)
    if evaluated.returncode == 0:
        result = json.loads(evaluated.stdout.strip().splitlines()[-1])
        now, then = result["figures"], result["in_run"] or {}
        print(f"rlrun eval of {Path(result['checkpoint']).name} (version {result['version']}): pass@1 {now['pass@1']:.3f}, reward "
              f"{now['reward_mean']:.3f}; the run's own: pass@1 {then.get('pass@1', float('nan')):.3f}, reward "
              f"{then.get('reward_mean', float('nan')):.3f}; correct per prompt equal: {now['correct'] == then.get('correct')}")  # fmt: skip
    else:
        print(f"rlrun eval failed (exit {evaluated.returncode}): {evaluated.stderr[-2000:]}")
    if not args.no_baseline:
        without = folder / "without-eval" / "run"
        without.parent.mkdir()
        code, wall, _ = run(without, overrides(folder, train, held, args.steps, 0, args.eval_prompts) + args.extra)
        a, b = samples_per_s(with_eval), samples_per_s(without)
        print(f"without evaluation: exit {code} after {wall:.0f} s; {b:.2f} samples/s; with eval.every_steps={args.every}: {a:.2f} "
              f"samples/s ({100 * (a / b - 1):+.1f} %)")  # fmt: skip
    print(f"runs kept under {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
