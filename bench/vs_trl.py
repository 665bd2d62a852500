"""rlrun against TRL's GRPOTrainer on the same task, model and machine: reward over wall-clock time.

    python bench/vs_trl.py [--budget-s 300] [--systems trl-gspo,rlrun-gspo,rlrun-gspo-sync,trl-grpo,rlrun-grpo]
                           [--recipe smollm2_grpo]
                           [--rounds N] [--baseline DIR] [--out DIR] [--window 10] [--trl-threads N]
                           [hydra overrides for every system...]

Needs TRL (`pip install 'rlrun[bench]'`). Runs each system one after another, each as its own
process group, capped at --budget-s of wall time from its launch (startup included); with
--rounds N it runs them N times, alternated (A B C, B C A, C A B, ...: no system always first or
after the same neighbour), the whole bench under one lock (/tmp/rlrun-bench.lock: two benches
never share the cores), the load recorded before and after every run. It prints ONE table of
medians with their spread (min-max over the rounds), the split of an rlrun step, and writes ONE
PNG (reward against wall-clock seconds, one curve per run):

  rlrun-gspo / rlrun-grpo   `rlrun train recipe=math_gspo|math_grpo` (Redis, vLLM CPU, actor,
                            trainer: asynchronous, actor.max_steps_ahead as configured)
  rlrun-gspo-sync / -grpo-sync  the same with actor.max_steps_ahead=0: the actor opens a step's
                            groups only once the trainer has taken the previous step and pushed
                            its weights, so generation and training strictly alternate
  trl-gspo / trl-grpo       TRL's GRPOTrainer (this script with --worker), generating with
                            transformers' generate on CPU (no vLLM)
  base-gspo / base-gspo-sync   with --baseline DIR: rlrun-gspo(-sync) run from another checkout
                            (`git worktree add DIR <commit>`), for before/after figures alternated
                            in one bench
  trl-smollm2 / rlrun-smollm2  the real model: `recipe=smollm2_grpo` (SmolLM2-135M-Instruct,
                            one-digit sums, bf16 autocast; `--recipe smollm2_grpo` picks these two);
                            rlrun-smollm2-shm: with trainer.weight_transfer=shm;
                            rlrun-smollm2-shared: with world.cpu_affinity=none and
                            trainer.threads=2 (the trainer may use every core); -byneed: with
                            world.cpu_affinity=by_need; -fast: by_need and shm; -overlap: -fast
                            with trainer.overlap_weight_update=true; base-smollm2 with
                            --baseline DIR

The same for all: the recipe's model (the tiny warm-started model rlrun builds, rlrun.models.tiny,
or SmolLM2 from its package; the same folder), the arithmetic prompts in the actor's seeded order
(rlrun.task.tasks.problem_index; TRL's sampler with shuffle_dataset=False), group size, samples per
optimizer step (one generation = one step for TRL: per_device_train_batch_size = samples per step,
steps_per_generation = 1, num_iterations = 1), learning rate, AdamW betas, weight decay, gradient
clipping, a constant learning rate, the clip range, temperature, max new tokens, the task's reward,
the chat template (prompts as conversations when the recipe sets model.chat_template) and bf16
autocast when it sets trainer.mixed_precision=bf16. TRL's losses are set to the ones rlrun computes
(tests/unit/test_losses_vs_trl.py checks them on identical tensors): GRPO = loss_type "dapo" (token
mean), GSPO = importance_sampling_level "sequence" with loss_type "grpo" (mean over sequences).
Known differences, not corrected: TRL's advantages divide by the Bessel-corrected group std (3-7 %
smaller), TRL samples with transformers (rlrun with vLLM), and TRL uses --trl-threads torch threads
(default: every core, as a user would) where rlrun splits the cores between its processes.

Figures, per system, all in seconds from its launch: the time its reward first reaches 0.5, 0.7,
0.8, 0.9 (the mean over the last --window steps, full windows only: one lucky step does not
count), the reward at equal wall time (the smoothed reward at the end of the shortest run), its
samples per second over the training (first step's start to last step), and the ratio of each to
TRL's run of the same algorithm (rlrun's time to 0.8 / TRL's: <= 1.0 = no later than TRL). The
load average before and after each run is printed: on a shared 2-core machine other jobs change
every figure.

The split of an rlrun step (median over steps 2.., from metrics.jsonl): the trainer's step, of
which waiting for groups, handing the weights to vLLM (and, within it, vLLM paused: median and
p90) and the rest, training; generation = the actor's wall time with a request in flight per step
(vLLM idle = 1 - generation / step); HTTP requests per group; samples in flight across an update
per step; tokens prefilled again per step (the prompt and prefix of every continued sample); ETTR.
It prints figures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
THRESHOLDS = (0.5, 0.7, 0.8, 0.9)
LOCK = Path("/tmp/rlrun-bench.lock")  # one bench at a time on this machine
STOP_GRACE_S = 60.0  # rlrun stops its processes in order on SIGTERM; then SIGKILL to the group
SYSTEMS = {  # name -> (kind, recipe, extra overrides)
    "trl-gspo": ("trl", "math_gspo", []),
    "rlrun-gspo": ("rlrun", "math_gspo", []),
    "rlrun-gspo-sync": ("rlrun", "math_gspo", ["actor.max_steps_ahead=0"]),
    "trl-grpo": ("trl", "math_grpo", []),
    "rlrun-grpo": ("rlrun", "math_grpo", []),
    "rlrun-grpo-sync": ("rlrun", "math_grpo", ["actor.max_steps_ahead=0"]),
    "base-gspo": ("base", "math_gspo", []),
    "base-gspo-sync": ("base", "math_gspo", ["actor.max_steps_ahead=0"]),
    # the real model (recipe=smollm2_grpo): SmolLM2-135M-Instruct, one-digit sums, bf16 autocast
    "trl-smollm2": ("trl", "smollm2_grpo", []),
    "rlrun-smollm2": ("rlrun", "smollm2_grpo", []),
    "rlrun-smollm2-shm": ("rlrun", "smollm2_grpo", ["trainer.weight_transfer=shm"]),
    "rlrun-smollm2-shared": ("rlrun", "smollm2_grpo", ["world.cpu_affinity=none", "trainer.threads=2"]),
    "rlrun-smollm2-byneed": ("rlrun", "smollm2_grpo", ["world.cpu_affinity=by_need"]),
    "rlrun-smollm2-fast": ("rlrun", "smollm2_grpo", ["world.cpu_affinity=by_need", "trainer.weight_transfer=shm"]),
    "rlrun-smollm2-overlap": (
        "rlrun",
        "smollm2_grpo",
        ["world.cpu_affinity=by_need", "trainer.weight_transfer=shm", "trainer.overlap_weight_update=true"],
    ),
    "base-smollm2": ("base", "smollm2_grpo", []),
}
DEFAULT_SYSTEMS = "trl-gspo,rlrun-gspo,rlrun-gspo-sync,trl-grpo,rlrun-grpo"
RECIPE_SYSTEMS = {"smollm2_grpo": "trl-smollm2,rlrun-smollm2"}  # --recipe R: these systems by default


@dataclass(frozen=True)
class Point:
    seconds: float  # since the system's launch
    step: int
    samples: int
    reward: float  # this step's mean reward


# --- pure figures ----------------------------------------------------------------------------------


def smoothed(points: list[Point], window: int) -> list[tuple[float, float]]:
    """(seconds, mean reward of the last `window` steps) at every step with a full window."""
    out = []
    for i in range(window - 1, len(points)):
        chunk = points[i - window + 1 : i + 1]
        out.append((points[i].seconds, sum(p.reward for p in chunk) / window))
    return out


def time_to(curve: list[tuple[float, float]], threshold: float) -> float | None:
    """The first time the smoothed reward is at least `threshold`; None if it never is."""
    return next((t for t, r in curve if r >= threshold), None)


def reward_at(curve: list[tuple[float, float]], seconds: float) -> float | None:
    """The smoothed reward known at `seconds` (its last value at or before then)."""
    known = [r for t, r in curve if t <= seconds]
    return known[-1] if known else None


def samples_per_s(points: list[Point], first_step_s: float) -> float | None:
    """Samples trained over the training time: from the first step's start to the last step."""
    if not points or points[-1].seconds <= first_step_s:
        return None
    return points[-1].samples / (points[-1].seconds - first_step_s)


def within(points: list[Point], budget_s: float) -> list[Point]:
    """The steps recorded within the budget: an rlrun run told to stop at the cap finishes the
    step in flight while its processes stop in order; those late steps do not count."""
    return [p for p in points if p.seconds <= budget_s]


def ratio(reference: float | None, value: float | None) -> str:
    if reference is None or value is None or value == 0:
        return "-"
    return f"{reference / value:.2f}"


# --- running one system ----------------------------------------------------------------------------


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def run_capped(command: list[str], log: Path, budget_s: float, cwd: Path = REPO, env: dict | None = None) -> tuple[int | None, float]:
    """Run `command` in its own session; SIGTERM its group at `budget_s`, SIGKILL after a grace."""
    started = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen(command, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})  # fmt: skip
        try:
            proc.wait(timeout=budget_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
    return proc.returncode, time.monotonic() - started


def rlrun_points(run_dir: Path, launched: float) -> tuple[list[Point], float]:
    from rlrun.telemetry.metrics import final_records, read_metrics

    records = final_records(read_metrics(run_dir / "metrics.jsonl")) if (run_dir / "metrics.jsonl").is_file() else []
    points = [Point(r["time"] - launched, r["step"], r["samples"], float(r["reward_mean"])) for r in records]
    # Startup ends when the first step's groups have arrived: a fresh trainer starts beside vLLM, so
    # its first step's wait covers vLLM's start.
    first = records[0] if records else {}
    first_start = (first["time"] - float(first.get("step_time_s") or 0.0) + float(first.get("wait_s") or 0.0) - launched) if records else 0.0
    return points, first_start


def startup_split(run_dir: Path, launched: float) -> dict | None:
    """Where an rlrun run's start went, seconds from its launch (events.jsonl, metrics.jsonl): the
    supervisor up (the CLI composed the config, made the run directory), Redis, the trainer and
    vLLM ready, the actor started, the first step's groups arrived, the first step done."""
    path = run_dir / "events.jsonl"
    if not path.is_file():
        return None
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def first(event: str, process: str = "") -> float | None:
        hit = next((e for e in events if e.get("event") == event and e.get("process", "") == process), None)
        return hit["time"] - launched if hit else None

    points, groups_at = rlrun_points(run_dir, launched)
    return {
        "supervisor_s": first("run_started"), "redis_s": first("process_ready", "redis"),
        "trainer_s": first("process_ready", "trainer"), "vllm_s": first("process_ready", "vllm-0"),
        "actor_s": first("process_started", "actor"), "groups_s": groups_at if points else None,
        "first_step_s": points[0].seconds if points else None,
    }  # fmt: skip


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile, q in [0, 100]; None for no values."""
    ordered = sorted(values)
    if not ordered:
        return None
    position = (len(ordered) - 1) * q / 100
    low, high = int(position), min(int(position) + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def median(values: list[float]) -> float | None:
    return percentile(values, 50)


def mean_prompt_tokens(recipe: str) -> float:
    """The mean prompt length of the recipe's task in tokens (what a continued sample prefills again besides its prefix)."""
    from rlrun.actor.tokenizer import load_tokenizer
    from rlrun.config import compose
    from rlrun.task.tasks import load_task
    from rlrun.models.source import model_path

    cfg, _ = compose([f"recipe={recipe}"])
    tokenizer, task = load_tokenizer(model_path(cfg.model, build=True, seed=cfg.run.seed, max_operand=cfg.dataset.max_operand)), load_task(cfg.dataset, cfg.run.seed)
    return sum(len(tokenizer.encode(p.prompt, add_special_tokens=False)) for p in task.problems) / len(task.problems)


def step_split(run_dir: Path, recipe: str) -> dict | None:
    """Where an rlrun step's time went (module docstring), from the run's metrics.jsonl."""
    from rlrun.telemetry.metrics import final_records, read_metrics

    path = run_dir / "metrics.jsonl"
    records = [r for r in final_records(read_metrics(path)) if r["step"] > 1] if path.is_file() else []
    if len(records) < 2:
        return None
    first, last = records[0], records[-1]
    steps = last["step"] - first["step"]

    def per_step(key: str) -> float | None:
        if first.get(key) is None or last.get(key) is None:
            return None
        return (last[key] - first[key]) / steps

    def of(key: str) -> list[float]:
        return [float(r[key]) for r in records if r.get(key) is not None]

    step, wait, weights = median(of("step_time_s")), median(of("wait_s")), median(of("weights_s"))
    groups, requests = per_step("groups_published"), per_step("requests")
    # every continuation prefills its prompt and prefix again: after a restart (from the journal) or a failed request
    continued, reused = per_step("samples_continued"), per_step("tokens_reused")
    if continued is not None and reused is not None:  # (records written before the two were counted apart have none on retry)
        continued += per_step("samples_continued_on_retry") or 0
        reused += per_step("tokens_kept_on_retry") or 0
    generating = per_step("generating_ms")
    return {
        "step_s": step, "wait_s": wait, "weights_s": weights,
        "train_s": median([r["step_time_s"] - r["wait_s"] - r["weights_s"] for r in records]),
        "paused_s": median(of("vllm_paused_s")), "paused_p90_s": percentile(of("vllm_paused_s"), 90),
        "generating_s": generating / 1000 if generating is not None else None,
        "requests_per_group": requests / groups if requests is not None and groups else None,
        "spanning_per_step": median(of("samples_spanning_update")) if of("samples_spanning_update") else None,
        "prefilled_again_per_step": (reused + continued * mean_prompt_tokens(recipe)) if continued is not None and reused is not None else None,
        "ettr": last.get("ettr"),
    }  # fmt: skip


def trl_points(path: Path) -> tuple[list[Point], float]:
    if not path.is_file():
        return [], 0.0
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    starts = [r for r in rows if r.get("kind") == "train_begin"]
    steps = [r for r in rows if r.get("kind") == "step"]
    points = [Point(r["seconds"], r["step"], r["samples"], r["reward"]) for r in steps]
    return points, (starts[0]["seconds"] if starts else 0.0)


def trl_split(path: Path) -> dict | None:
    """A TRL step's time (between step ends) and its generation with scoring, medians over steps 2.."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    steps = [r for r in rows if r.get("kind") == "step"]
    if len(steps) < 3:
        return None
    durations = [b["seconds"] - a["seconds"] for a, b in zip(steps[1:], steps[2:])]
    generating = [r["generating_s"] for r in steps[2:] if r.get("generating_s") is not None]
    step = median(durations)
    gen = median(generating)
    return {"step_s": step, "generating_s": gen, "train_s": step - gen if step is not None and gen is not None else None}


def run_system(name: str, out: Path, budget_s: float, overrides: list[str], trl_threads: int, round_: int = 1,
               baseline: Path | None = None) -> dict:  # fmt: skip
    kind, recipe, extra = SYSTEMS[name]
    folder = out / f"{name}-{round_}"
    folder.mkdir(parents=True, exist_ok=True)
    launched = time.time()
    cwd, env = REPO, {}
    if kind in ("rlrun", "base"):
        command = [sys.executable, "-m", "rlrun", "train", f"recipe={recipe}", f"run.dir={folder / 'run'}",
                   "supervisor.live_view=false", *extra, *overrides]  # fmt: skip
        if kind == "base":
            if baseline is None:
                raise SystemExit(f"{name} needs --baseline DIR (a checkout of the commit to compare with)")
            cwd, env = baseline, {"PYTHONPATH": str(baseline)}
    else:
        command = [sys.executable, str(Path(__file__).resolve()), "--worker", "--launched", repr(launched),
                   "--budget-s", str(budget_s), "--out", str(folder), "--trl-threads", str(trl_threads),
                   f"recipe={recipe}", *extra, *overrides]  # fmt: skip
    before = load()
    print(f"[{name} #{round_}] {' '.join(command)}  (budget {budget_s:.0f} s; load {before})", flush=True)
    code, wall = run_capped(command, folder / "log.txt", budget_s, cwd, env)
    rlrun = kind in ("rlrun", "base")
    points, first_start = rlrun_points(folder / "run", launched) if rlrun else trl_points(folder / "steps.jsonl")
    points = within(points, budget_s)
    split = step_split(folder / "run", recipe) if rlrun else trl_split(folder / "steps.jsonl")
    startup = startup_split(folder / "run", launched) if rlrun else None
    print(f"[{name} #{round_}] exit {code} after {wall:.0f} s, {len(points)} steps; load {load()}", flush=True)
    return {"name": name, "round": round_, "kind": kind, "recipe": recipe, "code": code, "wall_s": wall,
            "first_step_s": first_start, "points": points, "load": f"{before} -> {load()}", "split": split,
            "startup": startup}  # fmt: skip


# --- TRL, in its own process (--worker) ------------------------------------------------------------


def trl_worker(args, overrides: list[str]) -> int:
    import warnings

    warnings.filterwarnings("ignore", message=".*vLLM.*")
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlrun.config import compose
    from rlrun.task.rewards import reward_in_process
    from rlrun.task.tasks import load_task, problem_index
    from rlrun.models.source import model_path

    torch.set_num_threads(args.trl_threads)
    cfg, _ = compose(overrides)
    path = model_path(cfg.model, build=True, seed=cfg.run.seed, max_operand=cfg.dataset.max_operand)
    task = load_task(cfg.dataset, cfg.run.seed, cfg.reward)
    score = reward_in_process(task.rewards)
    t, algo = cfg.trainer, cfg.algo
    per_step = t.samples_per_step
    groups = cfg.groups_per_step * t.max_train_steps
    order = [problem_index(c, len(task.problems), cfg.run.seed) for c in range(groups)]
    chat = cfg.model.chat_template  # rlrun renders the prompt with the model's chat template; TRL does for messages

    def as_prompt(prompt):
        return ([{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)) if chat else prompt

    dataset = Dataset.from_dict({"prompt": [as_prompt(task.problems[i].prompt) for i in order], "problem": order})
    rewards: list[float] = []
    generating = [0.0]  # seconds in TRL's generation (and scoring) since the last step

    def text_of(completion) -> str:  # a chat completion is [{"role": "assistant", "content": ...}]
        return completion[0]["content"] if chat else completion

    def reward(prompts, completions, problem, **_):
        scores = [score(text_of(c), task.problems[i].prompt, task.problems[i].row) for c, i in zip(completions, problem)]
        rewards.extend(scores)
        return scores

    steps_file = open(Path(args.out) / "steps.jsonl", "w")  # noqa: SIM115 - closed at the end

    def write(record: dict) -> None:
        steps_file.write(json.dumps({**record, "seconds": round(time.time() - args.launched, 3)}) + "\n")
        steps_file.flush()

    class Progress(TrainerCallback):
        def on_train_begin(self, _args, state, control, **_):
            write({"kind": "train_begin"})

        def on_step_end(self, _args, state, control, **_):
            batch = rewards[-per_step:]
            write({"kind": "step", "step": state.global_step, "samples": state.global_step * per_step,
                   "reward": sum(batch) / max(len(batch), 1), "generating_s": round(generating[0], 3)})  # fmt: skip
            rewards.clear()
            generating[0] = 0.0
            if time.time() - args.launched >= args.budget_s - 5.0:  # stop cleanly before the cap
                control.should_training_stop = True

    gspo = algo.name == "gspo"
    config = GRPOConfig(
        output_dir=str(Path(args.out) / "trl"),
        per_device_train_batch_size=t.train_batch_size,
        gradient_accumulation_steps=t.gradient_accumulation_passes,
        steps_per_generation=t.gradient_accumulation_passes,  # one generation per optimizer step
        num_iterations=1,
        num_generations=algo.group_size,
        max_completion_length=cfg.actor.max_new_tokens,
        temperature=cfg.actor.temperature,
        top_p=1.0,
        top_k=0,
        learning_rate=t.lr,
        adam_beta1=t.betas[0],
        adam_beta2=t.betas[1],
        weight_decay=t.weight_decay,
        max_grad_norm=t.grad_clip,
        lr_scheduler_type="constant",
        warmup_steps=0,
        beta=0.0,
        epsilon=algo.clip_eps_low,
        epsilon_high=algo.clip_eps_high,
        loss_type="grpo" if gspo else "dapo",
        importance_sampling_level="sequence" if gspo else "token",
        scale_rewards="group" if algo.normalize_advantage_std else "none",
        shuffle_dataset=False,
        max_steps=t.max_train_steps,
        seed=cfg.run.seed,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_steps=10,
        disable_tqdm=True,
        dataloader_num_workers=0,
        bf16=cfg.trainer.mixed_precision == "bf16",  # autocast over float32 weights, as rlrun's trainer
    )

    class TimedGRPOTrainer(GRPOTrainer):  # the step split: generation (with scoring) vs the rest
        def _generate_and_score_completions(self, inputs):
            started = time.monotonic()
            try:
                return super()._generate_and_score_completions(inputs)
            finally:
                generating[0] += time.monotonic() - started

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(path)
    trainer = TimedGRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=dataset, processing_class=tokenizer,
                          callbacks=[Progress()])  # fmt: skip
    trainer.train()
    steps_file.close()
    return 0


# --- the table and the picture ---------------------------------------------------------------------


def fmt(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def spread(values: list[float | None], digits: int = 0) -> str:
    """The median of the rounds, with min-max when there are several: '127 (126-129)'; '-' for none."""
    known = [v for v in values if v is not None]
    if not known:
        return "-"
    if len(known) == 1:
        return fmt(known[0], digits)
    return f"{fmt(median(known), digits)} ({fmt(min(known), digits)}-{fmt(max(known), digits)})"


def figures_of(run: dict, window: int, equal_t: float) -> dict:
    curve = smoothed(run["points"], window)
    return {
        "times": {th: time_to(curve, th) for th in THRESHOLDS},
        "reward_at": reward_at(curve, equal_t),
        "sps": samples_per_s(run["points"], run["first_step_s"]),
        "last": curve[-1][1] if curve else None,
    }


def report(results: list[dict], window: int) -> str:
    ends = [r["points"][-1].seconds for r in results if r["points"]]
    equal_t = min(ends) if ends else 0.0
    names = list(dict.fromkeys(r["name"] for r in results))
    runs = {n: [r for r in results if r["name"] == n] for n in names}

    def trl_of(recipe: str) -> str:  # the TRL system of a recipe, the reference of its ratios
        return next((n for n, (kind, r, _) in SYSTEMS.items() if kind == "trl" and r == recipe), "")
    figures = {n: [figures_of(r, window, equal_t) for r in runs[n]] for n in names}

    def med(name: str, pick) -> float | None:
        values = [v for v in (pick(f) for f in figures.get(name, [])) if v is not None]
        return median(values)

    rounds = max(len(v) for v in runs.values()) if runs else 0
    header = (f"{'system':<16} | {'runs':>4} | {'startup s':>11} | " + " | ".join(f"{'to ' + str(th):>13}" for th in THRESHOLDS)
              + f" | {'reward@' + format(equal_t, '.0f') + 's':>11} | {'samples/s':>16} | {'steps':>5} | {'last step s':>13} | {'to 0.8 / TRL':>12} | load before -> after")  # fmt: skip
    lines = ["", f"seconds from each system's launch (startup included); reward = mean of the last {window} steps; "
                 f"median of {rounds} round(s) (min-max)", header, "-" * len(header)]  # fmt: skip
    for name in names:
        fs, rs = figures[name], runs[name]
        trl = trl_of(rs[0]["recipe"])
        mine, theirs = med(name, lambda f: f["times"][0.8]), med(trl, lambda f: f["times"][0.8])
        lines.append(
            f"{name:<16} | {len(rs):>4} | {spread([r['first_step_s'] for r in rs]):>11} | "
            + " | ".join(f"{spread([f['times'][th] for f in fs]):>13}" for th in THRESHOLDS)
            + f" | {spread([f['reward_at'] for f in fs], 3):>11} | {spread([f['sps'] for f in fs]):>16} | "
            f"{spread([len(r['points']) for r in rs]):>5} | {spread([r['points'][-1].seconds if r['points'] else None for r in rs]):>13} | "
            f"{fmt(mine / theirs if mine and theirs else None, 2):>12} | "
            + "; ".join(r["load"] for r in rs)
        )  # fmt: skip
    lines.append("(to 0.8 / TRL: this system's median time to 0.8 over TRL's, same algorithm; <= 1.0 = no later than TRL)")
    split_rows = [(n, [r["split"] for r in runs[n] if r.get("split")]) for n in names]
    split_rows = [(n, sp) for n, sp in split_rows if sp]
    if split_rows:
        cols = [("step", "step_s", 3), ("train", "train_s", 3), ("weights", "weights_s", 3), ("paused", "paused_s", 3),
                ("paused p90", "paused_p90_s", 3), ("wait", "wait_s", 3), ("generating", "generating_s", 3),
                ("req/group", "requests_per_group", 2), ("spanning", "spanning_per_step", 1),
                ("prefill again", "prefilled_again_per_step", 0), ("ETTR", "ettr", 2)]  # fmt: skip
        head = f"{'split of a step':<16} | " + " | ".join(f"{c[0]:>14}" for c in cols)
        lines += ["", "seconds per step, median over steps 2.. (each run), then the median of the runs (min-max); "
                      "generating: wall time with a request in flight; spanning: samples in flight across an update; "
                      "prefill again: tokens", head, "-" * len(head)]  # fmt: skip
        for name, sp in split_rows:
            lines.append(f"{name:<16} | " + " | ".join(f"{spread([x.get(key) for x in sp], d):>14}" for _, key, d in cols))
    start_rows = [(n, [r["startup"] for r in runs[n] if r.get("startup")]) for n in names]
    start_rows = [(n, st) for n, st in start_rows if st]
    if start_rows:
        cols = [("supervisor up", "supervisor_s"), ("redis ready", "redis_s"), ("trainer ready", "trainer_s"),
                ("vllm ready", "vllm_s"), ("actor started", "actor_s"), ("groups in", "groups_s"),
                ("first step", "first_step_s")]  # fmt: skip
        head = f"{'startup':<16} | " + " | ".join(f"{c[0]:>13}" for c in cols)
        lines += ["", "seconds from launch at which each rlrun run reached each point (events.jsonl), median (min-max)",
                  head, "-" * len(head)]  # fmt: skip
        for name, st in start_rows:
            lines.append(f"{name:<16} | " + " | ".join(f"{spread([x.get(key) for x in st], 1):>13}" for _, key in cols))
    for a in names:
        kind, recipe, _ = SYSTEMS[a]
        trl, sync = trl_of(recipe), f"{a}-sync"
        if kind != "rlrun":
            continue
        mine = med(a, lambda f: f["times"][0.8])
        if trl in figures:
            theirs = med(trl, lambda f: f["times"][0.8])
            goal = "met" if mine is not None and theirs is not None and mine <= theirs else "NOT met"
            lines.append(f"goal {a}: reaches 0.8 no later than {trl} (ratio <= 1.0): {goal} "
                         f"({fmt(mine)} s vs {fmt(theirs)} s, ratio {fmt(mine / theirs if mine and theirs else None, 2)})")  # fmt: skip
        if sync in figures:
            slow = med(sync, lambda f: f["times"][0.8])
            worth = slow / mine if mine and slow else None
            sps = (med(a, lambda f: f["sps"]), med(sync, lambda f: f["sps"]))
            goal = "met" if worth is not None and worth >= 1.3 else "NOT met"
            lines.append(f"goal {a}: asynchrony worth >= 1.3x over {sync} (time to 0.8): {goal} ({fmt(worth, 2)}x; "
                         f"samples/s {fmt(sps[0], 1)} vs {fmt(sps[1], 1)}, {fmt(sps[0] / sps[1] if all(sps) else None, 2)}x)")  # fmt: skip
    return "\n".join(lines)


def draw(results: list[dict], window: int, out: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 6), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    for r in results:
        curve = smoothed(r["points"], window)
        if curve:
            (line,) = ax.plot([t for t, _ in curve], [v for _, v in curve], linewidth=1.8, label=f"{r['name']} #{r.get('round', 1)}")
            ax.plot([p.seconds for p in r["points"]], [p.reward for p in r["points"]], linewidth=0.5, alpha=0.25, color=line.get_color())
    for th in THRESHOLDS:
        ax.axhline(th, color="gray", linewidth=0.5, linestyle=":")
    ax.set_xlabel("wall-clock seconds since launch (startup included)")
    ax.set_ylabel(f"reward (mean of the last {window} steps; faint: each step)")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    recipes = ", ".join(dict.fromkeys(r["recipe"] for r in results))
    ax.set_title(f"rlrun vs TRL GRPOTrainer: recipe {recipes}, same settings")
    fig.savefig(out, format="png")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=300.0, help="wall time per system, startup included (default 300)")
    parser.add_argument("--systems", default=None, help=f"comma-separated, from {','.join(SYSTEMS)} (default {DEFAULT_SYSTEMS})")
    parser.add_argument("--recipe", choices=sorted(RECIPE_SYSTEMS), help="the recipe's systems: " + "; ".join(f"{r}: {v}" for r, v in RECIPE_SYSTEMS.items()))
    parser.add_argument("--out", type=Path, default=None, help="where runs, logs, results.json and vs_trl.png go")
    parser.add_argument("--window", type=int, default=10, help="steps in the reward's trailing mean (default 10)")
    parser.add_argument("--trl-threads", type=int, default=os.cpu_count() or 1, help="torch threads of the TRL process")
    parser.add_argument("--rounds", type=int, default=1, help="run every system this many times, alternated (default 1)")
    parser.add_argument("--baseline", type=Path, help="a checkout of another commit: the base-* systems run from it")
    parser.add_argument("--report", type=Path, help="print the table and draw the PNG again from a results.json; runs nothing")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--launched", type=float, default=0.0, help=argparse.SUPPRESS)
    args, overrides = parser.parse_known_args(argv)
    if args.worker:
        return trl_worker(args, overrides)
    if args.report:
        saved = json.loads(args.report.read_text())
        results = [{**r, "points": within([Point(**p) for p in r["points"]], args.budget_s)} for r in saved]
        print(report(results, args.window))
        draw(results, args.window, args.report.with_name("vs_trl.png"))
        return 0
    systems = args.systems or (RECIPE_SYSTEMS[args.recipe] if args.recipe else DEFAULT_SYSTEMS)
    names = [n.strip() for n in systems.split(",") if n.strip()]
    unknown = sorted(set(names) - set(SYSTEMS))
    if unknown:
        parser.error(f"unknown system(s) {', '.join(unknown)}; choose from {', '.join(SYSTEMS)}")
    if any(SYSTEMS[n][0] == "trl" for n in names):
        try:
            import trl  # noqa: F401
        except ImportError:
            parser.error("TRL is not installed: pip install 'rlrun[bench]' (or leave the trl-* systems out)")
    out = args.out or Path(f"/tmp/rlrun-vs-trl-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds through run_capped: children stopped
    with open(LOCK, "w") as lock:
        if args.rounds < 1:
            parser.error("--rounds must be at least 1")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"another bench holds {LOCK}: waiting for it (two benches on 2 cores measure each other)", flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        print(f"bench/vs_trl.py: {', '.join(names)} x {args.rounds} round(s), alternated; {args.budget_s:.0f} s each; out {out}; "
              f"{os.cpu_count()} CPUs; load {load()}", flush=True)  # fmt: skip
        results = []
        for round_ in range(1, args.rounds + 1):
            shift = (round_ - 1) % len(names)
            for name in names[shift:] + names[:shift]:  # A B C, B C A, ...
                results.append(run_system(name, out, args.budget_s, overrides, args.trl_threads, round_, args.baseline))
    text = report(results, args.window)
    print(text)
    (out / "results.json").write_text(json.dumps([{**r, "points": [p.__dict__ for p in r["points"]]} for r in results], indent=1) + "\n")
    draw(results, args.window, out / "vs_trl.png")
    print(f"\nplot: {out / 'vs_trl.png'}; runs, logs and results.json in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
