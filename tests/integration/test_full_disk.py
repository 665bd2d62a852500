"""A full disk under the trainer's writes, for real: a 64 KiB tmpfs mounted under the test's folder
(root with CAP_SYS_ADMIN only; skipped elsewhere). The weights handed to vLLM and a checkpoint do not
fit: the write fails with DiskFull (the trainer then exits 2: never retried, the run stops with 5
instead of spending its restart budget), and no temporary folder (`weights/.tmp-v*`,
`checkpoints/.tmp-step_*`) is left behind."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from rlrun.errors import ExitCode
from rlrun.rundir import RunDir
from rlrun.trainer import checkpoint
from rlrun.trainer.disk import DiskFull

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def full_disk(tmp_path) -> Path:
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({done.stderr.strip()}): a real full disk needs root")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


@pytest.fixture(scope="module")
def model_and_optimizer():
    """A real transformers model of ~130 KB of weights: more than the disk holds."""
    from tests.models import stepped_qwen2

    return stepped_qwen2()


def test_weights_for_vllm_on_a_full_disk(full_disk, model_and_optimizer):
    from rlrun.trainer.weight_publisher import write_weights

    model, _ = model_and_optimizer
    run = RunDir(full_disk / "run")
    run.weights.mkdir(parents=True)
    with pytest.raises(DiskFull) as full:
        write_weights(run, model, model.state_dict(), version=1)
    message = " ".join(str(full.value).split())
    assert f"the disk holding {run.weights} is full" in message and "rlrun resume" in message
    assert full.value.exit_code == ExitCode.RUN_DIR
    assert sorted(p.name for p in run.weights.iterdir()) == []  # no .tmp-v000001, no v000001, no current


def test_a_checkpoint_on_a_full_disk(full_disk, model_and_optimizer):
    from rlrun.trainer.parallel import Parallel, Ranks

    model, optimizer = model_and_optimizer
    run = RunDir(full_disk / "run")
    run.checkpoints.mkdir(parents=True)
    state = checkpoint.TrainerState(step=2, samples_processed=16, policy_version=2)
    with pytest.raises(DiskFull):
        checkpoint.save(model, optimizer, state, run.checkpoint(2), keep=2, parallel=Parallel(Ranks()))
    assert sorted(p.name for p in run.checkpoints.iterdir()) == []  # no .tmp-step_000002 left


def test_a_failed_write_with_room_left_is_not_called_a_full_disk(tmp_path):
    """Another failure keeps its own error; the temporary folder goes all the same."""
    from rlrun.trainer.disk import temporary_folder

    tmp = tmp_path / ".tmp-v000001"
    tmp.mkdir()
    with pytest.raises(ValueError, match="not a disk problem"):
        with temporary_folder(tmp):
            (tmp / "part").write_text("half")
            raise ValueError("not a disk problem")
    assert not tmp.exists()
