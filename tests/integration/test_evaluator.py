"""Actor 0's held-out evaluation against the stand-in of vLLM's generate route
(tests/integration/test_actor_generation.py) and the run's real Redis: one result per version,
written once and whole; an evaluation cut short leaves nothing and is done again; one whose tokens
came from other weights is started again, then recorded as abandoned, never half-counted."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from rlrun.actor.evaluator import ATTEMPTS, evaluator_for
from rlrun.config import compose
from rlrun.streams import names
from rlrun.task.pool import scorer_for
from rlrun.task.rewards import reward_specs
from rlrun.task.tasks import Problem

from tests.integration.test_actor_generation import PROMPT, URL, Characters, Vllm

pytestmark = pytest.mark.timeout(60)

K = 2
MAX_TOKENS = 2


class Tokens:
    """The stand-in tokenizer: every prompt is PROMPT (what the stand-in vLLM expects); ids decode as
    digits (tests/integration/test_actor_generation.py's Characters)."""

    def encode(self, text, add_special_tokens=False):
        return list(PROMPT)

    decode = Characters.decode


def problems() -> list[Problem]:
    """Three eval rows; sample i of every prompt reads "<i><i+1>" (the stand-in's ids 20+i, 21+i)."""
    answers = ["01", "12", "99"]  # prompt 0: sample 0 right; prompt 1: sample 1 right; prompt 2: none
    return [Problem(f"q{j}", {"answer": a}, source="a" if j < 2 else "b") for j, a in enumerate(answers)]


def evaluator(client):
    cfg, _ = compose(["eval.every_steps=4", f"eval.samples_per_prompt={K}", "eval.temperature=1.0", f"actor.max_new_tokens={MAX_TOKENS}"])
    scorer = scorer_for(reward_specs(["rlrun.task.scorers:exact_answer"], []), cfg.reward)
    return evaluator_for(cfg, problems(), Tokens(), None, scorer, client, [URL]), scorer


def run(ev, scorer, vllm: Vllm, version: int) -> None:
    async def go():
        await scorer.pool.start()
        try:
            async with httpx.AsyncClient(transport=httpx.MockTransport(vllm.handle), headers={"Authorization": "Bearer key"}) as http:
                await ev.evaluate(http, version)
        finally:
            await scorer.pool.close()

    asyncio.run(go())


def spans_of(version: str):
    return lambda n: [{"version": version, "start": 0, "end": n}]


def test_a_due_version_is_evaluated_once_with_seeded_requests(client):
    ev, scorer = evaluator(client)
    assert ev.due(4) and not ev.due(3) and not ev.due(5)  # eval.every_steps=4
    vllm = Vllm(interval=MAX_TOKENS, spans=spans_of("4"))
    run(ev, scorer, vllm, 4)
    result = json.loads(client.hget(names.EVAL_RESULTS, "4"))
    assert result["correct"] == [1, 1, 0] and result["k"] == K and result["prompts"] == 3
    assert result["pass@1"] == pytest.approx((0.5 + 0.5 + 0) / 3) and result[f"pass@{K}"] == pytest.approx(2 / 3)
    assert result["per_source"]["a"]["correct"] == [1, 1] and result["per_source"]["b"]["correct"] == [0]
    seeds = [r["sampling_params"]["seed"] for r in vllm.requests]
    assert sorted(seeds) == [0, 1, 2] and {r["cache_salt"] for r in vllm.requests} == {"eval-v4"}  # prompt i: seed i (run.seed 0)
    assert not ev.due(4)  # done: asked of Redis once, then remembered
    again, _ = evaluator(client)
    assert not again.due(4)  # a restarted actor sees the result and does not evaluate it again


def test_an_evaluation_cut_short_leaves_nothing_and_is_done_again(client):
    ev, scorer = evaluator(client)
    with pytest.raises(httpx.ConnectError):
        run(ev, scorer, Vllm(interval=MAX_TOKENS, spans=spans_of("4"), down=[2]), 4)  # the server goes away mid-evaluation
    assert client.hget(names.EVAL_RESULTS, "4") is None and ev.due(4)  # nothing half-counted
    successor, scorer = evaluator(client)  # the restarted actor
    run(successor, scorer, Vllm(interval=MAX_TOKENS, spans=spans_of("4")), 4)
    assert json.loads(client.hget(names.EVAL_RESULTS, "4"))["correct"] == [1, 1, 0]


def test_tokens_of_other_weights_restart_the_evaluation_then_abandon_it(client):
    ev, scorer = evaluator(client)
    for attempt in range(1, ATTEMPTS):
        run(ev, scorer, Vllm(interval=MAX_TOKENS, spans=spans_of("5")), 4)  # the weights moved on under it
        assert client.hget(names.EVAL_RESULTS, "4") is None and ev.due(4), attempt
    run(ev, scorer, Vllm(interval=MAX_TOKENS, spans=spans_of("5")), 4)
    result = json.loads(client.hget(names.EVAL_RESULTS, "4"))
    assert "abandoned" in result and "pass@1" not in result and not ev.due(4)
