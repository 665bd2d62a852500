"""Redis ACL for a run with Fast-LLM: its passwordless clients read documents and write events.

Fast-LLM's Redis clients connect with host and port only (`redis.Redis(host, port)` in
fast_llm/data/dataset/streaming.py and fast_llm/engine/training/streaming.py): they are the
`default` user. So the run's server gets two users instead of `requirepass`:

- `default`: no password, on, and with ACL selectors (Redis 7+ / valkey) exactly what Fast-LLM
  sends, each command on its own stream only. Measured against the real source
  (Fast-LLM main and its rl520 / gspo502 branches: the same calls in all three):
  the data loader sends `XGROUP CREATE <stream> <group> 0 MKSTREAM` once, then
  `XREADGROUP GROUP <group> <consumer> COUNT 1 BLOCK 1000 NOACK STREAMS <stream> >`; the training
  callback sends `XADD <events> * event <json>`. redis-py adds `CLIENT SETINFO` on connect.
  So the documents stream can be consumed (XREADGROUP, XGROUP CREATE/CREATECONSUMER) and nothing
  else (no XADD: nobody can inject training data; no XDEL, XTRIM, XGROUP SETID/DESTROY, XACK, XRANGE),
  and the events stream can be appended to and nothing else. No other key (`rlrun:*`, journals),
  no pub/sub channel, no admin command. What ACLs cannot limit: an XADD's own arguments (its
  MAXLEN can trim the events stream), and a reader that consumes documents meant for Fast-LLM;
  events are therefore checked by what reads them (events.py: a step that goes backwards or jumps
  is counted and ignored).
- `rlrun`: rlrun's own processes, with the run's password and every key and command (written by
  `rlrun.streams.server`, as for every run). rlrun's clients name their user: a bare
  `AUTH <password>` would log in as the passwordless `default` user and be refused everything else.
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
