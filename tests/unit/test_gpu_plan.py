"""world=local on GPUs without a GPU: the plan for 1, 2 and 8 visible GPUs (tensor parallel 2,
shared, refused), the visible GPUs found from CUDA_VISIBLE_DEVICES or NVML (a fake here: this
machine has no GPU and no NVML), and the CUDA_VISIBLE_DEVICES each real spawned process reads
back from its own environment (fake ids: the processes only read the variable)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

import pytest
from typer.testing import CliRunner

from rlrun.cli.app import app
from rlrun.cluster import gpus
from rlrun.config import compose
from rlrun.errors import ConfigError
from rlrun.run import launch
from rlrun.run.built import build
from rlrun.run.plan import build_plan
from rlrun.rundir import RunDir
from rlrun.run.preflight import check_settings
from rlrun.supervisor.local import LocalSpawner
from tests.refusals import settings_refusal


def visible(n: int) -> gpus.Visible:
    return gpus.Visible(tuple(map(str, range(n))), f"{n} fake GPUs")


def plan_of(n: int, *overrides: str) -> gpus.GpuPlan:
    return build(compose(list(overrides))[0]).world.gpu_plan(visible(n))


def vllm_flag(tmp_path, plan: gpus.GpuPlan, overrides: list[str], flag: str, server: str = "vllm-0") -> str:
    built = build(compose(overrides)[0])
    spec = next(s for s in build_plan(built, RunDir(tmp_path), plan, preview=True).specs if s.name == server)
    return spec.argv[spec.argv.index(flag) + 1]


CUDA = ["trainer.device=cuda"]
FOUR_RANKS = ["trainer.nproc_per_node=4", "trainer.gradient_accumulation_passes=4"]


def test_one_gpu_goes_to_vllm_and_nothing_else_sees_one(tmp_path):
    plan = plan_of(1)  # the trainer on its default cpu
    assert plan.gpus == {"redis": (), "vllm-0": ("0",), "trainer": (), "actor": ()}
    assert plan.env("vllm-0") == {"CUDA_VISIBLE_DEVICES": "0"}
    assert plan.env("trainer") == plan.env("actor") == plan.env("redis") == {"CUDA_VISIBLE_DEVICES": ""}
    assert vllm_flag(tmp_path, plan, [], "--gpu-memory-utilization") == "0.9"  # a GPU default, not the CPU build's 0.05


def test_one_gpu_for_vllm_and_the_trainer_is_refused_unless_sharing_is_asked(tmp_path):
    with pytest.raises(ConfigError) as refused:
        plan_of(1, *CUDA)
    message = str(refused.value)
    assert "needs 2 GPU(s) (vllm-0: 1, trainer: 1)" in message and "this machine shows 1 (1 fake GPUs)" in message
    assert "world.share_gpus=true" in message

    shared = plan_of(1, *CUDA, "world.share_gpus=true")
    assert list(shared.gpus.items()) == [("redis", ()), ("vllm-0", ("0",)), ("trainer", ("0",)), ("actor", ())]  # start order
    assert shared.use("vllm-0") == shared.use("trainer") == "shared" and shared.use("actor") == "cpu"
    overrides = [*CUDA, "world.share_gpus=true"]
    assert vllm_flag(tmp_path, shared, overrides, "--gpu-memory-utilization") == "0.45"  # half left to the trainer
    assert vllm_flag(tmp_path, shared, [*overrides, "inference.gpu_memory_utilization=0.3"], "--gpu-memory-utilization") == "0.3"


def test_two_gpus_give_vllm_and_the_trainer_one_each():
    plan = plan_of(2, *CUDA)
    assert (plan.gpus["vllm-0"], plan.gpus["trainer"], plan.gpus["actor"]) == (("0",), ("1",), ())
    assert plan.use("vllm-0") == plan.use("trainer") == "own"


def test_eight_gpus_two_servers_of_tensor_parallel_2_and_four_ranks(tmp_path):
    overrides = [*CUDA, *FOUR_RANKS, "inference.num_servers=2", "inference.tensor_parallel_size=2", "actor.num_actors=2"]
    plan = plan_of(8, *overrides)
    assert plan.gpus == {
        "redis": (), "vllm-0": ("0", "1"), "vllm-1": ("2", "3"), "trainer": ("4", "5", "6", "7"), "actor-0": (), "actor-1": (),
    }  # fmt: skip
    assert vllm_flag(tmp_path, plan, overrides, "--tensor-parallel-size", "vllm-1") == "2"  # vLLM told its size
    specs = {s.name: s for s in build_plan(build(compose(overrides)[0]), RunDir(tmp_path), plan, preview=True).specs}
    assert specs["trainer"].env["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"  # rank r takes cuda:r among them


def test_more_than_the_machine_shows_is_refused_naming_both_numbers():
    with pytest.raises(ConfigError, match=r"needs 10 GPU\(s\) \(vllm-0: 2, vllm-1: 2, trainer: 6\) and this machine shows 8"):
        plan_of(8, *CUDA, "trainer.nproc_per_node=6", "trainer.gradient_accumulation_passes=6", "inference.num_servers=2",
                "inference.tensor_parallel_size=2")  # fmt: skip
    with pytest.raises(ConfigError, match=r"needs 3 GPU\(s\) \(vllm-0: 3\) and this machine shows 2"):
        plan_of(2, "inference.tensor_parallel_size=3", "world.share_gpus=true")  # sharing is the trainer's, not the servers'


def test_the_ids_are_the_visible_ones_in_their_order():
    seen = gpus.Visible(("GPU-c0ffee", "GPU-beef"), "CUDA_VISIBLE_DEVICES")
    plan = build(compose(CUDA)[0]).world.gpu_plan(seen)
    assert plan.gpus["vllm-0"] == ("GPU-c0ffee",) and plan.gpus["trainer"] == ("GPU-beef",)


def test_without_a_gpu_nothing_is_placed_unless_the_trainer_asks_for_cuda(tmp_path):
    none = gpus.Visible((), "CUDA_VISIBLE_DEVICES is unset and NVML's Python bindings are not installed")
    plan = build(compose([])[0]).world.gpu_plan(none)
    assert not plan.on_gpus and plan.env("vllm-0") == {} and plan.use("vllm-0") == "cpu"
    assert vllm_flag(tmp_path, plan, [], "--gpu-memory-utilization") == "0.05"  # the CPU build's
    with pytest.raises(ConfigError, match=r"needs 1 GPU\(s\) \(trainer: 1\) and this machine shows 0 \(CUDA_VISIBLE_DEVICES is unset and NVML"):
        build(compose(CUDA)[0]).world.gpu_plan(none)


def test_a_trainer_named_on_one_gpu_is_told_to_take_the_one_it_is_given():
    with pytest.raises(ConfigError, match=r"trainer.device=cuda:1 names one GPU.*set trainer.device=cuda"):
        plan_of(2, "trainer.device=cuda:1")
    assert plan_of(2, "trainer.device=cuda:0").gpus["trainer"] == ("1",)


def test_other_worlds_are_not_narrowed_here():
    cfg, _ = compose(["world=ray", "world.address=10.0.0.1:6379", *CUDA])
    assert build(cfg).world.gpu_plan(visible(8)) is gpus.NOT_PLACED


# --- finding the visible GPUs ------------------------------------------------------------------------


class FakeNvml:
    def __init__(self, count: int) -> None:
        self.count = count

    def device_count(self) -> int:
        return self.count


def no_nvml():
    raise gpus.NvmlUnavailable("NVML's Python bindings are not installed (pip install nvidia-ml-py; in rlrun[gpu])")


def test_cuda_visible_devices_is_read_as_cuda_reads_it_and_nvml_is_not_asked():
    assert gpus.find_visible({"CUDA_VISIBLE_DEVICES": "3,1"}, no_nvml).ids == ("3", "1")
    assert gpus.find_visible({"CUDA_VISIBLE_DEVICES": "0, 1,-1,2"}, no_nvml).ids == ("0", "1")  # -1 ends the list
    assert gpus.find_visible({"CUDA_VISIBLE_DEVICES": ""}, no_nvml).ids == ()
    assert gpus.find_visible({}, lambda: FakeNvml(4)).ids == ("0", "1", "2", "3")


def test_nvml_absent_is_no_gpu_with_the_reason_not_a_crash():
    found = gpus.find_visible({}, no_nvml)
    assert found.ids == () and "pip install nvidia-ml-py" in found.source


def test_the_real_nvml_here_says_why_it_cannot_be_used():
    try:
        nvml = gpus.open_nvml()
    except gpus.NvmlUnavailable as exc:  # this machine: no bindings or no driver
        assert "nvidia-ml-py" in str(exc) or "no NVIDIA driver" in str(exc)
        return
    assert nvml.device_count() >= 0  # pragma: no cover - a machine with NVML


# --- real processes: each reads its narrowed CUDA_VISIBLE_DEVICES back ----------------------------------

READ_BACK = "import json, os, sys; open(sys.argv[1], 'w').write(json.dumps(os.environ.get('CUDA_VISIBLE_DEVICES')))"


def test_each_spawned_process_reads_its_own_gpus_from_its_environment(tmp_path, monkeypatch):
    fake = "GPU-a,GPU-b,GPU-c,GPU-d,GPU-e,GPU-f"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", fake)  # what rlrun itself sees: every process would inherit it
    overrides = [*CUDA, "trainer.nproc_per_node=2", "trainer.gradient_accumulation_passes=2", "inference.num_servers=2",
                 "inference.tensor_parallel_size=2"]  # fmt: skip
    built = build(compose(overrides)[0])
    specs = build_plan(built, RunDir(tmp_path / "run"), launch.gpu_plan(built), preview=True).specs
    spawner = LocalSpawner()
    handles = {}
    for spec in specs:  # the spec as the supervisor gets it, its command swapped for one that reads its environment
        out = tmp_path / f"{spec.name}.json"
        reader = dataclasses.replace(spec, argv=[sys.executable, "-c", READ_BACK, str(out)], secret_env={}, log_path=tmp_path / f"{spec.name}.log")
        handles[spec.name] = (spawner.spawn(reader), out)
    deadline = time.monotonic() + 60
    while any(h.poll() is None for h, _ in handles.values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(h.poll() == 0 for h, _ in handles.values())
    seen = {name: json.loads(out.read_text()) for name, (_, out) in handles.items()}
    assert seen == {"redis": "", "vllm-0": "GPU-a,GPU-b", "vllm-1": "GPU-c,GPU-d", "trainer": "GPU-e,GPU-f", "actor": ""}


def test_the_dry_run_shows_each_process_its_gpus(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    result = CliRunner().invoke(app, ["train", "--dry-run", *CUDA], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    title = "GPUs of each process (world=local; CUDA_VISIBLE_DEVICES='4,5')"
    table = result.output[result.output.index(title) :].splitlines()
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in table if line.count("│") == 4}
    assert rows["vllm-0"] == "4" and rows["trainer"] == "5" and rows["actor"] == "none"


def test_the_dry_run_refuses_more_gpus_than_shown_with_exit_2(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    result = CliRunner().invoke(app, ["train", "--dry-run", *CUDA])
    assert result.exit_code == 2
    assert "needs 2 GPU(s)" in result.output and "shows 1" in result.output


def test_the_dry_run_says_why_no_gpu_is_placed(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(gpus, "open_nvml", no_nvml)
    result = CliRunner().invoke(app, ["train", "--dry-run"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    assert "GPUs: none placed (CUDA_VISIBLE_DEVICES is unset and NVML's Python bindings are not installed (pip install nvidia-ml-py; in rlrun[gpu]))" in result.output


def test_a_gpu_run_previewed_where_no_gpu_is_visible_is_shown_not_refused(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    result = CliRunner().invoke(app, ["train", "--dry-run", *CUDA], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "GPUs: none placed (CUDA_VISIBLE_DEVICES='')" in result.output
    assert "`rlrun train` here would refuse trainer.device=cuda" in result.output


def test_the_tensor_parallel_size_is_checked_where_it_cannot_work():
    with pytest.raises(ConfigError, match=r"one vLLM worker per server.*inference.tensor_parallel_size=1"):
        compose(["trainer.weight_transfer=broadcast", "inference.tensor_parallel_size=2"])  # each server joins as one rank
    # world=slurm's rule is the SLURM job's, asked by preflight before anything is submitted or started
    settings_refusal(["world=slurm", "world.gpus_per_node=8", "world.vllm.gpus=1", "inference.tensor_parallel_size=2"],
                     "world.vllm.gpus=1 is fewer than inference.tensor_parallel_size=2")  # fmt: skip
    check_settings(build(compose(["world=slurm", "world.gpus_per_node=8", "world.vllm.gpus=2", "inference.tensor_parallel_size=2"])[0]))


# --- memory back before a restart (a recorded NVML: this machine has none) ------------------------------


class RecordedNvml:
    """NVML answering from a recording: per GPU, what each successive `processes` call returns
    (the last answer repeats), as a dead engine's memory is freed by the driver."""

    def __init__(self, answers: dict[str, list[list[gpus.GpuProcess]]]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    def device_count(self) -> int:
        return len(self.answers)

    def utilization(self, gpu: str) -> int:
        return 40 + int(gpu)

    def processes(self, gpu: str) -> list[gpus.GpuProcess]:
        self.asked.append(gpu)
        seen = self.asked.count(gpu)
        return self.answers[gpu][min(seen, len(self.answers[gpu])) - 1]


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


DEAD, PEER = gpus.GpuProcess(4242, 30 * 2**30), gpus.GpuProcess(777, 10 * 2**30)


def release_wait(nvml, events, ours=frozenset({PEER.pid}), timeout_s=10.0):
    clock = FakeClock()
    wait = gpus.ReleaseWait("vllm-0", ("0", "1"), lambda: nvml, lambda: set(ours), lambda e, **f: events.append((e, f)), timeout_s,
                            clock=clock, sleep=clock.sleep)  # fmt: skip
    return wait, clock


def test_a_restart_waits_until_the_dead_process_is_off_its_gpus():
    # GPU 0: the dead engine for 3 answers, then gone; GPU 1: a live peer of the run (sharing), never a reason to wait.
    nvml = RecordedNvml({"0": [[DEAD], [DEAD], [DEAD], []], "1": [[PEER]]})
    events: list = []
    wait, clock = release_wait(nvml, events)
    wait()  # the first start: nothing asked
    assert nvml.asked == [] and events == []
    wait()  # a restart
    assert nvml.asked.count("0") == 4 and clock.now == 3 * gpus.RELEASE_POLL_S
    assert events == [("gpu_memory_released", {"process": "vllm-0", "gpus": ["0", "1"], "waited_s": 1.5})]


def test_memory_still_held_at_the_deadline_is_named_and_the_process_starts_anyway():
    nvml = RecordedNvml({"0": [[DEAD]], "1": [[]]})
    events: list = []
    wait, clock = release_wait(nvml, events, timeout_s=5.0)
    wait()
    wait()
    assert clock.now == 5.0
    ((event, fields),) = events
    assert event == "gpu_memory_held" and fields["waited_s"] == 5.0
    assert fields["holders"] == [{"gpu": "0", "pid": 4242, "used_bytes": 30 * 2**30}]


def test_without_nvml_a_restart_is_not_held_back_and_says_why():
    events: list = []

    def no_nvml():
        raise gpus.NvmlUnavailable("NVML's Python bindings are not installed")

    clock = FakeClock()
    wait = gpus.ReleaseWait("trainer", ("0",), no_nvml, set, lambda e, **f: events.append((e, f)), 10.0, clock=clock, sleep=clock.sleep)
    wait()
    wait()
    assert clock.now == 0.0 and events == [("gpu_memory_unchecked", {"process": "trainer", "gpus": ["0"], "why": "NVML's Python bindings are not installed"})]


def test_each_process_on_gpus_waits_for_its_own_gpus_before_its_own_hook(tmp_path):
    built = build(compose(CUDA)[0])
    plan = plan_of(2, *CUDA)
    specs = {s.name: s for s in build_plan(built, RunDir(tmp_path), plan, preview=True).specs}
    assert specs["redis"].before_start is None and specs["actor"].before_start is not None  # untouched: no GPU
    calls: list = []
    nvml = RecordedNvml({"0": [[]], "1": [[DEAD], []]})
    trainer = gpus.on_gpus(dataclasses.replace(specs["trainer"], env={}, before_start=lambda: calls.append("own hook")), plan,
                           lambda e, **f: calls.append(e), 10.0, nvml=lambda: nvml)  # fmt: skip
    assert trainer.env == {"CUDA_VISIBLE_DEVICES": "1"}
    trainer.before_start()
    trainer.before_start()  # a restart: GPU 1's dead process goes, then its own hook
    assert nvml.asked == ["1", "1"] and calls == ["own hook", "gpu_memory_released", "own hook"]


def test_the_run_s_live_processes_are_the_supervisor_s_descendants():
    import os
    import subprocess

    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        assert child.pid in gpus.descendants_of(os.getpid())
    finally:
        child.communicate(b"")
    assert child.pid not in gpus.descendants_of(os.getpid())


# --- rlrun status: each process's GPUs, the memory it holds, their use ------------------------------------

GiB = 2**30


def test_usage_counts_the_memory_of_a_process_tree_on_its_own_gpus():
    nvml = RecordedNvml({"0": [[gpus.GpuProcess(101, 5 * GiB), gpus.GpuProcess(999, GiB)]], "1": [[gpus.GpuProcess(102, 3 * GiB)]],
                         "2": [[gpus.GpuProcess(201, 2 * GiB)]]})  # fmt: skip
    tree = {100: {101, 102}, 200: {201}}
    used = gpus.usage({"vllm-0": ["0", "1"], "trainer": ["2"], "actor": []}, {"vllm-0": 100, "trainer": None, "actor": 300}, nvml,
                      descendants=lambda pid: tree.get(pid, set()))  # fmt: skip
    assert used["vllm-0"] == gpus.ProcessGpus(("0", "1"), 8 * GiB, {"0": 40, "1": 41})  # not pid 999's, not another GPU's
    assert used["trainer"] == gpus.ProcessGpus(("2",))  # not running: its GPUs only
    assert used["actor"] == gpus.ProcessGpus(())


def placed_run(tmp_path):
    from rlrun.supervisor import EventLog

    run = RunDir(tmp_path / "run")
    run.create({"kind": "rlrun-run"})
    events = EventLog(run.events)
    events.emit("gpus_placed", source="CUDA_VISIBLE_DEVICES='0,1'", gpus={"redis": [], "vllm-0": ["0"], "trainer": ["1"], "actor": []})
    events.emit("process_started", process="vllm-0", pid=os.getpid(), log="logs/vllm-0.log")
    events.emit("process_started", process="trainer", pid=1, log="logs/trainer.log")
    events.emit("process_failed", process="trainer", reason="exited with code 1", action="restart")
    return run


def test_status_of_a_stopped_run_on_gpus_shows_their_gpus_and_says_why_no_memory(tmp_path):
    from rlrun.cli import status

    run = placed_run(tmp_path)
    report = status.report(run)["gpus"]
    assert report["processes"]["vllm-0"] == {"gpus": ["0"], "memory_bytes": None, "utilization": {}}
    assert "not running" in report["note"]
    result = CliRunner().invoke(app, ["status", str(run.root)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    table = result.output[result.output.index("GPUs") :]
    assert "vllm-0" in table and "trainer" in table and "not running" in table


def test_status_of_a_running_run_asks_nvml_and_says_so_when_it_cannot(tmp_path):
    from rlrun.cli import status
    from rlrun.run import runlock

    run = placed_run(tmp_path)
    rows = status.load(run)[1]
    nvml = RecordedNvml({"0": [[gpus.GpuProcess(os.getpid(), 7 * GiB)]], "1": [[]]})
    with runlock.acquire(run):
        used, note = status.gpu_usage(run, rows, lambda: nvml)
        assert used["vllm-0"] == {"gpus": ["0"], "memory_bytes": 7 * GiB, "utilization": {"0": 40}} and note == ""
        assert used["trainer"]["memory_bytes"] is None  # in backoff: not running
        used, note = status.gpu_usage(run, rows, no_nvml)  # NVML absent: a clear note, no crash
        assert used["vllm-0"]["memory_bytes"] is None and "pip install nvidia-ml-py" in note


def test_status_of_a_run_not_on_gpus_has_no_gpu_part(tmp_path):
    from rlrun.cli import status

    run = RunDir(tmp_path / "run")
    run.create({"kind": "rlrun-run"})
    assert status.gpu_usage(run, []) == ({}, "")


# --- after the stop: nothing of the run left on its GPUs ----------------------------------------------------


def test_after_the_stop_what_of_the_run_still_holds_its_gpus_is_named_and_killed():
    import signal

    plan = plan_of(2, *CUDA)  # vllm-0 on "0", trainer on "1"
    nvml = RecordedNvml({"0": [[gpus.GpuProcess(11, GiB), gpus.GpuProcess(99, GiB)]], "1": [[gpus.GpuProcess(12, None), gpus.GpuProcess(13, GiB)]]})
    groups = {11: 500, 12: 600, 99: 900}  # 13: gone already
    killed, events = [], []

    def pgid_of(pid):
        if pid not in groups:
            raise ProcessLookupError(pid)
        return groups[pid]

    ended = gpus.end_leftovers(plan, {500, 600}, lambda e, **f: events.append((e, f)), lambda: nvml, pgid_of,
                               lambda pid, sig: killed.append((pid, sig)))  # fmt: skip
    assert ended == [11, 12] and killed == [(11, signal.SIGKILL), (12, signal.SIGKILL)]  # not 99: another group, not ours
    assert events == [("gpu_leftover_killed", {"pid": 11, "gpu": "0", "group": 500, "used_bytes": GiB}),
                      ("gpu_leftover_killed", {"pid": 12, "gpu": "1", "group": 600, "used_bytes": None})]  # fmt: skip
    assert gpus.end_leftovers(plan, {500}, lambda e, **f: None, no_nvml) == []  # no NVML: nothing asked, nothing ended


def test_a_real_leftover_in_one_of_the_run_s_groups_is_ended(tmp_path):
    import subprocess

    from rlrun.supervisor.local import LocalSpawner

    seen = gpus.GroupsSeen(LocalSpawner())
    spec = build_plan(build(compose([])[0]), RunDir(tmp_path), gpus.NOT_PLACED, preview=True).specs[0]
    handle = seen.spawn(dataclasses.replace(spec, argv=[sys.executable, "-c", "import time; time.sleep(300)"], secret_env={},
                                            log_path=tmp_path / "left.log"))  # fmt: skip (not stdin: CI has none, so a read ends at once)
    assert seen.groups == {handle.pid}
    # The guard's child: in the guard's group, as an engine core left holding memory would be.
    child = next(iter(_wait_for_children(handle)))
    nvml = RecordedNvml({"0": [[gpus.GpuProcess(child, GiB)]]})
    plan = gpus.GpuPlan(gpus.Visible(("0",), "fake"), {spec.name: ("0",)})
    assert gpus.end_leftovers(plan, seen.groups, lambda e, **f: None, lambda: nvml) == [child]
    while handle.poll() is None:  # the guard exits once its child is killed
        time.sleep(0.05)
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)


def _wait_for_children(handle) -> set[int]:
    """The guard's children once it has one; the guard ending first fails the test (not a hang)."""
    while not gpus.descendants_of(handle.pid):
        assert handle.poll() is None, f"the guard exited ({handle.poll()}) before its child was seen"
        time.sleep(0.05)
    return gpus.descendants_of(handle.pid)
