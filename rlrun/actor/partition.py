"""How K actors split a run between them (pure): prompts, vLLM servers, and their share of a step.

Actor k of K owns the prompt positions k, k + K, ... of the run's seeded order (its c-th group
takes c·K + k): disjoint, no gap, and its own journal's cursor is all a replacement needs to
neither skip nor repeat a prompt. Its vLLM servers are k, k + K, ... (fewer servers than actors:
shared), and it may run ahead of the trainer by its share of a step's groups.
"""

from __future__ import annotations

from rlrun.streams.names import actor_name


def _check(actor: int, num_actors: int) -> None:
    if num_actors < 1 or not 0 <= actor < num_actors:
        raise ValueError(f"actor {actor} of {num_actors}: need 0 <= actor < num_actors")


def prompt_position(cursor: int, actor: int, num_actors: int) -> int:
    """The position in the run's prompt order of actor `actor`'s `cursor`-th group."""
    _check(actor, num_actors)
    if cursor < 0:
        raise ValueError(f"cursor must be >= 0, got {cursor}")
    return cursor * num_actors + actor


def servers_of(actor: int, num_actors: int, num_servers: int) -> list[int]:
    """The vLLM servers actor `actor` sends to: round-robin; with fewer servers than actors, k mod M."""
    _check(actor, num_actors)
    if num_servers < 1:
        raise ValueError(f"need at least one vLLM server (got {num_servers})")
    if num_servers < num_actors:
        return [actor % num_servers]
    return list(range(actor, num_servers, num_actors))


def share(total: int, actor: int, num_actors: int) -> int:
    """Actor `actor`'s share of `total` items dealt round-robin (the first total % K actors get one more)."""
    _check(actor, num_actors)
    return len(range(actor, total, num_actors))


def group_namespace(run: str, actor: int, num_actors: int) -> str:
    """The first part of its group ids: `<run>`, or `<run>/a<k>` with several actors (cursors are theirs)."""
    _check(actor, num_actors)
    return run if num_actors == 1 else f"{run}/a{actor}"


def ownership(num_actors: int, num_servers: int) -> dict[str, list[str]]:
    """Process names: each actor → the vLLM servers it sends to (what --dry-run shows)."""
    return {
        actor_name(k, num_actors): [f"vllm-{i}" for i in servers_of(k, num_actors, num_servers)]
        for k in range(num_actors)
    }
