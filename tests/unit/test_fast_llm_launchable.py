"""A Fast-LLM launch command is checked through its wrappers: the program it finally runs must exist."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from rlrun.backends.fast_llm.launchable import ensure_launchable, missing
from rlrun.errors import EnvironmentProblem

PY = sys.executable


@pytest.fixture(autouse=True)
def venv_on_path(monkeypatch):
    """torchrun lives next to this interpreter (the run's environment), as under `rlrun` itself."""
    monkeypatch.setenv("PATH", f"{Path(PY).parent}{os.pathsep}{os.environ.get('PATH', '')}")


@pytest.mark.parametrize(
    "argv, lacking",
    [
        (["fast-llm-nope", "train"], "fast-llm-nope (not found)"),
        (["torchrun", "--nproc_per_node=1", "--no_python", "fast-llm-nope", "train", "gpt"], "fast-llm-nope (not found)"),
        (["env", "CUDA_VISIBLE_DEVICES=0", "fast-llm-nope", "train"], "fast-llm-nope (not found)"),
        (["env", "-u", "X", "A=1", "torchrun", "--nproc-per-node", "2", "--no-python", "fast-llm-nope"], "fast-llm-nope (not found)"),
        (["nice", "-n", "5", "nohup", "fast-llm-nope"], "fast-llm-nope (not found)"),
        (["timeout", "3600", "fast-llm-nope"], "fast-llm-nope (not found)"),
        (["bash", "-c", "A=1 fast-llm-nope train gpt --config x.yaml"], "fast-llm-nope (not found)"),
        (["sh", "-c", "exec env torchrun --no_python fast-llm-nope"], "fast-llm-nope (not found)"),
        (["bash", "-c", "cd /tmp && fast-llm train"], None),  # `cd` is a builtin: the shell decides
        ([PY, "-m", "fast_llm_nope.cli", "train"], "Python module fast_llm_nope.cli"),
        (["python3", "-u", "-m", "fast_llm_nope"], "Python module fast_llm_nope"),
        ([PY, "/no/such/train.py"], "the script /no/such/train.py (no such file)"),
        (["torchrun", "--nproc_per_node=2", "-m", "fast_llm_nope.cli"], "Python module fast_llm_nope.cli"),
        (["torchrun", "--nnodes", "1", "/no/such/train.py"], "the script /no/such/train.py"),
        ([PY, "-m", "torch.distributed.run", "--no_python", "fast-llm-nope"], "fast-llm-nope (not found)"),
        (["/no/such/bin/fast-llm"], "/no/such/bin/fast-llm (not found)"),
        ([], "an empty command"),
    ],
)
def test_a_missing_program_is_found_behind_its_wrappers(argv, lacking):
    got = missing(argv)
    if lacking is None:
        assert got == []
    else:
        assert len(got) == 1 and got[0].startswith(lacking), got


@pytest.mark.parametrize(
    "argv",
    [
        [PY, "tests/fast_llm_standin.py", "--config", "x"],
        ["env", "A=1", PY, "-m", "json.tool"],
        ["nice", "-n", "5", PY, "-m", "rlrun.entrypoints.trainer"],
        ["bash", "-c", f"{PY} -m json.tool"],
        ["torchrun", "--nproc_per_node=1", "--no_python", "true"],
    ],
)
def test_a_command_that_can_start_passes(argv):
    assert missing(argv) == []


def test_the_error_is_exit_3_and_names_what_is_missing():
    with pytest.raises(EnvironmentProblem) as caught:
        ensure_launchable(["env", "A=1", "fast-llm-nope", "train"])
    assert int(caught.value.exit_code) == 3
    assert "fast-llm-nope (not found)" in str(caught.value) and "trainer.fast_llm.command" in str(caught.value)
