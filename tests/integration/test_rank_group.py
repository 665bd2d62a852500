"""The trainer's rank group (rlrun/trainer/rank_group.py) with real processes: torchrun's
environment, one failing rank fails the group and stops the others, no rank outlives it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from rlrun.listen import interface_of
from rlrun.trainer.rank_group import first_failure, rank_env
from tests.waiting import wait_until

# Each rank reports itself in a file written whole (renamed into place). The failing rank fails
# once every rank has reported: failing earlier, it would stop ranks that have yet to report.
RANK = """
import json, os, sys, time
out = sys.argv[1]
rank = int(os.environ["RANK"])
with open(f"{out}/rank{rank}.tmp", "w") as f:
    json.dump({k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")} | {"pid": os.getpid(), "pgid": os.getpgrp()}, f)
os.rename(f"{out}/rank{rank}.tmp", f"{out}/rank{rank}.json")
action = sys.argv[2]
if action == "ok":
    sys.exit(0)
if action == "rank1-fails" and rank == 1:
    while not all(os.path.exists(f"{out}/rank{r}.json") for r in range(int(os.environ["WORLD_SIZE"]))):
        time.sleep(0.05)
    sys.exit(3)
time.sleep(60)
"""


def launch(tmp_path: Path, action: str, nproc: int = 3, options: tuple[str, ...] = ()) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "rlrun.entrypoints.rank_group", "--nproc", str(nproc), *options, "--", sys.executable, "-c", RANK,
         str(tmp_path), action],  # fmt: skip
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        start_new_session=True,  # as the supervisor's guard: the group leads its own process group
    )


def ranks_written(tmp_path: Path, nproc: int, timeout: float = 30.0) -> list[dict]:
    def written() -> list[dict] | None:
        try:
            return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(nproc)]
        except FileNotFoundError:  # not yet started
            return None

    return wait_until(written, timeout, "the ranks to start")


def gone(pid: int, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_every_rank_gets_torchruns_environment_and_the_group_exits_0(tmp_path):
    group = launch(tmp_path, "ok")
    assert group.wait(timeout=30) == 0
    ranks = ranks_written(tmp_path, 3)
    assert [r["RANK"] for r in ranks] == ["0", "1", "2"] and {r["WORLD_SIZE"] for r in ranks} == {"3"}
    assert {r["MASTER_ADDR"] for r in ranks} == {"127.0.0.1"} and len({r["MASTER_PORT"] for r in ranks}) == 1
    assert {r["pgid"] for r in ranks} == {group.pid}  # in the supervised group: its stop and guard reach them


def test_two_nodes_rank_groups_number_their_ranks_as_one_world(tmp_path):
    """torchrun's multi-node options, as the Ray spawner starts one rank group per node."""
    common = ("--nnodes", "2", "--world-size", "3", "--master-addr", "127.0.0.1", "--master-port", "29999")
    first = launch(tmp_path, "ok", 2, (*common, "--node-rank", "0", "--first-rank", "0"))
    second = launch(tmp_path, "ok", 1, (*common, "--node-rank", "1", "--first-rank", "2"))
    assert first.wait(timeout=30) == 0 and second.wait(timeout=30) == 0
    ranks = ranks_written(tmp_path, 3)
    assert [(r["RANK"], r["LOCAL_RANK"], r["GROUP_RANK"]) for r in ranks] == [("0", "0", "0"), ("1", "1", "0"), ("2", "0", "1")]
    assert {(r["WORLD_SIZE"], r["MASTER_ADDR"], r["MASTER_PORT"]) for r in ranks} == {("3", "127.0.0.1", "29999")}
    assert {r["pgid"] for r in ranks[:2]} == {first.pid} and ranks[2]["pgid"] == second.pid


def test_several_nodes_without_a_rendezvous_port_are_refused(tmp_path):
    refused = launch(tmp_path, "ok", 1, ("--nnodes", "2", "--world-size", "2"))
    assert refused.wait(timeout=30) == 2 and not list(tmp_path.glob("rank*.json"))


def test_a_failing_rank_fails_the_group_with_its_status_and_stops_the_others(tmp_path):
    group = launch(tmp_path, "rank1-fails")
    ranks = ranks_written(tmp_path, 3)
    assert group.wait(timeout=30) == 3
    assert all(gone(r["pid"]) for r in ranks)


def test_a_sigkilled_rank_fails_the_group_and_stops_the_others(tmp_path):
    group = launch(tmp_path, "sleep")
    ranks = ranks_written(tmp_path, 3)
    os.kill(ranks[2]["pid"], signal.SIGKILL)
    assert group.wait(timeout=30) == 128 + signal.SIGKILL
    assert all(gone(r["pid"]) for r in ranks)


def test_no_rank_outlives_a_sigkilled_group_process(tmp_path):
    group = launch(tmp_path, "sleep")
    ranks = ranks_written(tmp_path, 3)
    group.kill()
    group.wait()
    assert all(gone(r["pid"]) for r in ranks)  # PR_SET_PDEATHSIG, even outside the supervisor


def test_the_group_exit_status_rules():
    assert first_failure([None, 0, None]) is None
    assert first_failure([0, 0]) is None
    assert first_failure([None, -9, 3]) == -9
    assert rank_env(1, 2, "127.0.0.1", 555) == {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                                                "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                                                "MASTER_PORT": "555", "GLOO_SOCKET_IFNAME": interface_of("127.0.0.1")}  # fmt: skip
    assert interface_of("127.0.0.1") is not None and "GLOO_SOCKET_IFNAME" not in rank_env(1, 2, "10.1.2.3", 555)


PARALLEL = """
import json, os, sys
import psutil, torch, torch.distributed as dist
from rlrun.trainer.parallel import Parallel, Ranks
parallel = Parallel(Ranks.from_env(os.environ), "ddp", "cpu", store_prefix="run-test/")
total = torch.ones(1)
dist.all_reduce(total)
listening = [[c.laddr.ip, c.laddr.port] for c in psutil.Process().net_connections("inet") if c.status == "LISTEN"]
with open(f"{sys.argv[1]}/rank{os.environ['RANK']}.json", "w") as f:
    json.dump({"sum": total.item(), "listening": listening, "MASTER_PORT": os.environ["MASTER_PORT"]}, f)
dist.barrier()
parallel.close()
"""


def test_the_ranks_store_and_gloo_pairs_listen_on_loopback_only(tmp_path):
    """torch's own rendezvous store would listen on every interface, and gloo's default device is
    the host name's: rank 0 serves the store on MASTER_ADDR and the ranks' gloo pairs use its
    interface (GLOO_SOCKET_IFNAME)."""
    group = subprocess.Popen(
        [sys.executable, "-m", "rlrun.entrypoints.rank_group", "--nproc", "2", "--", sys.executable, "-c", PARALLEL, str(tmp_path)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}, start_new_session=True,
    )  # fmt: skip
    assert group.wait(timeout=120) == 0
    ranks = ranks_written(tmp_path, 2)
    assert [r["sum"] for r in ranks] == [2.0, 2.0]
    assert ["127.0.0.1", int(ranks[0]["MASTER_PORT"])] in ranks[0]["listening"]  # rank 0 serves the store
    for rank in ranks:
        assert rank["listening"] and all(ip == "127.0.0.1" for ip, _port in rank["listening"]), rank
