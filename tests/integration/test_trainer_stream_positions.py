"""The trainer's place in the groups streams across a stop, against a real Redis: when the
acknowledgement sent after a checkpoint is lost (a cancelled SLURM job signals Redis and the
trainer at once; a machine crash loses Redis's last second), the restarted trainer still reads
only what came after that checkpoint; and a trainer asked to stop while it waits for a step's
groups gives back what it read for that step, so the checkpoint it writes does not cover them.
"""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from rlrun.run import launch
from rlrun.config import compose
from rlrun.run.built import build
from rlrun.streams import names
from rlrun.streams.codec import encode
from rlrun.trainer import checkpoint

from .test_bad_messages import group_message

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def make_trainer(client, tmp_path):
    from transformers import AutoModelForCausalLM, Qwen2Config

    from rlrun.trainer.loop import Trainer

    config = Qwen2Config(vocab_size=32, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=1, num_key_value_heads=1, tie_word_embeddings=False)  # fmt: skip
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "model")
    cfg, resolved = compose(["recipe=math_grpo", "trainer.train_batch_size=16"])  # 2 groups of 8 per step
    run_dir = launch.create_run(build(cfg), resolved, [], root=tmp_path / "run")

    def make(stop: threading.Event | None = None):
        trainer = Trainer(cfg, run_dir, client, str(tmp_path / "model"), vllm=None, stop=stop)  # its input path and checkpoints
        trainer.batches.rewind()  # as train() does first
        return trainer

    return make, run_dir


def deliver(client, first: int, count: int) -> list[str]:
    return [client.xadd(names.GROUPS_STREAM, {"data": encode(group_message(f"run/{g}"))}) for g in range(first, first + count)]


def test_a_lost_acknowledgement_does_not_train_the_checkpointed_groups_again(client, make_trainer):
    make, run_dir = make_trainer
    trainer = make()
    ids = deliver(client, 0, 4)  # two steps' worth

    groups = trainer.batches.take(step=1)
    assert [g.group_id for g in groups] == ["run/0", "run/1"]
    # Step 1 trains them and is checkpointed; its acknowledgement never reaches Redis.
    trainer.state = replace(trainer.state, step=1)
    trainer.batches.unacked = []  # the ack is the one lost
    trainer.save_checkpoint()
    assert checkpoint.read_state(run_dir.checkpoint(1)).stream_positions == {names.GROUPS_STREAM: [ids[1], 2]}
    assert client.xpending(names.GROUPS_STREAM, names.TRAINER_GROUP)["pending"] == 2

    restarted = make()  # resumes from step 1
    again = restarted.batches.take(step=2)

    assert [g.group_id for g in again] == ["run/2", "run/3"]  # not run/0 and run/1 a second time


def test_a_stop_while_waiting_gives_back_what_the_step_had_read(client, make_trainer):
    make, run_dir = make_trainer
    stop = threading.Event()
    trainer = make(stop)
    deliver(client, 0, 3)  # a step and a half

    first = trainer.batches.take(step=1)
    assert [g.group_id for g in first] == ["run/0", "run/1"]
    trainer.state = replace(trainer.state, step=1)
    threading.Timer(1.5, stop.set).start()  # SIGTERM while step 2 waits for its second group
    assert trainer.batches.take(step=2) is None
    assert len(trainer.batches.unacked) == 2  # step 1's: run/2 is given back, not acked
    trainer.save_checkpoint()  # the stop's checkpoint covers step 1's groups only
    assert checkpoint.read_state(run_dir.checkpoint(1)).stream_positions[names.GROUPS_STREAM][1] == 2

    deliver(client, 3, 1)
    restarted = make()
    again = restarted.batches.take(step=2)
    assert [g.group_id for g in again] == ["run/2", "run/3"]  # run/2, read before the stop, is not lost
