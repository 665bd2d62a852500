"""world=local on a machine's GPUs: which of its visible GPUs each process gets (`plan`, pure), and
where the visible GPUs are found (`find_visible`: CUDA_VISIBLE_DEVICES, else NVML behind `Nvml`).

The rules are world=ray's and world=slurm's (`placement.py`, `slurm_plan.plan`), on one node whose
GPUs are the visible ones: each vLLM server gets `inference.tensor_parallel_size` GPUs of its own,
the trainer one per rank when `trainer.device` is cuda, actors, Redis and the weight follower none.
Each process then starts with CUDA_VISIBLE_DEVICES narrowed to its GPUs (`GpuPlan.env`). Asking for
more GPUs than are visible is a ConfigError naming both numbers, unless `world.share_gpus` puts the
trainer's ranks on the servers' GPUs (the single-GPU set-up). No GPU visible: nothing is placed and
nothing narrowed (the CPU build), unless the trainer asks for cuda. Knows nothing of what a process does.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from rlrun.cluster import placement, slurm_plan
from rlrun.config.schema import RolePlacement, WorldConfig
from rlrun.errors import ConfigError

GpuUse = Literal["cpu", "own", "shared"]  # what a process's GPUs are: none, its own, also another process's
NVML_PACKAGE = "nvidia-ml-py"  # imported as pynvml; in rlrun[gpu]


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used here; the message says why, for a person."""


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_bytes: int | None  # None where the driver does not say


class Nvml(Protocol):
    """The little of NVML rlrun asks (indices are the machine's, as nvidia-smi numbers them)."""

    def device_count(self) -> int: ...

    def processes(
        self, gpu: str
    ) -> list[GpuProcess]: ...  # compute processes holding memory on `gpu` (an index or UUID)

    def memory(self, gpu: str) -> tuple[int, int]: ...  # (used, total) bytes

    def utilization(self, gpu: str) -> int: ...  # % of the last sample period a kernel ran


def device_handle(nvml, gpu: str):
    """NVML's handle of a GPU named as CUDA_VISIBLE_DEVICES names it: a UUID, or an index (NVML
    numbers by PCI bus, as CUDA does on a node of one GPU model, or with CUDA_DEVICE_ORDER=PCI_BUS_ID)."""
    if gpu.isdigit():
        return nvml.nvmlDeviceGetHandleByIndex(int(gpu))
    return nvml.nvmlDeviceGetHandleByUUID(gpu)


class PyNvml:
    """`Nvml` over nvidia-ml-py (pynvml); `open_nvml` builds it."""

    def __init__(self, pynvml) -> None:
        self._nvml = pynvml

    def device_count(self) -> int:
        return int(self._nvml.nvmlDeviceGetCount())

    def processes(self, gpu: str) -> list[GpuProcess]:
        found = self._nvml.nvmlDeviceGetComputeRunningProcesses(device_handle(self._nvml, gpu))
        return [GpuProcess(int(p.pid), None if p.usedGpuMemory is None else int(p.usedGpuMemory)) for p in found]

    def memory(self, gpu: str) -> tuple[int, int]:
        info = self._nvml.nvmlDeviceGetMemoryInfo(device_handle(self._nvml, gpu))
        return int(info.used), int(info.total)

    def utilization(self, gpu: str) -> int:
        return int(self._nvml.nvmlDeviceGetUtilizationRates(device_handle(self._nvml, gpu)).gpu)


def open_nvml() -> Nvml:
    """NVML, started; NvmlUnavailable saying why not (the package missing, no driver)."""
    try:
        import pynvml
    except ImportError:
        raise NvmlUnavailable(
            f"NVML's Python bindings are not installed (pip install {NVML_PACKAGE}; in rlrun[gpu])"
        ) from None
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # pynvml.NVMLError_LibraryNotFound, _DriverNotLoaded, ...
        raise NvmlUnavailable(f"NVML does not start: {exc} (no NVIDIA driver on this machine?)") from None
    return PyNvml(pynvml)


@dataclass(frozen=True)
class Visible:
    """The GPUs this machine shows rlrun, as CUDA_VISIBLE_DEVICES names them (indices or UUIDs)."""

    ids: tuple[str, ...]
    source: str  # how they were found, or why none were, for a person


def parse_visible(value: str) -> tuple[str, ...]:
    """CUDA_VISIBLE_DEVICES → its ids, as CUDA reads it: comma-separated, ending at the first empty
    or negative entry ('0,1,-1,2' shows 0 and 1; '' none)."""
    ids = []
    for item in value.split(","):
        item = item.strip()
        if not item or item.startswith("-"):
            break
        ids.append(item)
    return tuple(ids)


def find_visible(environ: Mapping[str, str], nvml: Callable[[], Nvml] | None = None) -> Visible:
    """The GPUs CUDA would show a child started with `environ`: CUDA_VISIBLE_DEVICES when set, else
    every GPU NVML counts. NVML missing is no error: no GPU, and `source` says why."""
    if "CUDA_VISIBLE_DEVICES" in environ:
        value = environ["CUDA_VISIBLE_DEVICES"]
        return Visible(parse_visible(value), f"CUDA_VISIBLE_DEVICES={value!r}")
    try:
        count = (nvml or open_nvml)().device_count()
    except NvmlUnavailable as exc:
        return Visible((), f"CUDA_VISIBLE_DEVICES is unset and {exc}")
    return Visible(tuple(map(str, range(count))), f"NVML counts {count} GPU(s)")


@dataclass(frozen=True)
class GpuPlan:
    """Which GPUs each process of a world=local run sees. Empty `gpus`: not on GPUs (the CPU build,
    or another world, which places GPUs itself): nothing narrowed."""

    visible: Visible
    gpus: dict[str, tuple[str, ...]] = field(default_factory=dict)  # process → its GPU ids, every process of the run
    shared: frozenset[str] = frozenset()  # processes whose GPUs another process uses too

    @property
    def on_gpus(self) -> bool:
        return bool(self.gpus)

    def env(self, process: str) -> dict[str, str]:
        """What the process's environment gets: CUDA_VISIBLE_DEVICES narrowed to its GPUs ('' for none)."""
        if not self.on_gpus:
            return {}
        return {"CUDA_VISIBLE_DEVICES": ",".join(self.gpus.get(process, ()))}

    def use(self, process: str) -> GpuUse:
        if not self.gpus.get(process):
            return "cpu"
        return "shared" if process in self.shared else "own"


NOT_PLACED = GpuPlan(Visible((), "not placed by world=local"))


def plan(
    visible: Visible,
    processes: Sequence[str],
    ranks: Mapping[str, int],
    anchors: Mapping[str, str],
    *,
    tensor_parallel: int,
    trainer_device: str,
    share: bool,
) -> GpuPlan:
    """The GPUs of each of `processes` (start order; `ranks`: the trainer's; `anchors`: actor → its
    first server) among `visible`. ConfigError when they ask for more than `visible` has."""
    trainer_cuda = trainer_device.startswith("cuda")
    if not visible.ids and not trainer_cuda:
        return GpuPlan(visible)  # the CPU build: vLLM on the CPU, nothing to narrow
    if trainer_cuda and trainer_device not in ("cuda", "cuda:0"):
        raise ConfigError(
            f"trainer.device={trainer_device} names one GPU, but world=local gives the trainer GPUs of its own and narrows "
            f"CUDA_VISIBLE_DEVICES to them (its first is cuda:0): set trainer.device=cuda."
        )
    world = dataclasses.replace(
        WorldConfig(),
        redis=RolePlacement(local=True),
        actor=RolePlacement(cpus=0),
        vllm=RolePlacement(cpus=0, gpus=tensor_parallel if visible.ids else 0),
        trainer=RolePlacement(cpus=0, gpus=1 if trainer_cuda else 0),
    )  # what each process takes, as world.<role>.gpus says it under ray and slurm
    trainer_side = [p for p in processes if placement.role_of(p) == "trainer"] if share else []
    groups = [[p for p in processes if p not in trainer_side], trainer_side]  # shared: each from the first GPU
    needed = [_gpus_wanted(world, group, ranks) for group in groups]
    total = (
        max(sum(n for n in needed[0].values()), sum(n for n in needed[1].values()))
        if share
        else sum(needed[0].values())
    )
    if total > len(visible.ids):
        raise ConfigError(_over_request(needed, total, visible, share, trainer_cuda))
    node = slurm_plan.Node("this machine", "127.0.0.1", None, len(visible.ids))
    gpus: dict[str, tuple[str, ...]] = {}
    for group in groups:
        if not group:
            continue
        placed = slurm_plan.plan(world, list(group), dict(ranks), frozenset(), dict(anchors), [node]).placed
        for name, where in placed.items():
            gpus[name] = tuple(visible.ids[i] for share_ in where.shares for i in share_.gpus)
    gpus = {name: gpus[name] for name in processes}  # in start order
    shared: frozenset[str] = frozenset()
    if share:
        on_trainer = {g for p in trainer_side for g in gpus[p]}
        on_others = {g for p in groups[0] for g in gpus[p]}
        shared = frozenset(p for p, ids in gpus.items() if set(ids) & (on_others if p in trainer_side else on_trainer))
    return GpuPlan(visible, gpus, shared)


def _gpus_wanted(world: WorldConfig, processes: list[str], ranks: Mapping[str, int]) -> dict[str, int]:
    """Process → the whole GPUs its bundles ask for (placement.bundles, one node)."""
    wanted = placement.bundles(world, processes, dict(ranks))
    return {
        name: int(sum(b.get("GPU", 0.0) for b in bs)) for name, bs in wanted.items() if any(b.get("GPU") for b in bs)
    }


def _over_request(needed: list[dict[str, int]], total: int, visible: Visible, share: bool, trainer_cuda: bool) -> str:
    asked = ", ".join(f"{name}: {n}" for group in needed for name, n in group.items())
    message = f"the run needs {total} GPU(s) ({asked}) and this machine shows {len(visible.ids)} ({visible.source})."
    fixes = "Ask for fewer (inference.num_servers, inference.tensor_parallel_size, trainer.nproc_per_node)"
    if trainer_cuda and not share and needed[0]:
        fixes += ", or put the trainer on the vLLM servers' GPUs with world.share_gpus=true (memory split by inference.gpu_memory_utilization)"
    if not visible.ids:
        fixes = "Run it where a GPU is visible, or set trainer.device=cpu"
    return f"{message} {fixes}."


# --- memory back before a restart ---------------------------------------------------------------------

RELEASE_POLL_S = 0.5


@dataclass
class ReleaseWait:
    """Before each restart of a process on GPUs (its spec's `before_start`): wait until NVML lists
    no process on its GPUs but the run's live ones (`ours`: the supervisor's descendants, so a
    server sharing the GPU is no reason to wait), at most `timeout_s`. A dead engine's memory is
    freed by the driver some time after its death; a restart meanwhile dies of out-of-memory. What
    still holds memory at the deadline is named in an event (`gpu_memory_held`) and the process
    starts anyway (its own failure is then handled by its restart policy). The first start does not
    wait: memory held by others then is theirs, not a leftover of ours. It blocks the supervisor's
    loop while it waits (at most `timeout_s`, only at a restart)."""

    process: str
    gpus: tuple[str, ...]  # as CUDA_VISIBLE_DEVICES names them
    nvml: Callable[[], Nvml]
    ours: Callable[[], set[int]]
    emit: Callable[..., None]  # EventLog.emit
    timeout_s: float
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    starts: int = 0

    def __call__(self) -> None:
        self.starts += 1
        if self.starts == 1 or not self.gpus:
            return
        try:
            nvml = self.nvml()
        except NvmlUnavailable as exc:
            self.emit("gpu_memory_unchecked", process=self.process, gpus=list(self.gpus), why=str(exc))
            return
        started = self.clock()
        while True:
            held = self.held(nvml)
            waited = round(self.clock() - started, 3)
            if not held:
                if waited:
                    self.emit("gpu_memory_released", process=self.process, gpus=list(self.gpus), waited_s=waited)
                return
            if waited >= self.timeout_s:
                holders = [{"gpu": gpu, "pid": p.pid, "used_bytes": p.used_bytes} for gpu, p in held]
                self.emit(
                    "gpu_memory_held", process=self.process, gpus=list(self.gpus), waited_s=waited, holders=holders
                )
                return
            self.sleep(RELEASE_POLL_S)

    def held(self, nvml: Nvml) -> list[tuple[str, GpuProcess]]:
        """(GPU, process) of every process on this process's GPUs that is not one of the run's live ones."""
        ours = self.ours()
        return [(gpu, p) for gpu in self.gpus for p in nvml.processes(gpu) if p.pid not in ours]


def descendants_of(pid: int) -> set[int]:
    """Every live descendant of `pid` (the supervisor's: the run's processes, their children)."""
    from rlrun.supervisor.local import parents

    children: dict[int, list[int]] = {}
    for child, parent in parents().items():
        children.setdefault(parent, []).append(child)
    found, todo = set(), list(children.get(pid, ()))
    while todo:
        child = todo.pop()
        found.add(child)
        todo.extend(children.get(child, ()))
    return found


def on_gpus(spec, plan: GpuPlan, emit: Callable[..., None], timeout_s: float, nvml: Callable[[], Nvml] = open_nvml):
    """`spec` (a supervisor ProcessSpec) as the plan has it: CUDA_VISIBLE_DEVICES narrowed to its
    GPUs and, when it has some, a wait for their memory before each restart ahead of its own
    `before_start`."""
    import os

    env = {**spec.env, **plan.env(spec.name)}
    mine = plan.gpus.get(spec.name, ())
    if not mine:
        return dataclasses.replace(spec, env=env)
    wait = ReleaseWait(spec.name, mine, nvml, lambda: descendants_of(os.getpid()), emit, timeout_s)
    own = spec.before_start

    def before_start() -> None:
        wait()
        if own is not None:
            own()

    return dataclasses.replace(spec, env=env, before_start=before_start)


# --- what `rlrun status` shows -----------------------------------------------------------------------


@dataclass(frozen=True)
class ProcessGpus:
    gpus: tuple[str, ...]
    memory_bytes: int | None = None  # GPU memory its processes hold (NVML); None: not asked (not running, no NVML)
    utilization: dict[str, int] = field(default_factory=dict)  # per GPU, the whole GPU's busy %, not the process's own


def usage(
    placed: Mapping[str, Sequence[str]],
    pids: Mapping[str, int | None],
    nvml: Nvml | None,
    descendants: Callable[[int], set[int]] = descendants_of,
) -> dict[str, ProcessGpus]:
    """Each placed process's GPUs and, for one running (a pid in `pids`) where `nvml` answers, the
    memory its process tree holds on them and their utilisation."""
    out = {}
    for name, ids in placed.items():
        pid = pids.get(name)
        if nvml is None or pid is None or not ids:
            out[name] = ProcessGpus(tuple(ids))
            continue
        tree = {pid} | descendants(pid)
        held = [p.used_bytes or 0 for gpu in ids for p in nvml.processes(gpu) if p.pid in tree]
        out[name] = ProcessGpus(tuple(ids), sum(held), {gpu: nvml.utilization(gpu) for gpu in ids})
    return out


# --- nothing of the run left on its GPUs after it stops -----------------------------------------------


class GroupsSeen:
    """A spawner that remembers the process group of everything it started (each local process's
    guard leads one): after the stop, what still holds the run's GPUs in one of them is the run's."""

    def __init__(self, spawner) -> None:
        self._spawner = spawner
        self.groups: set[int] = set()

    def spawn(self, spec):
        handle = self._spawner.spawn(spec)
        self.groups.add(handle.pid)
        return handle

    def close(self) -> None:
        self._spawner.close()

    def server_hosts(self) -> dict[str, str]:
        return self._spawner.server_hosts()


def end_leftovers(
    plan: GpuPlan,
    groups: set[int],
    emit: Callable[..., None],
    nvml: Callable[[], Nvml] | None = None,
    pgid_of: Callable[[int], int] | None = None,
    kill: Callable[[int, int], None] | None = None,
) -> list[int]:
    """After the run stopped: every process on its GPUs still in one of its process groups
    (`groups`) is named in an event (`gpu_leftover_killed`) and SIGKILLed; the pids ended. NVML
    missing: nothing asked, nothing ended."""
    import os
    import signal

    pgid_of, kill = pgid_of or os.getpgid, kill or os.kill
    try:
        found = (nvml or open_nvml)()
    except NvmlUnavailable:
        return []
    ended = []
    for gpu in sorted({g for ids in plan.gpus.values() for g in ids}):
        for p in found.processes(gpu):
            try:
                group = pgid_of(p.pid)
            except (ProcessLookupError, PermissionError):
                continue  # gone, or not a pid of this machine's (a container's NVML may show the host's)
            if group not in groups or p.pid in ended:
                continue
            emit("gpu_leftover_killed", pid=p.pid, gpu=gpu, group=group, used_bytes=p.used_bytes)
            try:
                kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            ended.append(p.pid)
    return ended
