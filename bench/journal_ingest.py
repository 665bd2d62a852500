#!/usr/bin/env python3
"""Journal ingest: how many tokens/s the token journal takes, on one Redis and on a 3-node cluster.

    python bench/journal_ingest.py [--quick] [--seconds S] [--actors K] [--sequences N]
                                   [--rate TOKENS_PER_S] [--shapes 16x8,64x8,64x64]

Simulated actors, each a process of its own, append tokens with the real journal scripts
(`rlrun.journal.store.Journal`: open_group, append_many with finishes, deliver), as the actor
does: each actor keeps `--sequences` samples generating (groups of 8), every sample gains
`flush` tokens per flush (`actor.journal_flush_tokens`), and one flush's appends go to Redis in
calls of `batch` samples (`append_many`; the real actor sends the samples of one request, a
group, per call). A sample that reaches 256 tokens is finished in its last append; a group whose
samples are all finished is delivered (published to its actor's stream and marked, one script)
and a new group opened. Each actor has its own journal namespace and stream, tagged `{a<k>}`,
so on the cluster the actors' journals spread over the nodes.

The actors together aim at `--rate` tokens/s; an actor that falls behind its schedule appends
without sleeping, so the sustained tokens/s is what the journal took. Per shape
(flush x batch) and per target (one valkey run as a run runs it: AOF everysec, ACL; then three
valkey servers as a cluster, AOF everysec, started by this script on 127.0.0.1): sustained
tokens/s, p50/p99 latency of one append call, script calls/s, and the CPU the server(s) used
(psutil, user+system, in cores: 1.0 = one core busy; valkey runs commands on one thread, so a
shard saturates near 1.0). Server CPU per million tokens (net of what the servers use idle, measured
for 2 s before each target's trials) is the figure that does not depend on
how fast this machine's Python clients are; the projection at the end uses it:

  64 nodes x 8 vLLM servers x 256 sequences x 50 tokens/s = 6,553,600 tokens/s: shards needed at
  a given CPU budget per shard (default 0.5 core, where latency stays flat), and the actor-side
  batching (flush size, samples per call) that keeps calls/s per shard within what was measured.

It prints figures; it asserts nothing. Stops every server it started (also on SIGTERM).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: the Redis started for tests lives in tests/

GROUP_SIZE = 8
SAMPLE_BUDGET = 256  # tokens per sample before it is finished ("length")
TARGET = dict(nodes=64, servers_per_node=8, sequences_per_server=256, tokens_per_s_per_sequence=50)


# --- pure parts (unit-tested: tests/unit/test_bench_journal_ingest.py) ---------------------------


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) of `values`, linear between the closest ranks; NaN if empty."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be within 0..100, got {q}")
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """"16x8,64x64" -> [(flush tokens, samples per call), ...]."""
    shapes = []
    for part in text.split(","):
        flush, _, batch = part.strip().partition("x")
        if not (flush.isdigit() and batch.isdigit()) or int(flush) < 1 or int(batch) < 1:
            raise ValueError(f"shape {part!r} is not FLUSHxBATCH with positive integers (e.g. 16x8)")
        shapes.append((int(flush), int(batch)))
    return shapes


@dataclass(frozen=True)
class Projection:
    tokens_per_s: float  # the whole fleet
    sequences: int
    shards: int  # Redis primaries needed
    tokens_per_s_per_shard: float
    calls_per_s: float  # append scripts per second, the whole fleet
    calls_per_s_per_shard: float
    tokens_per_call: int
    flush_interval_s: float  # how often one sequence's tokens are appended


def project(
    *, nodes: int, servers_per_node: int, sequences_per_server: int, tokens_per_s_per_sequence: float,
    cpu_s_per_million_tokens: float, cpu_budget_per_shard: float, flush_tokens: int, samples_per_call: int,
) -> Projection:  # fmt: skip
    """Shards and call rates for a fleet, from the server CPU one million journaled tokens cost at
    this flush size and batching (measured), and the CPU share a shard may use (latency stays flat
    well below one busy core)."""
    if cpu_s_per_million_tokens <= 0 or cpu_budget_per_shard <= 0:
        raise ValueError("the CPU cost and the CPU budget per shard must be positive")
    sequences = nodes * servers_per_node * sequences_per_server
    tokens_per_s = sequences * tokens_per_s_per_sequence
    per_shard = cpu_budget_per_shard / cpu_s_per_million_tokens * 1e6
    shards = math.ceil(tokens_per_s / per_shard)
    tokens_per_call = flush_tokens * samples_per_call
    calls = tokens_per_s / tokens_per_call
    return Projection(
        tokens_per_s=tokens_per_s, sequences=sequences, shards=shards, tokens_per_s_per_shard=tokens_per_s / shards,
        calls_per_s=calls, calls_per_s_per_shard=calls / shards, tokens_per_call=tokens_per_call,
        flush_interval_s=flush_tokens / tokens_per_s_per_sequence,
    )  # fmt: skip


# --- one simulated actor ------------------------------------------------------------------------


def _actor(k: int, url: str, password: str, sequences: int, rate: float, flush: int, batch: int, seconds: float, out) -> None:
    """Append at `rate` tokens/s over `sequences` samples for `seconds`; put (tokens, latencies,
    calls, deliveries) on `out`."""
    from rlrun.journal.store import Append, Journal
    from rlrun.streams import names
    from rlrun.streams.server import connect

    client = connect(url, password, socket_timeout=30.0, reconnect_s=0)
    stream = f"bench:groups:{{a{k}}}"
    journal = Journal(client, names.journal_prefix(stream))
    groups = sequences // GROUP_SIZE

    def open_one() -> list:
        g = journal.open_group(lambda c: c, lambda p: [1, 2, 3, 4], group_size=GROUP_SIZE, max_new_tokens=SAMPLE_BUDGET, run=f"a{k}")
        return [g.group_id, 0]  # group id, tokens per sample so far

    live = [open_one() for _ in range(groups)]
    interval = flush * groups * GROUP_SIZE / rate  # one flush of every sample, at the target rate
    tokens_list = list(range(flush))
    logprobs = [-0.25] * flush
    latencies: list[float] = []
    tokens = calls = deliveries = 0
    start = time.perf_counter()
    due = start
    while time.perf_counter() - start < seconds:
        now = time.perf_counter()
        if now < due:
            time.sleep(due - now)
        due += interval
        appends = []
        for g in live:
            length = g[1]
            n = min(flush, SAMPLE_BUDGET - length)
            finish = "length" if length + n >= SAMPLE_BUDGET else None
            appends += [Append(g[0], i, length, tokens_list[:n], logprobs[:n], 0, finish) for i in range(GROUP_SIZE)]
            g[1] = length + n
        for first in range(0, len(appends), batch):
            chunk = appends[first : first + batch]
            t0 = time.perf_counter()
            results = journal.append_many(chunk)
            latencies.append(time.perf_counter() - t0)
            calls += 1
            tokens += sum(len(a.token_ids) for a, r in zip(chunk, results) if r.accepted)
        for slot, g in enumerate(live):
            if g[1] >= SAMPLE_BUDGET:  # every sample finished: publish (a message of the group's size)
                journal.deliver(g[0], stream, [json.dumps({"tokens": [0] * (GROUP_SIZE * SAMPLE_BUDGET)})])
                deliveries += 1
                live[slot] = open_one()
        if deliveries and deliveries % 64 == 0:
            client.xtrim(stream, maxlen=100, approximate=True)  # the trainer would have read them
    elapsed = time.perf_counter() - start
    out.put((tokens, latencies, calls, deliveries, elapsed))
    client.close()


def _cpu_seconds(pids: list[int]) -> float:
    import psutil

    total = 0.0
    for pid in pids:
        times = psutil.Process(pid).cpu_times()
        total += times.user + times.system
    return total


def idle_cores(pids: list[int], seconds: float = 2.0) -> float:
    """The CPU the servers use doing nothing (their cron; on a cluster, the bus's pings)."""
    cpu0 = _cpu_seconds(pids)
    time.sleep(seconds)
    return (_cpu_seconds(pids) - cpu0) / seconds


def trial(url: str, password: str, pids: list[int], actors: int, sequences: int, rate: float, flush: int, batch: int, seconds: float, idle: float) -> dict:
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_actor, args=(k, url, password, sequences, rate / actors, flush, batch, seconds, out)) for k in range(actors)]
    cpu0, wall0 = _cpu_seconds(pids), time.perf_counter()
    for p in procs:
        p.start()
    results = [out.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join(30)
    wall = time.perf_counter() - wall0
    cpu = _cpu_seconds(pids) - cpu0
    tokens = sum(r[0] for r in results)
    latencies = [x for r in results for x in r[1]]
    elapsed = max(r[4] for r in results)
    return {
        "flush": flush, "batch": batch, "target_tokens_per_s": rate, "tokens_per_s": tokens / elapsed,
        "calls_per_s": sum(r[2] for r in results) / elapsed, "deliveries": sum(r[3] for r in results),
        "p50_ms": percentile(latencies, 50) * 1e3, "p99_ms": percentile(latencies, 99) * 1e3,
        "server_cores": cpu / wall,
        # net of what the servers burn idle, which a busier fleet would amortise
        "cpu_s_per_million_tokens": max(cpu - idle * wall, 0.0) / max(tokens, 1) * 1e6,
    }  # fmt: skip


# --- the targets --------------------------------------------------------------------------------


def single_target(root: Path):
    from rlrun.rundir import RunDir
    from tests.standalone_redis import managed_server

    run_dir = RunDir(root / "single")
    run_dir.create({"kind": "rlrun-bench", "bench": "journal_ingest"})
    return managed_server(run_dir, host="127.0.0.1", appendfsync="everysec")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 s per trial, two shapes: shows it works, figures are noisy")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--actors", type=int, default=3)
    parser.add_argument("--sequences", type=int, default=256, help="samples generating per actor (groups of 8)")
    parser.add_argument("--rate", type=float, default=200_000, help="target tokens/s, all actors together")
    parser.add_argument("--shapes", default="4x8,16x8,16x64,64x64", help="FLUSHxBATCH: tokens per append x samples per call")
    parser.add_argument("--cpu-budget", type=float, default=0.5, help="CPU share (cores) a shard may use in the projection")
    parser.add_argument("--targets", default="single,cluster")
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.shapes = 2.0, "16x8,64x64"
    shapes = parse_shapes(args.shapes)
    if args.sequences % GROUP_SIZE:
        parser.error(f"--sequences must be a multiple of the group size {GROUP_SIZE}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds the context managers: servers stopped

    from tests.redis_cluster import local_cluster

    print(f"load average at start: {'/'.join(f'{x:.2f}' for x in os.getloadavg())} (1/5/15 min), {os.cpu_count()} CPUs")
    print(f"{args.actors} actors x {args.sequences} sequences, target {args.rate:,.0f} tokens/s, {args.seconds:g} s per trial, AOF everysec")
    header = f"{'target':8} | {'flush':>5} | {'batch':>5} | {'tokens/s':>9} | {'calls/s':>7} | {'p50 ms':>7} | {'p99 ms':>7} | {'server cores':>12} | {'CPU s / M tok':>13} | load"
    print(header)
    print("-" * len(header))
    rows = []
    with tempfile.TemporaryDirectory(prefix="rlrun-ingest-") as tmp:
        for target in args.targets.split(","):
            if target == "single":
                manager = single_target(Path(tmp))
            elif target == "cluster":
                manager = local_cluster(Path(tmp) / "cluster", "bench-password", nodes=3)
            else:
                parser.error(f"unknown target {target!r} (single, cluster)")
            with manager as server:
                pids = [server.server_pid()] if target == "single" else server.pids
                url = server.url
                idle = idle_cores(pids)
                print(f"{target:8} | idle: the server(s) use {idle:.3f} cores doing nothing", flush=True)
                for flush, batch in shapes:
                    row = trial(url, server.password, pids, args.actors, args.sequences, args.rate, flush, batch, args.seconds, idle)
                    row["target"] = target
                    rows.append(row)
                    print(
                        f"{target:8} | {flush:5d} | {batch:5d} | {row['tokens_per_s']:9,.0f} | {row['calls_per_s']:7,.0f} | "
                        f"{row['p50_ms']:7.2f} | {row['p99_ms']:7.2f} | {row['server_cores']:12.2f} | "
                        f"{row['cpu_s_per_million_tokens']:13.2f} | {os.getloadavg()[0]:.2f}",
                        flush=True,
                    )
    print()
    print(f"projection: {TARGET['nodes']} nodes x {TARGET['servers_per_node']} servers x {TARGET['sequences_per_server']} "
          f"sequences x {TARGET['tokens_per_s_per_sequence']} tokens/s, a shard may use {args.cpu_budget:g} core")
    for row in rows:
        p = project(**TARGET, cpu_s_per_million_tokens=row["cpu_s_per_million_tokens"], cpu_budget_per_shard=args.cpu_budget,
                    flush_tokens=row["flush"], samples_per_call=row["batch"])  # fmt: skip
        print(
            f"  {row['target']:8} flush {row['flush']:3d} x batch {row['batch']:3d}: {p.tokens_per_s:,.0f} tokens/s -> "
            f"{p.shards} shards ({p.tokens_per_s_per_shard:,.0f} tokens/s each), {p.calls_per_s_per_shard:,.0f} calls/s per shard, "
            f"a sequence flushed every {p.flush_interval_s:.2f} s"
        )
    print(f"load average at end: {'/'.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
