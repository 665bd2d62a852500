"""The run's Redis without the rest of the run, for tests and benchmarks: started as `rlrun train`
starts it (same config file and command line, under a one-process `Supervisor`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rlrun.rundir import RunDir
from rlrun.streams.server import (
    DEFAULT_USER_OFF, find_server_binary, pick_free_port, ping, redis_url, server_argv, write_server_config,
)  # fmt: skip
from rlrun.supervisor import ProcessSpec, Supervisor, supervised


class StandaloneServer:
    """A started Redis: `.url`, `.port`, `.password`; `.stop()`, `.kill()`, `.restart()`."""

    def __init__(self, run_dir: RunDir, url: str, port: int, password: str, supervisor: Supervisor) -> None:
        self.run_dir, self.url, self.port, self.password = run_dir, url, port, password
        self._supervisor = supervisor

    @property
    def status(self):
        """The supervisor's view of the process (`.pid` is its process group's leader)."""
        return self._supervisor.status("redis")

    @property
    def exit_code(self) -> int | None:
        return self.status.handle.poll()

    def server_pid(self) -> int:
        """The redis-server process itself (the group's leader is the supervisor's guard)."""
        return self.status.handle.descendants(fresh=True)[0]

    def stop(self) -> None:
        """As a run stops it: SIGTERM (the server fsyncs its AOF), SIGKILL after the grace."""
        self._supervisor.stop_all()

    def kill(self) -> None:
        """SIGKILL to the whole group, no clean shutdown: what a crash looks like."""
        self._supervisor.kill_attempt(self.status)

    def restart(self) -> None:
        """Stop it if it runs, then start it again on the same port from the same AOF."""
        self._supervisor.stop_all()
        self._supervisor.start_all()


@contextmanager
def managed_server(
    run_dir: RunDir,
    host: str = "127.0.0.1",
    appendfsync: str = "everysec",
    binary: str = "auto",
    *,
    default_user: str = DEFAULT_USER_OFF,
) -> Iterator[StandaloneServer]:
    """Start the run's Redis on a free port, yield it ready, stop it on exit (log: the run's redis log)."""
    port = pick_free_port(host)
    write_server_config(run_dir, port, host, appendfsync, default_user=default_user)
    url, password = redis_url(host, port), run_dir.ensure_secret(run_dir.redis_password)
    spec = ProcessSpec(
        name="redis", argv=server_argv(find_server_binary(binary), run_dir), log_path=run_dir.log("redis"),
        ready=lambda pid: ping(url, password), ready_timeout_s=30.0,
    )  # fmt: skip
    with supervised(spec) as supervisor:
        yield StandaloneServer(run_dir, url, port, password, supervisor)
