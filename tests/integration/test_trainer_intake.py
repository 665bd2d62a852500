"""The hf trainer's group intake on the run's real Redis: a trainer restarted from a checkpoint reads
again exactly what that checkpoint does not cover, in order, none twice — also when it falls back
past a newer checkpoint that had acknowledged more (a damaged one), which the old pending-first
replay lost for ever (the trainer starved, the actor waited for it: issue 26)."""

from __future__ import annotations

from rlrun.streams import names
from rlrun.trainer.intake import GroupIntake, Position, before

STREAM = names.GROUPS_STREAM
PER_STEP = 4


def deliver(client, first: int, count: int, stream: str = STREAM) -> None:
    for n in range(first, first + count):
        client.xadd(stream, {"data": f"group-{n}"})


def take_steps(intake: GroupIntake, steps: int, per_step: int = PER_STEP) -> list[list[str]]:
    """What `steps` optimizer steps read, one list of groups per step (as BatchReader.take)."""
    taken = []
    for _ in range(steps):
        batch = []
        while len(batch) < per_step:
            batch += [fields["data"] for _s, _id, fields in intake.read(per_step - len(batch), lambda: True, block_ms=50)]
        taken.append(batch)
    return taken


def read_ids(intake: GroupIntake, count: int) -> list[tuple[str, str]]:
    out = []
    while len(out) < count:
        out += [(s, i) for s, i, _f in intake.read(count - len(out), lambda: True, block_ms=50)]
    return out


def test_a_fallback_past_a_checkpoint_that_acknowledged_more_reads_its_groups_again(client):
    deliver(client, 0, 26 * PER_STEP)
    first = GroupIntake(client, [STREAM], names.TRAINER_GROUP)
    first.rewind({})
    checkpoints = {}
    for step in range(1, 25):
        ids = read_ids(first, PER_STEP)
        if step % 10 == 0:  # a checkpoint: its positions recorded, then what it covers acked
            checkpoints[step] = dict(first.positions)
            first.ack(ids)
    assert checkpoints[10][STREAM].entries_read == 10 * PER_STEP
    # The trainer dies at step 24; checkpoint 20 is damaged: the next one restarts from 10.
    second = GroupIntake(client, [STREAM], names.TRAINER_GROUP)
    second.rewind(checkpoints[10])
    again = take_steps(second, 16)
    assert [g for step in again for g in step] == [f"group-{n}" for n in range(10 * PER_STEP, 26 * PER_STEP)]
    assert second.positions[STREAM].entries_read == 26 * PER_STEP
    info = next(g for g in client.xinfo_groups(STREAM) if g["name"] == names.TRAINER_GROUP)
    assert info["lag"] == 0 and info["entries-read"] == 26 * PER_STEP  # Redis counts as the trainer does


def test_a_restart_from_the_newest_checkpoint_reads_only_what_came_after_it(client):
    deliver(client, 0, 6 * PER_STEP)
    first = GroupIntake(client, [STREAM], names.TRAINER_GROUP)
    first.rewind({})
    take_steps(first, 2)
    covered = dict(first.positions)
    take_steps(first, 3)  # read after the checkpoint, never acked: the trainer dies
    second = GroupIntake(client, [STREAM], names.TRAINER_GROUP)
    second.rewind(covered)
    assert [g for s in take_steps(second, 4) for g in s] == [f"group-{n}" for n in range(2 * PER_STEP, 6 * PER_STEP)]


def test_the_base_model_starts_every_stream_from_its_first_entry(client):
    streams = [names.actor_stream(k, 2) for k in range(2)]
    for k, stream in enumerate(streams):
        deliver(client, 100 * k, 3, stream)
    intake = GroupIntake(client, streams, names.TRAINER_GROUP)
    intake.rewind({})
    take_steps(intake, 1, per_step=3)  # the trainer dies before its first checkpoint
    again = GroupIntake(client, streams, names.TRAINER_GROUP)
    assert again.rewind({}) == {stream: Position() for stream in streams}
    read = sorted(g for s in take_steps(again, 2, per_step=3) for g in s)
    assert read == sorted([f"group-{n}" for n in (0, 1, 2, 100, 101, 102)])
    assert {again.positions[s].entries_read for s in streams} == {3}


def test_a_checkpoint_without_positions_continues_after_what_was_acknowledged(client):
    """Written by an older rlrun: where the group stood at that checkpoint's acks."""
    deliver(client, 0, 5 * PER_STEP)
    old = GroupIntake(client, [STREAM], names.TRAINER_GROUP)
    old.rewind({})
    old.ack(read_ids(old, 2 * PER_STEP))  # checkpoint at step 2
    read_ids(old, PER_STEP)  # step 3, not covered
    again = GroupIntake(client, [STREAM], names.TRAINER_GROUP)
    assert again.rewind(None)[STREAM].entries_read == 2 * PER_STEP
    assert [g for s in take_steps(again, 3) for g in s] == [f"group-{n}" for n in range(2 * PER_STEP, 5 * PER_STEP)]


def test_the_id_before_another():
    assert before("5-3") == "5-2"
    assert before("5-0") == f"4-{2**64 - 1}"
    assert before("0-0") == "0-0"


def test_a_checkpoints_positions_are_read_back_and_malformed_ones_are_damage(tmp_path):
    import pytest

    from rlrun.trainer import checkpoint

    state = checkpoint.TrainerState(step=2, samples_processed=8, policy_version=2, stream_positions={STREAM: ["5-1", 8]})
    assert checkpoint.stream_positions(state) == {STREAM: Position("5-1", 8)}
    assert checkpoint.stream_positions(checkpoint.TrainerState(step=2, samples_processed=8, policy_version=2)) is None  # an older rlrun's
    for bad in ({STREAM: ["5-1"]}, {STREAM: ["5-1", -1]}, {STREAM: [5, 8]}, [["5-1", 8]]):
        with pytest.raises((ValueError, TypeError)):
            checkpoint.stream_positions(checkpoint.TrainerState(step=2, samples_processed=8, policy_version=2, stream_positions=bad))
    from tests.integration.test_bad_input import write_checkpoint

    state = {"step": 2, "samples_processed": 8, "policy_version": 2, "stream_positions": {STREAM: "x"}}
    why = checkpoint.problem(write_checkpoint(tmp_path / "step_000002", state))
    assert why.startswith("trainer_state.json is unreadable") and "stream position" in why  # damage: skipped, not loaded
    assert checkpoint.problem(write_checkpoint(tmp_path / "step_000004", {**state, "step": 4, "stream_positions": {STREAM: ["5-1", 8]}})) is None
