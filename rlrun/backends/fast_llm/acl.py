"""Redis ACL for a run with Fast-LLM: its passwordless clients may touch its streams, nothing else.

Fast-LLM's Redis clients connect with host and port only (`redis.Redis(host, port)` in
fast_llm/data/dataset/streaming.py and fast_llm/engine/training/streaming.py): they are the
`default` user. So the run's server gets two users instead of `requirepass`:

- `default`: no password, on, limited to the Fast-LLM stream keys and to the commands Fast-LLM's
  reader and callback send (XGROUP CREATE with MKSTREAM, XREADGROUP ... NOACK, XADD of events)
  plus a few read-only stream commands and PING. No other key (`rlrun:*`, journals), no pub/sub
  channel, no admin command.
- `rlrun`: rlrun's own processes, with the run's password and every key and command. The password
  is stored as its SHA-256 (`#<hex>`), so the server config does not hold it in clear.

Wiring (done where the server config is written): put these lines in the config file in place of
`requirepass` (which would set a password on `default`), and make rlrun's clients authenticate as
`RLRUN_USER` (`AUTH rlrun <password>`, redis-py `username=`): a bare `AUTH <password>` would log in
as the passwordless `default` user and be refused everything else.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

FAST_LLM_USER = "default"
RLRUN_USER = "rlrun"

# What Fast-LLM's clients send, and read-only stream commands useful to inspect them. CLIENT
# SETINFO is what redis-py sends on connect (it ignores a refusal, but the log stays clean).
FAST_LLM_COMMANDS = (
    "ping",
    "echo",
    "client|setinfo",
    "xadd",
    "xreadgroup",
    "xread",
    "xack",
    "xgroup|create",
    "xgroup|createconsumer",
    "xinfo|stream",
    "xinfo|groups",
    "xinfo|consumers",
    "xlen",
    "xrange",
    "xrevrange",
)

_KEY_NAME = re.compile(r"[A-Za-z0-9_:.\-]+")  # no glob characters, no spaces


def acl_lines(password: str, streams: Sequence[str], events_stream: str) -> list[str]:
    """The `user ...` lines of the server config: restricted passwordless `default` for Fast-LLM's
    `streams` and `events_stream`, and `rlrun` with `password` and full access."""
    if not password:
        raise ValueError("the rlrun user needs a non-empty password")
    keys = [*streams, events_stream]
    if not streams:
        raise ValueError("give at least one Fast-LLM data stream")
    for key in keys:
        if not _KEY_NAME.fullmatch(key):
            raise ValueError(
                f"Fast-LLM stream name {key!r} cannot be put in an ACL key pattern: use letters, "
                "digits and _ : . - only"
            )
    patterns = " ".join(f"~{key}" for key in dict.fromkeys(keys))
    commands = " ".join(f"+{command}" for command in FAST_LLM_COMMANDS)
    digest = hashlib.sha256(password.encode("utf-8")).hexdigest()
    return [
        f"user {FAST_LLM_USER} reset on nopass {patterns} resetchannels -@all {commands}",
        f"user {RLRUN_USER} reset on #{digest} ~* &* +@all",
    ]
