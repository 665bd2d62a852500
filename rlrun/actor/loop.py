"""The actor: opens groups while back-pressure allows and completes each (its process:
`rlrun/entrypoints/actor.py`, one per actor.num_actors).

It samples a group of completions per prompt from vLLM (one request per group, token ids in and
out), has the task's rewards score them in worker processes (`rlrun/task/pool.py`: never in this
event loop) and publishes each finished group to the trainer's stream. Actor 0 also samples the
held-out evaluation when a version is due (`evaluator.py`). Every token goes to
the token journal as it arrives, so whatever stops a generation (a lost server, a restart) it is
continued from the tokens already produced; a weight update stops nothing (vLLM keeps the requests
in flight and labels each token with the weights that sampled it). It stays at most `actor.max_steps_ahead` steps
ahead of the trainer and stops once the trainer says `training_done`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from pathlib import Path
from typing import Callable

import httpx

from rlrun.actor.conversation import Conversations, take_step, turn_budget
from rlrun.actor.evaluator import Evaluator
from rlrun.actor.ledger import JournalLedger, MemoryLedger, flush
from rlrun.actor.partition import prompt_position
from rlrun.actor.replay import resume
from rlrun.actor.sampling import LiveGroup, SampleState, close_if_spent, count_kept, remaining_budget, token_versions
from rlrun.actor.trainer_view import TrainerView
from rlrun.actor.vllm_client import generate
from rlrun.config.schema import ActorConfig, AlgoConfig
from rlrun.errors import ConfigError
from rlrun.inference.auth import bearer_header
from rlrun.journal.plan import is_stale, plan_replay
from rlrun.journal.records import FINAL_REASONS
from rlrun.rules.advantages import group_advantages
from rlrun.streams import names
from rlrun.streams.rollouts import Group, Sample
from rlrun.task.pool import Scorer
from rlrun.task.rewards import GroupCall, SampleInfo
from rlrun.task.tasks import Messages, Task, problem_index

log = logging.getLogger("rlrun.actor")

RETRY_DELAY_S = 1.0
PROGRESS_LOG_S = 60.0  # how often the actor's log says how far it got (its heartbeat is every second)


def _text(prompt: str | Messages) -> str:
    """A prompt without a chat template: text (the task's checks refuse conversations without one)."""
    assert isinstance(prompt, str)
    return prompt


class Actor:
    """`settings`: the actor section; `algo`: the group size and how advantages are normalised;
    `seed` (run.seed): the order of the problems. The rest of the config it never reads."""

    def __init__(
        self,
        settings: ActorConfig,
        algo: AlgoConfig,
        redis,
        tokenizer,
        task: Task,
        server_urls: list[str],
        ledger: JournalLedger | MemoryLedger,
        run_name: str,
        api_key: str = "",
        *,
        seed: int,
        trainer: TrainerView,
        scorer: Scorer,
        actor_index: int = 0,
        render_prompt: Callable[[str | Messages], str] | None = None,
        evaluator: Evaluator | None = None,
        conversations: Conversations | None = None,
        generating: Callable[[bool], None] | None = None,
    ) -> None:
        self.settings, self.algo, self.seed = settings, algo, seed
        self.redis, self.tokenizer, self.task = redis, tokenizer, task
        self.scorer, self.evaluator = scorer, evaluator  # the rewards' worker pool; actor 0's evaluation (None: none)
        self.render_prompt = render_prompt or _text  # model.chat_template: the model's chat format
        self.conversations = conversations  # environment.step: rollouts of several turns (None: one turn)
        self.trainer = trainer  # the run's bound backend's view (built once, by the role's entry point)
        self.index, self.num_actors = actor_index, settings.num_actors
        self.state_key = names.actor_state(actor_index, settings.num_actors)  # its own progress hash
        self.urls = server_urls
        self.ledger = ledger
        self.run_name = run_name
        self.api_key = api_key
        self.audit_path: Path | None = None  # set when actor.audit is on
        self._failure: BaseException | None = None
        self._last_heartbeat = 0.0
        self._last_progress: tuple[float, dict[str, int]] = (
            0.0,
            {},
        )  # when it last logged progress, and its counters then
        self._in_flight, self._busy_since = 0, 0.0  # requests in flight, and since when some were
        self._generating = generating or (lambda busy: None)  # told on each change (world.cpu_affinity=by_need)
        self._generating(False)  # a restarted actor has nothing in flight, whatever its predecessor said
        self._held_since = 0.0  # since when back-pressure has kept it from opening a group (0: it is not)
        self.counters = {  # whole-run counts, published in ACTOR_STATE (see _continue_counters)
            "groups_published": 0,
            "tokens_generated": 0,  # streamed from vLLM
            "tokens_reused": 0,  # kept from the journal at a (re)start of the actor, not regenerated
            "samples_continued": 0,  # of those, generated on from their prefix
            "tokens_kept_on_retry": 0,  # left by a failed request and kept for the next (each token once)
            "samples_continued_on_retry": 0,  # samples a failed request left with new tokens, continued
            "tokens_regenerated": 0,  # dropped (stale or unreadable) and generated again
            "prefixes_dropped_stale": 0,
            "requests": 0,  # generation requests sent to vLLM (per group: 1 but after a failure or a restart)
            "generating_ms": 0,  # wall time with at least one request in flight (vLLM had work)
            "journal_corrupt_records": 0,
            "request_errors": 0,
            "groups_dropped": 0,  # not trained on: a reward failed and reward.on_error=drop_group
        }
        if conversations is not None:  # environment.step: its steps, counted like the tokens
            self.counters.update(
                {
                    "env_steps": 0,  # steps the environment ran (tool calls, feedback, the last step's reward)
                    "env_steps_reused": 0,  # answers kept from the journal at a (re)start of the actor, not run again
                    "env_steps_rerun": 0,  # steps a crash cut, run again (the step function allows it)
                    "env_steps_interrupted": 0,  # steps a crash cut, not run again (rerun_interrupted=False): the model is told
                    "env_step_timeouts": 0,  # steps stopped at environment.timeout_s: the model is told
                    "env_step_errors": 0,  # steps that raised: the conversation ends with reward 0
                    "observations_truncated": 0,  # cut to environment.max_observation_tokens, saying so
                }
            )

    async def run(self) -> None:
        self._continue_counters()
        self._last_progress = (time.time(), dict(self.counters))
        resumed = self._replay_plan()
        limits = httpx.Limits(max_connections=self.settings.max_concurrent_groups * self.algo.group_size)
        headers = bearer_header(self.api_key) if self.api_key else {}
        await self.scorer.pool.start()
        if self.conversations is not None:
            await self.conversations.pool.start()
        async with httpx.AsyncClient(limits=limits, timeout=self.settings.request_timeout_s, headers=headers) as client:
            running: set[asyncio.Task] = set()
            evaluating: set[asyncio.Task] = set()

            def launch(coro) -> None:
                task = asyncio.create_task(coro)
                running.add(task)
                task.add_done_callback(running.discard)
                task.add_done_callback(self._note_failure)

            try:
                for live in resumed:  # interrupted groups first, from the tokens they already have
                    launch(self._complete(client, live))
                while not self.trainer.done():
                    self._heartbeat(len(running))
                    if self._failure is not None:
                        raise self._failure
                    if self.evaluator is not None and not evaluating:
                        version = self.trainer.policy_version()
                        if self.evaluator.due(version):
                            task = asyncio.create_task(self._evaluate(client, version))
                            evaluating.add(task)
                            task.add_done_callback(evaluating.discard)
                    if len(running) >= self.settings.max_concurrent_groups:
                        # Wake as soon as a slot frees up, not on a timer: groups are short.
                        await asyncio.wait(running, timeout=0.5, return_when=asyncio.FIRST_COMPLETED)
                        continue
                    if not self.trainer.window(len(running)).room:  # back-pressure
                        self._held_since = self._held_since or time.time()
                        await asyncio.sleep(0.02)
                        continue
                    self._held_since = 0.0
                    launch(self._complete(client, self._open_group()))
            finally:  # done, failed or stopped (SIGTERM): the groups in flight end before their client
                for task in running | evaluating:
                    task.cancel()
                await asyncio.gather(*running, *evaluating, return_exceptions=True)
                await self.scorer.pool.close()
                if self.conversations is not None:
                    await self.conversations.pool.close()
        log.info("trainer said training_done; actor stops (%s)", self.counters)

    async def _evaluate(self, client: httpx.AsyncClient, version: int) -> None:
        """One evaluation; a failed request is logged and the version tried again on a later loop."""
        assert self.evaluator is not None  # called only with one
        try:
            await self.evaluator.evaluate(client, version)
        except (httpx.HTTPError, RuntimeError, ValueError) as exc:
            if refused(exc):  # every retry would be refused the same way: stop, naming it
                self._failure = ConfigError(
                    f"vLLM refused the evaluation's request: {exc}. Change the eval.* setting it names."
                )
                return
            log.warning("evaluation of policy version %d failed (%s): it starts again", version, exc)
            await asyncio.sleep(RETRY_DELAY_S)

    def _continue_counters(self) -> None:
        """Count for the whole run: go on from what the last actor published at its last heartbeat."""
        published = self.redis.hgetall(self.state_key) or {}
        for key, value in published.items():
            if key in self.counters and str(value).isdigit():
                self.counters[key] = int(value)
            elif key.startswith(("reward_errors.", "reward_timeouts.")) and str(value).isdigit():
                self.scorer.counters[key] = int(value)

    def _note_failure(self, task: asyncio.Task) -> None:
        """A group task that raised something unexpected stops the actor (the supervisor sees it)."""
        if not task.cancelled() and task.exception() is not None:
            self._failure = task.exception()

    def _heartbeat(self, in_flight: int) -> None:
        """Its pid, counters and, for the diagnostics of a stalled run, its groups in flight and since
        when back-pressure has held it (0: not held)."""
        now = time.time()
        if now - self._last_heartbeat >= 1.0:
            waiting = {"in_flight": in_flight, "held_by_backpressure_since": self._held_since}
            counts = {**self.counters, **self.scorer.counters}
            self.redis.hset(self.state_key, mapping={"pid": os.getpgrp(), "heartbeat": now, **waiting, **counts})
            self._last_heartbeat = now
        since, before = self._last_progress
        if now - since >= PROGRESS_LOG_S:
            held_s = now - self._held_since if self._held_since else 0.0
            log.info("%s", progress_line(self.counters, before, now - since, in_flight, held_s))
            self._last_progress = (now, dict(self.counters))

    def _problem_index(self, cursor: int) -> int:
        position = prompt_position(cursor, self.index, self.num_actors)
        return problem_index(position, len(self.task.problems), self.seed)

    def _prompt_ids(self, problem_index: int) -> list[int]:
        prompt = self.task.problems[problem_index].prompt
        if self.conversations is not None:  # the chat template shows the tools, where there are some
            text = self.conversations.turns.prompt_text(prompt, self.conversations.tools or None)
        else:
            text = self.render_prompt(prompt)
        return self.tokenizer.encode(text, add_special_tokens=False)

    @property
    def _budget(self) -> int:
        """A group's token budget per sample: a conversation's whole, or one completion's."""
        return self.conversations.limits.max_total_tokens if self.conversations else self.settings.max_new_tokens

    def _open_group(self) -> LiveGroup:
        h = self.ledger.open_next(
            self._problem_index, self._prompt_ids, self.algo.group_size, self._budget, self.run_name
        )
        samples = [SampleState(index=i) for i in range(h.group_size)]
        return LiveGroup(h.group_id, h.cursor, h.prompt_index, list(h.prompt_ids), h.max_new_tokens, samples)

    def _replay_plan(self) -> list[LiveGroup]:
        groups, corrupt = self.ledger.load_open_groups()
        for key, reason in corrupt:
            assert isinstance(self.ledger, JournalLedger)  # a MemoryLedger replays nothing
            if ":group:" in key:
                what = "that group is quarantined (its prompt is skipped; its keys are kept)"
                self.ledger.quarantine(key.split(":group:", 1)[1])
            elif reason.endswith(("skipped", "ignored")):
                what = "the entry is ignored"
            else:
                what = "that sample is generated again"
            log.warning("journal record %s is unreadable (%s): %s", key, reason, what)
        self.counters["journal_corrupt_records"] += len(corrupt)
        version, staleness = self.trainer.policy_version(), self.settings.max_prefix_staleness
        talking = self.conversations is not None
        plan = plan_replay(groups, current_version=version, max_prefix_staleness=staleness, conversations=talking)
        resumed = resume(plan, conversations=talking)
        if talking:  # every answer the journal holds is used as it is
            self.counters["env_steps_reused"] += sum(len(s.observations) for g in resumed.groups for s in g.samples)
        for group_id, index in resumed.resets:
            self.ledger.reset(group_id, index)
        self.counters["tokens_reused"] += resumed.tokens_reused
        self.counters["samples_continued"] += resumed.samples_continued
        self.counters["tokens_regenerated"] += plan.counters.tokens_dropped_stale
        self.counters["prefixes_dropped_stale"] += plan.counters.prefixes_dropped_stale
        if plan.groups:
            log.info(
                "replaying the journal: %d groups, %d tokens kept, %d samples continued, %s",
                len(plan.groups),
                resumed.tokens_reused,
                resumed.samples_continued,
                plan.counters,
            )
        return resumed.groups

    async def _complete(self, client: httpx.AsyncClient, group: LiveGroup) -> None:
        """Generate until every sample is finished, journaling as it goes; then publish once."""
        budget = group.max_new_tokens
        failures = 0
        while True:
            # Groups spread over the servers by cursor; after a failure the group moves on to the
            # next server (the failed one may be restarting), continuing from the tokens kept.
            url = self.urls[(group.cursor + failures) % len(self.urls)]
            version = self.trainer.policy_version()
            if self.conversations is not None:
                await self._answer_turns(group)
            else:
                for sample in group.samples:
                    if failures and is_stale(sample, version, self.settings.max_prefix_staleness):
                        self._drop_stale(group, sample)  # (a replay's prefixes were judged by its plan)
                    close_if_spent(sample, budget)  # recorded by the flush below
            pending = [s for s in group.samples if not s.finished]
            if not pending:
                break
            # The samples that start from the prompt in one request (n of them); one request for each
            # continued from a prefix of its own (after a lost request or a restart, or the next
            # turn of a conversation: its prompt is the conversation so far).
            fresh = [s for s in pending if not s.completion_ids]
            requests = ([fresh] if fresh else []) + [[s] for s in pending if s.completion_ids]
            try:
                # Wait for every request before retrying any: a retry must never run beside
                # a request still streaming into the same sample.
                outcomes = await asyncio.gather(
                    *(self._request(client, url, group, samples, version) for samples in requests),
                    return_exceptions=True,
                )
                failed = [o for o in outcomes if isinstance(o, BaseException)]
                if failed:
                    raise failed[0]
            except (httpx.HTTPError, RuntimeError, ValueError) as exc:
                if refused(exc):
                    raise ConfigError(
                        f"vLLM refused the actor's request: {exc}. It would refuse every retry the same way: "
                        "change the setting it names (inference.extra_args, actor.max_new_tokens, model.max_model_len, "
                        "algo.group_size ...)."
                    ) from exc
                self.counters["request_errors"] += 1
                self._count_interrupted(pending)
                failures += 1
                log.warning(
                    "group %s: request to %s failed (%s); continuing from the tokens kept", group.group_id, url, exc
                )
                await asyncio.sleep(RETRY_DELAY_S)
            finally:
                self._flush(group, group.samples)
        self._flush(group, group.samples)  # finishes decided locally (budget spent)
        await self._publish(group)

    async def _answer_turns(self, group: LiveGroup) -> None:
        """Have the environment answer every turn of `group` that ended (a turn whose budget is
        spent ends here, as "length"); each answer is journaled before the next turn starts."""
        assert self.conversations is not None  # called only in a conversation
        for sample in group.samples:
            if not sample.finished and not sample.step_due and turn_budget(sample, self.conversations.limits) == 0:
                sample.end_turn("length")
        due = [s for s in group.samples if s.step_due]
        if due:
            self._flush(group, due)  # a turn's end is in the journal before its step runs
            await asyncio.gather(*(self._answer(group, s) for s in due))

    async def _answer(self, group: LiveGroup, sample: SampleState) -> None:
        """One step of the environment for `sample`'s last turn, and its answer journaled."""
        decode = lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
        problem = self.task.problems[group.prompt_index]
        assert self.conversations is not None  # called only in a conversation
        await take_step(self.conversations, sample, problem, group.group_id, decode, self.counters)
        self._journal_observation(group, sample, finish=sample.finish_reason if sample.finished else None)

    def _journal_observation(self, group: LiveGroup, sample: SampleState, finish: str | None = None) -> None:
        result = self.ledger.append_observation(group.group_id, sample, finish=finish)
        if result.accepted:
            sample.journaled, sample.finish_recorded = result.length, sample.finished
            self._audit(
                {
                    "kind": "observed",
                    "group": group.group_id,
                    "index": sample.index,
                    "turn": len(sample.turn_ends),
                    **sample.observations[-1],
                    "token_ids": sample.completion_ids[sample.observations[-1]["start"] : result.length],
                }
            )
        else:
            log.error(
                "journal refused an observation of %s/%d (%s): re-reading it",
                group.group_id,
                sample.index,
                result.reason,
            )
            self._resync(group, sample)

    def _count_interrupted(self, samples: list[SampleState]) -> None:
        """What a failed request left: samples continued next from the tokens they hold, each
        token counted once (a retry that added nothing counts nothing; a replay's prefixes were
        counted by the replay)."""
        kept = [n for n in map(count_kept, samples) if n]
        self.counters["samples_continued_on_retry"] += len(kept)
        self.counters["tokens_kept_on_retry"] += sum(kept)

    async def _request(self, client, url: str, group: LiveGroup, samples: list[SampleState], version: int) -> None:
        """One request for `samples`: all starting from the prompt (n = len), or one continued
        from its prefix. Tokens come tagged with `version` (the policy published now) until vLLM's
        spans on each choice's last chunk say which weights sampled them."""
        prefix = samples[0].completion_ids if len(samples) == 1 else []
        actor, talking = self.settings, self.conversations is not None
        for sample in samples:
            sample.finish_reason = None  # an interrupted sample being continued
        if self.conversations is not None:  # the rest of this turn's budget, within the conversation's
            already = len(prefix) - samples[0].turn_start  # this turn's tokens so far
            max_tokens = turn_budget(samples[0], self.conversations.limits)
        else:
            already = len(prefix)
            max_tokens = remaining_budget(samples[0], group.max_new_tokens)
        self.counters["requests"] += 1
        if self.audit_path is not None:
            self._audit(
                {
                    "kind": "request",
                    "group": group.group_id,
                    "indexes": [s.index for s in samples],
                    "prefix": len(prefix),
                }
            )
        if self._in_flight == 0:
            self._busy_since = time.monotonic()
            self._generating(True)
        self._in_flight += 1
        try:
            async for delta in generate(
                client,
                url,
                group.prompt_ids + list(prefix),
                n=len(samples),
                max_tokens=max_tokens,
                temperature=actor.temperature,
                timeout_s=actor.request_timeout_s,
                min_tokens=max(0, actor.min_new_tokens - already),
                stream=max_tokens > actor.journal_flush_tokens,  # else the journal needs nothing before the end
                cache_salt=f"v{version}",  # no prompt KV reused from before the last update (architecture.md)
            ):
                sample = samples[delta.index]  # the request's n choices are `samples`, in order
                sample.append(delta.token_ids, delta.logprobs, version)
                self.counters["tokens_generated"] += len(delta.token_ids)
                if delta.finish_reason is not None:  # the choice's last chunk: its versions
                    sent = len(prefix)  # its tokens before this request's
                    sample.relabel(sent, token_versions(delta.spans, len(sample.completion_ids) - sent, version))
                    if not talking:
                        sample.finish_reason = delta.finish_reason
                    elif delta.finish_reason in FINAL_REASONS:  # the turn ended: the environment answers it next
                        sample.end_turn(delta.finish_reason)
                if len(sample.completion_ids) - sample.journaled >= actor.journal_flush_tokens:
                    self._flush(group, [sample])  # long generations: small batches as they come
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self.counters["generating_ms"] += round((time.monotonic() - self._busy_since) * 1000)
                self._generating(False)
            self._flush(group, samples)

    def _flush(self, group: LiveGroup, samples: list[SampleState]) -> None:
        """Append the samples' unjournaled tokens and record their finishes, in one round trip."""
        for f in flush(self.ledger, group.group_id, samples):
            if f.result.accepted:
                self._audit(
                    {
                        "kind": "journaled",
                        "group": group.group_id,
                        "index": f.sample.index,
                        "offset": f.offset,
                        "token_ids": f.sample.completion_ids[f.offset : f.result.length],
                        "logprobs": f.sample.logprobs[f.offset : f.result.length],
                    }
                )
            else:  # our view and the journal's disagree: the journal is the truth
                log.error(
                    "journal refused an append to %s/%d (%s): re-reading it",
                    group.group_id,
                    f.sample.index,
                    f.result.reason,
                )
                self._resync(group, f.sample)

    def _resync(self, group: LiveGroup, sample: SampleState) -> None:
        """Take the journal's view of `sample` (damage elsewhere in the group is logged, not fatal); one that
        reads as empty is reset in the journal too, so its recorded length agrees with the empty log."""
        record, problems = self.ledger.read_group(group.group_id)
        for problem in problems:
            log.warning("re-reading %s: %s", group.group_id, problem)
        stored = next((s for s in record.samples if s.index == sample.index), None) if record else None
        lost = len(sample.completion_ids) - (len(stored.token_ids) if stored else 0)
        self.counters["tokens_regenerated"] += max(0, lost)
        sample.take_journal(stored)
        if stored is not None and not stored.token_ids and not stored.finished:
            self.ledger.reset(group.group_id, sample.index)

    def _drop_stale(self, group: LiveGroup, sample: SampleState) -> None:
        log.info(
            "dropping a stale prefix of %d tokens in %s/%d", len(sample.completion_ids), group.group_id, sample.index
        )
        self.counters["prefixes_dropped_stale"] += 1
        self.counters["tokens_regenerated"] += len(sample.completion_ids)
        self.ledger.reset(group.group_id, sample.index)
        sample.reset()

    async def _publish(self, group: LiveGroup) -> None:
        """Score the group in the reward workers, then deliver it once (a group whose reward failed
        under reward.on_error=drop_group is marked delivered with nothing published)."""
        if self.conversations is not None:  # the environment's rewards, from its last steps
            self._deliver(group, [s.reward or 0.0 for s in group.samples])
            return
        problem = self.task.problems[group.prompt_index]
        texts = [self.tokenizer.decode(s.completion_ids, skip_special_tokens=True) for s in group.samples]
        version = self.trainer.policy_version()
        infos = [
            SampleInfo(s.finish_reason or "length", len(s.completion_ids), s.index, max(s.versions, default=version))
            for s in group.samples
        ]
        call = GroupCall(
            problem.prompt,
            problem.row,
            texts,
            [list(s.completion_ids) for s in group.samples],
            infos,
            conversational=isinstance(problem.prompt, tuple),
        )
        score = await self.scorer.score(call)
        if score.rewards is None:
            stream, _ = self.trainer.destination(Group(group.group_id, group.prompt_index, group.prompt_ids, []))
            if self.ledger.deliver(group.group_id, stream, []) is not None:
                self.counters["groups_dropped"] += 1
                self._audit({"kind": "dropped", "group": group.group_id, "failures": score.failures})
            return
        self._deliver(group, score.rewards)

    def _deliver(self, group: LiveGroup, rewards: list[float]) -> None:
        advantages = group_advantages(rewards, self.algo.normalize_advantage_std)
        message = Group(
            group_id=group.group_id,
            prompt_index=group.prompt_index,
            prompt_ids=group.prompt_ids,
            samples=[
                Sample(
                    s.index,
                    s.completion_ids,
                    s.logprobs,
                    s.versions,
                    s.finish_reason or "length",
                    r,
                    a,
                    observation_spans=s.observation_spans,
                )
                for s, r, a in zip(group.samples, rewards, advantages)
            ],
        )
        stream, messages = self.trainer.destination(message)
        if self.ledger.deliver(group.group_id, stream, messages) is not None:
            self.counters["groups_published"] += 1
            self._audit({"kind": "delivered", **message.to_dict()})

    def _audit(self, record: dict) -> None:
        if self.audit_path is not None:
            with open(self.audit_path, "a") as handle:
                handle.write(json.dumps({"time": time.time(), "pid": os.getpid(), **record}) + "\n")


def progress_line(
    counters: dict[str, int], before: dict[str, int], elapsed_s: float, in_flight: int, held_s: float
) -> str:
    """One line of the actor's log: how far it got in all and over the last `elapsed_s`, and what
    holds it now (`before`: its counters at the previous line, or those it started from)."""
    groups, tokens = counters["groups_published"], counters["tokens_generated"]
    new_groups, new_tokens = groups - before["groups_published"], tokens - before["tokens_generated"]
    line = (
        f"{groups:,} groups published (+{new_groups:,} in {elapsed_s:.0f} s), "
        f"{tokens:,} tokens generated ({new_tokens / max(elapsed_s, 1e-9):,.0f}/s), {in_flight} groups in flight"
    )
    if held_s:
        line += f"; held by back-pressure for {held_s:.0f} s (the trainer is behind)"
    if counters["request_errors"] > before["request_errors"]:
        line += f"; {counters['request_errors'] - before['request_errors']} requests failed"
    return line


def refused(exc: BaseException) -> bool:
    """vLLM answered 4xx: the request itself is wrong (n above --max-num-seqs, a prompt too long, a
    bad key), not the server's state. Timeouts and rate limits (408, 429) pass with time."""
    if not isinstance(exc, httpx.HTTPStatusError):
        return False
    status = exc.response.status_code
    return 400 <= status < 500 and status not in (408, 429)
