"""The trainer backend interface: each backend answers for its own processes, completion, ports,
Redis user and checkpoints, and nothing outside rlrun/backends names a backend."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlrun.backends import HALF, backend_class, checkpoint_layouts, run_verdict
from rlrun.rules.completion import Verdict
from rlrun.config import compose
from rlrun.parts.role_parts import Endpoints, RedisProbe
from rlrun.run.built import build
from rlrun.rundir import RunDir
from rlrun.streams import names
from rlrun.streams.server import DEFAULT_USER_OFF
from rlrun.supervisor import EventLog

REPO = Path(__file__).resolve().parents[2]
FAST_LLM = ["trainer=fast_llm", "trainer.device=cpu"]


def test_an_unknown_backend_is_named_with_the_known_ones():
    with pytest.raises(ValueError, match=r"'megatron'.*hf, fast_llm"):
        backend_class("megatron")


def test_no_module_outside_the_backends_names_a_backend():
    """A third backend is one new module: launch, roles, preflight, inspection, the actor and the CLI
    ask the run's bound backend instead of comparing names."""
    offenders = []
    for path in sorted((REPO / "rlrun").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel.startswith(("rlrun/backends/", "rlrun/config/")):
            continue  # the backends themselves, and the schema that lists their settings
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"backend\s*[!=]=\s*[\"'](?!gloo|nccl)", line):  # torch.distributed's backends are not trainers
                offenders.append(f"{rel}:{number}: {line.strip()}")
    assert offenders == []


@pytest.mark.parametrize("overrides, roles", [([], ["trainer"]), (FAST_LLM, ["weights", "trainer"])])
def test_each_backend_builds_the_processes_it_names(overrides, roles, tmp_path):
    cfg, _ = compose(overrides)
    backend = build(cfg).backend
    endpoints = Endpoints("redis://127.0.0.1:1/0", 1, ["http://127.0.0.1:2"], broadcast_port=3)
    probe = RedisProbe(endpoints.redis_url, RunDir(tmp_path))
    specs = backend.specs(RunDir(tmp_path), endpoints, str(tmp_path / "model"), probe, EventLog(None))
    assert [spec.name for spec in specs] == roles == backend.roles()
    trainer = specs[-1]
    assert trainer.finishes  # the completion rule reads its exit code


def test_a_fresh_hf_trainer_starts_beside_vllm_and_a_resuming_one_after_it(tmp_path):
    from tests.unit.test_inspect import write_hf

    cfg, _ = compose([])
    run_dir = RunDir(tmp_path)
    endpoints = Endpoints("redis://127.0.0.1:1/0", 1, ["http://127.0.0.1:2"])
    no_redis = Endpoints("redis://10.0.0.1:6379/0", None, ["http://127.0.0.1:2"])  # a Redis rlrun does not start

    def trainer_after(endpoints: Endpoints):
        specs = build(cfg).backend.specs(run_dir, endpoints, "m", RedisProbe(endpoints.redis_url, run_dir), EventLog(None))
        return specs[-1].after

    assert trainer_after(endpoints) == ("redis",)
    assert trainer_after(no_redis) == ()
    write_hf(run_dir.checkpoint(2), 2, samples=64, version=2, ok=False)  # half-written: still a fresh start
    assert trainer_after(endpoints) == ("redis",)
    write_hf(run_dir.checkpoint(3), 3, samples=96, version=3)
    assert trainer_after(endpoints) is None  # it pushes the checkpoint's weights to vLLM first: after everything before it


def test_only_fast_llm_and_a_broadcasting_hf_trainer_have_a_broadcast_port_and_only_fast_llm_a_passwordless_redis_user():
    hf, _ = compose([])
    fast_llm, _ = compose([*FAST_LLM, "trainer.fast_llm.broadcast_port=29555"])
    picked = lambda host: 40000  # noqa: E731
    assert build(hf).backend.broadcast_port(picked) == 0  # weights through files
    broadcasting, _ = compose(["trainer.weight_transfer=broadcast"])
    assert build(broadcasting).backend.broadcast_port(picked) == 40000
    assert build(hf).backend.explicit_ports() == []
    assert build(hf).backend.redis_default_user() == DEFAULT_USER_OFF
    assert build(fast_llm).backend.broadcast_port(picked) == 29555  # fixed in the config
    assert build(fast_llm).backend.explicit_ports() == [("trainer.fast_llm.broadcast_port", "127.0.0.1", 29555)]
    user = build(fast_llm).backend.redis_default_user()
    assert user != DEFAULT_USER_OFF and fast_llm.trainer.fast_llm.stream in user


def test_a_trainer_exiting_0_before_the_end_is_rejected_and_after_it_is_not():
    early = run_verdict(Verdict(False, "interrupted at step 3 of 8"), {"trainer": 0})
    assert (early.finished, early.reject) == (False, "trainer")
    running = run_verdict(Verdict(False, "trainer still running"), {"trainer": None})
    assert running.reject is None
    done = run_verdict(Verdict(True, "done"), {"trainer": 0})
    assert (done.finished, done.reject) == (True, None)


class FakeProgress:
    """What the hf completion check reads: the trainer's state hash (its done signal included)."""

    def __init__(self, samples: int, step: int, done: bool = False) -> None:
        self.state = {"samples_processed": str(samples), "step": str(step), names.TRAINING_DONE: "1" if done else "0"}

    def trainer_state(self) -> dict:
        return self.state


def test_the_hf_check_judges_the_samples_its_trainer_reports():
    cfg, _ = compose(["trainer.max_train_steps=4"])
    target = cfg.trainer.max_train_steps * cfg.trainer.train_batch_size * cfg.trainer.gradient_accumulation_passes
    check = build(cfg).backend.completion_check(FakeProgress(samples=target, step=4))
    assert check({"trainer": None}).finished is False  # still saving its last checkpoint
    assert check({"trainer": 0}).finished is True
    short = build(cfg).backend.completion_check(FakeProgress(samples=target - 1, step=3))
    verdict = short({"trainer": 0})
    assert (verdict.finished, verdict.reject) == (False, "trainer")
    said_done = build(cfg).backend.completion_check(FakeProgress(samples=target - 1, step=3, done=True))
    assert said_done({"trainer": 0}).finished is True  # the trainer's own training_done, short of the count


def write_hf_checkpoint(run: RunDir, step: int, ok: bool) -> Path:
    folder = run.checkpoints / f"step_{step:06d}"
    folder.mkdir(parents=True)
    if ok:
        (folder / "ok").write_text("")
    return folder


def test_each_layout_recognises_its_own_checkpoints_only(tmp_path):
    hf_folder = tmp_path / "checkpoints" / "step_000010"
    fl_folder = tmp_path / "fast_llm" / "checkpoint" / "12"
    for folder in (hf_folder, fl_folder):
        folder.mkdir(parents=True)
    by_name = {layout.name: layout for layout in checkpoint_layouts()}
    assert set(by_name) == {"hf", "fast_llm"}
    assert by_name["hf"].looks_like(hf_folder) and not by_name["hf"].looks_like(fl_folder)
    assert by_name["fast_llm"].looks_like(fl_folder) and not by_name["fast_llm"].looks_like(hf_folder)
    assert not any(layout.looks_like(tmp_path) for layout in by_name.values())


def test_fast_llm_candidates_in_a_run_say_which_are_half_written(tmp_path):
    run = RunDir(tmp_path)
    for step, ok in ((4, True), (6, False)):
        folder = tmp_path / "fast_llm" / "checkpoint" / str(step)
        folder.mkdir(parents=True)
        if ok:
            (folder / "ok").write_text("")
    layout = backend_class("fast_llm").layout
    found = sorted((c.step, c.skipped_because) for c in layout.candidates(run))
    assert found == [(4, None), (6, HALF)]


def test_under_fast_llm_the_actor_is_held_back_by_the_documents_fast_llm_has_not_read():
    cfg, _ = compose(FAST_LLM)
    f = cfg.trainer.fast_llm

    class Redis:
        lag = 0

        def get(self, key):
            return "7" if key == names.POLICY_VERSION else None

        def xinfo_groups(self, stream):
            assert stream == f.stream
            return [{"name": f.consumer_group, "lag": self.lag}]

    redis = Redis()
    view = build(cfg).backend.trainer_view(redis)
    assert view.policy_version() == 7 and view.done() is False  # never decides the end itself
    assert view.window(in_flight=0).room
    redis.lag = (1 + cfg.actor.max_steps_ahead) * view.docs_per_step  # a full window unread
    window = view.window(in_flight=0)
    assert not window.room and window.unit == "documents" and window.detail["unread_documents"] == redis.lag
