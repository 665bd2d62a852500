"""The Fast-LLM ACL on a real server: passwordless Fast-LLM clients reach its streams only."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis

from rlrun.backends.fast_llm.acl import RLRUN_USER, acl_lines
from rlrun.streams.server import find_server_binary, pick_free_port

pytestmark = pytest.mark.timeout(60)

STREAM, GROUP, EVENTS = "fast_llm_streaming", "fast_llm_group", "fast_llm_events"
PASSWORD = "s3cret-for-the-test"


@contextmanager
def acl_server(folder: Path, password: str = PASSWORD) -> Iterator[int]:
    """A throwaway server on 127.0.0.1 configured with `acl_lines`; yields its port and kills its
    process group on exit."""
    folder.mkdir(parents=True, exist_ok=True)
    binary = find_server_binary("auto")
    for _ in range(5):
        port = pick_free_port("127.0.0.1")
        conf = folder / "redis.conf"
        lines = [
            "bind 127.0.0.1",
            f"port {port}",
            "protected-mode yes",
            "daemonize no",
            f'dir "{folder}"',
            'save ""',
            "appendonly no",
            *acl_lines(password, [STREAM], EVENTS),
        ]
        conf.write_text("\n".join(lines) + "\n")
        log = open(folder / "redis.log", "ab")
        process = subprocess.Popen(
            [str(binary), str(conf)], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        try:
            if _wait_ready(process, port, password):
                yield port
                return
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    raise RuntimeError(f"could not start the ACL test server; see {folder / 'redis.log'}")


def _wait_ready(process: subprocess.Popen, port: int, password: str) -> bool:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False  # port taken meanwhile (or a bad config: the caller's error names the log)
        try:
            if redis.Redis(port=port, username=RLRUN_USER, password=password, socket_timeout=1).ping():
                return True
        except redis.RedisError:
            time.sleep(0.05)
    raise RuntimeError("the ACL test server did not answer PING within 20 s")


def fast_llm_client(port: int) -> redis.Redis:
    """A client the way Fast-LLM makes one: host and port, no password."""
    return redis.Redis(host="127.0.0.1", port=port)


def test_fast_llm_client_reads_and_writes_its_streams(tmp_path):
    with acl_server(tmp_path / "redis") as port:
        rlrun = redis.Redis(port=port, username=RLRUN_USER, password=PASSWORD)
        rlrun.xadd(STREAM, {"data": '{"tokens":[1,2,3]}'})
        fast_llm = fast_llm_client(port)
        assert fast_llm.ping()
        # what Fast-LLM's streaming dataset does
        fast_llm.xgroup_create(name=STREAM, groupname=GROUP, id="0", mkstream=True)
        with pytest.raises(redis.ResponseError, match="BUSYGROUP"):
            fast_llm.xgroup_create(name=STREAM, groupname=GROUP, id="0", mkstream=True)
        got = fast_llm.xreadgroup(GROUP, "fast_llm_consumer_0", {STREAM: ">"}, count=1, block=100, noack=True)
        assert got[0][1][0][1] == {b"data": b'{"tokens":[1,2,3]}'}
        # what its streaming callback does
        fast_llm.xadd(EVENTS, {"event": '{"type": "training_finished"}'})
        assert fast_llm.xlen(EVENTS) == 1 and fast_llm.xinfo_stream(STREAM)["length"] == 1
        assert rlrun.xrange(EVENTS)[0][1] == {b"event": b'{"type": "training_finished"}'}


@pytest.mark.parametrize(
    "command",
    [
        lambda c: c.xadd("rlrun:groups", {"data": "x"}),
        lambda c: c.xrange("rlrun:groups"),
        lambda c: c.get("rlrun:policy_version"),
        lambda c: c.set("anything", "1"),
        lambda c: c.hgetall("rlrun:actor:state"),
        lambda c: c.keys("*"),
        lambda c: c.delete(STREAM),  # its own stream, but not a command it needs
        lambda c: c.xgroup_destroy(STREAM, GROUP),
        lambda c: c.publish("chan", "x"),
        lambda c: c.acl_setuser("default", enabled=True, passwords=["+x"]),
        lambda c: c.flushall(),
    ],
)
def test_fast_llm_client_is_refused_everything_else(tmp_path, command):
    with acl_server(tmp_path / "redis") as port:
        rlrun = redis.Redis(port=port, username=RLRUN_USER, password=PASSWORD)
        rlrun.set("rlrun:policy_version", "3")
        rlrun.xadd(STREAM, {"data": "{}"})
        rlrun.xgroup_create(STREAM, GROUP, id="0")
        with pytest.raises(redis.exceptions.NoPermissionError):
            command(fast_llm_client(port))
        assert rlrun.get("rlrun:policy_version") == b"3" and rlrun.exists(STREAM)


def test_rlrun_user_with_password_can_do_everything(tmp_path):
    with acl_server(tmp_path / "redis") as port:
        rlrun = redis.Redis(port=port, username=RLRUN_USER, password=PASSWORD)
        rlrun.set("rlrun:policy_version", "4")
        rlrun.xadd("rlrun:groups", {"data": "{}"})
        rlrun.hset("rlrun:actor:state", mapping={"cursor": "1"})
        rlrun.xadd(STREAM, {"data": "{}"})
        rlrun.xgroup_create(STREAM, GROUP, id="0")
        rlrun.xgroup_destroy(STREAM, GROUP)
        assert rlrun.get("rlrun:policy_version") == b"4"
        assert sorted(rlrun.keys("*")) == [STREAM.encode(), b"rlrun:actor:state", b"rlrun:groups", b"rlrun:policy_version"]
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port, username=RLRUN_USER, password="wrong").ping()


def test_a_bare_password_logs_in_as_the_restricted_user(tmp_path):
    """Why rlrun's clients must name their user: AUTH <password> alone is the default user."""
    with acl_server(tmp_path / "redis") as port:
        bare = redis.Redis(port=port, password=PASSWORD)
        assert bare.ping()
        with pytest.raises(redis.exceptions.NoPermissionError):
            bare.get("rlrun:policy_version")


def test_acl_lines_keep_the_password_out_of_the_config_and_refuse_glob_names():
    lines = acl_lines(PASSWORD, [STREAM], EVENTS)
    assert not any(PASSWORD in line for line in lines)
    assert lines[0].startswith("user default reset on nopass ~fast_llm_streaming ~fast_llm_events ")
    for bad in ("fast_llm_*", "a b", ""):
        with pytest.raises(ValueError):
            acl_lines(PASSWORD, [bad], EVENTS)
    with pytest.raises(ValueError):
        acl_lines("", [STREAM], EVENTS)
