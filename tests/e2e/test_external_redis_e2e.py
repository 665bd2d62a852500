"""A whole tiny run on an external, password-protected Redis (streams.url + streams.password_file):
rlrun starts no server of its own, every process authenticates with the password from the file,
the run claims its database, completes at exactly max_train_steps, and leaves no process and no
password anywhere but its 0600 secrets."""

from __future__ import annotations

import os

import pytest

from rlrun.streams import external, names
from rlrun.streams.server import connect
from tests.integration.test_external_redis import PASSWORD, protected_server  # noqa: F401 - the fixture

from .conftest import leaked_secrets, left_behind, read_jsonl, start_rlrun, wait_or_kill

pytestmark = pytest.mark.e2e

STEPS = 3


def test_a_run_on_an_external_redis(tmp_path, protected_server):  # noqa: F811 - the fixture
    password_file = tmp_path / "team-redis.password"
    password_file.write_text(PASSWORD + "\n")
    os.chmod(password_file, 0o600)
    url = protected_server.rsplit("/", 1)[0] + "/7"
    run_dir = tmp_path / "run"
    proc = start_rlrun(
        run_dir, "recipe=math_grpo", f"trainer.max_train_steps={STEPS}", "trainer.train_batch_size=64",
        f"streams.url={url}", f"streams.password_file={password_file}",
    )  # fmt: skip
    wait_or_kill(proc, 600)
    output = (tmp_path / "rlrun.out").read_text()
    cmdlines = sorted(proc.run_processes.cmdlines)
    assert proc.returncode == 0, output[-3000:]
    assert [m["step"] for m in read_jsonl(run_dir / "metrics.jsonl")] == list(range(1, STEPS + 1))
    assert not any("valkey-server" in " ".join(c) or "redis-server" in " ".join(c) for c in cmdlines)
    client = connect(external.process_url(url, True), PASSWORD)
    try:
        assert client.get(external.OWNER_KEY) == str(run_dir.resolve())  # the database is this run's
        assert client.hget(names.TRAINER_STATE, "step") == str(STEPS)
    finally:
        client.close()
    assert (run_dir / "secrets" / "redis.password").read_text() == PASSWORD
    assert leaked_secrets(run_dir, cmdlines, (output,)) == []
    assert left_behind(proc) == []
