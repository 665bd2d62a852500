"""The in-memory weight path (trainer.weight_transfer=broadcast): the hf trainer's rank 0 as rank 0
of Fast-LLM's weight broadcast group (wire format: rlrun/weights/broadcast.py).

`BroadcastSync` is one weight update (docs/architecture.md, "Weight updates"); any failure drops
the group and raises, and a receiver loads nothing before the whole broadcast arrived. A collective
(or the forming of the group) that takes longer than trainer.weight_sync_timeout_s is
`WeightSyncTimeout`, which nothing retries: the trainer exits and its restart policy restarts it.
"""

from __future__ import annotations

import datetime
import functools
import logging
import pickle
import time
from concurrent.futures import Future, wait
from dataclasses import dataclass, replace
from typing import Callable

import torch
import torch.distributed as dist

from rlrun.inference.admin import in_thread, results, version_label
from rlrun.weights.broadcast import (
    SOURCE_RANK,
    WEIGHTS_SHARD,
    CollectiveTimeout,
    broadcast_tensor,
    member_of,
    serve_store,
)

log = logging.getLogger("rlrun.trainer.weights")

TIMEOUT_S = 60.0  # trainer.weight_sync_timeout_s's default: forming the group, and each collective of a broadcast


class WeightSyncTimeout(Exception):
    """A weight update's collective, or the forming of its group, took longer than its timeout: a
    vLLM server stopped taking part. Not a RuntimeError, so that no retry takes it: a timed-out
    NCCL communicator is not used again, the trainer exits and is restarted."""


class Activity:
    """What the sender does now and since when (monotonic), read by the watchdog of another thread."""

    def __init__(self) -> None:
        self.doing: tuple[float, str] | None = None

    def start(self, what: str) -> None:
        self.doing = (time.monotonic(), what)

    def end(self) -> None:
        self.doing = None


class WeightBroadcaster:
    """Rank 0 of a broadcast group to `receivers` vLLM workers (ranks 1..receivers), on `store`
    (served at host:port; a new one when None) under `namespace` (see `broadcast.member_of`)."""

    def __init__(
        self,
        host: str,
        port: int,
        receivers: int,
        transport: str = "gloo",
        timeout_s: float = 600.0,
        namespace: str = "",
        store: dist.Store | None = None,
    ) -> None:
        timeout = datetime.timedelta(seconds=timeout_s)
        self.store = store if store is not None else serve_store(host, port, receivers + 1, timeout_s)
        # Blocks until every receiver has joined (each joins in its weight-transfer engine's thread).
        self.member = member_of(self.store, SOURCE_RANK, receivers + 1, transport, timeout, namespace, host)
        self.device = self.member.device
        self.activity = Activity()  # the collective in progress (BroadcastSync's watchdog reads it)

    def _broadcast_object(self, value) -> None:
        payload = torch.frombuffer(bytearray(pickle.dumps(value)), dtype=torch.uint8).to(self.device)
        broadcast_tensor(self.member, torch.tensor([payload.numel()], dtype=torch.int64, device=self.device))
        broadcast_tensor(self.member, payload)

    def send(self, weights: dict[str, torch.Tensor]) -> int:
        """Broadcast every tensor of `weights` (a full state dict), then the end marker; the bytes sent."""
        sent = 0
        try:
            for n, (name, tensor) in enumerate(weights.items(), start=1):
                self.activity.start(f"sending {name} ({n} of {len(weights)} tensors)")
                tensor = tensor.detach().to(self.device).contiguous()
                self._broadcast_object((WEIGHTS_SHARD, name, tuple(tensor.shape), tensor.dtype))
                broadcast_tensor(self.member, tensor)
                sent += tensor.numel() * tensor.element_size()
            self.activity.start("sending the end marker")
            self._broadcast_object(None)
        except CollectiveTimeout as exc:
            doing = self.activity.doing
            raise CollectiveTimeout(f"{doing[1] if doing else 'sending'}: {exc}") from exc
        self.activity.end()
        return sent


def disk_copy_due(step: int, checkpoint_every: int, last_step: int, down: list[str]) -> bool:
    """Whether a broadcast update also writes weights/current for servers that start cold: one
    restarting now (`down`), and at checkpoints one that restarts unseen between two updates."""
    return bool(down) or step % checkpoint_every == 0 or step >= last_step


@dataclass(frozen=True)
class Membership:
    """One formation of the group: its receivers (rank i+1 is servers[i]), and the weight version
    label every one of them serves since the last broadcast (None before the first)."""

    servers: tuple[str, ...]
    label: str | None = None


def needs_new_group(current: Membership | None, servers: list[str], reported: dict[str, str]) -> bool:
    """True when the servers that answer are not exactly the current group's members, or one
    reports a weight version other than the group's last broadcast: it restarted (a fresh server
    reports "default"), so it is in no group."""
    if current is None or tuple(servers) != current.servers:
        return True
    return current.label is not None and any(reported.get(url) != current.label for url in servers)


class BroadcastSync:
    """The hf trainer's rank 0 side of trainer.weight_transfer=broadcast. `admin`: the vLLM
    servers' VllmAdmin; `host:port`: where rank 0 serves the group's store (on that interface
    only); `prefix`: the run's prefix of its keys (`listen.run_prefix`)."""

    def __init__(
        self, admin, host: str, port: int, transport: str = "gloo", timeout_s: float = TIMEOUT_S, prefix: str = ""
    ) -> None:
        self.admin, self.host, self.port, self.transport, self.timeout_s = admin, host, port, transport, timeout_s
        self.prefix = prefix
        self.membership: Membership | None = None
        self.sender: WeightBroadcaster | None = None
        # One store for every formation, each under a namespace of its own: a store served anew
        # on the port would share the old one's server (torch keeps one per port and process)
        # and with it the keys a killed member left.
        self._store: dist.Store | None = None
        self.formations = 0

    def update(
        self,
        weights: dict[str, torch.Tensor],
        version: int,
        publish: Callable[[], None],
        while_waiting: Callable[[], None] = lambda: None,
    ) -> list[str]:
        """Broadcast `weights` (a full state dict) as policy `version` to every server that
        answers, then `publish()`; the servers that were down. Raises (RuntimeError, httpx errors;
        WeightSyncTimeout past the timeout) when it failed: nothing published, every server keeps
        what it served."""
        return self.admin.update(lambda live: self._load(live, weights, version, while_waiting), publish)

    def _load(self, live: list[str], weights, version: int, while_waiting) -> list[str]:
        import httpx

        down, reported = [], {}
        for url in live:
            try:
                reported[url] = self.admin.weight_version(url)
            except (httpx.ConnectError, httpx.RemoteProtocolError):
                down.append(url)
        servers = [url for url in live if url not in down]
        if not servers:
            return down
        try:
            if needs_new_group(self.membership, servers, reported):
                self._form(servers, while_waiting)
            self._broadcast(weights, version, while_waiting)
        except (WeightSyncTimeout, CollectiveTimeout) as exc:
            self.close()
            raise WeightSyncTimeout(
                f"the weight update to policy version {version} ({', '.join(servers)}) is stuck: {exc} "
                f"(trainer.weight_sync_timeout_s={self.timeout_s:g}); a vLLM server stopped taking part, "
                "the trainer exits to be restarted"
            ) from exc
        except Exception as exc:
            self.close()
            raise RuntimeError(f"weight broadcast of v{version} to {', '.join(servers)} failed: {exc}") from exc
        return down

    def _form(self, servers: list[str], while_waiting) -> None:
        self.close()
        if self._store is None:
            self._store = serve_store(self.host, self.port, len(servers) + 1, self.timeout_s)
        self.formations += 1
        namespace, store = f"{self.prefix}formation-{self.formations}/", self._store
        log.info(
            "forming the weight broadcast group at %s:%d (%s) with %s",
            self.host,
            self.port,
            namespace,
            ", ".join(servers),
        )
        for rank, url in enumerate(servers, start=1):  # each answers at once and joins in the background
            self.admin.join_broadcast(
                url, self.host, self.port, rank, len(servers) + 1, self.transport, self.timeout_s, namespace
            )
        forming = in_thread(
            lambda: WeightBroadcaster(
                self.host, self.port, len(servers), self.transport, self.timeout_s, namespace, store
            )
        )
        since = (time.monotonic(), "forming the group")
        self.sender = self._watched(forming, lambda: since, while_waiting)
        self.membership = Membership(tuple(servers))

    def _broadcast(self, weights, version: int, while_waiting) -> None:
        assert self.membership is not None and self.sender is not None
        info = {"timeout_s": self.timeout_s}
        receiving = [
            in_thread(functools.partial(self.admin.load, url, info, version, self.timeout_s))
            for url in self.membership.servers
        ]
        sender = self.sender
        sent = self._watched(in_thread(lambda: sender.send(weights)), lambda: sender.activity.doing, while_waiting)
        results(receiving, while_waiting)
        self.membership = replace(self.membership, label=version_label(version))
        log.info("weights v%d broadcast (%.1f MB) to %d server(s)", version, sent / 1e6, len(self.membership.servers))

    def _watched(self, future: Future, doing: Callable[[], tuple[float, str] | None], while_waiting):
        """`future`'s result, `while_waiting()` about once a second meanwhile. WeightSyncTimeout once
        what `doing()` says (since when, what) has lasted past the timeout: the backend's own
        timeout is the first bound, this one holds where it does not (NCCL's blocking init)."""
        while wait([future], timeout=1.0).not_done:
            while_waiting()
            current = doing()
            if current is not None and time.monotonic() - current[0] > self.timeout_s:
                raise WeightSyncTimeout(f"{current[1]} did not complete in {self.timeout_s:g} s")
        return future.result()

    def close(self) -> None:
        """Forget the group (the store stays: the next formation uses it under a new namespace)."""
        self.sender, self.membership = None, None
