"""What a SIGKILL of the run's Redis loses, under `appendfsync everysec` and `always`.

    python bench/redis_loss.py [--trials 5] [--seconds 5] [--modes journal,rpush] [--policies everysec,always]

For every policy, mode and trial: a fresh temporary run directory (rlrun.rundir.RunDir.create),
the run's real Redis started with tests.standalone_redis.managed_server(run_dir, appendfsync=...)
(AOF on, loopback, password), and ONE client (no retries) that writes as fast as it can, one
round trip at a time:

  journal  rlrun.journal.store.Journal.append on an opened group: 4 tokens (+ logprobs) per
           append, ~130-byte log entry, the Lua script the actor's flushes use;
  rpush    RPUSH of a ~100-byte JSON entry with a sequence number.

At a random moment (uniform in [1 s, --seconds]) another thread SIGKILLs the server
(`.kill()`, no clean shutdown); the writer stops at the connection error. The server is then
restarted from its AOF (`.restart()`, same port) and read back. Reported per trial: appends
acknowledged before the kill and the rate (appends/s), entries (journal: tokens) acknowledged
but missing after the restart, the time window the lost ones span (ack time of the first lost
one → the last ack), entries present but never acknowledged (the write in flight at the kill),
and how long the restart from the AOF took. A summary per policy and mode gives the cost of
`always` (its rate / everysec's).

Note: a SIGKILL of the server is a process crash, not a machine crash: what the server already
write()-ten to its AOF survives in the OS page cache whatever the fsync policy. The fsync policy
decides what a power loss or kernel crash loses, which this does not simulate.

It prints figures; it asserts nothing. Servers are stopped and temporary directories removed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import redis

from rlrun.journal.store import Append, Journal
from rlrun.rundir import RunDir
from rlrun.streams.server import connect

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: the Redis started for tests lives in tests/
from tests.standalone_redis import managed_server  # noqa: E402

TOKENS_PER_APPEND = 4
LIST_KEY = "bench:loss"


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def client(server) -> redis.Redis:
    """A client made as rlrun's processes make theirs (same authentication), without retries:
    the writer must see the kill, not wait for the server to come back."""
    return connect(server.url, server.password, socket_timeout=10.0, reconnect_s=0)


def trial(root: Path, policy: str, mode: str, seconds: float, rng: random.Random) -> dict:
    run_dir = RunDir(root)
    run_dir.create({"kind": "rlrun-bench", "bench": "redis_loss", "appendfsync": policy, "mode": mode, "created": time.time()})
    kill_after = rng.uniform(1.0, seconds)
    with managed_server(run_dir, host="127.0.0.1", appendfsync=policy) as server:
        c = client(server)
        journal = Journal(c)
        group_id = ""
        if mode == "journal":
            group = journal.open_group(lambda cursor: 0, lambda index: [1, 2, 3], group_size=1, max_new_tokens=10**9, run="bench")
            group_id = group.group_id
            journal.append_many([Append(group_id, 0, 0, [], [], 0)])  # load the script before the clock starts
        acks: list[tuple[float, int]] = []  # (ack time, length after it): tokens, or seq + 1
        killed: dict[str, float] = {}

        def kill() -> None:
            killed["time"] = time.time()
            server.kill()

        timer = threading.Timer(kill_after, kill)
        length = 0
        started = time.time()
        timer.start()
        try:
            while True:
                if mode == "journal":
                    tokens = [(length + k) % 50 for k in range(TOKENS_PER_APPEND)]
                    (result,) = journal.append_many([Append(group_id, 0, length, tokens, [-0.5] * TOKENS_PER_APPEND, 0)])
                    if not result.accepted:
                        raise RuntimeError(f"append refused: {result}")
                    length = result.length
                else:
                    entry = json.dumps({"seq": length, "t": round(time.time(), 6), "pad": "x" * 48})
                    c.rpush(LIST_KEY, entry)
                    length += 1
                acks.append((time.time(), length))
        except (redis.ConnectionError, redis.TimeoutError, ConnectionError):
            pass
        timer.join()
        c.close()
        kill_time = killed["time"]
        restart_started = time.time()
        server.restart()
        restart_s = time.time() - restart_started
        c = client(server)
        if mode == "journal":
            record, _ = Journal(c).read_group(group_id)
            restored = len(record.samples[0].token_ids) if record else 0
        else:
            entries = [json.loads(e) for e in c.lrange(LIST_KEY, 0, -1)]
            seqs = [e["seq"] for e in entries]
            if seqs != list(range(len(seqs))):
                raise RuntimeError("the restored list is not a prefix of the writes")
            restored = len(seqs)
        c.close()
    acked = acks[-1][1] if acks else 0
    lost_acks = [t for t, n in acks if n > restored]
    unit = TOKENS_PER_APPEND if mode == "journal" else 1
    return {
        "policy": policy,
        "mode": mode,
        "kill_after": kill_after,
        "appends": len(acks),
        "rate": len(acks) / (kill_time - started),
        "acked": acked,
        "restored": restored,
        "lost": max(0, acked - restored),
        "lost_appends": len(lost_acks),
        "window_ms": 1000 * (lost_acks[-1] - lost_acks[0]) if lost_acks else 0.0,
        "unacked_present": max(0, restored - acked) // unit,
        "restart_s": restart_s,
        "load": load(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5, help="kills per policy and mode (default 5)")
    parser.add_argument("--seconds", type=float, default=5.0, help="write for at most this long; the kill is uniform in [1, seconds] (default 5)")
    parser.add_argument("--modes", default="journal,rpush", help="journal, rpush or both (default journal,rpush)")
    parser.add_argument("--policies", default="everysec,always", help="appendfsync policies (default everysec,always)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the kill moments (default 0)")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    policies, modes = args.policies.split(","), args.modes.split(",")
    print(f"load average at start: {load()} (1/5/15 min), {os.cpu_count()} CPUs", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="rlrun-bench-redis-loss-", dir=os.environ.get("BENCH_TMP")))
    print(f"run directories under {tmp} (filesystem of the AOF matters for `always`)", flush=True)
    rows = []
    try:
        for k in range(args.trials):  # policies interleaved, so load changes hit both alike
            for mode in modes:
                for policy in policies:
                    row = trial(tmp / f"{mode}-{policy}-{k}", policy, mode, args.seconds, rng)
                    row["trial"] = k + 1
                    rows.append(row)
                    print(
                        f"  {mode:<7} {policy:<8} #{k + 1}: kill at {row['kill_after']:.2f} s, {row['appends']} appends "
                        f"({row['rate']:.0f}/s), lost {row['lost']} ({row['lost_appends']} appends, "
                        f"{row['window_ms']:.1f} ms), restart {row['restart_s']:.2f} s, load {row['load']}",
                        flush=True,
                    )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print()
    unit = {"journal": "tokens", "rpush": "entries"}
    header = (
        f"{'mode':<7} | {'appendfsync':<11} | {'trial':>5} | {'kill at s':>9} | {'appends/s':>9} | {'acked':>7} | "
        f"{'restored':>8} | {'lost':>5} | {'lost window ms':>14} | {'unacked kept':>12} | {'restart s':>9} | load after"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['mode']:<7} | {r['policy']:<11} | {r['trial']:>5} | {r['kill_after']:>9.2f} | "
            f"{r['rate']:>9.0f} | {r['acked']:>7} | {r['restored']:>8} | {r['lost']:>5} | {r['window_ms']:>14.1f} | "
            f"{r['unacked_present']:>12} | {r['restart_s']:>9.2f} | {r['load']}"
        )
    print("-" * len(header))
    print("summary (acked / restored / lost in tokens for journal, entries for rpush):")
    for mode in modes:
        base = None
        for policy in policies:
            sel = [r for r in rows if r["mode"] == mode and r["policy"] == policy]
            rate = sum(r["rate"] for r in sel) / len(sel)
            base = base or rate
            lost = sum(r["lost"] for r in sel)
            worst = max(r["window_ms"] for r in sel)
            print(
                f"  {mode:<7} {policy:<8}: mean {rate:6.0f} appends/s ({rate / base:.2f} x {policies[0]}), "
                f"{sum(1 for r in sel if r['lost'])}/{len(sel)} kills lost data, {lost} {unit[mode]} lost in all, "
                f"worst window {worst:.1f} ms, mean restart {sum(r['restart_s'] for r in sel) / len(sel):.2f} s"
            )
    print(f"machine: {os.cpu_count()} CPUs; load average now {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
