"""The start of every srun step of a world=slurm run, on each of its nodes:

    python -m rlrun.entrypoints.slurm_step --record PATH [--gpus 0,1 | --layout JSON] -- CMD...

It makes this task lead its process group (the probes compare a process's `os.getpgrp()` with the
pid the supervisor tracks), narrows CUDA_VISIBLE_DEVICES to the GPUs the plan gave it (the step
sees all the job's GPUs on its node: steps run with --overlap), and for ranks spanning nodes
(`--layout`) turns CMD into this node's rank group (`rank_group.node_command`), meeting at the
first node, whose task picks the port and leaves it beside the record for the others; gloo's and
NCCL's sockets go through the interface that reaches that node (GLOO_SOCKET_IFNAME and
NCCL_SOCKET_IFNAME, unless set: left alone, gloo takes the address of the host's name, which need
not be one the other nodes reach). The task of the first node records its pid and node in PATH
(the spawner waits for it). Each then runs CMD in its group and waits; when CMD ends it writes
its exit status beside the record (PATH.exit.<node rank>) and exits as CMD did. That file, not
srun, tells the supervisor a process ended: once SLURM is ending the job, srun waits for the whole
job to be done (KillWait) before it exits. No guard against a lost parent: SLURM tracks every
process of the step and kills them with it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

PORT_WAIT_S = 300.0  # the other nodes wait this long for the first node's rendezvous port


def visible_gpus(planned: list[int], slurm_visible: str | None) -> str:
    """CUDA_VISIBLE_DEVICES for a task given GPU indices `planned` among those SLURM shows the step
    (`slurm_visible`, its CUDA_VISIBLE_DEVICES; None: the node's own numbering)."""
    if slurm_visible is None:
        return ",".join(map(str, planned))
    shown = [g for g in slurm_visible.split(",") if g != ""]
    missing = [i for i in planned if i >= len(shown)]
    if missing:
        raise ValueError(
            f"the plan gives this task GPUs {planned}, but the step sees {len(shown)} ({slurm_visible!r}): does the job "
            f"have world.gpus_per_node GPUs on every node?"
        )
    return ",".join(shown[i] for i in planned)


def for_node(layout: dict, node: str, cmd: list[str], port: int) -> list[str]:
    """The command of node `node`'s rank group, meeting the others at the layout's master address
    and `port` (`layout` as slurm_plan.srun_argv writes it)."""
    from rlrun.trainer import rank_group

    mine = layout["nodes"].get(node)
    if mine is None:
        raise ValueError(f"node {node} is not in this step's layout ({', '.join(layout['nodes'])})")
    return rank_group.node_command(
        cmd,
        nproc=mine["nproc"],
        first_rank=mine["first_rank"],
        node_rank=mine["node_rank"],
        nnodes=len(layout["nodes"]),
        world_size=layout["world_size"],
        master_addr=layout["master_addr"],
        master_port=port,
    )


def interface_toward(address: str) -> str | None:
    """The name of this machine's network interface that packets to `address` leave by."""
    import psutil

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((address, 9))  # no packet is sent: the kernel only picks the route
        local = probe.getsockname()[0]
    return next((name for name, addrs in psutil.net_if_addrs().items() if any(a.address == local for a in addrs)), None)


def exit_file(record: Path, node_rank: int) -> Path:
    return record.with_name(f"{record.name}.exit.{node_rank}")


def port_file(record: Path) -> Path:
    return record.with_name(record.name + ".port")


def _write(path: Path, text: str) -> None:
    from rlrun.rundir import write_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text)


def _wait_for_port(path: Path, deadline: float) -> int:
    while time.monotonic() < deadline:
        try:
            return int(path.read_text())
        except (OSError, ValueError):
            time.sleep(0.2)
    raise TimeoutError(f"no rendezvous port from the first node in {path} after {PORT_WAIT_S:g} s")


def run_step(record_path: Path, gpus: str, layout_json: str, cmd: list[str]) -> int:
    """This node's task of the step: record, narrow the GPUs, run `cmd` (its rank group with
    `layout_json`) and exit as it did; 2 when the plan does not fit the job, as a config error."""
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    if os.getpgrp() != os.getpid():
        os.setpgid(0, 0)
    try:
        planned = [int(g) for g in gpus.split(",") if g]
        first, node_rank = True, 0
        if layout_json:
            from rlrun.trainer.rank_group import free_port

            layout = json.loads(layout_json)
            for_node(layout, node, cmd, 0)  # a node not in the layout: said now, not after the wait
            mine = layout["nodes"][node]
            planned, node_rank = mine["gpus"], mine["node_rank"]
            first = node_rank == 0
            ports = port_file(record_path)
            if first:
                port = free_port(layout["master_addr"])
                _write(ports, str(port))
            else:
                port = _wait_for_port(ports, time.monotonic() + PORT_WAIT_S)
            cmd = for_node(layout, node, cmd, port)
            interface = interface_toward(socket.gethostbyname(layout["master_addr"]))
            for variable in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
                if interface and variable not in os.environ:
                    os.environ[variable] = interface
        if planned:
            os.environ["CUDA_VISIBLE_DEVICES"] = visible_gpus(planned, os.environ.get("CUDA_VISIBLE_DEVICES"))
        if first:
            record = {
                "pid": os.getpid(),
                "node": node,
                "job": os.environ.get("SLURM_JOB_ID"),
                "step": os.environ.get("SLURM_STEP_ID"),
            }
            _write(record_path, json.dumps(record) + "\n")
    except (ValueError, KeyError) as exc:  # a plan that does not fit the job: a restart would meet it again
        print(f"rlrun slurm step on {node}: {exc}", file=sys.stderr, flush=True)
        return 2  # as a configuration error: the supervisor does not retry it
    except (TimeoutError, OSError) as exc:
        print(f"rlrun slurm step on {node}: {exc}", file=sys.stderr, flush=True)
        return 1
    return run(cmd, exit_file(record_path, node_rank))


def run(cmd: list[str], exit_path: Path) -> int:
    """CMD in this process's group until it ends; its status written to `exit_path`, then ours."""
    # SLURM signals every process of the step, CMD too: this one waits for CMD's own shutdown.
    # (Python handlers, not SIG_IGN: a child would inherit an ignored signal, not a handler.)
    signal.signal(signal.SIGTERM, lambda *_: None)
    signal.signal(signal.SIGINT, lambda *_: None)
    from rlrun.trainer.rank_group import die_with_parent

    try:
        # Dies with this process: should SLURM miss the command when it ends the step (its
        # tracking cannot see every process), the command still goes with the step's task.
        code = subprocess.Popen(cmd, preexec_fn=die_with_parent).wait()
    except OSError as exc:
        print(f"rlrun slurm step: cannot start {cmd[0]}: {exc}", file=sys.stderr, flush=True)
        code = 127
    _write(exit_path, f"{code}\n")
    if code < 0:  # die the way CMD died, so srun and the supervisor read the same status
        if -code not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code
