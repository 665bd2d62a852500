"""The Redis keys and streams rlrun's own processes use, named in one place.

Fast-LLM's stream names are not here: they belong to the Fast-LLM version they match and live in
that backend's config. The token journal names its per-sample keys itself.
"""

from __future__ import annotations

GROUPS_STREAM = "rlrun:groups"  # finished groups, actor → trainer (one message per group)
TRAINER_GROUP = "rlrun:trainer"  # the trainer's consumer group on GROUPS_STREAM
TRAINER_STATE = "rlrun:trainer:state"  # hash: the trainer's progress (steps, samples processed)
TRAINER_EVENTS = "rlrun:trainer:events"  # stream: trainer events (weights ready, training done)
POLICY_VERSION = "rlrun:policy_version"  # string: the policy version vLLM currently serves
ACTOR_STATE = "rlrun:actor:state"  # hash: the actor's progress (prompt cursor, groups published)
WEIGHTS_STATE = "rlrun:weights"  # hash: the Fast-LLM weight follower (join requests, last event, counts)


def rank_heartbeat(rank: int) -> str:
    """TRAINER_STATE's field where trainer rank `rank` > 0 writes its heartbeat (rank 0: `heartbeat`)."""
    return f"heartbeat_rank{rank}"
