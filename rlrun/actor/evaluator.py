"""The held-out evaluation, sampled by actor 0 on the run's vLLM servers while training goes on.

When the policy version vLLM serves is one `rlrun.task.evaluation.is_due` names and no result is
in Redis for it, every eval prompt is sampled (`eval.samples_per_prompt` completions, greedy or at
`eval.temperature`) and scored by the run's rewards. vLLM's `weight_versions` must say that every
token came from that version: the trainer holds the next weight update until the result is in
(`rlrun/trainer/eval_gate.py`), so this holds unless the trainer gave up waiting or a server
restarted under it; then the evaluation is tried again, and after `ATTEMPTS` it is recorded as
abandoned, never half-counted. The result is one field of `names.EVAL_RESULTS`, written once, whole:
an actor killed in the middle leaves nothing, and its successor evaluates that version again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import defaultdict
from typing import Callable

import httpx

from rlrun.actor.conversation import Conversations, take_step, turn_budget
from rlrun.actor.sampling import SampleState, token_versions
from rlrun.actor.vllm_client import VersionSpan, generate
from rlrun.config.schema import EvalConfig
from rlrun.streams import names
from rlrun.task.evaluation import PromptResult, is_due, summarize
from rlrun.task.pool import Scorer
from rlrun.task.rewards import GroupCall, SampleInfo
from rlrun.task.tasks import Problem

log = logging.getLogger("rlrun.actor")

ATTEMPTS = 3  # evaluations of one version cut by a change of weights before it is abandoned


class VersionChanged(Exception):
    """A sample's tokens came from weights other than the version evaluated."""


class Evaluator:
    def __init__(
        self,
        eval_cfg: EvalConfig,
        last_version: int,
        problems: list[Problem],
        encode: Callable[[Problem], list[int]],
        decode: Callable[[list[int]], str],
        scorer: Scorer,
        redis,
        urls: list[str],
        max_new_tokens: int,
        concurrency: int,
        request_timeout_s: float,
        seed: int = 0,
        conversations: Conversations | None = None,
    ) -> None:
        self.cfg, self.last_version, self.scorer, self.redis, self.urls = eval_cfg, last_version, scorer, redis, urls
        self.problems = problems[: eval_cfg.max_prompts] if eval_cfg.max_prompts else problems
        self.encode, self.decode = encode, decode
        self.max_new_tokens = eval_cfg.max_new_tokens or max_new_tokens
        self.concurrency, self.request_timeout_s, self.seed = concurrency, request_timeout_s, seed
        self.conversations = (
            conversations  # environment.step: each sample is a conversation, rewarded by the environment
        )
        self._finished: set[int] = set()  # versions with a result in Redis (asked once each)
        self._attempts: dict[int, int] = {}

    def due(self, version: int) -> bool:
        """Whether `version` still needs its evaluation."""
        if version in self._finished or not is_due(version, self.cfg, self.last_version):
            return False
        if self.redis.hexists(names.EVAL_RESULTS, str(version)):
            self._finished.add(version)
            return False
        return True

    async def evaluate(self, client: httpx.AsyncClient, version: int) -> None:
        """Sample and score every eval prompt at `version`, and write its one result."""
        try:
            result = await self.measure(client, version)
        except VersionChanged as exc:
            self._attempts[version] = self._attempts.get(version, 0) + 1
            if self._attempts[version] < ATTEMPTS:
                log.warning("evaluation of policy version %d cut (%s): it starts again", version, exc)
                return
            result = {"version": version, "abandoned": str(exc), "time": round(time.time(), 3)}
        else:
            log.info(
                "evaluation of policy version %d: %s",
                version,
                {k: v for k, v in result.items() if k not in ("per_source", "correct")},
            )
        self.redis.hset(names.EVAL_RESULTS, str(version), json.dumps(result))
        self._finished.add(version)

    async def measure(self, client: httpx.AsyncClient, version: int) -> dict:
        """The figures of every eval prompt sampled at `version` (VersionChanged when vLLM says a
        token came from other weights); `rlrun eval` measures a checkpoint with it too."""
        started = time.time()
        gate = asyncio.Semaphore(self.concurrency)
        try:  # the first prompt that fails cancels the others: nothing of this evaluation goes on
            async with asyncio.TaskGroup() as group:
                tasks = [
                    group.create_task(self._prompt(client, gate, version, i, p)) for i, p in enumerate(self.problems)
                ]
        except BaseExceptionGroup as failed:
            raise failed.exceptions[0] from None
        figures = summarize([task.result() for task in tasks], self.cfg.pass_threshold)
        return {"version": version, **figures, "eval_s": round(time.time() - started, 3), "time": round(time.time(), 3)}

    async def _prompt(self, client, gate: asyncio.Semaphore, version: int, i: int, problem: Problem) -> PromptResult:
        k = self.cfg.samples_per_prompt
        if self.conversations is not None:
            async with gate:
                samples = await asyncio.gather(*(self._conversation(client, version, i, j, problem) for j in range(k)))
            return PromptResult([s.reward or 0.0 for s in samples], problem.source)
        ids: list[list[int]] = [[] for _ in range(k)]
        finishes: list[str] = [""] * k
        spans: list[list[VersionSpan] | None] = [None] * k
        async with gate:
            async for delta in generate(
                client,
                self.urls[i % len(self.urls)],
                self.encode(problem),
                n=k,
                max_tokens=self.max_new_tokens,
                temperature=self.cfg.temperature,
                timeout_s=self.request_timeout_s,
                min_tokens=0,
                stream=False,
                cache_salt=f"eval-v{version}",
                seed=self.seed + i,  # prompt i's samples: the same random draws at every version
            ):
                ids[delta.index].extend(delta.token_ids)
                if delta.finish_reason is not None:
                    finishes[delta.index], spans[delta.index] = delta.finish_reason, delta.spans
        for sample_ids, sample_spans in zip(ids, spans):
            if sample_ids and set(token_versions(sample_spans, len(sample_ids), version)) != {version}:
                raise VersionChanged(f"vLLM sampled an eval prompt with weights other than version {version}")
        infos = [SampleInfo(finishes[j] or "length", len(ids[j]), j, version) for j in range(k)]
        call = GroupCall(
            problem.prompt, problem.row, [self.decode(x) for x in ids], ids, infos, isinstance(problem.prompt, tuple)
        )
        score = await self.scorer.score(call)
        return PromptResult(score.rewards if score.rewards is not None else [0.0] * k, problem.source)

    async def _conversation(self, client, version: int, i: int, j: int, problem: Problem) -> SampleState:
        """Sample `j` of eval prompt `i` as a conversation: its turns sampled at `version` (each
        with its own seed), the environment answering each; nothing journaled (a crash redoes it)."""
        talk, sample, prompt_ids = self.conversations, SampleState(j), self.encode(problem)
        assert talk is not None  # called with an environment only
        counters: dict[str, int] = defaultdict(int)  # the actor counts its own conversations only
        while not sample.finished:
            budget = turn_budget(sample, talk.limits)
            if budget:
                first, finish, spans = len(sample.completion_ids), None, None
                async for delta in generate(
                    client,
                    self.urls[i % len(self.urls)],
                    prompt_ids + sample.completion_ids,
                    n=1,
                    max_tokens=min(budget, self.max_new_tokens),
                    temperature=self.cfg.temperature,
                    timeout_s=self.request_timeout_s,
                    stream=False,
                    cache_salt=f"eval-v{version}",
                    seed=self.seed + i + 7919 * (j + 1) * (len(sample.turn_ends) + 1),
                ):
                    sample.append(delta.token_ids, delta.logprobs, version)
                    finish, spans = delta.finish_reason or finish, delta.spans or spans
                sampled = len(sample.completion_ids) - first
                if sampled and set(token_versions(spans, sampled, version)) != {version}:
                    raise VersionChanged(f"vLLM sampled an eval conversation with weights other than version {version}")
                sample.end_turn(finish if finish in ("stop", "length") else "length")
            else:
                sample.end_turn("length")
            await take_step(talk, sample, problem, f"eval-v{version}/{i}", self.decode, counters)
        return sample


def evaluator_for(
    cfg,
    problems: list[Problem],
    tokenizer,
    render_prompt,
    scorer: Scorer,
    redis,
    urls: list[str],
    conversations: Conversations | None = None,
) -> Evaluator:
    """The run's evaluator over `problems` (the actor's and `rlrun eval`'s one way to build it);
    `render_prompt`: the model's chat template, or None to give prompts as they are;
    `conversations`: the run's environment (its prompts show the tools)."""
    render = render_prompt or (lambda prompt: prompt)
    if conversations is not None:
        render = lambda prompt: conversations.turns.prompt_text(prompt, conversations.tools or None)  # noqa: E731
    return Evaluator(
        cfg.eval,
        cfg.trainer.max_train_steps,
        problems,
        encode=lambda problem: tokenizer.encode(render(problem.prompt), add_special_tokens=False),
        decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
        scorer=scorer,
        redis=redis,
        urls=urls,
        max_new_tokens=cfg.actor.max_new_tokens,
        concurrency=cfg.actor.max_concurrent_groups,
        request_timeout_s=cfg.actor.request_timeout_s,
        seed=cfg.run.seed * 1_000_003,
        conversations=conversations,
    )
