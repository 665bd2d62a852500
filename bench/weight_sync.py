"""Handing weights to vLLM, disk vs broadcast, and the trainer's step time with 1 and 2 ranks.

    python bench/weight_sync.py [--sizes tiny,100m] [--repeats 3] [--steps 6] [--skip-steps]

1. Weight hand-over, for a model built locally (nothing downloaded): `tiny` is rlrun's demo
   shape (~0.3 M parameters), `100m` a ~100 M-parameter Qwen2 (8 layers of 768, vocabulary 32k).
   - disk: what the hf trainer does after every step today — `save_pretrained` (safetensors) into
     a fresh folder, into the page cache, not fsynced, as the trainer does — then reading every
     tensor back into memory (what vLLM's reload reads); bytes = the folder.
   - broadcast: rank 0 of the in-memory path (rlrun/trainer/weight_broadcast.py) to one receiver
     process running rlrun's receiver (rlrun/backends/fast_llm/broadcast.py, what each vLLM worker
     runs), gloo on 127.0.0.1; timed from the first header sent to the receiver holding the last
     tensor; bytes = the tensors sent.
   Neither includes vLLM's own load into its model nor the pause/resume HTTP calls (the same for
   both paths): these are the parts of the pause the two paths do differently.
2. Step time: `rlrun.trainer.step.optimizer_step` on the tiny shape, a GSPO step of 256 samples
   (2 passes of 128, 16 per group, ~10-token prompts, 4-token completions, as the demo), median
   of --steps steps after one warm-up, with 1 rank and with 2 ranks (FSDP2 and DDP, gloo,
   1 torch thread per rank).

Prints tables; asserts nothing. Other load on the machine changes the figures a lot.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SHAPES = {
    "tiny": dict(vocab_size=64, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1),
    "100m": dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=8, num_attention_heads=12, num_key_value_heads=4),
}


def build(size: str):
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    config = Qwen2Config(**SHAPES[size], tie_word_embeddings=False, max_position_embeddings=256)
    return AutoModelForCausalLM.from_config(config).float()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- 1. weight hand-over -------------------------------------------------------------------------
def disk_once(model, root: Path) -> tuple[float, float, int]:
    from safetensors import safe_open

    target = root / "v"
    shutil.rmtree(target, ignore_errors=True)
    started = time.perf_counter()
    model.save_pretrained(target, safe_serialization=True)
    written = time.perf_counter()
    for file in sorted(target.glob("*.safetensors")):
        with safe_open(str(file), "pt") as handle:
            for key in handle.keys():
                handle.get_tensor(key).clone()  # a copy: the pages are really read, not only mapped
    read = time.perf_counter()
    size = sum(p.stat().st_size for p in target.rglob("*") if p.is_file())
    return written - started, read - written, size


def _receive(port: int, repeats: int, results) -> None:
    from rlrun.backends.fast_llm import broadcast

    member = broadcast.join("127.0.0.1", port, 1, 2, "gloo", 120)
    for _ in range(repeats):
        count = sum(1 for _ in broadcast.receive_weights(member))
        results.put((time.time(), count))


def broadcast_all(model, repeats: int) -> list[tuple[float, int]]:
    import multiprocessing

    from rlrun.trainer.weight_broadcast import WeightBroadcaster

    ctx = multiprocessing.get_context("spawn")
    port, results = free_port(), ctx.Queue()
    child = ctx.Process(target=_receive, args=(port, repeats, results), daemon=True)
    child.start()
    sender = WeightBroadcaster("127.0.0.1", port, receivers=1, timeout_s=120)
    state = model.state_dict()
    out = []
    for _ in range(repeats):
        started = time.time()
        sent = sender.send(state)
        done, _count = results.get(timeout=600)
        out.append((max(done, time.time()) - started, sent))
    child.join(60)
    return out


def weight_table(sizes: list[str], repeats: int) -> None:
    print("\n## weight hand-over, disk vs broadcast (median of %d)" % repeats)
    print(f"{'model':>6} {'params':>10} | {'disk write s':>12} {'disk read s':>11} {'disk total s':>12} {'disk MB':>8} | {'broadcast s':>11} {'bcast MB':>8}")
    for size in sizes:
        model = build(size)
        params = sum(p.numel() for p in model.parameters())
        with tempfile.TemporaryDirectory() as tmp:
            disk = [disk_once(model, Path(tmp)) for _ in range(repeats)]
        cast = broadcast_all(model, repeats)
        w = statistics.median(d[0] for d in disk)
        r = statistics.median(d[1] for d in disk)
        b = statistics.median(c[0] for c in cast)
        print(f"{size:>6} {params / 1e6:>9.2f}M | {w:>12.3f} {r:>11.3f} {w + r:>12.3f} {disk[0][2] / 1e6:>8.1f} | {b:>11.3f} {cast[0][1] / 1e6:>8.1f}")
        del model


# --- 2. step time ---------------------------------------------------------------------------------
def samples(seed: int = 0) -> list:
    from rlrun.rollouts import Sample

    rng = random.Random(seed)
    out = []
    for g in range(16):
        prompt = [rng.randrange(3, 64) for _ in range(10)]
        for i in range(16):
            out.append((prompt, Sample(i, [rng.randrange(3, 64) for _ in range(4)], [-rng.uniform(2, 5) for _ in range(4)],
                                       [0] * 4, "stop", float(i % 2), rng.uniform(-1, 1))))  # fmt: skip
    return out


def step_times(rank: int, world: int, port: int, sharding: str, steps: int) -> list[float]:
    import torch

    from rlrun.config import compose
    from rlrun.trainer.parallel import Parallel, Ranks
    from rlrun.trainer.step import optimizer_step

    torch.set_num_threads(1)
    cfg, _ = compose(["recipe=math_gspo", "trainer.train_batch_size=128", "trainer.gradient_accumulation_passes=2",
                      f"trainer.nproc_per_node={world}"])  # fmt: skip
    parallel = Parallel(Ranks(rank, world, "127.0.0.1", port), sharding)
    model = parallel.wrap(build("tiny"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = samples()
    times = []
    for _ in range(steps + 1):
        started = time.perf_counter()
        optimizer_step(model, optimizer, batch, cfg, parallel, torch.device("cpu"))
        times.append(time.perf_counter() - started)
    parallel.close()
    return times[1:]


def _rank(rank: int, world: int, port: int, sharding: str, steps: int, out: str) -> None:
    times = step_times(rank, world, port, sharding, steps)
    if rank == 0:
        Path(out).write_text(" ".join(map(str, times)))


def step_table(steps: int) -> None:
    import torch.multiprocessing as mp

    print(f"\n## trainer step time, tiny model, GSPO, 256 samples per step (median of {steps} steps)")
    print(f"{'ranks':>5} {'sharding':>8} | {'step s':>7} {'min s':>7}")
    one = step_times(0, 1, 0, "auto", steps)
    print(f"{1:>5} {'-':>8} | {statistics.median(one):>7.3f} {min(one):>7.3f}")
    for sharding in ("fsdp2", "ddp"):
        with tempfile.NamedTemporaryFile() as out:
            mp.start_processes(_rank, args=(2, free_port(), sharding, steps, out.name), nprocs=2, start_method="spawn")
            two = [float(v) for v in Path(out.name).read_text().split()]
        print(f"{2:>5} {sharding:>8} | {statistics.median(two):>7.3f} {min(two):>7.3f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="tiny,100m", help="comma-separated: tiny, 100m")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--skip-steps", action="store_true", help="only the weight hand-over")
    args = parser.parse_args(argv)
    sizes = [s for s in args.sizes.split(",") if s]
    unknown = [s for s in sizes if s not in SHAPES]
    if unknown:
        print(f"unknown size(s) {unknown}: choose among {', '.join(SHAPES)}", file=sys.stderr)
        return 2
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(f"load average before: {os.getloadavg()}")
    weight_table(sizes, args.repeats)
    if not args.skip_steps:
        step_table(args.steps)
    print(f"\nload average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
