"""The Fast-LLM stand-in on a real Redis: overshoot, exact step count, events, checkpoints, and the
completion rules evaluated on what it was observed to do (the scaled-down seed scenario)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
import yaml

from rlrun.streams.server import RLRUN_USER
from rlrun.backends.fast_llm.checkpoints import latest_complete_step, move_aside_incomplete, read_metadata
from rlrun.backends.fast_llm.config import data_parallel, docs_per_step, write_config
from rlrun.backends.fast_llm.installed import choose_revision
from rlrun.backends.fast_llm.revisions import named
from rlrun.backends.fast_llm.rewind import rewind_group
from rlrun.backends.fast_llm.protocol import TrainingFinished, WeightsReady, encode_group, parse_event
from rlrun.rules.completion import HfTarget, TrainerObservation, fast_llm_finished, hf_finished
from rlrun.config import compose
from rlrun.errors import ConfigError
from rlrun.streams.rollouts import Group, Sample
from tests.integration.test_fast_llm_acl import PASSWORD, acl_server
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

STANDIN = Path(__file__).resolve().parent.parent / "fast_llm_standin.py"
TRAIN_ITERS = 10
# 16-token documents, 64-token micro-batches: 4 documents per micro-batch; 3 ranks: 12 per round;
# docs_per_step 16 needs two rounds: 24 documents per step, 50 % over the target.
PROMPT, COMPLETION, GROUP_SIZE = 6, 10, 8
OVERRIDES = [
    "recipe=math_grpo",
    "trainer=fast_llm",
    "trainer.device=cpu",
    f"trainer.max_train_steps={TRAIN_ITERS}",
    "trainer.train_batch_size=16",
    "trainer.checkpoint_every=4",
    "trainer.keep_checkpoints=2",
    "trainer.fast_llm.micro_batch_size=64",
    "trainer.fast_llm.data_parallel=3",
    "trainer.fast_llm.timeout_s=3",
    "trainer.fast_llm.checkpoint_format=qwen2",  # /models/tiny does not exist: auto would read its config.json
]
DOCS_PER_STEP_SEEN = 24


class Run:
    """A Redis with the Fast-LLM ACL, the generated Fast-LLM config, and the stand-in process."""

    def __init__(self, tmp_path: Path, port: int) -> None:
        self.cfg, _ = compose(OVERRIDES)
        self.experiment_dir = tmp_path / "fast_llm"
        self.config_path = write_config(
            self.cfg, named("gspo"), tmp_path / "fast_llm.yaml", redis_host="127.0.0.1", redis_port=port,
            experiment_dir=self.experiment_dir, model_path="/models/tiny", broadcast_host="127.0.0.1", broadcast_port=0,
        )
        self.client = redis.Redis(host="127.0.0.1", port=port, username=RLRUN_USER, password=PASSWORD)
        self.log = tmp_path / "standin.log"
        self.fed_groups = 0
        self.process: subprocess.Popen | None = None

    def feed(self, documents: int) -> None:
        """Publish whole groups of documents, as the actor does."""
        assert documents % GROUP_SIZE == 0
        for _ in range(documents // GROUP_SIZE):
            samples = [
                Sample(index=i, completion_ids=[10 + i] * COMPLETION, logprobs=[-0.5] * COMPLETION,
                       versions=[0] * COMPLETION, finish_reason="length", reward=float(i % 2), advantage=i - 3.5)
                for i in range(GROUP_SIZE)
            ]
            group = Group(group_id=f"t/{self.fed_groups}", prompt_index=self.fed_groups, prompt_ids=[1] * PROMPT, samples=samples)
            with self.client.pipeline(transaction=True) as pipe:  # a whole group at once, as the journal delivers
                for data in encode_group(group):
                    pipe.xadd(self.cfg.trainer.fast_llm.stream, {"data": data})
                pipe.execute()
            self.fed_groups += 1

    def start(self, *extra: str) -> subprocess.Popen:
        argv = [sys.executable, str(STANDIN), "--config", str(self.config_path),
                "--data-parallel", str(data_parallel(self.cfg)), *extra]
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        return self.process

    def wait(self, timeout: float = 60) -> int:
        return self.process.wait(timeout)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def events(self, after: str = "-") -> list:
        return [parse_event(fields) for _, fields in self.client.xrange(self.cfg.trainer.fast_llm.events_stream, min=after)]

    def last_event_id(self) -> str:
        entries = self.client.xrevrange(self.cfg.trainer.fast_llm.events_stream, count=1)
        return entries[0][0].decode() if entries else "-"

    def wait_for_step(self, step: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(isinstance(e, WeightsReady) and e.step >= step for e in self.events()):
                return
            assert self.process.poll() is None, self.log.read_text()
            time.sleep(0.05)
        raise AssertionError(f"no weights_ready for step {step} within {timeout} s")


@pytest.fixture
def run(tmp_path):
    with acl_server(tmp_path / "redis") as port:
        run = Run(tmp_path, port)
        try:
            yield run
        finally:
            run.stop()


def decoded(run: Run) -> redis.Redis:
    """A client answering str, as rlrun's own clients do."""
    kwargs = run.client.connection_pool.connection_kwargs
    return redis.Redis(host=kwargs["host"], port=kwargs["port"], username=RLRUN_USER, password=PASSWORD, decode_responses=True)


def _observation(events: list, exit_code, checkpoint_step=None) -> TrainerObservation:
    ready = [e for e in events if isinstance(e, WeightsReady)]
    return TrainerObservation(
        samples_processed=ready[-1].documents_seen if ready else 0,
        trainer_exit_code=exit_code,
        training_done=False,
        last_step=ready[-1].step if ready else 0,
        training_finished_seen=any(isinstance(e, TrainingFinished) for e in events),
        last_checkpoint_step=checkpoint_step,
        last_weights_ready_step=ready[-1].step if ready else None,
    )


def test_seed_scenario_overshoot_exact_steps_and_the_two_completion_rules(run):
    run.feed(TRAIN_ITERS * DOCS_PER_STEP_SEEN)
    run.start()
    assert run.wait() == 0, run.log.read_text()

    events = run.events()
    ready = [e for e in events if isinstance(e, WeightsReady)]
    assert [e.step for e in ready] == list(range(TRAIN_ITERS + 1))  # run begin, then every step
    assert isinstance(events[-1], TrainingFinished) and sum(isinstance(e, TrainingFinished) for e in events) == 1
    per_step = [b.documents_seen - a.documents_seen for a, b in zip(ready, ready[1:])]
    target = docs_per_step(run.cfg)
    assert target == 16 and all(n > target for n in per_step), per_step  # overshoots like Fast-LLM
    assert per_step == [DOCS_PER_STEP_SEEN] * TRAIN_ITERS

    # checkpoints at 4, 8 and the last step, `ok` last; keep=2
    root = run.experiment_dir / "checkpoint"
    assert sorted(int(p.name) for p in root.iterdir()) == [8, 10]
    assert all((root / s / "ok").is_file() for s in ("8", "10"))
    assert latest_complete_step(run.experiment_dir) == TRAIN_ITERS
    assert read_metadata(root / "10").documents_seen == TRAIN_ITERS * DOCS_PER_STEP_SEEN

    # The sample-counting rule, on the counts observed after each step (as if the trainer stopped
    # there): target = steps × docs_per_step = 160 documents, reached after step 7 of 10.
    hf_target = HfTarget(TRAIN_ITERS, run.cfg.trainer.samples_per_step)
    fired = [
        e.step for e in ready
        if hf_finished(hf_target, TrainerObservation(e.documents_seen, 0, False, e.step)).finished
    ]
    assert fired[0] == 7 < TRAIN_ITERS

    # The fast_llm rule: never while the trainer runs, only at train_iters after a clean exit.
    for i in range(1, len(ready)):
        assert not fast_llm_finished(TRAIN_ITERS, _observation(ready[: i + 1], None)).finished
    verdict = fast_llm_finished(TRAIN_ITERS, _observation(events, 0, latest_complete_step(run.experiment_dir)))
    assert verdict.finished, verdict.reason


def test_trainer_starves_when_fed_only_the_sample_count_and_times_out(run):
    """What happened in the seed run: the actor stopped at the sample target, the trainer starved."""
    run.feed(TRAIN_ITERS * docs_per_step(run.cfg))  # 160 documents: 6 steps of 24, then 16 left
    run.start()
    code = run.wait()
    output = run.log.read_text()
    assert code != 0 and "TimeoutError: No document received after" in output
    events = run.events()
    assert [e.step for e in events if isinstance(e, WeightsReady)][-1] == 6
    assert not any(isinstance(e, TrainingFinished) for e in events)  # not sent on a crash
    assert not fast_llm_finished(TRAIN_ITERS, _observation(events, code, latest_complete_step(run.experiment_dir))).finished


def test_sigterm_sends_training_finished_but_is_not_completion_and_a_restart_finishes(run):
    run.feed(TRAIN_ITERS * DOCS_PER_STEP_SEEN)
    run.start("--hold-after-step", "3")  # the SIGTERM is seen at step 3, however late it comes
    run.wait_for_step(3)
    run.process.send_signal(signal.SIGTERM)
    assert run.wait() == 0, run.log.read_text()  # like Fast-LLM: a clean exit after an interrupt

    events = run.events()
    assert isinstance(events[-1], TrainingFinished)
    stopped = [e for e in events if isinstance(e, WeightsReady)][-1].step
    assert stopped == 3
    assert latest_complete_step(run.experiment_dir) == stopped  # saved on interrupt (checkpoint_every=4)
    verdict = fast_llm_finished(TRAIN_ITERS, _observation(events, 0, stopped))
    assert not verdict.finished and verdict.reason == f"interrupted at step {stopped} of {TRAIN_ITERS}"

    # restarted from its checkpoint, it finishes
    since = run.last_event_id()
    run.start()
    assert run.wait() == 0, run.log.read_text()
    later = run.events(after=f"({since}")
    assert [e.step for e in later if isinstance(e, WeightsReady)] == list(range(stopped, TRAIN_ITERS + 1))
    assert fast_llm_finished(TRAIN_ITERS, _observation(later, 0, latest_complete_step(run.experiment_dir))).finished


def test_half_written_checkpoint_blocks_fast_llm_until_moved_aside(run):
    run.feed(TRAIN_ITERS * DOCS_PER_STEP_SEEN)
    run.start("--crash-in-checkpoint", "8")
    assert run.wait() != 0
    root = run.experiment_dir / "checkpoint"
    assert (root / "8").is_dir() and not (root / "8" / "ok").exists()
    assert latest_complete_step(run.experiment_dir) == 4

    # Fast-LLM picks the highest directory and refuses it without `ok`.
    run.start()
    assert run.wait() != 0 and "has no 'ok' file" in run.log.read_text()

    moved = move_aside_incomplete(run.experiment_dir)
    assert [p.name.split(".")[0] for p in moved] == ["8"] and moved[0].is_dir()
    run.feed(6 * DOCS_PER_STEP_SEEN)  # the actor keeps feeding: steps 5-8 are done again
    since = run.last_event_id()
    run.start()
    assert run.wait() == 0, run.log.read_text()
    later = run.events(after=f"({since}")
    assert [e.step for e in later if isinstance(e, WeightsReady)][0] == 4  # resumed from the complete one
    assert latest_complete_step(run.experiment_dir) == TRAIN_ITERS
    assert fast_llm_finished(TRAIN_ITERS, _observation(later, 0, TRAIN_ITERS)).finished


def documents_awaited_for(run: Run, timeout_s: float) -> None:
    """Fast-LLM's config for this run with its loaders waiting `timeout_s` for a document."""
    data = yaml.safe_load(run.config_path.read_text())
    data["data"]["datasets"]["training"]["timeout"] = timeout_s
    run.config_path.write_text(yaml.safe_dump(data))


def test_documents_read_after_the_checkpoint_are_delivered_again_once(run, tmp_path):
    """Exactly-once under NOACK reads: killed after checkpoint 4 (steps 5-6 read and trained, lost
    with the process), restarted from checkpoint 4 after the rewind; the final lineage trained
    each document exactly once, the first `documents_seen` of the stream, none skipped."""
    trained = tmp_path / "trained.jsonl"
    # Documents for 6 steps only: the trainer waits for step 7's (up to the timeout, longer than
    # the test takes to see step 6) and is killed waiting, never past checkpoint 8, however slow
    # the test's reaction. The rest is fed before the restart.
    documents_awaited_for(run, 60)
    run.feed(6 * DOCS_PER_STEP_SEEN)
    run.start("--trained-log", str(trained))
    run.wait_for_step(6)
    run.stop()  # SIGKILL: no checkpoint at 6
    assert latest_complete_step(run.experiment_dir) == 4
    checkpoint = read_metadata(run.experiment_dir / "checkpoint" / "4")

    rewind = rewind_group(decoded(run), run.cfg.trainer.fast_llm.stream, run.cfg.trainer.fast_llm.consumer_group, checkpoint)
    assert (rewind.checkpoint_step, rewind.documents_seen, rewind.lost) == (4, 4 * DOCS_PER_STEP_SEEN, 0)
    assert rewind.redelivered == rewind.delivered_before - 4 * DOCS_PER_STEP_SEEN >= 2 * DOCS_PER_STEP_SEEN

    run.feed(TRAIN_ITERS * DOCS_PER_STEP_SEEN + 48 - 6 * DOCS_PER_STEP_SEEN)
    run.start("--trained-log", str(trained))
    assert run.wait() == 0, run.log.read_text()
    final: dict[int, list[str]] = {}
    for line in trained.read_text().splitlines():
        record = json.loads(line)
        final[record["step"]] = record["ids"]  # a retaken step replaces the dead lineage's
    ids = [i for step in range(1, TRAIN_ITERS + 1) for i in final[step]]
    stream = [entry_id.decode() for entry_id, _ in run.client.xrange(run.cfg.trainer.fast_llm.stream)]
    assert len(ids) == len(set(ids))  # nothing trained twice
    assert ids == stream[: len(ids)]  # nothing skipped: the stream's first documents, in order
    assert read_metadata(run.experiment_dir / "checkpoint" / str(TRAIN_ITERS)).documents_seen == len(ids)


def test_a_revision_without_documents_seen_is_not_rewound_and_says_so(run):
    run.feed(4 * DOCS_PER_STEP_SEEN)
    run.start("--revision", "pr502")
    # Its weights_ready for step 4 comes before the checkpoint: killed once that is complete.
    wait_until(lambda: latest_complete_step(run.experiment_dir) == 4 or run.process.poll() is not None, 30, "checkpoint 4")
    run.stop()
    checkpoint = read_metadata(run.experiment_dir / "checkpoint" / "4")
    assert checkpoint.documents_seen is None
    client = decoded(run)
    before = client.xinfo_groups(run.cfg.trainer.fast_llm.stream)[0]["last-delivered-id"]
    rewind = rewind_group(client, run.cfg.trainer.fast_llm.stream, run.cfg.trainer.fast_llm.consumer_group, checkpoint)
    assert (rewind.documents_seen, rewind.lost, rewind.redelivered) == (None, None, 0)
    assert client.xinfo_groups(run.cfg.trainer.fast_llm.stream)[0]["last-delivered-id"] == before == rewind.position


def test_from_the_base_model_every_document_is_delivered_again(run):
    stream, group = run.cfg.trainer.fast_llm.stream, run.cfg.trainer.fast_llm.consumer_group
    run.feed(2 * DOCS_PER_STEP_SEEN)
    run.client.xgroup_create(stream, group, id="0")
    run.client.xreadgroup(group, "c", {stream: ">"}, count=5, noack=True)
    rewind = rewind_group(decoded(run), stream, group, None)
    assert (rewind.checkpoint_step, rewind.documents_seen, rewind.delivered_before, rewind.redelivered) == (None, 0, 5, 5)
    assert rewind.position == "0-0"
    assert len(run.client.xreadgroup(group, "c", {stream: ">"}, count=100, noack=True)[0][1]) == 2 * DOCS_PER_STEP_SEEN


@pytest.mark.parametrize(
    "revision, overrides, accepted",
    [
        ("pr520", [], "gspo"),  # the RL branches know schedule.docs_per_step
        ("pr502", [], "gspo"),
        ("main", [], "main"),  # main refuses it: auto falls back to main's config
        ("main", ["trainer.fast_llm.version=gspo"], None),  # the user's choice is refused: exit 2
        ("main", ["recipe=math_gspo"], "broken"),  # main accepts GSPO's config but crashes in its loss
    ],
)
def test_preflight_asks_the_trainer_which_revision_it_is(tmp_path, revision, overrides, accepted):
    command = f'trainer.fast_llm.command=[{sys.executable},{STANDIN},--revision,{revision},--config,"{{config}}"]'
    cfg, _ = compose(OVERRIDES + [command, *overrides])
    if accepted is None:
        with pytest.raises(ConfigError) as info:
            choose_revision(cfg, "/models/tiny", tmp_path / "fast_llm")
        assert "`schedule.docs_per_step`: unknown key" in str(info.value) and "'gspo'" in str(info.value)  # the key by its path
    elif accepted == "broken":
        with pytest.raises(ConfigError, match="IndexError.*recipe=math_grpo"):
            choose_revision(cfg, "/models/tiny", tmp_path / "fast_llm")
    else:
        assert choose_revision(cfg, "/models/tiny", tmp_path / "fast_llm").name == accepted


def test_the_stand_in_refuses_what_the_real_one_refuses(tmp_path):
    cfg, _ = compose(OVERRIDES)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "qwen2", "head_dim": 64}))
    config = write_config(cfg, named("gspo"), tmp_path / "f.yaml", redis_host="127.0.0.1", redis_port=1,
                          experiment_dir=tmp_path / "x", model_path=str(model), broadcast_host="127.0.0.1", broadcast_port=0)  # fmt: skip

    def validate(path) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(STANDIN), "--config", str(path), "-v"], capture_output=True, text=True)

    assert "unknown key 'head_dim'" in validate(config).stderr
    (model / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    assert validate(config).returncode == 0
    data = yaml.safe_load(config.read_text())
    data["model"]["base_model"]["head"]["losses"]["grpo"]["policy_loss"] = "gspo"  # an old intermediate key
    config.write_text(yaml.safe_dump(data))
    refused = validate(config)
    assert refused.returncode == 1 and "Unknown field `!!! policy_loss`" in refused.stderr


def test_a_second_loader_per_rank_crashes_the_first_batch(run):
    data = yaml.safe_load(run.config_path.read_text())
    data["training"].pop("num_workers")  # Fast-LLM's default: 2
    run.config_path.write_text(yaml.safe_dump(data))
    run.feed(DOCS_PER_STEP_SEEN)
    run.start()
    assert run.wait() != 0 and "StreamingDataset can work only with one instance per rank" in run.log.read_text()
