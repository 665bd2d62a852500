"""trainer.overlap_weight_update: a step's weights go to vLLM in a thread while the next step
trains. What it must keep: the weights sent are those of the step (a copy, not the parameters the
next step changes), at most one update is in flight, and an update's failure is the trainer's (a
stuck one at once, not retried). Driven through `WeightPublisher` as the trainer builds it (one
rank, trainer.weight_transfer=broadcast), with a stand-in for the broadcast to vLLM and a small
torch model."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from rlrun.config.schema import TrainerConfig
from rlrun.rundir import RunDir
from rlrun.streams import names
from rlrun.trainer.parallel import Parallel, Ranks
from rlrun.trainer.weight_publisher import WeightPublisher


class Model(torch.nn.Linear):
    def __init__(self) -> None:
        super().__init__(3, 1, bias=False)
        torch.nn.init.zeros_(self.weight)

    def save_pretrained(self, path, state_dict, safe_serialization):  # as a Hugging Face model writes its folder
        from safetensors.torch import save_file

        Path(path).mkdir(parents=True)
        save_file({k: v.contiguous() for k, v in state_dict.items()}, Path(path) / "model.safetensors")


class Broadcast:
    """Stands in for BroadcastSync: `hand_over(weights, version)` is what reaching vLLM does."""

    def __init__(self, hand_over) -> None:
        self.hand_over = hand_over

    def update(self, weights, version, publish, while_waiting):
        self.hand_over(weights, version)
        publish()
        return []  # no server down


class Redis:
    def __init__(self) -> None:
        self.strings: dict[str, int] = {}

    def set(self, key, value):
        self.strings[key] = value


def publisher(tmp_path, hand_over, vllm_wait_s: float = 600.0, updating=lambda version: None) -> tuple[WeightPublisher, Redis]:
    redis = Redis()
    weights = WeightPublisher(
        TrainerConfig(weight_transfer="broadcast", overlap_weight_update=True), RunDir(Path(tmp_path)), redis, vllm=None,
        parallel=Parallel(Ranks()), broadcast=Broadcast(hand_over), stop=threading.Event(), heartbeat=lambda **_: None,
        vllm_wait_s=vllm_wait_s, updating=updating,
    )  # fmt: skip
    return weights, redis


def test_the_update_runs_beside_the_next_step_and_sends_that_steps_weights(tmp_path):
    release, sent = threading.Event(), []

    def hand_over(weights, version):
        release.wait(10)
        sent.append((weights["weight"].clone(), version))

    weights, redis = publisher(tmp_path, hand_over)
    model = Model()
    weights.push(model, version=1, step=1, overlap=True)  # returns while vLLM is still being updated
    assert sent == [] and weights.last_update_s() is None
    with torch.no_grad():
        model.weight.add_(5.0)  # the next optimizer step changes the parameters in place
    release.set()
    weights.finish()
    assert torch.equal(sent[0][0], torch.zeros(1, 3)) and sent[0][1] == 1  # step 1's weights and version
    assert redis.strings[names.POLICY_VERSION] == 1  # published once the servers have it
    assert weights.last_update_s() is not None and weights.last_update_s() is None  # taken once


def test_the_trainer_takes_the_servers_cores_only_once_their_update_is_over(tmp_path):
    """world.cpu_affinity=by_need: an overlapped update counts as vLLM at work, like a request."""
    from rlrun.trainer.core_share import ThreadsByNeed

    release = threading.Event()
    weights, _ = publisher(tmp_path, lambda w, v: release.wait(10))
    share = ThreadsByNeed(lambda: False, busy_threads=1, idle_threads=2)  # no request in flight
    share.also_busy_while(weights.in_flight)
    assert not weights.in_flight() and not share.busy()
    weights.push(Model(), version=1, step=1, overlap=True)
    assert weights.in_flight() and share.busy()  # the servers reload on their cores
    release.set()
    weights.finish()
    assert not weights.in_flight() and not share.busy()


def test_a_second_update_waits_for_the_first(tmp_path):
    order, first_may_end = [], threading.Event()

    def hand_over(weights, version):
        order.append(("start", version))
        if version == 1:
            first_may_end.wait(10)
        order.append(("end", version))

    weights, _ = publisher(tmp_path, hand_over)
    model = Model()
    weights.push(model, version=1, step=1, overlap=True)
    threading.Timer(0.2, first_may_end.set).start()
    weights.push(model, version=2, step=2, overlap=True)
    weights.finish()
    assert order == [("start", 1), ("end", 1), ("start", 2), ("end", 2)]


def test_a_failed_update_fails_the_trainer_at_its_next_push_and_leaves_its_weights_for_a_cold_start(tmp_path):
    def hand_over(weights, version):
        raise RuntimeError("no vLLM server answers")

    weights, redis = publisher(tmp_path, hand_over, vllm_wait_s=0.0)  # given up at once
    weights.push(Model(), version=1, step=1, overlap=True)
    with pytest.raises(RuntimeError, match="no vLLM server answers"):
        weights.push(Model(), version=2, step=2, overlap=True)
    assert names.POLICY_VERSION not in redis.strings  # nothing published
    run = RunDir(Path(tmp_path))
    assert run.current_weights.resolve() == run.weights_version(1).resolve()  # a server restarting loads v1


def test_without_overlap_the_step_waits_for_the_update(tmp_path):
    sent = []
    weights, redis = publisher(tmp_path, lambda w, version: sent.append(version))
    weights.push(Model(), version=1, step=1, overlap=False)
    assert sent == [1] and redis.strings[names.POLICY_VERSION] == 1


def test_a_stuck_update_is_not_retried_and_the_trainer_said_which_version_it_was_updating_to(tmp_path):
    from rlrun.trainer.weight_broadcast import WeightSyncTimeout

    said = []

    def hand_over(weights, version):
        said.append(("during", list(said)))
        raise WeightSyncTimeout("sending weight (1 of 1 tensors) did not complete in 60 s")

    weights, redis = publisher(tmp_path, hand_over, vllm_wait_s=600.0, updating=said.append)  # a failure is retried for 600 s
    started = time.monotonic()
    with pytest.raises(WeightSyncTimeout):
        weights.push(Model(), version=4, step=4, overlap=False)
    assert time.monotonic() - started < 1.5  # not retried (a retry waits 2 s first)
    assert said == [4, ("during", [4]), None]  # the state says "updating to 4" while it lasts, and no longer after
    assert names.POLICY_VERSION not in redis.strings


class GoneRedis:
    """The run's Redis after it stopped: every write is a lost connection."""

    def set(self, key, value):
        import redis

        raise redis.ConnectionError("Error 111 connecting to the run's Redis. Connection refused.")


@pytest.mark.parametrize("overlap", [False, True])
def test_a_redis_gone_while_stopping_leaves_the_update_unpublished_not_the_trainer_dead(tmp_path, overlap):
    """A SLURM cancel signals every process at once: vLLM may take the weights after Redis stopped.
    The trainer, asked to stop, goes on to its checkpoint; the version is not published."""
    sent, stop = [], threading.Event()
    stop.set()
    weights = WeightPublisher(
        TrainerConfig(weight_transfer="broadcast", overlap_weight_update=overlap), RunDir(Path(tmp_path)), GoneRedis(),
        vllm=None, parallel=Parallel(Ranks()), broadcast=Broadcast(lambda w, version: sent.append(version)), stop=stop,
        heartbeat=lambda **_: None,
    )  # fmt: skip
    weights.push(Model(), version=1, step=1, overlap=overlap)
    weights.finish()
    assert sent == [1]


def test_a_redis_lost_while_training_is_the_trainers_failure(tmp_path, monkeypatch):
    monkeypatch.setattr("rlrun.trainer.stopping.STOP_RACE_S", 0.05)  # no SIGTERM follows
    import redis

    weights = WeightPublisher(
        TrainerConfig(weight_transfer="broadcast"), RunDir(Path(tmp_path)), GoneRedis(), vllm=None,
        parallel=Parallel(Ranks()), broadcast=Broadcast(lambda w, version: None), stop=threading.Event(),
        heartbeat=lambda **_: None,
    )  # fmt: skip
    with pytest.raises(redis.ConnectionError):
        weights.push(Model(), version=1, step=1)


class SharedVllm:
    """Stands in for VllmAdmin with trainer.weight_transfer=shm: the update reads the file the way a
    vLLM worker does (SharedReader), once `release` is set."""

    def __init__(self, release: threading.Event) -> None:
        self.release, self.read = release, []

    def update_from_shared(self, path, version, publish):
        from rlrun.weights.shared import SharedReader

        self.release.wait(10)
        self.read.append(({name: t.clone() for name, t in SharedReader().tensors(path)}, version))
        publish()
        return []


def test_with_shm_the_file_is_the_copy_and_the_next_step_leaves_it_alone(tmp_path):
    from rlrun.weights.shared import SharedWeights

    release = threading.Event()
    vllm, shared = SharedVllm(release), SharedWeights(tmp_path / "weights")
    weights = WeightPublisher(
        TrainerConfig(weight_transfer="shm", overlap_weight_update=True), RunDir(Path(tmp_path)), Redis(), vllm,
        parallel=Parallel(Ranks()), broadcast=None, stop=threading.Event(), heartbeat=lambda **_: None, shared=shared,
    )  # fmt: skip
    model = Model()
    weights.push(model, version=1, step=1, overlap=True)  # the file written now, vLLM updated in a thread
    with torch.no_grad():
        model.weight.add_(5.0)  # the next step, while vLLM loads
    release.set()
    weights.finish()
    assert torch.equal(vllm.read[0][0]["weight"], torch.zeros(1, 3)) and vllm.read[0][1] == 1
    weights.push(model, version=2, step=2, overlap=True)
    weights.finish()
    assert torch.equal(vllm.read[1][0]["weight"], torch.full((1, 3), 5.0)) and vllm.read[1][1] == 2
