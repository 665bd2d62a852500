"""Redis ACL for a run with Fast-LLM: its passwordless clients read documents and write events.

Fast-LLM's clients connect as the `default` user, without a password, so that user may do exactly
what Fast-LLM sends (docs/architecture.md lists it) on its two streams and nothing else. What ACLs
cannot limit (an XADD's arguments) is checked by what reads the events (`events.py`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

FAST_LLM_USER = "default"

# Key-less commands: PING (health checks), CLIENT SETINFO (what redis-py sends on connect; it
# ignores a refusal, but the server log stays clean).
FAST_LLM_GLOBAL = ("ping", "client|setinfo")
# On the documents stream only: what Fast-LLM's streaming dataset sends to consume it.
FAST_LLM_DOCUMENTS = ("xreadgroup", "xgroup|create", "xgroup|createconsumer")
# On the events stream only: what its streaming callback sends (weights_ready, training_finished).
FAST_LLM_EVENTS = ("xadd",)

_KEY_NAME = re.compile(r"[A-Za-z0-9_:.\-]+")  # no glob characters, no spaces


def default_user_line(streams: Sequence[str], events_stream: str) -> str:
    """The `user default ...` line: passwordless, each of Fast-LLM's commands on its own stream only."""
    if not streams:
        raise ValueError("give at least one Fast-LLM data stream")
    for key in [*streams, events_stream]:
        if not _KEY_NAME.fullmatch(key):
            raise ValueError(
                f"Fast-LLM stream name {key!r} cannot be put in an ACL key pattern: use letters, "
                "digits and _ : . - only"
            )
    if events_stream in streams:
        raise ValueError(f"the events stream {events_stream!r} must not be a documents stream")
    documents = " ".join([*(f"~{key}" for key in dict.fromkeys(streams)), *(f"+{c}" for c in FAST_LLM_DOCUMENTS)])
    events = " ".join([f"~{events_stream}", *(f"+{c}" for c in FAST_LLM_EVENTS)])
    root = " ".join(f"+{c}" for c in FAST_LLM_GLOBAL)
    return f"user {FAST_LLM_USER} reset on nopass resetchannels -@all {root} ({documents}) ({events})"
