"""The sockets a run will listen on, as planned from its config and listed by `--dry-run`: every one
on loopback with world=local, each saying what a client must present (a live run's sockets are
checked in tests/e2e/test_trainer_ranks_e2e.py and test_train_e2e.py)."""

from __future__ import annotations

import pytest

from rlrun.parts import sockets
from rlrun.config import compose
from rlrun.run.built import build

LOOPBACK_HOSTS = ("127.0.0.1", "127.0.0.1 (vLLM's own; measured with vLLM 0.32)")


def plan(*overrides: str) -> list[sockets.Listener]:
    cfg, _ = compose(list(overrides))
    backend = build(cfg).backend
    return sockets.planned(cfg.streams, cfg.inference, backend.redis_default_user(), backend.listeners())


@pytest.mark.parametrize("overrides", [
    [],
    ["trainer.weight_transfer=broadcast", "inference.num_servers=2"],
    ["trainer.nproc_per_node=2", "trainer.gradient_accumulation_passes=2"],
], ids=["disk", "broadcast", "two-ranks"])  # fmt: skip
def test_every_socket_of_a_local_hf_run_is_on_loopback(overrides):
    listeners = plan(*overrides)
    assert listeners and all(listener.host in LOOPBACK_HOSTS for listener in listeners), listeners
    assert all(listener.secret for listener in listeners)
    assert {"redis", "vllm-0"} <= {listener.process for listener in listeners}


def test_the_broadcast_adds_its_store_and_gloo_pairs_and_says_they_take_no_secret():
    disk = {listener.what for listener in plan()}
    broadcast = plan("trainer.weight_transfer=broadcast")
    added = [listener for listener in broadcast if listener.what not in disk]
    assert [listener.what for listener in added] == ["torch TCPStore: the weight broadcast (rank 0 serves it)",
                                                     "gloo pairs of a torch.distributed group"]  # fmt: skip
    assert all(listener.secret.startswith("nothing:") for listener in added)
    assert next(listener for listener in plan() if listener.process == "vllm-0").secret.startswith("the run's API key")


def test_fast_llm_names_who_serves_its_broadcast_store_and_where():
    ours = plan("trainer=fast_llm", "trainer.fast_llm.broadcast_store=rlrun")
    theirs = plan("trainer=fast_llm", "trainer.fast_llm.broadcast_store=trainer")
    store = next(listener for listener in ours if "TCPStore" in listener.what)
    assert (store.process, store.host) == ("weights", "127.0.0.1")
    store = next(listener for listener in theirs if "TCPStore" in listener.what)
    assert store.process == "trainer" and store.host.startswith("::")  # torch's own: rlrun cannot bind it


def test_dry_run_lists_the_sockets(tmp_path):
    from typer.testing import CliRunner

    from rlrun.cli.app import app

    dry = CliRunner().invoke(app, ["train", "--dry-run", "trainer.weight_transfer=broadcast", f"run.dir={tmp_path / 'run'}"],
                             env={"COLUMNS": "250"})  # fmt: skip
    assert dry.exit_code == 0, dry.output
    assert "sockets the run will listen on" in dry.output
    assert "torch TCPStore: the weight broadcast" in dry.output and "TCPStore has no authentication" in dry.output
    assert not (tmp_path / "run").exists()
