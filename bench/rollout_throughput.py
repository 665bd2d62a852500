"""Rollout throughput: vLLM alone vs. the same requests through rlrun's actor, with and without
the token journal.

    python bench/rollout_throughput.py [--groups N] [--rounds R] [hydra overrides...]

Starts, in a temporary run directory, the run's Redis and ONE vLLM server (as `rlrun train`
would, from the composed config), then runs three phases R times, their order rotated every
round (A B C, B C A, C A B, ...) so that no phase always runs first or right after another:

  A  "vLLM alone": the actor's requests (same prompts in the same seeded order, token-id prompt,
     n = group_size, max_tokens, temperature, logprobs 0, return_token_ids, streamed through
     rlrun.actor.vllm_client.stream_completion) with `actor.max_concurrent_groups` groups in
     flight; a finished group is replaced at once. Nothing else: no Redis, no scoring.
  B  "actor + journal": rlrun.actor.loop.Actor run in-process against the same server and
     Redis with the JournalLedger (every token appended to the token journal in Redis, as in a
     real run), and no trainer (the trainer state hash says step=10**9, so back-pressure never
     blocks; `training_done`=1 is set once N groups are published, which stops the actor). A
     subclass only notes the moment the N-th group is published; the actor's code is unchanged.
  C  "actor, no journal": the same with the MemoryLedger (actor.journal=false): nothing is
     journaled, groups are published straight to the stream.

Before B and C the journal's keys (rlrun:journal:*, SCAN + DEL), the actor's state hash and the
groups stream are deleted, so each phase starts at prompt 0 with an empty Redis. One untimed
warm-up wave (max_concurrent_groups groups) of A, B and C runs first. In B and C the ledger is
wrapped to add up the time spent inside its calls, per method (they are synchronous Redis round
trips made from the actor's event loop), and a median Redis PING is taken before the phase.

Every phase times the window from the first request to the moment the N-th group is complete and
counts every completion token received in that window (also those of groups still in flight), so
all measure the steady state with the same number of groups in flight. B/A is the actor's cost
against vLLM alone; B/C is the journal's cost (target >= 0.97); both are printed per round, over
all rounds, as the median of the rounds and with their spread (min-max over the rounds).

Like with like: A, B and C send the same prompts in the same order with the same sampling
settings and concurrency, after the same warm-up, to the same server. B does all of C's work plus
the journal and C all of A's plus Redis and scoring, so B/A, C/A and B/C cannot exceed 1 by more
than noise: a median ratio above 1 + --tolerance (default 0.05) is printed as a MEASUREMENT
ERROR (the machine's load changed between phases; see the load column), not as a result. It
prints figures; it asserts nothing about speed.
Redis and vLLM are started, probed and stopped by rlrun's supervisor as in a run (each under its
guard; at the end SIGTERM to its process group, SIGKILL after 10 s); SIGTERM to this script
unwinds the same way.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import platform
import signal
import sys
import tempfile
import time
from pathlib import Path

import httpx

from rlrun.actor.ledger import JournalLedger, MemoryLedger
from rlrun.actor.loop import Actor
from rlrun.actor.vllm_client import generate
from rlrun.config import compose
from rlrun.task.pool import scorer_for
from rlrun.task.tasks import load_task
from rlrun.inference.auth import bearer_header
from rlrun.inference.server import HealthCheck, base_url, server_argv, server_env
from rlrun.journal.store import KEY_PREFIX
from rlrun.models.source import model_path
from rlrun.run.launch import create_run
from rlrun.run.built import build
from rlrun.streams import names
from rlrun.streams.server import connect, pick_free_port
from rlrun.supervisor import ProcessSpec, supervised

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: the Redis started for tests lives in tests/
from tests.standalone_redis import managed_server  # noqa: E402

STOP_GRACE_S = 10.0
VLLM_READY_TIMEOUT_S = 600.0
POLL_S = 0.005
NO_BACKPRESSURE_STEP = 10**9


# --- the machine ---------------------------------------------------------------------------------


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


# --- the vLLM server -----------------------------------------------------------------------------


@contextlib.contextmanager
def vllm_server(cfg, path: str, run_dir):
    """vLLM serving the base model, started, probed and stopped by rlrun's supervisor (as in a run)."""
    url = base_url(cfg.inference.host, pick_free_port(cfg.inference.host))
    spec = ProcessSpec(
        name="vllm-0", argv=server_argv(cfg.inference, cfg.model, path, int(url.rsplit(":", 1)[1]), tokenizer=path, stream_interval=cfg.actor.journal_flush_tokens),
        env=server_env(cfg.inference), secret_env={"VLLM_API_KEY": run_dir.vllm_api_key},  # as the run's spec: never on argv
        log_path=run_dir.log("vllm-0"), ready=HealthCheck(url), ready_timeout_s=VLLM_READY_TIMEOUT_S, stop_grace_s=STOP_GRACE_S,
    )  # fmt: skip
    started = time.monotonic()
    with supervised(spec, poll_interval_s=0.5) as supervisor:
        print(f"vLLM healthy on {url} after {time.monotonic() - started:.1f} s (pid {supervisor.status('vllm-0').pid})", flush=True)
        yield url


# --- the phases ----------------------------------------------------------------------------------


async def phase_vllm_alone(cfg, url: str, prompts: list[list[int]], groups: int, api_key: str) -> dict:
    """The actor's requests with its concurrency, straight to vLLM; stop when `groups` are done."""
    size, concurrency = cfg.algo.group_size, cfg.actor.max_concurrent_groups
    count = {"tokens": 0, "done": 0}
    end: dict[str, float] = {}

    async def one_group(client: httpx.AsyncClient, cursor: int) -> None:
        async for delta in generate(
            client,
            url,
            prompts[cursor],
            n=size,
            max_tokens=cfg.actor.max_new_tokens,
            temperature=cfg.actor.temperature,
            timeout_s=cfg.actor.request_timeout_s,
            stream=cfg.actor.max_new_tokens > cfg.actor.journal_flush_tokens,  # as the actor asks
        ):
            count["tokens"] += len(delta.token_ids)
        count["done"] += 1
        if count["done"] == groups:
            end.update(time=time.perf_counter(), tokens=count["tokens"])

    limits = httpx.Limits(max_connections=concurrency * size)
    async with httpx.AsyncClient(limits=limits, timeout=cfg.actor.request_timeout_s, headers=bearer_header(api_key)) as client:
        running: set[asyncio.Task] = set()
        cursor = 0
        started = time.perf_counter()
        try:
            while not end:
                while len(running) < concurrency:  # refill every free slot at once
                    running.add(asyncio.create_task(one_group(client, cursor)))
                    cursor += 1
                finished, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in finished:
                    task.result()  # a failed request fails the benchmark
        finally:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
    return {"wall_s": end["time"] - started, "tokens": int(end["tokens"]), "groups": groups, "started": cursor, "errors": 0, "continued": 0}


class TimedLedger:
    """The actor's ledger, unchanged, with the time spent in its calls added up. Its calls are
    synchronous Redis round trips made from the actor's event loop: while one runs, no stream
    from vLLM is read. (Sampled before the N-th group is published, like the tokens.)"""

    def __init__(self, ledger) -> None:
        self.inner = ledger
        self.seconds = 0.0
        self.calls = 0
        self.by_method: dict[str, list] = {}  # name -> [calls, seconds]

    def __getattr__(self, name: str):
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return attr(*args, **kwargs)
            finally:
                spent = time.perf_counter() - started
                self.seconds += spent
                self.calls += 1
                entry = self.by_method.setdefault(name, [0, 0.0])
                entry[0] += 1
                entry[1] += spent

        return timed


def redis_rtt_ms(redis, pings: int = 200) -> float:
    """Median PING round trip, ms: what one synchronous Redis call costs right now."""
    times = []
    for _ in range(pings):
        started = time.perf_counter()
        redis.ping()
        times.append(time.perf_counter() - started)
    return 1000 * sorted(times)[len(times) // 2]


class TimedActor(Actor):
    """rlrun's Actor, unchanged, that notes the moment its `target`-th group is published."""

    def __init__(self, *args, target: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.target = target
        self.reached: dict | None = None

    def _publish(self, *args, **kwargs) -> None:
        super()._publish(*args, **kwargs)
        if self.reached is None and self.counters["groups_published"] >= self.target:
            self.reached = {"time": time.perf_counter(), "ledger_s": self.ledger.seconds, "ledger_calls": self.ledger.calls,
                            "ledger_methods": {k: tuple(v) for k, v in self.ledger.by_method.items()}, **self.counters}


def reset_redis(redis) -> int:
    """Delete the journal (rlrun:journal:*, SCAN + DEL: FLUSHALL is disabled), the actor's state
    hash and the groups stream, so the next actor phase starts at prompt 0. Returns keys deleted."""
    deleted = 0
    batch: list[str] = []
    for key in redis.scan_iter(match=f"{KEY_PREFIX}*", count=1000):
        batch.append(key)
        if len(batch) >= 500:
            deleted += redis.delete(*batch)
            batch = []
    if batch:
        deleted += redis.delete(*batch)
    return deleted + redis.delete(names.ACTOR_STATE, names.GROUPS_STREAM)


async def phase_actor(cfg, redis, tokenizer, task, url: str, run_name: str, groups: int, journal: bool, api_key: str) -> dict:
    """rlrun's Actor in-process, no trainer, with (B) or without (C) the journal; stop it once
    `groups` are published."""
    reset_redis(redis)  # the actor resumes its cursor from the journal / state hash: start at 0
    redis.hset(names.TRAINER_STATE, mapping={"step": NO_BACKPRESSURE_STEP, "training_done": "0"})
    rtt = redis_rtt_ms(redis)
    inner = JournalLedger(redis) if journal else MemoryLedger(redis)
    ledger = TimedLedger(inner)
    actor = TimedActor(cfg, redis, tokenizer, task, [url], ledger, run_name=run_name, target=groups, api_key=api_key,
                       trainer=build(cfg).backend.trainer_view(redis), scorer=scorer_for(task.rewards, cfg.reward))  # fmt: skip
    started = time.perf_counter()
    run = asyncio.create_task(actor.run())
    while actor.reached is None:
        if run.done():
            run.result()  # raises what the actor raised
            raise RuntimeError("the actor stopped before publishing enough groups")
        await asyncio.sleep(POLL_S)
    redis.hset(names.TRAINER_STATE, "training_done", "1")
    await run
    leftovers = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    await asyncio.gather(*leftovers, return_exceptions=True)  # the group tasks it cancelled
    reached = actor.reached
    started_groups = inner.journal.cursor() if journal else inner._cursor
    return {
        "wall_s": reached["time"] - started,
        "tokens": reached["tokens_generated"],
        "groups": reached["groups_published"],
        "started": started_groups,
        "errors": reached["request_errors"],
        "continued": reached["samples_continued"] + reached["samples_continued_on_retry"],
        "ledger_s": reached["ledger_s"],
        "ledger_calls": reached["ledger_calls"],
        "ledger_methods": reached["ledger_methods"],
        "rtt_ms": rtt,
    }


# --- the whole benchmark -------------------------------------------------------------------------


PHASES = {"A": "vLLM alone", "B": "actor + journal", "C": "actor, no journal"}
# Each ratio is (the phase doing more work) / (the phase doing a subset of it): at most 1.
RATIOS = {"B/A": "actor with journal vs vLLM alone", "B/C": "journal overhead (target >= 0.97)", "C/A": "actor without journal vs vLLM alone"}
PHYSICAL_CEILING = 1.0


def phase_order(round_number: int) -> list[str]:
    """A B C, then B C A, then C A B, ...: every phase takes every position in turn."""
    names = list(PHASES)
    shift = (round_number - 1) % len(names)
    return names[shift:] + names[:shift]


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def verdict(per_round: list[float], tolerance: float) -> str:
    """A ratio's result: its median and spread over the rounds, or a measurement error when the
    median is above what is physically possible (PHYSICAL_CEILING) by more than `tolerance`."""
    mid, low, high = median(per_round), min(per_round), max(per_round)
    spread = f"median {mid:.3f} over {len(per_round)} round{'s' if len(per_round) != 1 else ''}, range {low:.3f}-{high:.3f}"
    if mid > PHYSICAL_CEILING + tolerance:
        return (f"MEASUREMENT ERROR ({spread}): above {PHYSICAL_CEILING:.2f} + {tolerance:.2f}, which no phase doing more "
                f"work than the other can reach; the load changed between phases (see the load column)")  # fmt: skip
    if len(per_round) < 3:
        return f"{spread} (fewer than 3 rounds: no spread worth the name)"
    return spread


async def run_phases(cfg, redis, tokenizer, task, url: str, run_name: str, groups: int, rounds: int, api_key: str) -> list[tuple[str, dict]]:
    probe = Actor(cfg.actor, cfg.algo, redis, tokenizer, task, [url], MemoryLedger(redis), run_name=run_name, seed=cfg.run.seed,
                  trainer=build(cfg).backend.trainer_view(redis), scorer=scorer_for(task.rewards, cfg.reward))  # only for its prompt order
    horizon = groups + 4 * cfg.actor.max_concurrent_groups
    prompts = [tokenizer.encode(task.problems[probe._problem_index(c)].prompt, add_special_tokens=False) for c in range(horizon)]
    # Warm-up (untimed): one wave of groups per phase, so no phase pays for its first requests
    # (connections, the journal's Lua scripts loaded into Redis, ...).
    wave = min(groups, cfg.actor.max_concurrent_groups)
    await phase_vllm_alone(cfg, url, prompts, wave, api_key)
    for journal in (True, False):
        await phase_actor(cfg, redis, tokenizer, task, url, run_name, wave, journal=journal, api_key=api_key)
    results = []
    for r in range(1, rounds + 1):
        for name in phase_order(r):
            before = load()
            if name == "A":
                result = await phase_vllm_alone(cfg, url, prompts, groups, api_key)
            else:
                result = await phase_actor(cfg, redis, tokenizer, task, url, run_name, groups, journal=name == "B", api_key=api_key)
            result["load"] = f"{before} -> {load()}"
            results.append((f"{name}{r}", result))
            print(
                f"  {name}{r} ({PHASES[name]}): {result['tokens']} tokens in {result['wall_s']:.2f} s = "
                f"{result['tokens'] / result['wall_s']:.0f} tok/s (load {result['load']})"
                + (f"; {result['ledger_calls']} ledger calls took {result['ledger_s']:.2f} s, Redis PING {result['rtt_ms']:.2f} ms" if name != "A" else ""),
                flush=True,
            )
    reset_redis(redis)
    return results


def rate(result: dict) -> float:
    return result["tokens"] / result["wall_s"]


def print_table(cfg, results: list[tuple[str, dict]], groups: int, tolerance: float = 0.05) -> None:
    print()
    print(f"machine: {os.cpu_count()} CPUs, {cpu_model()}; load average now {load()} (1/5/15 min)")
    print(
        f"shape: {groups} groups x n={cfg.algo.group_size}, max_tokens={cfg.actor.max_new_tokens}, "
        f"{cfg.actor.max_concurrent_groups} groups in flight, journal_flush_tokens={cfg.actor.journal_flush_tokens}, "
        f"vLLM threads={cfg.inference.threads}, appendfsync={cfg.streams.appendfsync}"
    )
    header = (
        f"{'round':>5} | {'A vLLM tok/s':>12} | {'B actor+journal':>15} | {'C actor, no journal':>19} | "
        f"{'B/A':>5} | {'B/C':>5} | {'C/A':>5} | {'tokens A/B/C':>17} | {'wall s A/B/C':>17} | load (1/5/15) before -> after A ; B ; C"
    )
    print(header)
    print("-" * len(header))
    by_round: dict[str, dict[str, dict]] = {}
    for label, result in results:
        by_round.setdefault(label[1:], {})[label[0]] = result
    for r, trio in by_round.items():
        a, b, c = trio["A"], trio["B"], trio["C"]
        ta, tb, tc = rate(a), rate(b), rate(c)
        print(
            f"{r:>5} | {ta:>12.0f} | {tb:>15.0f} | {tc:>19.0f} | {tb / ta:>5.2f} | {tb / tc:>5.2f} | {tc / ta:>5.2f} | "
            f"{a['tokens']:>5}/{b['tokens']:>5}/{c['tokens']:>5} | {a['wall_s']:>5.2f}/{b['wall_s']:>5.2f}/{c['wall_s']:>5.2f} | "
            f"{a['load']} ; {b['load']} ; {c['load']}"
        )
    totals = {k: (sum(r["tokens"] for label, r in results if label[0] == k), sum(r["wall_s"] for label, r in results if label[0] == k)) for k in PHASES}
    ta, tb, tc = (t / w for t, w in totals.values())
    print("-" * len(header))
    print(f"{'all':>5} | {ta:>12.0f} | {tb:>15.0f} | {tc:>19.0f} | {tb / ta:>5.2f} | {tb / tc:>5.2f} | {tc / ta:>5.2f} |  (tokens / wall time over all rounds)")
    ratios = {k: [rate(t[k[0]]) / rate(t[k[2]]) for t in by_round.values()] for k in RATIOS}
    mid = {k: median(v) for k, v in ratios.items()}
    rates = {k: [rate(t[k]) for t in by_round.values()] for k in PHASES}
    print(f"{'med.':>5} | {'':>12} | {'':>15} | {'':>19} | {mid['B/A']:>5.2f} | {mid['B/C']:>5.2f} | {mid['C/A']:>5.2f} |  (median of the per-round ratios)")
    spans = {k: f"{min(v):.0f}-{max(v):.0f}" for k, v in rates.items()}
    ratio_spans = {k: f"{min(v):.2f}-{max(v):.2f}" for k, v in ratios.items()}
    print(f"{'range':>5} | {spans['A']:>12} | {spans['B']:>15} | {spans['C']:>19} | {ratio_spans['B/A']:>5} | {ratio_spans['B/C']:>5} | "
          f"{ratio_spans['C/A']:>5} |  (min-max over the rounds)")  # fmt: skip
    print(
        f"B/A = actor with journal vs vLLM alone: {tb / ta:.3f} (median per round {mid['B/A']:.3f}); "
        f"B/C = journal overhead (target >= 0.97): {tb / tc:.3f} (median per round {mid['B/C']:.3f})"
    )
    for key, what in RATIOS.items():
        print(f"verdict {key} ({what}): {verdict(ratios[key], tolerance)}")
    print(
        "time inside ledger calls (s, share of wall) / calls / Redis PING ms before the phase: "
        + ", ".join(
            f"{label}={r['ledger_s']:.2f} s ({100 * r['ledger_s'] / r['wall_s']:.0f} %) / {r['ledger_calls']} / {r['rtt_ms']:.2f}"
            for label, r in results
            if label[0] != "A"
        )
    )
    for label, r in results:
        if label[0] != "A":
            methods = sorted(r["ledger_methods"].items(), key=lambda kv: -kv[1][1])
            print(f"  {label} ledger calls: " + ", ".join(f"{m} {n} x {1000 * t / n:.2f} ms = {t:.2f} s" for m, (n, t) in methods))
    errors = sum(r["errors"] for _, r in results)
    continued = sum(r["continued"] for _, r in results)
    print(f"actor request errors: {errors}, samples continued: {continued}; groups started (incl. in flight at the end): "
          + ", ".join(f"{label}={r['started']}" for label, r in results))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=256, help="groups completed per phase (default 256)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the three phases, order rotated (default 3: ABC, BCA, CAB)")
    parser.add_argument("--tolerance", type=float, default=0.05, help="a median ratio above 1 + this is a measurement error (default 0.05)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, as for `rlrun train`")
    args = parser.parse_args(argv)
    # SIGTERM (e.g. from `timeout`) unwinds like Ctrl-C, so every child is stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from transformers import AutoTokenizer

    print(f"load average at start: {load()}", flush=True)
    cfg, resolved_yaml = compose(list(args.overrides))
    path = model_path(cfg.model, build=True, seed=cfg.run.seed, max_operand=cfg.dataset.max_operand)
    tokenizer = AutoTokenizer.from_pretrained(path)
    task = load_task(cfg.dataset, cfg.run.seed)
    with tempfile.TemporaryDirectory(prefix="rlrun-bench-") as tmp:
        run_dir = create_run(build(cfg), resolved_yaml, list(args.overrides), root=Path(tmp) / "run")
        with managed_server(run_dir, host=cfg.streams.host, appendfsync=cfg.streams.appendfsync, binary=cfg.streams.server) as server:
            redis = connect(server.url, server.password)
            try:
                api_key = run_dir.ensure_secret(run_dir.vllm_api_key)
                with vllm_server(cfg, path, run_dir) as url:
                    results = asyncio.run(run_phases(cfg, redis, tokenizer, task, url, run_dir.root.name, args.groups, args.rounds, api_key))
            finally:
                redis.close()
    print_table(cfg, results, args.groups, args.tolerance)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
