"""Handing weights to vLLM, disk vs broadcast vs shm, and the trainer's step time with 1 and 2 ranks.

    python bench/weight_sync.py [--sizes tiny,100m] [--repeats 3] [--steps 6] [--skip-steps] [--vllm]
    python bench/weight_sync.py --only-vllm --sizes smollm2 --repeats 3

1. Weight hand-over, for a model built locally (nothing downloaded): `tiny` is rlrun's demo
   shape (~0.3 M parameters), `100m` a ~100 M-parameter Qwen2 (8 layers of 768, vocabulary 32k).
   - disk: what the hf trainer does after every step with trainer.weight_transfer=disk (the
     default) — `save_pretrained` (safetensors) into
     a fresh folder, into the page cache, not fsynced, as the trainer does — then reading every
     tensor back into memory (what vLLM's reload reads); bytes = the folder.
   - broadcast: rank 0 of the in-memory path (rlrun/trainer/weight_broadcast.py) to one receiver
     process running rlrun's receiver (rlrun/weights/broadcast.py, what each vLLM worker
     runs), gloo on 127.0.0.1; timed from the first header sent to the receiver holding the last
     tensor; bytes = the tensors sent.
   Neither includes vLLM's own load into its model nor the pause/resume HTTP calls (the same for
   both paths): these are the parts of the pause the two paths do differently.
2. Step time: `rlrun.trainer.step.optimizer_step` on the tiny shape, a GSPO step of 256 samples
   (2 passes of 128, 16 per group, ~10-token prompts, 4-token completions, as the demo), median
   of --steps steps after one warm-up, with 1 rank and with 2 ranks (FSDP2 and DDP, gloo,
   1 torch thread per rank).

3. (--vllm; heavy: run it under the lock) A whole weight update into a real vLLM CPU server
   through the trainer's own code, per model size, --repeats updates each way, each with new
   weights: disk = `rlrun.trainer.weight_publisher.write_weights` (the folder, weights/current) then
   `VllmAdmin.update_from_folder` (pause, the engine's reload, publish, resume); broadcast =
   `BroadcastSync.update` (pause, group check, receive while rank 0 sends, publish, resume), its
   first update forming the group; shm = `SharedWeights.write` (the copy into the run's file in
   /dev/shm, before the pause) then `VllmAdmin.update_from_shared`, its first write allocating
   the file's pages. `pause` is vLLM's: from the /pause request to the /resume answer (generation
   stopped); `update` is the trainer's whole call (the disk write or the shm copy, done before
   the pause, included; `write` alone); `receive`/`load`: the vLLM worker's own report from its
   log (the tensors in, then vLLM's load into its model); bytes = the folder written (and read
   back by the server), the tensors sent or copied. The model folder is served by the server from
   its start; the `tiny` shape here is the run's real tiny model (warm-started, tied embeddings),
   `100m` the shape above with the tiny model's tokenizer, `smollm2` (--only-vllm) recipe=
   smollm2_grpo's SmolLM2-135M-Instruct (tied).

Prints tables; asserts nothing. Other load on the machine changes the figures a lot.
"""

from __future__ import annotations

import argparse
import os
import random
import re
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
    from rlrun.weights import broadcast

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
    from rlrun.streams.rollouts import Sample

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


# --- 3. a whole update into a real vLLM server ----------------------------------------------------
from rlrun.inference.admin import VllmAdmin  # noqa: E402 - light (httpx), after sys.path is set


class TimedAdmin(VllmAdmin):
    """A VllmAdmin that remembers when it sent its first /pause and got its last /resume answer."""

    paused_at: float | None = None
    resumed_at: float | None = None

    def _post(self, url, **kwargs):
        if url.endswith("/pause") and self.paused_at is None:
            self.paused_at = time.perf_counter()
        response = super()._post(url, **kwargs)
        if url.endswith("/resume"):
            self.resumed_at = time.perf_counter()
        return response


def model_folder(size: str, root: Path) -> tuple[str, str]:
    """(model folder, tokenizer folder) for `size`: the run's tiny model, or the 100m shape saved."""
    from rlrun.config import compose
    from rlrun.models.source import model_path

    if size == "smollm2":
        real = compose(["recipe=smollm2_grpo"])[0]
        smollm2 = model_path(real.model, build=True, seed=real.run.seed, max_operand=real.dataset.max_operand)
        return smollm2, smollm2
    cfg, _ = compose(["recipe=math_grpo"])
    tiny = model_path(cfg.model, build=True, seed=cfg.run.seed, max_operand=cfg.dataset.max_operand)
    if size == "tiny":
        return tiny, tiny
    folder = root / size
    build(size).save_pretrained(folder, safe_serialization=True)
    return str(folder), tiny


def start_vllm(model: str, tokenizer: str, log: Path):
    import subprocess

    from rlrun.config import compose
    from rlrun.inference.server import HealthCheck, base_url, server_argv, server_env

    cfg, _ = compose(["recipe=math_grpo"])
    port = free_port()
    env = {**os.environ, **server_env(cfg.inference), "VLLM_API_KEY": "bench-key", "VLLM_LOGGING_LEVEL": "INFO"}  # the engine's report
    with open(log, "wb") as out:
        proc = subprocess.Popen(server_argv(cfg.inference, cfg.model, model, port, tokenizer=tokenizer, stream_interval=cfg.actor.journal_flush_tokens), env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    url, deadline = base_url("127.0.0.1", port), time.time() + 600
    while not HealthCheck(url)():
        if proc.poll() is not None or time.time() > deadline:
            raise RuntimeError(f"vLLM did not start: {log.read_text()[-2000:]}")
        time.sleep(1)
    return proc, url


def nudged(state: dict, version: int) -> dict:
    """New weights for every update (as after an optimizer step): every tensor moved a little."""
    return {name: t + 1e-4 * version for name, t in state.items()}


LOADED = re.compile(r"weights loaded from .*?: \d+ tensors, received in ([\d.]+) s, loaded in ([\d.]+) s")


def engine_report(log: Path, seen: int) -> tuple[float, float]:
    """(receive s, load s) of the engine's report after the first `seen` ones in the server's log."""
    reports = LOADED.findall(log.read_text(errors="replace"))
    if len(reports) <= seen:
        return float("nan"), float("nan")
    return float(reports[seen][0]), float(reports[seen][1])


def vllm_updates(size: str, repeats: int, root: Path) -> list[tuple]:
    """(way, version, pause s, update s, bytes, write s, receive s, load s) for `repeats` disk, then
    `repeats` + 1 broadcast, then `repeats` + 1 shm updates (the first of each forms or allocates)."""
    import signal

    from transformers import AutoModelForCausalLM

    from rlrun.rundir import RunDir
    from rlrun.trainer.weight_publisher import write_weights
    from rlrun.trainer.weight_broadcast import BroadcastSync
    from rlrun.weights.shared import SharedWeights, shared_path

    import transformers

    transformers.utils.logging.disable_progress_bar()
    folder, tokenizer = model_folder(size, root)
    model = AutoModelForCausalLM.from_pretrained(folder)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # as save_pretrained writes a tied model
    run = RunDir(root / f"run-{size}")
    run.weights.mkdir(parents=True)
    log = root / f"vllm-{size}.log"
    proc, url = start_vllm(folder, tokenizer, log)
    out = []
    shared = SharedWeights(shared_path(f"bench-{os.getpid()}/"))
    try:
        admin = TimedAdmin([url], api_key="bench-key")
        for version in range(1, repeats + 1):
            admin.paused_at = None
            weights = nudged(state, version)
            started = time.perf_counter()
            target = write_weights(run, model, weights, version)
            written = time.perf_counter()
            admin.update_from_folder(str(target), version, lambda: None)
            done = time.perf_counter()
            size_bytes = sum(p.stat().st_size for p in target.rglob("*.safetensors"))
            out.append(("disk", version, admin.resumed_at - admin.paused_at, done - started, size_bytes, written - started,
                        *engine_report(log, len(out))))  # fmt: skip
        sync = BroadcastSync(admin, "127.0.0.1", free_port(), "gloo", timeout_s=120)
        for version in range(repeats + 1, 2 * repeats + 2):  # one more: the first forms the group
            admin.paused_at = None
            weights = nudged(state, version)
            started = time.perf_counter()
            sync.update(weights, version, lambda: None)
            done = time.perf_counter()
            sent = sum(t.numel() * t.element_size() for t in weights.values())
            out.append(("broadcast" if version > repeats + 1 else "broadcast, forming", version,
                        admin.resumed_at - admin.paused_at, done - started, sent, 0.0, *engine_report(log, len(out))))  # fmt: skip
        sync.close()
        for version in range(2 * repeats + 2, 3 * repeats + 3):  # one more: the first allocates the file's pages
            admin.paused_at = None
            weights = nudged(state, version)
            started = time.perf_counter()
            copied = shared.write(weights)
            written = time.perf_counter()
            admin.update_from_shared(str(shared.path), version, lambda: None)
            done = time.perf_counter()
            out.append(("shm" if version > 2 * repeats + 2 else "shm, first", version, admin.resumed_at - admin.paused_at,
                        done - started, copied, written - started, *engine_report(log, len(out))))  # fmt: skip
        admin.close()
    finally:
        shared.close()
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    return out


def vllm_table(sizes: list[str], repeats: int) -> None:
    print(f"\n## a whole update into a real vLLM CPU server (median of {repeats}; pause = /pause sent to /resume answered)")
    print(f"{'model':>6} {'way':>18} | {'pause s':>8} {'write s':>8} {'update s':>8} {'MB':>7} | {'receive s':>9} {'load s':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            rows = vllm_updates(size, repeats, Path(tmp))
            for way in ("disk", "broadcast, forming", "broadcast", "shm, first", "shm"):
                mine = [r for r in rows if r[0] == way]
                pause, update = statistics.median(r[2] for r in mine), statistics.median(r[3] for r in mine)
                write, receive, load = (statistics.median(r[k] for r in mine) for k in (5, 6, 7))
                print(f"{size:>6} {way:>18} | {pause:>8.3f} {write:>8.3f} {update:>8.3f} {mine[0][4] / 1e6:>7.1f} | {receive:>9.3f} {load:>7.3f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="tiny,100m", help="comma-separated: tiny, 100m; smollm2 with --only-vllm")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--skip-steps", action="store_true", help="only the weight hand-over")
    parser.add_argument("--vllm", action="store_true", help="also whole updates into a real vLLM server (heavy)")
    parser.add_argument("--only-vllm", action="store_true", help="only the whole updates into a real vLLM server")
    args = parser.parse_args(argv)
    sizes = [s for s in args.sizes.split(",") if s]
    unknown = [s for s in sizes if s not in SHAPES and not (s == "smollm2" and args.only_vllm)]
    if unknown:
        print(f"unknown size(s) {unknown}: choose among {', '.join(SHAPES)}", file=sys.stderr)
        return 2
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import transformers

    transformers.utils.logging.disable_progress_bar()
    print(f"load average before: {os.getloadavg()}")
    if not args.only_vllm:
        weight_table(sizes, args.repeats)
    if args.vllm or args.only_vllm:
        vllm_table(sizes, args.repeats)
    if not (args.skip_steps or args.only_vllm):
        step_table(args.steps)
    print(f"\nload average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
