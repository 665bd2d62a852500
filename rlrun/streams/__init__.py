"""The run's Redis: its server lifecycle, the names of its keys and streams, and the message codec.

This package owns everything rlrun needs to know about Redis itself: which server binary to run
and how it is configured (loopback, generated password kept 0600, AOF on, no RDB snapshots,
commands a run never needs disabled), how clients connect and probe it, the one list of stream and
key names, and the JSON codec for the messages on those streams (versioned, never pickle). It
refuses RL maths, the token journal's semantics, and the supervisor's restart policy: those live
in `rlrun.journal`, `rlrun.actor`, `rlrun.trainer` and `rlrun.supervisor`, which use this package.
"""
