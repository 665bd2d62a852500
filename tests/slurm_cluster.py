"""A SLURM cluster on this machine for tests (Debian's slurm-wlm 22.05 and munge).

    with LocalSlurm(tmp_path) as slurm:          # munged, slurmctld, slurmd; node `node0` on 127.0.0.1, idle
        subprocess.run(["sbatch", ...], env=slurm.env)   # SLURM_CONF points at its slurm.conf
    with LocalSlurm(tmp_path, nodes=[("node0", 1), ("node1", 3)]):   # two nodes, CPUs each

Everything lives in one folder: a fresh munge key and munged on its own socket, slurm.conf with its
own ports, state and spool folders, logs. Every daemon (and srun) listens on its node's address
only. One node runs on 127.0.0.1. Several nodes (this build has no multiple-slurmd) each get a
network namespace of their own, joined by a bridge on a private /24 that the test creates and
removes: node k at .1k (slurmctld on node0), this machine at .1, so the test's SLURM commands reach
them; jobs on a node see that node's address only, as on separate machines (the filesystem is
shared, as a cluster's is). Daemons run in the foreground as children of the test, in their own
sessions; `stop()` cancels every job, ends them, removes the namespaces and reports what it had to
kill. Needs root and the binaries (`available()` says why not); several nodes also need network
namespaces (`NamespacesUnavailable` otherwise).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from tests.processes import ProcessCollector

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "squeue", "scancel", "sinfo")


class NamespacesUnavailable(RuntimeError):
    """Several nodes need network namespaces and a bridge (ip netns, CAP_NET_ADMIN): not here."""


def available() -> str | None:
    """None when a cluster can be started here, else why not (the skip reason)."""
    missing = [b for b in BINARIES if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]
    if missing:
        return f"SLURM is not installed ({', '.join(missing)} missing): apt-get install slurm-wlm munge (./scripts/setup-env does, as root)"
    if os.geteuid() != 0:
        return "the local SLURM cluster needs root (slurmd starts jobs as their user)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _binary(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


class LocalSlurm:
    def __init__(self, root: Path, nodes: list[tuple[str, int]] = (("node0", 2),), kill_wait_s: int = 30) -> None:
        self.root = Path(root)
        self.nodes, self.kill_wait_s = list(nodes), kill_wait_s
        self.conf = self.root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self._daemons: list[subprocess.Popen] = []
        self._net: _Network | None = None
        self.addresses = {self.nodes[0][0]: "127.0.0.1"}  # node → its address

    def __enter__(self) -> "LocalSlurm":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        for folder in ("state", "spool", "log"):
            (self.root / folder).mkdir(parents=True, exist_ok=True)
        key = self.root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        socket_path = self.root / "munge.sock"
        self._spawn([_binary("munged"), "--foreground", "--force", f"--key-file={key}", f"--socket={socket_path}",
                     f"--pid-file={self.root / 'munged.pid'}", f"--log-file={self.root / 'log/munged.log'}",
                     f"--seed-file={self.root / 'munged.seed'}"], "munged")  # fmt: skip
        self._wait(lambda: socket_path.exists(), "munged's socket")
        names = [name for name, _ in self.nodes]
        if len(names) > 1:
            self._net = _Network.create(names)  # NamespacesUnavailable where it cannot be
            self.addresses = dict(self._net.addresses)
        self.conf.write_text(self._config(socket_path))
        head = self._net.run_in(names[0]) if self._net else []
        self._spawn([*head, _binary("slurmctld"), "-D", "-i", "-f", str(self.conf)], "slurmctld")
        self._wait(lambda: self._ask(["sinfo", "--noheader"]) is not None, "slurmctld to answer")
        for name in names:
            inside = self._net.run_in(name) if self._net else []
            self._spawn([*inside, _binary("slurmd"), "-D", "-N", name, "-f", str(self.conf)], f"slurmd-{name}")
        idle = lambda: (self._ask(["sinfo", "--noheader", "--Node", "--format=%t"]) or "").split() == ["idle"] * len(names)  # noqa: E731
        self._wait(idle, f"{', '.join(names)} to be idle")

    def _config(self, munge_socket: Path) -> str:
        r = self.root
        address = self.addresses[self.nodes[0][0]]
        ctld = f"localhost({address})" if self._net is None else f"{socket.gethostname()}({address})"  # slurmctld checks its host's name
        return "\n".join([
            "ClusterName=rlruntest", f"SlurmctldHost={ctld}",
            f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
            "SlurmUser=root", "SlurmdUser=root", "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={munge_socket}",
            f"StateSaveLocation={r / 'state'}", f"SlurmdSpoolDir={r / 'spool'}/%n",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}", f"SlurmdPidFile={r / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={r / 'log/slurmctld.log'}", f"SlurmdLogFile={r / 'log/slurmd-%n.log'}",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/backfill", "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none", "MpiDefault=none", "ReturnToService=2", "SlurmdParameters=config_overrides",
            # On one node every daemon and srun listens on 127.0.0.1, not every interface (they bind the
            # address their host's name resolves to). In namespaces a node's interfaces are its own.
            *(["CommunicationParameters=NoCtldInAddrAny,NoInAddrAny"] if self._net is None else []),
            f"KillWait={self.kill_wait_s}", "MinJobAge=600", "JobRequeue=1",
            *(f"NodeName={name} NodeAddr={self.addresses[name]} CPUs={cpus} State=UNKNOWN" for name, cpus in self.nodes),
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP", "",
        ])  # fmt: skip

    def _spawn(self, argv: list[str], name: str) -> None:
        out = open(self.root / "log" / f"{name}.out", "ab")
        self._daemons.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env, start_new_session=True))

    def _ask(self, argv: list[str]) -> str | None:
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=10, env=self.env)
        except subprocess.TimeoutExpired:
            return None
        return done.stdout if done.returncode == 0 else None

    def _wait(self, condition, what: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            dead = [p.args[0] for p in self._daemons if p.poll() is not None]
            if dead:
                raise RuntimeError(f"{', '.join(dead)} exited while waiting for {what}: see {self.root / 'log'}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}: see {self.root / 'log'}")
            time.sleep(0.2)

    # --- for tests ------------------------------------------------------------------------------
    def node_of(self, pid: int) -> str | None:
        """The node a process runs on: the one whose network namespace it is in (one node: node0)."""
        if self._net is None:
            return self.nodes[0][0]
        try:
            inode = os.stat(f"/proc/{pid}/ns/net").st_ino
        except OSError:
            return None
        for name, ns in self._net.namespaces.items():
            if os.stat(f"/run/netns/{ns}").st_ino == inode:
                return name
        return None

    def run(self, *argv: str, check: bool = True) -> str:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=30, env=self.env)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
        return done.stdout

    def job_state(self, job: str) -> str:
        """squeue's state of `job` ('' once it left the queue)."""
        return self.run("squeue", "--noheader", "--jobs", job, "--format=%T", check=False).strip()

    def job_field(self, job: str, field: str) -> str:
        """A field of `scontrol show job` (JobState, Restarts, RunTime, ...)."""
        text = self.run("scontrol", "show", "job", job)
        for token in text.split():
            if token.startswith(f"{field}="):
                return token.split("=", 1)[1]
        raise KeyError(field)

    def job_processes(self) -> list[str]:
        """Every process of this cluster's jobs still there (step daemons and all they started)."""
        import psutil

        found = []
        for stepd in self._step_daemons():
            try:
                found += [f"{p.pid} {' '.join(p.cmdline())[:120]}" for p in [stepd, *stepd.children(recursive=True)]]
            except psutil.Error:
                pass
        return sorted(set(found))

    def stop(self) -> list[str]:
        """Cancel every job, end the daemons; the job processes that had to be killed after."""
        import psutil

        if self._daemons and all(d.poll() is None for d in self._daemons):  # slurmd does not end its jobs when it stops
            running = self._step_daemons()
            self.run("scancel", f"--user={os.geteuid()}", check=False)
            psutil.wait_procs(running, timeout=self.kill_wait_s + 15)
        left = []
        for daemon in reversed(self._daemons):  # slurmd, slurmctld, munged
            if daemon.poll() is None:
                daemon.send_signal(signal.SIGTERM)
                try:
                    daemon.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(daemon.pid, signal.SIGKILL)
                    daemon.wait()
        for stepd in self._step_daemons():  # one outliving slurmd: its job must not outlive the test
            try:
                left.append(f"{stepd.pid} {' '.join(stepd.cmdline())}")
                for child in stepd.children(recursive=True):
                    child.kill()
                stepd.kill()
            except psutil.Error:
                pass
        self._daemons = []
        if self._net is not None:
            self._net.remove()
            self._net = None
        return left

    def _step_daemons(self) -> list:
        """This cluster's slurmstepd processes (they daemonize: found by the slurmd log of ours they
        hold open; their sockets in its spool folder are invisible from another network namespace)."""
        import psutil

        logs = str(self.root / "log") + os.sep
        found = []
        for proc in psutil.process_iter(["name"]):
            try:
                if (proc.info["name"] or "").startswith("slurmstepd") and any(f.path.startswith(logs) for f in proc.open_files()):
                    found.append(proc)
            except psutil.Error:
                pass
        return found


class JobProcesses(ProcessCollector):
    """Every process of a cluster's jobs (step daemons and all they start), collected while the
    jobs run."""

    def __init__(self, slurm: LocalSlurm) -> None:
        self.slurm = slurm
        self.cmdlines: set[str] = set()
        self.placed: set[tuple[str, str | None]] = set()  # (command line, the node it ran on)
        super().__init__()

    def _look(self) -> bool:
        import psutil

        for stepd in self.slurm._step_daemons():
            try:
                for p in [stepd, *stepd.children(recursive=True)]:
                    self.seen.add((p.pid, p.create_time()))
                    cmdline = " ".join(p.cmdline())
                    self.cmdlines.add(cmdline)
                    self.placed.add((cmdline, self.slurm.node_of(p.pid)))
            except psutil.Error:
                pass
        return True


class _Network:
    """One network namespace per node, joined by a bridge on a private /24 (this machine at .1)."""

    def __init__(self, tag: str, prefix: str, names: list[str]) -> None:
        self.tag, self.prefix = tag, prefix
        self.addresses = {name: f"{prefix}.{10 + k}" for k, name in enumerate(names)}
        self.namespaces = {name: f"rlrun-{tag}-{k}" for k, name in enumerate(names)}
        self.bridge = f"rlb{tag}"

    @classmethod
    def create(cls, names: list[str]) -> "_Network":
        if shutil.which("ip") is None:
            raise NamespacesUnavailable("`ip` (iproute2) is not installed")
        taken = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
        for _ in range(20):
            prefix = f"10.{random.randint(200, 250)}.{random.randint(0, 255)}"
            if f" {prefix}." not in taken:
                break
        net = cls(os.urandom(3).hex()[:5], prefix, names)
        try:
            net._ip("link", "add", net.bridge, "type", "bridge")
            net._ip("addr", "add", f"{prefix}.1/24", "dev", net.bridge)
            net._ip("link", "set", net.bridge, "up")
            for k, name in enumerate(names):
                ns, veth = net.namespaces[name], f"rlv{net.tag}{k}"
                net._ip("netns", "add", ns)
                net._ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
                net._ip("link", "set", veth, "master", net.bridge, "up")
                net._ip("-n", ns, "addr", "add", f"{net.addresses[name]}/24", "dev", "eth0")
                net._ip("-n", ns, "link", "set", "eth0", "up")
                net._ip("-n", ns, "link", "set", "lo", "up")
        except subprocess.CalledProcessError as exc:
            net.remove()
            raise NamespacesUnavailable(f"`{' '.join(exc.cmd)}` failed: {exc.stderr.strip()}") from None
        return net

    def _ip(self, *args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True, text=True)

    def run_in(self, name: str) -> list[str]:
        # nsenter, not `ip netns exec`: that one mounts a sysfs of its own, without the cgroup
        # filesystem slurmd wants.
        return [shutil.which("nsenter") or "nsenter", f"--net=/run/netns/{self.namespaces[name]}"]

    def remove(self) -> None:
        for ns in self.namespaces.values():  # their veth ends go with them
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
