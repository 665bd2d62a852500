"""The Redis keys and streams rlrun's own processes use, named in one place.

Fast-LLM's stream names are not here: they belong to the Fast-LLM version they match and live in
that backend's config. The token journal names its per-sample keys itself.
"""

from __future__ import annotations

GROUPS_STREAM = "rlrun:groups"  # finished groups, actor → trainer (one message per group)
TRAINER_GROUP = "rlrun:trainer"  # the trainer's consumer group on GROUPS_STREAM
TRAINER_STATE = "rlrun:trainer:state"  # hash: the trainer's progress (steps, samples processed)
TRAINER_EVENTS = (
    "rlrun:trainer:events"  # stream: each step's record, for observers outside rlrun (nothing in rlrun reads it)
)
POLICY_VERSION = "rlrun:policy_version"  # string: the policy version vLLM currently serves
ACTOR_STATE = "rlrun:actor:state"  # hash: the actor's progress (prompt cursor, groups published)
EVAL_RESULTS = "rlrun:eval"  # hash: policy version -> its evaluation's result (JSON), written once, whole, by actor 0
WEIGHTS_STATE = "rlrun:weights"  # hash: the Fast-LLM weight follower (join requests, last event, counts)


def trained_entries(stream: str) -> str:
    """TRAINER_STATE's field: how many entries of groups stream `stream` the trainer's steps have
    read (its current lineage: set back when it restarts from an older checkpoint)."""
    return f"trained:{stream}"


# TRAINER_STATE's field "1" once the hf trainer took its last step and vLLM serves it ("0" from the
# moment a trainer is ready until then): the one "done" signal, read by the completion check and
# by the actors. A field of a state, not an event: any reader at any time reads the same (a
# restarted actor, a resumed supervisor, a Redis back from its AOF), writing it twice changes
# nothing, and no reader has to find where in a stream this launch's events start.
TRAINING_DONE = "training_done"
# TRAINER_STATE's fields while the hf trainer hands a policy version to vLLM: the version, and since
# when (epoch seconds); deleted when the update ends. A stalled run's report names a stuck update.
UPDATING_WEIGHTS_TO = "updating_weights_to"
UPDATING_WEIGHTS_SINCE = "updating_weights_since"


def training_done(trainer_state: dict) -> bool:
    """Whether TRAINER_STATE (as read: HGETALL) says training is done."""
    return trainer_state.get(TRAINING_DONE) == "1"


def rank_heartbeat(rank: int) -> str:
    """TRAINER_STATE's field where trainer rank `rank` > 0 writes its heartbeat (rank 0: `heartbeat`)."""
    return f"heartbeat_rank{rank}"


# --- Redis Cluster: keys that Lua scripts touch together share a hash slot ----------------------

JOURNAL_BASE = "rlrun:journal:"


def hash_tag(key: str) -> str:
    """What Redis Cluster hashes of `key`: between the first `{` and the next `}` if not empty, else all."""
    start = key.find("{")
    if start != -1:
        end = key.find("}", start + 1)
        if end > start + 1:
            return key[start + 1 : end]
    return key


def journal_prefix(stream: str) -> str:
    """The key prefix of the journal delivering into `stream`: `rlrun:journal:{<its hash tag>}:`."""
    return f"{JOURNAL_BASE}{{{hash_tag(stream)}}}:"


# --- several actors (actor.num_actors = K): each its own stream, journal and state hash ---------


def actor_name(actor: int, num_actors: int) -> str:
    """Its process name: `actor` for a lone actor (unchanged), else `actor-<k>`."""
    if num_actors < 1 or not 0 <= actor < num_actors:
        raise ValueError(f"actor {actor} of {num_actors}: need 0 <= actor < num_actors")
    return "actor" if num_actors == 1 else f"actor-{actor}"


def actor_stream(actor: int, num_actors: int) -> str:
    """Where actor `actor` delivers: `rlrun:groups` alone, else `rlrun:groups:{a<k>}` (its own hash tag)."""
    return GROUPS_STREAM if num_actors == 1 else f"{GROUPS_STREAM}:{{a{actor}}}"


def actor_state(actor: int, num_actors: int) -> str:
    """The hash of actor `actor`'s progress and heartbeat (`rlrun:actor:state` for a lone actor)."""
    return ACTOR_STATE if num_actors == 1 else f"rlrun:actor:{{a{actor}}}:state"


def groups_streams(num_actors: int) -> list[str]:
    """Every stream the trainer reads, one per actor."""
    return [actor_stream(k, num_actors) for k in range(num_actors)]


def actor_states(num_actors: int) -> list[str]:
    return [actor_state(k, num_actors) for k in range(num_actors)]
