"""The live view: it ends on the run's final step and reward (Redis is stopped by then), and
supervisor.live_view=false gives plain lines even on a terminal."""

from __future__ import annotations

import io

from rich.console import Console

from rlrun.config import compose
from rlrun.parts import progress
from rlrun.cli.live import LiveView, progress_line
from rlrun.parts.progress import Progress, ProgressReader
from rlrun.rundir import RunDir
from rlrun.streams import names


class StoppingRedis:
    """Answers like the run's Redis until `stop()`; then every call fails as a stopped server does."""

    def __init__(self, hashes: dict) -> None:
        self.hashes, self.up = hashes, True

    def hgetall(self, key):
        if not self.up:
            raise ConnectionError("Connection refused")
        return dict(self.hashes.get(key, {}))

    def stop(self):
        self.up = False


def test_the_progress_after_redis_stopped_is_the_last_one_read(tmp_path, monkeypatch):
    cfg, _ = compose(["trainer.max_train_steps=60"])
    fake = StoppingRedis({
        names.TRAINER_STATE: {"step": "60", "samples_processed": "15360", "reward_mean": "0.812", "policy_version": "60"},
        names.ACTOR_STATE: {"groups_published": "1950"},
    })  # fmt: skip
    monkeypatch.setattr(progress.redis_server, "connect", lambda *a, **k: fake)
    reader = ProgressReader("redis://127.0.0.1:1/0", RunDir(tmp_path), num_actors=cfg.actor.num_actors, max_train_steps=cfg.trainer.max_train_steps)
    running = reader.read()
    fake.stop()  # the end of the run: everything was stopped, the view draws once more
    final = reader.read()
    assert final == running
    assert progress_line(final) == "step 60/60  samples 15360  reward 0.812  policy v60  groups 1950"


def test_nothing_read_yet_shows_nothing():
    cfg, _ = compose(["trainer.max_train_steps=60"])
    assert progress_line(ProgressReader("redis://127.0.0.1:1/0", RunDir(__import__("pathlib").Path("/nonexistent")), num_actors=cfg.actor.num_actors, max_train_steps=cfg.trainer.max_train_steps).read()).startswith("step 0/60")


def test_live_view_off_prints_plain_lines_on_a_terminal():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=200)
    with LiveView(console, live=False) as view:
        assert view._live is None
        view.update([], Progress(step=3, max_train_steps=60, samples=768, reward_mean=0.5))
    assert "[train] step 3/60  samples 768  reward 0.500" in out.getvalue()
    with LiveView(Console(file=io.StringIO(), force_terminal=True), live=True) as view:
        assert view._live is not None
