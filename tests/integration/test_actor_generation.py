"""The actor's generation path against a stand-in of vLLM's `/inference/v1/generate` (its wire format
as vLLM 0.32 sends it, tests/integration/test_vllm_weight_updates.py runs the real one) and the
run's real Redis: one request per group, each token's version from vLLM's spans (the journal
relabelled when tokens were journaled before the spans came), and after a request cut short
mid-stream one request per continued sample, each counted once."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from rlrun.actor.ledger import JournalLedger
from rlrun.actor.loop import Actor, refused
from rlrun.task.pool import scorer_for
from rlrun.actor.vllm_client import ROUTE
from rlrun.config import compose
from rlrun.task.tasks import load_task
from rlrun.errors import ConfigError
from rlrun.streams.rollouts import Group
from rlrun.streams.codec import decode

pytestmark = pytest.mark.timeout(60)

URL = "http://127.0.0.1:9"
PROMPT = [12, 14, 13, 17]


class Vllm:
    """What the actor sends, and vLLM's answers: choice i's token k is 20 + i + k; its log-prob -0.5.
    `spans(n_tokens)` gives each choice's weight_versions on its last chunk; `cut_after` chunks
    into each of the first `cut_requests` requests, its stream breaks (a server lost mid-generation);
    the requests numbered in `down` (from 1) find no server."""

    def __init__(self, interval: int, spans=None, cut_after: int | None = None, cut_requests: int = 1, down=()) -> None:
        self.interval, self.cut_after, self.cut_requests, self.down = interval, cut_after, cut_requests, set(down)
        self.spans = spans or (lambda n: [{"version": "default", "start": 0, "end": n}])
        self.requests: list[dict] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        assert request.url.path == ROUTE and request.headers["authorization"] == "Bearer key"
        body = json.loads(request.content)
        self.requests.append(body)
        if len(self.requests) in self.down:  # the server is gone (being restarted)
            raise httpx.ConnectError("connection refused")
        params = body["sampling_params"]
        start = len(body["token_ids"]) - len(PROMPT)  # a continued sample's prompt holds its prefix
        outputs = [[20 + i + start + k for k in range(params["max_tokens"])] for i in range(params["n"])]
        if not body["stream"]:
            choices = [self._choice(i, tokens, "length", self.spans(len(tokens))) for i, tokens in enumerate(outputs)]
            return httpx.Response(200, json={"choices": choices})
        chunks = []  # as vLLM steps: every choice's next chunk in turn
        for at in range(0, params["max_tokens"], self.interval):
            for i, tokens in enumerate(outputs):
                last = at + self.interval >= len(tokens)
                piece = tokens[at : at + self.interval]
                chunks.append(self._choice(i, piece, "length" if last else None, self.spans(len(tokens)) if last else None))
        lines = [f"data: {json.dumps({'choices': [c]})}\n\n".encode() for c in chunks] + [b"data: [DONE]\n\n"]
        cut = self.cut_after if len(self.requests) <= self.cut_requests else None  # the first requests break
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=Stream(lines, cut))

    @staticmethod
    def _choice(index: int, tokens: list[int], finish, spans) -> dict:
        content = [{"token_id": t, "logprob": -0.5, "rank": 1, "top_logprobs": []} for t in tokens]
        return {"index": index, "finish_reason": finish, "token_ids": tokens, "weight_versions": spans,
                "logprobs": {"content": content}}  # fmt: skip


class Stream(httpx.AsyncByteStream):
    def __init__(self, lines: list[bytes], cut_after: int | None) -> None:
        self.lines, self.cut_after = lines, cut_after

    async def __aiter__(self):
        for count, line in enumerate(self.lines):
            if self.cut_after is not None and count == self.cut_after:
                raise httpx.ReadError("the server went away")
            yield line


class View:
    """The trainer as the actor sees it: vLLM serves `version`; groups go to one stream."""

    stream = "rlrun:{rlrun:groups}:groups"

    def __init__(self, version: int) -> None:
        self.version = version

    def policy_version(self) -> int:
        return self.version

    def destination(self, group: Group) -> tuple[str, list[str]]:
        from rlrun.streams.codec import encode

        return self.stream, [encode(group.to_dict())]

    def window(self, in_flight: int):
        from rlrun.actor.trainer_view import Window

        return Window("groups", in_flight, in_flight + 1)  # always room

    def done(self) -> bool:
        return False


class Characters:
    def decode(self, ids, skip_special_tokens=True) -> str:
        return "".join(chr(48 + i % 10) for i in ids)


def actor_with(client, vllm: Vllm, version: int, *overrides: str) -> tuple[Actor, JournalLedger]:
    cfg, _ = compose(["recipe=math_grpo", "algo.group_size=4", "trainer.train_batch_size=8", *overrides])
    ledger = JournalLedger(client)
    task = load_task(cfg.dataset, 0)
    actor = Actor(cfg.actor, cfg.algo, client, Characters(), task, [URL], ledger, run_name="run", seed=cfg.run.seed, api_key="key",
                  trainer=View(version), scorer=scorer_for(task.rewards, cfg.reward))  # fmt: skip
    actor._prompt_ids = lambda index: list(PROMPT)
    return actor, ledger


def complete(actor: Actor, vllm: Vllm, group) -> None:
    async def go():
        transport = httpx.MockTransport(vllm.handle)
        await actor.scorer.pool.start()  # the reward workers, as Actor.run starts them
        try:
            async with httpx.AsyncClient(transport=transport, headers={"Authorization": "Bearer key"}) as http:
                await actor._complete(http, group)
        finally:
            await actor.scorer.pool.close()

    asyncio.run(go())


def published(client) -> Group:
    ((_, messages),) = client.xread({View.stream: "0"})
    (_, fields), = messages
    return Group.from_dict(decode(fields["data"]))


def test_a_group_is_one_request_and_its_versions_are_vllms_spans(client):
    """Four new tokens, a journal flush of 16: nothing to journal before the end, so the answer
    comes whole. Tokens sampled by weights the trainer labelled are that version; the weights a
    server loaded at its start ("default") keep the version published when the request was sent."""
    vllm = Vllm(interval=16, spans=lambda n: [{"version": "default", "start": 0, "end": 1}, {"version": "6", "start": 1, "end": n}])
    actor, _ = actor_with(client, vllm, 5, "actor.max_new_tokens=4", "actor.journal_flush_tokens=16")
    complete(actor, vllm, actor._open_group())
    (request,) = vllm.requests
    assert request["sampling_params"]["n"] == 4 and request["stream"] is False and request["cache_salt"] == "v5"
    group = published(client)
    assert [s.versions for s in group.samples] == [[5, 6, 6, 6]] * 4
    assert actor.counters["requests"] == 1 and actor.counters["samples_continued_on_retry"] == 0


def test_tokens_journaled_before_the_spans_came_are_relabelled_in_the_journal(client):
    """Eight tokens in chunks of 4 (the journal's flush size): the first four are journaled with the
    provisional version 5 before the last chunk says 5 sampled only two of them; the journal then
    holds vLLM's versions too, so a replay judges the sample by what really happened."""
    vllm = Vllm(interval=4, spans=lambda n: [{"version": "5", "start": 0, "end": 2}, {"version": "6", "start": 2, "end": n}])
    actor, ledger = actor_with(client, vllm, 5, "actor.max_new_tokens=8", "actor.journal_flush_tokens=4")
    live = actor._open_group()

    async def one_request():
        transport = httpx.MockTransport(vllm.handle)
        async with httpx.AsyncClient(transport=transport, headers={"Authorization": "Bearer key"}) as http:
            await actor._request(http, URL, live, live.samples, 5)

    asyncio.run(one_request())
    record, problems = ledger.read_group(live.group_id)
    assert problems == [] and vllm.requests[0]["stream"] is True
    assert [s.versions for s in record.samples] == [[5, 5, 6, 6, 6, 6, 6, 6]] * 4
    assert all(s.finished for s in record.samples) and not any(s.relabel_pending for s in live.samples)


def test_a_request_cut_short_continues_each_sample_from_its_tokens_counted_once(client):
    """The group's stream breaks after 2 chunks of 2 tokens (choices 0 and 1 have 2 tokens, 2 and 3
    none): each sample with tokens is continued by a request of its own (prompt + its prefix, the
    rest of its budget), the two without share one; the delivered samples hold their whole budget
    and the counters say what was kept, once."""
    vllm = Vllm(interval=2, cut_after=2)
    actor, _ = actor_with(client, vllm, 0, "actor.max_new_tokens=8", "actor.journal_flush_tokens=2")
    actor.counters.update(dict.fromkeys(actor.counters, 0))
    complete(actor, vllm, actor._open_group())
    first, *retries = vllm.requests
    assert first["sampling_params"]["n"] == 4
    shapes = sorted((len(r["token_ids"]) - len(PROMPT), r["sampling_params"]["n"], r["sampling_params"]["max_tokens"]) for r in retries)
    assert shapes == [(0, 2, 8), (2, 1, 6), (2, 1, 6)]  # the two fresh in one request; each prefix alone
    group = published(client)
    assert all(len(s.completion_ids) == 8 for s in group.samples)
    assert group.samples[0].completion_ids == [20 + k for k in range(8)]  # its prefix, then its continuation
    assert (actor.counters["request_errors"], actor.counters["samples_continued_on_retry"], actor.counters["tokens_kept_on_retry"]) == (1, 2, 4)
    assert (actor.counters["samples_continued"], actor.counters["tokens_reused"]) == (0, 0)  # no restart: nothing from the journal
    assert actor.counters["requests"] == 4


def test_a_scripted_replay_counts_each_kept_token_once_crash_reuse_apart_from_retries(client):
    """A restarted actor finds one group in the journal: sample 0 finished (3 tokens), 1 cut at 2
    tokens, 2 cut with its whole budget (8), 3 cut with 2 tokens of a stale policy. Its replay keeps
    13 tokens and continues sample 1; sample 3 starts over. Then its two requests (sample 1 from its
    prefix, sample 3 from the prompt) break after 2 tokens each, the retries find no server, the
    next ones finish. Exact counts: the journal's tokens once as crash reuse, the 4 tokens the
    broken requests left once as kept on retry, nothing for the retries that added nothing."""
    from rlrun.journal.store import Append

    vllm = Vllm(interval=2, cut_after=1, cut_requests=2, down=(3, 4))
    actor, ledger = actor_with(client, vllm, 5, "actor.max_new_tokens=8", "actor.journal_flush_tokens=1", "actor.max_prefix_staleness=1")
    group = ledger.open_group(lambda c: c, lambda p: list(PROMPT), group_size=4, max_new_tokens=8, run="run").header
    ledger.append_many([
        Append(group.group_id, 0, 0, [1, 2, 3], [-0.1] * 3, 5, "stop"),
        Append(group.group_id, 1, 0, [4, 5], [-0.2] * 2, 5),
        Append(group.group_id, 2, 0, list(range(30, 38)), [-0.3] * 8, 4),
        Append(group.group_id, 3, 0, [6, 7], [-0.4] * 2, 3),  # 3 < 5 - 1: stale
    ])  # fmt: skip

    (live,) = actor._replay_plan()
    complete(actor, vllm, live)

    counts = ("tokens_reused", "samples_continued", "tokens_kept_on_retry", "samples_continued_on_retry",
              "tokens_regenerated", "prefixes_dropped_stale", "request_errors", "requests")  # fmt: skip
    assert {k: actor.counters.get(k) for k in counts} == {
        "tokens_reused": 3 + 2 + 8, "samples_continued": 1,  # from the journal, at the restart
        "tokens_kept_on_retry": 2 + 2, "samples_continued_on_retry": 2,  # left by the broken requests
        "tokens_regenerated": 2, "prefixes_dropped_stale": 1, "request_errors": 2, "requests": 6,
    }
    done = published(client)
    assert [s.completion_ids for s in done.samples] == [
        [1, 2, 3], [4, 5, 22, 23, 24, 25, 26, 27], list(range(30, 38)), [20, 21, 22, 23, 24, 25, 26, 27]
    ]
    assert [s.finish_reason for s in done.samples] == ["stop", "length", "length", "length"]


def test_a_request_vllm_refuses_stops_the_actor_instead_of_retrying_forever(client):
    """A 4xx (here: n above the server's --max-num-seqs) would be refused on every retry: the actor
    stops with a configuration error quoting vLLM, after that one request."""
    requests = []

    def refuse(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        message = "sampling_params.n must be at most the server's max_num_seqs (4), got 4."
        return httpx.Response(400, json={"error": {"message": message, "type": "BadRequestError"}})

    actor, _ = actor_with(client, Vllm(interval=2), 0, "actor.max_new_tokens=8")

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(refuse)) as http:
            await actor._complete(http, actor._open_group())

    with pytest.raises(ConfigError, match="max_num_seqs"):
        asyncio.run(go())
    assert len(requests) == 1


@pytest.mark.parametrize("status, refused_for_good", [(400, True), (401, True), (404, True), (408, False), (429, False), (500, False), (503, False)])
def test_only_a_4xx_other_than_timeout_or_rate_limit_is_final(status, refused_for_good):
    response = httpx.Response(status, request=httpx.Request("POST", URL))
    assert refused(httpx.HTTPStatusError("x", request=response.request, response=response)) is refused_for_good
    assert refused(httpx.ReadError("the server went away")) is False
