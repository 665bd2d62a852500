"""The actor process: `python -m rlrun.actor.main --run-dir RUN --redis-url URL --vllm-url URL...`.

It hands out prompts in a seeded order, samples a group of completions per prompt from vLLM
(streamed, token ids in and out), scores them, computes group-normalised advantages and
publishes each finished group to the trainer's stream. It stays at most `actor.max_steps_ahead`
optimizer steps ahead of the trainer, and exits once the trainer announces `training_done`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import time
from pathlib import Path

import httpx

from rlrun.actor.sampling import SampleState, close_if_spent, remaining_budget
from rlrun.actor.vllm_client import stream_completion
from rlrun.config import RunConfig, load_resolved
from rlrun.data.tasks import Task, load_task
from rlrun.rollouts import Group, Sample
from rlrun.rundir import RunDir
from rlrun.streams import names
from rlrun.streams.codec import encode
from rlrun.streams.server import connect
from rlrun.trainer.advantages import group_advantages

log = logging.getLogger("rlrun.actor")

RETRY_DELAY_S = 1.0


class Actor:
    def __init__(
        self, cfg: RunConfig, redis, tokenizer, task: Task, server_urls: list[str], run_name: str, api_key: str = ""
    ) -> None:
        self.api_key = api_key
        self.cfg, self.redis, self.tokenizer, self.task = cfg, redis, tokenizer, task
        self.urls = server_urls
        self.run_name = run_name
        self.cursor = 0  # prompts handed out so far
        self.order = list(range(len(task.problems)))
        self._failure: BaseException | None = None
        self._last_heartbeat = 0.0
        self.counters = {"groups_published": 0, "tokens_generated": 0, "samples_continued": 0, "request_errors": 0}

    # --- the loop ------------------------------------------------------------------------------
    async def run(self) -> None:
        self._restore_progress()
        limits = httpx.Limits(max_connections=self.cfg.actor.max_concurrent_groups * self.cfg.algo.group_size)
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        async with httpx.AsyncClient(limits=limits, timeout=self.cfg.actor.request_timeout_s, headers=headers) as client:
            running: set[asyncio.Task] = set()
            while not self._training_done():
                self._heartbeat()
                if len(running) >= self.cfg.actor.max_concurrent_groups:
                    # Wake as soon as a slot frees up, not on a timer: groups are short.
                    await asyncio.wait(running, timeout=0.5, return_when=asyncio.FIRST_COMPLETED)
                    continue
                if not self._room_for_another_group(len(running)):
                    await asyncio.sleep(0.02)
                    continue
                task = asyncio.create_task(self._group(client, self.cursor))
                running.add(task)
                task.add_done_callback(running.discard)
                task.add_done_callback(self._note_failure)
                self.cursor += 1
                self.redis.hset(names.ACTOR_STATE, "cursor", self.cursor)  # a restart neither skips nor repeats prompts
                if self._failure is not None:
                    raise self._failure
            for task in running:
                task.cancel()
        log.info("trainer announced training_done; actor stops after %d groups", self.counters["groups_published"])

    def _note_failure(self, task: asyncio.Task) -> None:
        """A group task that raised something unexpected stops the actor (the supervisor sees it)."""
        if not task.cancelled() and task.exception() is not None:
            self._failure = task.exception()

    def _trainer(self) -> dict:
        return self.redis.hgetall(names.TRAINER_STATE) or {}

    def _training_done(self) -> bool:
        return self._trainer().get("training_done") == "1"

    def _restore_progress(self) -> None:
        state = self.redis.hgetall(names.ACTOR_STATE) or {}
        self.cursor = int(state.get("cursor", 0))
        self.counters["groups_published"] = int(state.get("groups_published", 0))

    def _heartbeat(self) -> None:
        now = time.time()
        if now - self._last_heartbeat >= 1.0:
            self.redis.hset(names.ACTOR_STATE, mapping={"pid": os.getpgrp(), "heartbeat": now})
            self._last_heartbeat = now

    def _room_for_another_group(self, in_flight: int) -> bool:
        """Back-pressure: groups for at most `max_steps_ahead` steps beyond the trainer's next.

        Counted as published + in flight (not prompts handed out), so groups lost with a
        crashed actor do not leave the trainer waiting for data that never comes.
        """
        step = int(self._trainer().get("step", 0))
        allowed = (step + 1 + self.cfg.actor.max_steps_ahead) * self.cfg.groups_per_step
        return self.counters["groups_published"] + in_flight < allowed

    def _problem_index(self, cursor: int) -> int:
        """A fresh seeded permutation of the problems for every pass over the data."""
        epoch, position = divmod(cursor, len(self.order))
        order = list(range(len(self.order)))
        random.Random(self.cfg.run.seed * 1_000_003 + epoch).shuffle(order)
        return order[position]

    # --- one group -----------------------------------------------------------------------------
    async def _group(self, client: httpx.AsyncClient, cursor: int) -> None:
        problem_index = self._problem_index(cursor)
        problem = self.task.problems[problem_index]
        prompt_ids = self.tokenizer.encode(problem.prompt, add_special_tokens=False)
        url = self.urls[cursor % len(self.urls)]
        size, budget = self.cfg.algo.group_size, self.cfg.actor.max_new_tokens
        samples = [SampleState(index=i) for i in range(size)]
        while True:
            for sample in samples:
                close_if_spent(sample, budget)
            pending = [s for s in samples if not s.finished]
            if not pending:
                break
            try:
                if len(pending) == size and all(not s.completion_ids for s in pending):
                    await self._request(client, url, prompt_ids, pending)  # the whole group at once
                else:
                    self.counters["samples_continued"] += len(pending)
                    await asyncio.gather(*(self._request(client, url, prompt_ids, [s]) for s in pending))
            except (httpx.HTTPError, RuntimeError, ValueError) as exc:
                self.counters["request_errors"] += 1
                log.warning("group %d: request to %s failed (%s); continuing from the tokens kept", cursor, url, exc)
                await asyncio.sleep(RETRY_DELAY_S)
        self._publish(cursor, problem_index, prompt_ids, samples, problem.answer)

    async def _request(self, client, url: str, prompt_ids: list[int], samples: list[SampleState]) -> None:
        """One streamed request for `samples`: all fresh (n = len) or one continued sample."""
        version = int(self.redis.get(names.POLICY_VERSION) or 0)
        prefix = samples[0].completion_ids if len(samples) == 1 else []
        by_index = {i: s for i, s in enumerate(samples)}
        for sample in samples:
            sample.finish_reason = None  # an earlier abort is being continued
            sample.requests += 1
        async for delta in stream_completion(
            client,
            url,
            list(prompt_ids) + list(prefix),
            n=len(samples),
            max_tokens=remaining_budget(samples[0], self.cfg.actor.max_new_tokens),
            temperature=self.cfg.actor.temperature,
            timeout_s=self.cfg.actor.request_timeout_s,
        ):
            sample = by_index[delta.index]
            sample.append(delta.token_ids, delta.logprobs, version)
            self.counters["tokens_generated"] += len(delta.token_ids)
            if delta.finish_reason is not None:
                sample.finish_reason = delta.finish_reason

    def _publish(self, cursor: int, problem_index: int, prompt_ids: list[int], samples: list[SampleState], answer: str) -> None:
        texts = [self.tokenizer.decode(s.completion_ids, skip_special_tokens=True) for s in samples]
        rewards = [self.task.reward(text, answer) for text in texts]
        advantages = group_advantages(rewards, self.cfg.algo.normalize_advantage_std)
        group = Group(
            group_id=f"{self.run_name}/{cursor}",
            prompt_index=problem_index,
            prompt_ids=list(prompt_ids),
            samples=[
                Sample(s.index, s.completion_ids, s.logprobs, s.versions, s.finish_reason or "length", r, a)
                for s, r, a in zip(samples, rewards, advantages)
            ],
        )
        with self.redis.pipeline(transaction=True) as tx:  # the message and its count land together
            tx.xadd(names.GROUPS_STREAM, {"data": encode(group.to_dict())})
            tx.hincrby(names.ACTOR_STATE, "groups_published", 1)
            tx.execute()
        self.counters["groups_published"] += 1
        others = {k: v for k, v in self.counters.items() if k != "groups_published"}
        self.redis.hset(names.ACTOR_STATE, mapping=others)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlrun::actor")
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--vllm-url", action="append", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    from transformers import AutoTokenizer

    run_dir = RunDir(args.run_dir)
    cfg = load_resolved(run_dir.config)
    redis = connect(args.redis_url, run_dir.redis_password.read_text().strip())
    tokenizer = AutoTokenizer.from_pretrained(args.model_path)
    task = load_task(cfg.dataset, cfg.run.seed)
    api_key = run_dir.vllm_api_key.read_text().strip() if run_dir.vllm_api_key.is_file() else ""
    actor = Actor(cfg, redis, tokenizer, task, args.vllm_url, run_name=run_dir.root.name, api_key=api_key)
    asyncio.run(actor.run())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
