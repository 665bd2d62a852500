"""Every socket a run listens on, planned from its config: what `rlrun train --dry-run` lists, and
what docs/operations.md ("What a run listens on") explains. The trainer backend adds its own
(`TrainerBackend.listeners`).

Each names the host it binds (loopback with world=local; the configured host under Ray) and what
a client must present: the run's secret where the protocol has a place for one. torch's TCPStore
and gloo have none (rlrun/listen.py): they are bound to the run's host and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlrun.config.schema import InferenceConfig, StreamsConfig

PICKED = "picked free at start"
EPHEMERAL = "ephemeral"


@dataclass(frozen=True)
class Listener:
    process: str  # who listens
    what: str  # the server or protocol
    host: str  # the address it binds
    port: str  # a number, PICKED or EPHEMERAL
    secret: str  # what a client must present


def planned(
    streams: StreamsConfig, inference: InferenceConfig, redis_default_user: str, trainer: list[Listener]
) -> list[Listener]:
    """The sockets a run with these `streams` and `inference` sections will listen on, in start
    order; its trainer backend's answers given: the ACL line of Redis's `default` user, and the
    trainer's own listeners."""
    from rlrun.streams.server import DEFAULT_USER_OFF

    out: list[Listener] = []
    if streams.url is None:
        redis_auth = "the run's password (ACL user; the `default` user is off)"
        if redis_default_user != DEFAULT_USER_OFF:
            redis_auth = "the run's password; without one only what the trainer's passwordless `default` user may touch"
        out.append(Listener("redis", "Redis (valkey)", streams.host, PICKED, redis_auth))
    for i in range(inference.num_servers):
        name = f"vllm-{i}"
        out.append(
            Listener(name, "vLLM OpenAI server", inference.host, PICKED, "the run's API key (every route but /health)")
        )
        out.append(
            Listener(
                name,
                "vLLM's internal sockets (engine and worker)",
                "127.0.0.1 (vLLM's own; measured with vLLM 0.32)",
                EPHEMERAL,
                "none: vLLM's internals",
            )
        )
    return out + trainer


def gloo_pairs(processes: str, host: str) -> Listener:
    """The sockets of a gloo group's pairs: on `host`'s interface when it is loopback."""
    from rlrun.listen import LOOPBACK

    where = host if host in LOOPBACK else "the interface of the machine's host name (gloo's default)"
    return Listener(
        processes, "gloo pairs of a torch.distributed group", where, EPHEMERAL, "nothing: gloo has no authentication"
    )


def tcp_store(process: str, what: str, host: str, port: str = PICKED) -> Listener:
    return Listener(
        process,
        f"torch TCPStore: {what}",
        host,
        port,
        "nothing: TCPStore has no authentication (keys under a per-run prefix)",
    )
