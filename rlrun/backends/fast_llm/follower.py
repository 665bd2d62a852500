"""rlrun::weights — makes the vLLM servers serve every policy Fast-LLM broadcasts (trainer=fast_llm;
its process: `rlrun/entrypoints/weights.py`).

At each join request (before every trainer start) the servers join the new trainer's group; on
each `weights_ready` that fits the run (`events.py`) they receive the broadcast, then the step is
published as the policy version. Progress is kept in Redis: a restart neither repeats nor skips.
"""

from __future__ import annotations

import logging
import os
import time

import httpx

from rlrun.backends.fast_llm.config import broadcast_backend
from rlrun.backends.fast_llm.events import EventJudge, stream_id_after
from rlrun.backends.fast_llm.protocol import WeightsReady
from rlrun.config.schema import TrainerConfig
from rlrun.inference.admin import VllmAdmin, in_thread, results
from rlrun.streams import names

log = logging.getLogger("rlrun.weights")

BLOCK_MS = 500  # how long one read of the events stream waits (the heartbeat beats between reads)
JOIN_CALL_TIMEOUT_S = 30.0  # a join only starts a thread in the worker: it answers at once


def last_id(redis, stream: str) -> str:
    """The id of `stream`'s newest entry ("0-0": none): what is read after it is newer, by the
    server's own ids (never by a clock of ours, which may differ from an external Redis's)."""
    last = redis.xrevrange(stream, count=1)
    return last[0][0] if last else "0-0"


def request_join(redis, events_stream: str, start_step: int | None = None) -> str:
    """Before (re)starting Fast-LLM: ask the follower for a new join (`start_step`: the step the new
    trainer resumes from, None: unknown). Returns `join_after`: what follows it is the new trainer's."""
    after = last_id(redis, events_stream)
    with redis.pipeline(transaction=True) as tx:
        tx.hincrby(names.WEIGHTS_STATE, "join_request", 1)
        tx.hset(names.WEIGHTS_STATE, "join_after", after)
        if start_step is None:
            tx.hdel(names.WEIGHTS_STATE, "join_step")
        else:
            tx.hset(names.WEIGHTS_STATE, "join_step", start_step)
        tx.execute()
    return after


class VllmBroadcastAdmin(VllmAdmin):
    def __init__(self, urls: list[str], receive_timeout_s: float, api_key: str = "") -> None:
        super().__init__(urls, httpx.Timeout(JOIN_CALL_TIMEOUT_S, read=receive_timeout_s + 30.0), api_key=api_key)
        self.receive_timeout_s = receive_timeout_s

    def join(self, host: str, port: int, backend: str, timeout_s: float, servers: list[str] | None = None) -> list[str]:
        """Ask `servers` (default: all) to join; returns those that could not be asked (down)."""
        world_size = len(self.urls) + 1
        failed = []
        for rank, url in enumerate(self.urls, start=1):
            if servers is not None and url not in servers:
                continue
            try:
                self.join_broadcast(url, host, port, rank, world_size, backend, timeout_s)
            except (httpx.HTTPError, RuntimeError) as exc:
                log.warning("vLLM %s could not be asked to join the broadcast (%s); asking again shortly", url, exc)
                failed.append(url)
        return failed

    def receive(self, servers: list[str], step: int, while_waiting=lambda: None) -> list[str]:
        """Every one of `servers` receives the broadcast of `step` at once, labelled `step`. Fast-LLM
        sends to every member of its group: with one down nobody is asked to receive (the others
        resume at once instead of waiting for the collective to time out). `while_waiting` (the
        heartbeat) is called about once a second meanwhile."""
        missing = [url for url in self.urls if url not in servers]
        if missing:
            raise RuntimeError(
                f"vLLM {', '.join(missing)} does not answer: Fast-LLM's broadcast needs every server of its group"
            )
        info = {"timeout_s": self.receive_timeout_s}
        calls = [lambda url=url: self.load(url, info, step, self.receive_timeout_s) for url in servers]
        results([in_thread(call) for call in calls], while_waiting)
        return []


class WeightFollower:
    """`trainer`: the trainer section (trainer.fast_llm's broadcast and events stream, the step
    target); `model_dtype` (model.dtype): float16 lets Fast-LLM skip steps (loss scaling)."""

    def __init__(
        self,
        trainer: TrainerConfig,
        redis,
        admin: VllmBroadcastAdmin,
        broadcast_host: str,
        broadcast_port: int,
        host_store: bool = False,
        *,
        model_dtype: str,
    ) -> None:
        self.redis, self.admin = redis, admin
        self.host_store = host_store
        self._store: object | None = None  # the broadcast's TCP store, when this process serves it
        self.broadcast = (broadcast_host, broadcast_port, broadcast_backend(trainer), trainer.fast_llm.timeout_s)
        self.stream = trainer.fast_llm.events_stream
        state = redis.hgetall(names.WEIGHTS_STATE) or {}
        self.last_id = state.get("last_event_id", "0")
        self.counters = {
            key: int(state.get(key, 0))
            for key in ("broadcasts_loaded", "broadcasts_failed", "joins", "events_rejected")
        }
        self.judge = EventJudge(trainer.max_train_steps, skips_possible=model_dtype == "float16")
        self._last_heartbeat = 0.0
        self._join_pending: tuple[str, list[str]] | None = None  # (request, servers still to ask)

    def run_forever(self) -> None:
        while True:
            self.step()

    def step(self) -> None:
        self._heartbeat()
        state = self.redis.hgetall(names.WEIGHTS_STATE) or {}
        request, after = state.get("join_request"), state.get("join_after")
        if request and state.get("joined") != request:
            self._join(request)
        if after != self.judge.attempt.after:  # a new trainer (or this follower restarted)
            step = state.get("join_step")
            # A restarted follower goes on from the last step it accepted of the same trainer.
            last = state.get("last_step") if state.get("last_step_after") == after else None
            self.judge.new_attempt(after, int(step) if step else None, int(last) if last else None)
        reply = self.redis.xread({self.stream: self.last_id}, count=100, block=BLOCK_MS)
        for _stream, messages in reply or []:
            for message_id, fields in messages:
                self._handle(message_id, fields, after)
                self.last_id = message_id
                progress = {"last_event_id": message_id, **self.counters}
                if after is not None and self.judge.attempt.last_step is not None:
                    progress.update(last_step=self.judge.attempt.last_step, last_step_after=after)
                self.redis.hset(names.WEIGHTS_STATE, mapping=progress)

    def _join(self, request: str) -> None:
        """Ask the servers not asked yet for this request; `joined` once every one was."""
        host, port, backend, timeout_s = self.broadcast
        pending = self._join_pending[1] if self._join_pending and self._join_pending[0] == request else None
        if pending is None:
            if self.host_store:
                self._serve_store(host, port, len(self.admin.urls) + 1)
            log.info(
                "asking %d vLLM server(s) to join the trainer's broadcast group at %s:%d (%s)",
                len(self.admin.urls),
                host,
                port,
                backend,
            )
        failed = self.admin.join(host, port, backend, timeout_s, servers=pending)
        if failed:  # a server down (restarting): asked again at the next turn
            self._join_pending = (request, failed)
            return
        self._join_pending = None
        self.counters["joins"] += 1
        self.redis.hset(names.WEIGHTS_STATE, mapping={"joined": request, "joins": self.counters["joins"]})

    def _serve_store(self, host: str, port: int, world_size: int) -> None:
        from rlrun.weights.broadcast import serve_store

        self._store = None  # the old server stops with its last reference
        self._store = serve_store(host, port, world_size, self.broadcast[3])
        log.info("serving the weight broadcast's TCP store at %s:%d (Fast-LLM's rank 0 is its client)", host, port)

    def _handle(self, message_id: str, fields: dict, join_after: str | None) -> None:
        if join_after is None or not stream_id_after(message_id, join_after):
            log.info("skipping event %s: it came from an earlier trainer", message_id)
            return
        event, why = self.judge.judge(message_id, fields)
        if why is not None:  # never acted on: the servers keep what they serve
            self.counters["events_rejected"] += 1
            log.warning("ignored event %s on %s: %s", message_id, self.stream, why)
        elif isinstance(event, WeightsReady):
            self._load(message_id, event.step)

    def _load(self, event_id: str, step: int) -> None:
        started = time.perf_counter()
        try:
            publish = lambda: self.redis.set(names.POLICY_VERSION, step)  # noqa: E731
            # Paused with their requests kept, loaded, the step published, resumed (admin.update).
            self.admin.update(lambda live: self.admin.receive(live, step, self._heartbeat), publish)
            self.counters["broadcasts_loaded"] += 1
            log.info("vLLM serves step %d (event %s, %.2f s)", step, event_id, time.perf_counter() - started)
        except (httpx.HTTPError, RuntimeError) as exc:  # never raises (admin.update resumed every paused server)
            self.counters["broadcasts_failed"] += 1
            log.error("the broadcast of step %d was not loaded (%s); the servers keep the previous weights", step, exc)

    def _heartbeat(self) -> None:
        now = time.time()
        if now - self._last_heartbeat >= 1.0:
            self.redis.hset(names.WEIGHTS_STATE, mapping={"pid": os.getpgrp(), "heartbeat": now})
            self._last_heartbeat = now
