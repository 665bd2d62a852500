"""An external Redis (`streams.url`, e.g. `redis://alice@10.0.0.5:6379/3`) instead of the run's own.

The password comes from `streams.password_file`, never the URL (which is written to the config
and to command lines), and is copied into the run's 0600 secrets. rlrun's keys have fixed names,
so one database holds one run: the run claims it (`rlrun:run` = its directory) and a database
claimed by another run is refused before anything starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast
from urllib.parse import urlsplit, urlunsplit

from rlrun.errors import EnvironmentProblem

SCHEMES = ("redis", "rediss", "unix")
OWNER_KEY = "rlrun:run"  # the run directory that uses this database
DEFAULT_USER = "default"  # Redis's own user, when the URL names none


def url_problems(url: str) -> list[str]:
    """What is wrong with `streams.url` (pure; empty when it is usable)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a malformed port
    except ValueError as exc:
        return [f"streams.url={url!r} is not a URL ({exc})"]
    problems = []
    if parts.scheme not in SCHEMES:
        problems.append(f"streams.url must start with {', '.join(s + '://' for s in SCHEMES)} (got {url!r})")
    if parts.password:
        problems.append(
            "streams.url holds a password, which would be written to the run's config and to command lines: "
            "put it in a file of mode 0600 and set streams.password_file=PATH instead"
        )
    if parts.scheme in ("redis", "rediss") and not parts.hostname:
        problems.append(f"streams.url names no host (got {url!r})")
    return problems


def process_url(url: str, has_password: bool) -> str:
    """The URL the run's processes use: with a password and no user in it, Redis's `default` user."""
    parts = urlsplit(url)
    if not has_password or parts.username or parts.scheme == "unix":
        return url
    return urlunsplit(parts._replace(netloc=f"{DEFAULT_USER}@{parts.netloc}"))


def read_password(password_file: str | None) -> str | None:
    if password_file is None:
        return None
    try:
        password = Path(password_file).expanduser().read_text().strip()
    except OSError as exc:
        raise EnvironmentProblem(f"streams.password_file={password_file} cannot be read ({exc.strerror}).") from None
    if not password:
        raise EnvironmentProblem(f"streams.password_file={password_file} is empty.")
    return password


def check_and_claim(url: str, password: str | None, owner: str, *, claim: bool) -> None:
    """Reach and authenticate to the server; check its database is free or already `owner`'s (the run
    directory) and with `claim` mark it so; otherwise an EnvironmentProblem saying what to do."""
    import redis

    from rlrun.streams.server import connect

    try:  # connecting asks the server whether it is a cluster: credentials are checked here already
        client = connect(process_url(url, password is not None), password, socket_timeout=5.0, reconnect_s=0)
        with client:
            client.ping()
            current = cast("str | None", client.get(OWNER_KEY))  # decode_responses=True
            if current is None and claim:
                client.set(OWNER_KEY, owner, nx=True)
                current = cast("str | None", client.get(OWNER_KEY))  # decode_responses=True
    except redis.AuthenticationError as exc:
        raise EnvironmentProblem(
            f"the Redis at streams.url={url} refused the credentials ({exc}). Check the user in the URL and "
            "the password in streams.password_file."
        ) from None
    except (redis.RedisError, OSError) as exc:
        raise EnvironmentProblem(
            f"cannot use the Redis at streams.url={url} ({type(exc).__name__}: {exc}). Start it, or unset "
            "streams.url to let rlrun start its own."
        ) from None
    if current is not None and current != owner:
        raise EnvironmentProblem(
            f"the Redis database at streams.url={url} holds another run's keys (that of {current}). Give this run "
            "its own database (redis://HOST:PORT/N with another N), or delete those keys if that run is over."
        )
