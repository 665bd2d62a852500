"""One Ray node on 127.0.0.1, in the foreground, like `ray start --block` (a test helper).

    python -m tests.ray_node --head --temp-dir DIR --resources '{"trainer_node": 1}'
    python -m tests.ray_node --address 127.0.0.1:PORT --temp-dir DIR --resources '{"vllm_node": 1}'

Why not `ray start`: its CLI refuses to put a second node on a loopback address (it rewrites
127.0.0.1 into the machine's external address, then binds every port on all interfaces). The
tests must stay on loopback, so this starts the node the way `ray start` does internally (and
the way Ray's own `cluster_utils` does), with `node_ip_address=127.0.0.1`: Ray then binds its
servers to loopback only.

Prints one JSON line `{"gcs_address": ..., "node_id": ...}` once the node is up, then blocks
until SIGTERM/SIGINT, and takes all of the node's processes down with it (also when killed:
Ray's reaper process watches this one). `LocalRayCluster` below starts such nodes for a test and
records every process they run, to check by pid that none is left.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--head", action="store_true")
    parser.add_argument("--address", help="the head's GCS address (worker nodes)")
    parser.add_argument("--temp-dir", required=True)
    parser.add_argument("--num-cpus", type=int, default=1)
    parser.add_argument("--resources", default="{}")
    parser.add_argument("--object-store-mb", type=int, default=80)
    args = parser.parse_args(argv)
    if args.head == bool(args.address):
        parser.error("give either --head or --address")

    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    import ray._private.node
    import ray._private.parameter

    params = ray._private.parameter.RayParams(
        node_ip_address="127.0.0.1",
        num_cpus=args.num_cpus,
        num_gpus=0,
        resources=json.loads(args.resources),
        object_store_memory=args.object_store_mb * 1024 * 1024,
        temp_dir=args.temp_dir,
        include_dashboard=False,
        min_worker_port=0,
        max_worker_port=0,
        node_manager_port=0,
        ray_client_server_port=None,
        dashboard_agent_listen_port=None,
    )
    if args.head:
        params.gcs_server_port = 0
    else:
        params.gcs_address = args.address
        params.include_log_monitor = False
    node = ray._private.node.Node(params, head=args.head, shutdown_at_exit=False, spawn_reaper=True)
    print(json.dumps({"gcs_address": node.gcs_address, "node_id": node.node_id}), flush=True)

    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    while not done.wait(1.0):
        if node.dead_processes():
            break
    node.kill_all_processes(check_alive=False, allow_graceful=True, wait=True)
    return 0


class LocalRayCluster:
    """Ray nodes on 127.0.0.1 for a test, each `python -m tests.ray_node` in its own session.

        cluster = LocalRayCluster(tmp_path)
        head = cluster.add_node({"trainer_node": 1}, head=True)
        node = cluster.add_node({"vllm_node": 1})
        ... ray.init(address=cluster.address) with DRIVER_ENV ...
        cluster.stop()             # every node down; .left_behind() lists what is still alive

    Everything the nodes started is recorded (pid and start time) while they run, so "nothing
    is left" is checked exactly, by pid, without touching other processes on the machine.
    """

    # A driver (rlrun, or the test process) must not rewrite 127.0.0.1 into the machine's
    # external address, which Ray does unless told this: the cluster listens on loopback only.
    DRIVER_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}

    def __init__(self, root) -> None:
        from pathlib import Path

        import tempfile

        self.root = Path(root)  # node output files
        self.temp = Path(tempfile.mkdtemp(prefix="rlray-"))  # Ray's sockets: a short path (AF_UNIX: 107 bytes)
        self.nodes: dict = {}  # node id → its node process (a Popen)
        self.address: str | None = None
        self.seen: set[tuple[int, float]] = set()

    def add_node(self, resources: dict, *, head: bool = False, num_cpus: int = 1, timeout: float = 180.0) -> str:
        import subprocess
        import time
        from pathlib import Path

        assert head == (self.address is None), "the head first, then the other nodes"
        repo = Path(__file__).resolve().parent.parent
        where = ["--head"] if head else ["--address", self.address]
        temp = self.temp / f"n{len(self.nodes)}"
        self.root.mkdir(parents=True, exist_ok=True)
        out = open(self.root / f"node{len(self.nodes)}.out", "w+")
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.ray_node", *where, "--temp-dir", str(temp), "--num-cpus", str(num_cpus),
             "--resources", json.dumps(resources)],
            cwd=repo, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"},
        )  # fmt: skip
        deadline = time.time() + timeout
        while True:
            out.seek(0)
            first = out.readline()
            if first.startswith("{") and first.endswith("\n"):
                break
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                out.seek(0)
                raise RuntimeError(f"Ray node did not start: {out.read()[-3000:]}")
            time.sleep(0.3)
        info = json.loads(first)
        self.address = self.address or info["gcs_address"]
        self.nodes[info["node_id"]] = proc
        self.record()
        return info["node_id"]

    def record(self) -> None:
        """Remember every process the nodes run now (call it while a test's processes run)."""
        import psutil

        for proc in self.nodes.values():
            try:
                for p in psutil.Process(proc.pid).children(recursive=True):
                    try:
                        self.seen.add((p.pid, p.create_time()))
                    except psutil.Error:
                        pass
            except psutil.Error:
                pass

    def node_of(self, pid: int) -> str | None:
        """The id of the node whose process tree holds `pid` (None: none of them)."""
        import psutil

        try:
            ancestors = {p.pid for p in psutil.Process(pid).parents()}
        except psutil.Error:
            return None
        return next((node_id for node_id, proc in self.nodes.items() if proc.pid in ancestors), None)

    def stop_node(self, node_id: str, timeout: float = 60.0) -> None:
        """Take one node down (SIGTERM: it stops all its processes), as a lost node."""
        self.record()
        proc = self.nodes.pop(node_id)
        proc.terminate()
        try:
            proc.wait(timeout)
        except Exception:  # noqa: BLE001
            proc.kill()
            proc.wait()

    def stop(self) -> None:
        import shutil

        for node_id in list(self.nodes)[::-1]:  # worker nodes first, the head last
            self.stop_node(node_id)
        shutil.rmtree(self.temp, ignore_errors=True)

    def left_behind(self, grace_s: float = 10.0) -> list[str]:
        """Processes the nodes ever ran that are still alive (after up to grace_s)."""
        from tests.processes import still_alive

        return still_alive(self.seen, grace_s)

    def kill_left_behind(self) -> None:
        """Last resort after a failed test: SIGKILL what is left, by pid."""
        import psutil

        for pid, started in self.seen:
            try:
                p = psutil.Process(pid)
                if p.create_time() == started:
                    p.kill()
            except psutil.Error:
                pass


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
