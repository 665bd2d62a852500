"""A GPU self-check: what to run first on a new GPU machine (and what a session lent one runs).

    python bench/gpu_check.py [--device auto|cuda|cpu] [--json gpu_check.json] [--parts versions,step,...]

Each part runs in a process of its own under a time cap (killed with its process group past it:
a collective stuck in NCCL cannot hang the check) and is reported as pass, fail, skip or timeout,
in a table and in the JSON file. Without CUDA (or with --device cpu) it runs in CPU mode: the same
checks on the CPU device with tiny shapes, so CI runs it (tests/unit/test_bench_gpu_check.py).

- versions: Python, torch (its CUDA, cuDNN and NCCL), transformers, vLLM, nvidia-ml-py, rlrun; the GPUs.
- step: rlrun's optimizer step (rlrun/trainer/step.py) on the device in fp32, fp32 with activation
  checkpointing and bf16 with activation checkpointing, against the fp32 step on the CPU: loss,
  grad norm and the weights after the step.
- checkpoint: two ranks (FSDP2; gloo on the CPU, NCCL on two GPUs; one rank on a one-GPU machine,
  where NCCL refuses two) take a step, write a sharded checkpoint (rlrun/trainer/checkpoint.py),
  load it into fresh models and optimizers and take a second step, which must equal the second
  step of ranks that never stopped.
- nccl: an all-reduce over every visible GPU (CUDA only).

Exit status 0 when no part failed or ran out of time. Not yet here (issue 35): the trainer role
for real with a SIGTERM and a resume, trainer throughput for SmolLM2-135M and Qwen2.5-0.5B shapes,
the end-to-end run with vLLM.
"""

from __future__ import annotations

import argparse
import json
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
CAPS = {"versions": (60, 120), "step": (120, 300), "checkpoint": (180, 300), "nccl": (60, 120)}
LR = 1e-3  # one Adam step moves a weight by about this: a wrong step is off by that much, not by noise
# Largest difference from the CPU fp32 reference each variant may show (loss relative, weights absolute).
TOLERANCE = {"fp32": (1e-4, 2e-5), "fp32+ac": (1e-4, 2e-5), "bf16+ac": (5e-2, None)}
BF16_WEIGHTS_AGREEING = 0.9  # bf16: at least this share of weights moved as the reference moved them (within LR / 2)


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
        "rlrun": version("rlrun"),
    }  # fmt: skip
    if device == "cuda":
        figures["cudnn"] = torch.backends.cudnn.version()
        figures["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        figures["gpus"] = [
            f"{p.name} ({p.total_memory / 2**30:.0f} GiB)" for p in map(torch.cuda.get_device_properties, range(torch.cuda.device_count()))
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
            failures.append(f"{variant}: loss {metrics['loss']:.6g} vs {reference[0]['loss']:.6g} on the CPU (relative {loss_rel:.2g} > {loss_tol:g})")
        if weight_tol is not None and not diffs.max().item() <= weight_tol:
            failures.append(f"{variant}: weights differ from the CPU's by up to {diffs.max().item():.2g} (> {weight_tol:g})")
        if weight_tol is None and agreeing < BF16_WEIGHTS_AGREEING:
            failures.append(f"{variant}: only {agreeing:.1%} of weights moved as on the CPU (< {BF16_WEIGHTS_AGREEING:.0%})")
    figures["reference_loss"] = reference[0]["loss"]
    if failures:
        return Result("step", "fail", detail="; ".join(failures), figures=figures)
    worst = max(figures[v]["loss_rel_diff"] for v in TOLERANCE)
    return Result("step", "pass", detail=f"{', '.join(TOLERANCE)} on {device} match the CPU fp32 step (loss within {worst:.1g})", figures=figures)


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
    mp.start_processes(checkpoint_rank, args=(nproc, port, device, str(model), str(work), str(out)), nprocs=nproc, join=True,
                       start_method="spawn")  # fmt: skip
    found = json.loads(out.read_text())
    layout = "sharded (torch.distributed.checkpoint)" if found["shards"] else "one optimizer file"
    detail = f"{nproc} rank(s), {found['sharding']}, {layout}; resumed step 2 vs uninterrupted: max weight diff {found['max_diff']:.2g}"
    if nproc == 1 and device == "cuda":
        detail += " (one GPU: NCCL refuses two ranks on it)"
    failures = []
    if found["problem"]:
        failures.append(f"the checkpoint is damaged: {found['problem']}")
    if nproc > 1 and len(found["shards"]) < nproc:
        failures.append(f"{len(found['shards'])} optimizer shard(s) for {nproc} ranks")
    if not found["max_diff"] <= 1e-6:
        failures.append(f"the resumed step differs from the uninterrupted one by up to {found['max_diff']:.2g} (> 1e-6)")
    if not found["moved"] > LR / 2:
        failures.append(f"the second step moved no weight by more than {found['moved']:.2g}: the comparison means nothing")
    return Result("checkpoint", "fail" if failures else "pass", detail="; ".join(failures) or detail, figures=found)


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


PARTS = {"versions": part_versions, "step": part_step, "checkpoint": part_checkpoint, "nccl": part_nccl}
HIDDEN = {"_hang": part_hang}


# --- what the parts share --------------------------------------------------------------------------------


def tiny_model(work: Path) -> Path:
    """A 2-layer Qwen2 of a 32-token vocabulary, saved once in `work`."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    path = work / "model"
    if not (path / "config.json").exists():
        config = Qwen2Config(vocab_size=32, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=1,
                             num_key_value_heads=1, tie_word_embeddings=False, max_position_embeddings=64)  # fmt: skip
        torch.manual_seed(1)
        AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return path


def train_config(mixed: str = "none", ac: bool = False):
    """The run's config as the step reads it, built from the schema (no Hydra: the GPU image lacks it)."""
    import dataclasses
    import typing

    from rlrun.config.schema import AlgoConfig, RunConfig, TrainerConfig

    sections = typing.get_type_hints(RunConfig)
    defaults = {f.name: sections[f.name]() for f in dataclasses.fields(RunConfig) if dataclasses.is_dataclass(sections[f.name])}
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


def checkpoint_rank(rank: int, nproc: int, port: int, device: str, model_path: str, work: str, out: str) -> None:
    """One rank: two steps straight; then one step, a checkpoint, fresh models loading it, the second step."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlrun.trainer import checkpoint
    from rlrun.trainer.parallel import Parallel, Ranks
    from rlrun.trainer.step import optimizer_step

    ranks = Ranks(rank, nproc, "127.0.0.1", port, local_rank=rank)
    where = ranks.device(device)
    parallel = Parallel(ranks, "fsdp2", device=where)
    cfg = train_config()

    def fresh(path):
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(where)
        model.train()
        wrapped = parallel.wrap(model)
        return wrapped, torch.optim.AdamW(wrapped.parameters(), lr=LR, betas=tuple(cfg.trainer.betas))

    def step(model, optimizer, seed):
        optimizer_step(model, optimizer, samples(seed), cfg, parallel, torch.device(where))

    model, optimizer = fresh(model_path)
    step(model, optimizer, 0)
    after_one = parallel.full_state_dict(model)
    step(model, optimizer, 1)
    straight = parallel.full_state_dict(model)

    model, optimizer = fresh(model_path)
    step(model, optimizer, 0)
    saved = Path(work) / "checkpoints" / "step_000001"
    checkpoint.save(model, optimizer, checkpoint.TrainerState(1, 16, 1), saved, keep=2, parallel=parallel)
    model, optimizer = fresh(saved)
    checkpoint.load_optimizer(optimizer, saved, model, parallel)
    step(model, optimizer, 1)
    resumed = parallel.full_state_dict(model)
    if ranks.is_main:
        shards = sorted(p.name for p in (saved / checkpoint.OPTIMIZER_DIR).glob("*.distcp")) if (saved / checkpoint.OPTIMIZER_DIR).is_dir() else []
        found = {
            "sharding": parallel.sharding, "shards": shards, "problem": checkpoint.problem(saved),
            "max_diff": max((resumed[k].float() - straight[k].float()).abs().max().item() for k in straight),
            "moved": max((straight[k].float() - after_one[k].float()).abs().max().item() for k in straight),
        }  # fmt: skip
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
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    started = time.monotonic()
    with open(log, "wb") as out:
        child = subprocess.Popen([sys.executable, __file__, "--part", name, "--device", device, "--work", str(work), "--result", str(result_file)],
                                 stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True)  # fmt: skip
        try:
            code = child.wait(timeout=cap_s)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            return Result(name, "timeout", time.monotonic() - started, f"still running after its cap of {cap_s:g} s: killed ({log})")
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
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto", help="auto: cuda where torch sees a GPU, else CPU mode")
    parser.add_argument("--json", type=Path, default=Path("gpu_check.json"), help="where the report is written")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument("--cap-s", type=float, default=None, help="one time cap for every part (default: per part and mode)")
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
