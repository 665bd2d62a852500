"""Conversations (environment.step) as token ids, per bundled chat format: the tiny model's plain one,
SmolLM2's template and TRL's Qwen2.5 template (both on SmolLM2's tokenizer). A scripted stand-in
of vLLM's `/inference/v1/generate` writes real text in the template's tokens (a tool call, an
answer; one turn runs out of tokens) and the real environment worker (tests/envs/adder.py) answers
it. Turn by turn, every request is the ids the server was sent and sampled before it plus the
observation's ids, the trainer gets exactly those ids, and the text is transformers' rendering of
the conversation; a restart mid-conversation replays the journal and runs no step twice."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from rlrun.actor.conversation import Conversations, Limits
from rlrun.actor.ledger import JournalLedger
from rlrun.actor.loop import Actor
from rlrun.actor.tokenizer import load_tokenizer
from rlrun.config import compose
from rlrun.task.pool import RewardPool, scorer_for
from rlrun.task.tasks import Problem, Task
from rlrun.task.turns import Observation, TurnFormat, chat_turn_format, plain_turn_format
from tests.integration.test_actor_generation import View, published
from tests.unit.test_turn_format import ADD, CALL, EOS_ID, qwen2_5, reference, sampled, smollm2, tiny_tokenizer  # noqa: F401 (fixtures)

pytestmark = pytest.mark.timeout(60)

STEP = f"{Path(__file__).resolve().parents[1] / 'envs' / 'adder.py'}:step"
PROMPT = "what is 2+3? use the tool."  # in the tiny model's characters too
LONG = "let me think about it step by step. " * 8  # longer than a turn's budget
MAX_TURN_TOKENS = 80  # actor.max_new_tokens: a tool call fits in it
PARSED = {"name": "add", "arguments": {"a": 2, "b": 3}}
NEXT_TURN = "\n<|im_start|>assistant\n"  # what the ChatML templates render after the model's last <|im_end|>


@dataclass
class Chat:
    tokenizer: object
    turns: TurnFormat
    folder: Path | None  # None: the plain format (no chat template, no tools)

    def written(self, text: str) -> list[int]:
        """A whole turn as the model samples it: one token per character (what re-tokenizing the
        text would not give back), then its end-of-turn id."""
        return sampled(self.tokenizer, self.turns, text, stopped=True, canonical=False)

    def script(self) -> list[list[tuple[str, Observation | None]]]:
        """Each sample's turns: what the model writes and what the environment answers it. The tiny
        model's characters have no "<": it answers wrong where the others call the tool."""
        first = (CALL, Observation("5", name="add")) if self.folder else ("4", Observation("wrong, try again", role="user"))
        return [[first, ("the sum is 5.", None)], [(LONG, Observation("finish your answer", role="user")), ("6", None)]]

    def sampled(self, text: str) -> tuple[list[int], bool]:
        """A turn's ids as the stand-in samples them (cut at the turn's budget), and whether the model ended it."""
        ids = self.written(text)
        return ids[:MAX_TURN_TOKENS], len(ids) <= MAX_TURN_TOKENS


@pytest.fixture(params=["tiny", "smollm2", "qwen2_5"])
def chat(request) -> Chat:
    if request.param == "tiny":
        tokenizer = request.getfixturevalue("tiny_tokenizer")
        return Chat(tokenizer, plain_turn_format(tokenizer, EOS_ID), None)
    folder = request.getfixturevalue(request.param)
    tokenizer = load_tokenizer(folder)
    return Chat(tokenizer, chat_turn_format(folder, tokenizer), folder)


@pytest.fixture
def steps(tmp_path, monkeypatch):
    """The environment's calls, as tests/envs/adder.py logs them (its workers inherit the variable)."""
    log = tmp_path / "adder.jsonl"
    monkeypatch.setenv("RLRUN_ADDER_LOG", str(log))
    return lambda: [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def logprob(sample: int, turn: int, k: int) -> float:
    return -(1 + sample + turn / 4 + k / 256)  # exact in binary: the journal's floats come back equal


class Model:
    """vLLM's generate as a scripted model: sample s writes `chat.script()[s][t]` in its turn t, cut at
    the request's max_tokens ("length"). It knows a conversation by the ids it has seen and sampled for
    it, records each turn's request, and with `hang` leaves every request after the first unanswered."""

    def __init__(self, chat: Chat, hang: bool = False, cut: tuple[int, int] | None = None) -> None:
        self.chat, self.hang, self.hung = chat, hang, 0
        self.cut = cut  # (sample, turn): its stream breaks halfway (a server lost), once
        self.partial: dict[int, int] = {}  # sample -> ids of its cut turn it received before the break
        self.requests: dict[tuple[int, int], list[int]] = {}  # (sample, turn) -> token_ids sent
        self.seen: dict[int, list[int]] = {}  # sample -> its conversation so far, as this server saw it
        self.turns: dict[int, int] = {}  # sample -> turns sampled

    async def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        ids, n, max_tokens = body["token_ids"], body["sampling_params"]["n"], body["sampling_params"]["max_tokens"]
        samples = [s for s, seen in self.seen.items() if ids[: len(seen)] == seen]
        if not self.seen:  # the group's first request: choice i is sample i
            samples = list(range(n))
        assert len(samples) == n, f"a request for no conversation this server sampled ({len(ids)} ids)"
        for s in samples:
            if s in self.partial:  # the cut turn, continued from what the sample kept
                self.requests[(s, self.turns[s], "continued")] = ids
            else:
                self.requests[(s, self.turns.get(s, 0) + 1)] = ids
        if self.hang and self.seen:  # the server never answers: the actor is stopped meanwhile
            self.hung += 1
            await asyncio.Event().wait()
        eot, choices = list(self.chat.turns.end_of_turn_ids), []
        for i, s in enumerate(samples):
            start = self.partial.pop(s, 0)
            turn = self.turns[s] = self.turns.get(s, 0) + (0 if start else 1)
            out = self.chat.written(self.chat.script()[s][turn - 1][0])[start:][:max_tokens]
            if self.cut == (s, turn):  # half of it reaches the actor, then the connection breaks
                self.cut, self.partial[s], half = None, len(out) // 2, out[: len(out) // 2]
                self.seen[s] = ids + half
                chunk = {"index": 0, "token_ids": half, "finish_reason": None,
                         "logprobs": {"content": [{"token_id": t, "logprob": logprob(s, turn, k)} for k, t in enumerate(half)]}}  # fmt: skip
                return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=Broken(chunk))
            self.seen[s] = ids + out
            content = [{"token_id": t, "logprob": logprob(s, turn, start + k)} for k, t in enumerate(out)]
            choices.append({"index": i, "token_ids": out, "logprobs": {"content": content},
                            "finish_reason": "stop" if out[-len(eot):] == eot else "length",
                            "weight_versions": [{"version": "default", "start": 0, "end": len(out)}]})  # fmt: skip
        if not body["stream"]:
            return httpx.Response(200, json={"choices": choices})
        lines = [f"data: {json.dumps({'choices': [c]})}\n\n" for c in choices] + ["data: [DONE]\n\n"]
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content="".join(lines).encode())


class Broken(httpx.AsyncByteStream):
    """A stream that sends one chunk, then breaks."""

    def __init__(self, chunk: dict) -> None:
        self.chunk = chunk

    async def __aiter__(self):
        yield f"data: {json.dumps({'choices': [self.chunk]})}\n\n".encode()
        raise httpx.ReadError("the server went away")


def actor_for(client, chat: Chat) -> Actor:
    cfg, _ = compose(["recipe=math_grpo", "algo.group_size=2", f"actor.max_new_tokens={MAX_TURN_TOKENS}", "model.max_model_len=512"])
    env = cfg.environment  # its defaults: 4 turns, 256 tokens, observations of 64 at most
    limits = Limits(env.max_turns, env.max_total_tokens, MAX_TURN_TOKENS, env.max_observation_tokens)
    pool = RewardPool([STEP], env.workers, env.timeout_s, environment=True)  # rerun_interrupted: the default
    talk = Conversations(pool, chat.turns, limits, [ADD] if chat.folder else [], env.timeout_s)
    task = Task([Problem(PROMPT, {"answer": 5})], [], [])
    return Actor(cfg.actor, cfg.algo, client, chat.tokenizer, task, ["http://127.0.0.1:9"], JournalLedger(client), run_name="run", seed=cfg.run.seed,
                 trainer=View(0), scorer=scorer_for([], cfg.reward), conversations=talk)  # fmt: skip


async def talking(actor: Actor, model: Model, go) -> None:
    """`go(http)` with the environment's workers started and closed as Actor.run does."""
    await actor.conversations.pool.start()
    try:
        async with httpx.AsyncClient(transport=httpx.MockTransport(model.handle)) as http:
            await go(http)
    finally:
        await actor.conversations.pool.close()


def complete(actor: Actor, model: Model, group) -> None:
    asyncio.run(talking(actor, model, lambda http: actor._complete(http, group)))


def expected(chat: Chat, index: int) -> tuple[list[tuple[str, list[int], list[float]]], list[dict]]:
    """Sample `index`'s conversation after the prompt as the script makes it: its pieces in order
    ("turn" ids with the stand-in's log-probs, "observation" ids with 0) and its messages."""
    pieces, messages = [], [{"role": "user", "content": PROMPT}]
    for turn, (text, observation) in enumerate(chat.script()[index], 1):
        ids, stopped = chat.sampled(text)
        pieces.append(("turn", ids, [logprob(index, turn, k) for k in range(len(ids))]))
        calls = {"tool_calls": [PARSED]} if text == CALL else {}
        messages.append({"role": "assistant", "content": chat.tokenizer.decode(ids, skip_special_tokens=True), **calls})
        if observation is not None:
            ids = chat.turns.observation_ids(observation, model_stopped=stopped)
            pieces.append(("observation", ids, [0.0] * len(ids)))
            messages.append(observation.message())
    return pieces, messages


def rendered(chat: Chat, messages: list[dict]) -> str:
    """The reference text of a conversation ready for the model's next turn: transformers' chat
    template (the turns as the model wrote them), or the plain format's content after the EOS."""
    if chat.folder is None:
        return "".join(m["content"] + ("<eos>" if m["role"] == "assistant" else "") for m in messages)
    return reference(chat.folder, [{k: v for k, v in m.items() if k != "tool_calls"} for m in messages], tools=[ADD])


def check_conversation(chat: Chat, model: Model, prompt_ids: list[int], sample) -> None:
    """Turn by turn: request k was the prompt and every piece before turn k, rendered as the template
    renders the messages before it; the trainer gets the pieces in order, observations masked."""
    pieces, messages = expected(chat, sample.index)
    sent, spans, turn = list(prompt_ids), [], 0
    for kind, ids, _ in pieces:
        if kind == "turn":
            turn += 1
            assert model.requests[(sample.index, turn)] == sent
            assert chat.tokenizer.decode(sent) == rendered(chat, messages[: 2 * turn - 1])
        else:
            spans.append([len(sent) - len(prompt_ids), len(sent) - len(prompt_ids) + len(ids)])
        sent = sent + ids
    assert sample.completion_ids == sent[len(prompt_ids) :]
    assert sample.logprobs == [lp for _, _, lps in pieces for lp in lps]
    assert sample.observation_spans == spans
    whole = chat.tokenizer.decode(sent)
    assert (whole + NEXT_TURN if chat.folder else whole) == rendered(chat, messages)


def test_the_trainer_gets_the_ids_sent_and_sampled_turn_by_turn(client, chat, steps):
    model, actor = Model(chat), actor_for(client, chat)
    complete(actor, model, actor._open_group())
    group = published(client)
    assert chat.tokenizer.decode(group.prompt_ids) == rendered(chat, [{"role": "user", "content": PROMPT}])  # tools shown, where rendered
    assert model.requests.keys() == {(0, 1), (1, 1), (0, 2), (1, 2)}
    for sample in group.samples:
        check_conversation(chat, model, group.prompt_ids, sample)
        seen = [c for c in steps() if c["index"] == sample.index]  # the parsed call among its messages
        assert seen[-1]["messages"] == expected(chat, sample.index)[1]
        assert [(c["turn"], c["finish_reason"]) for c in seen] == [(1, ["stop", "length"][sample.index]), (2, "stop")]
    assert [s.reward for s in group.samples] == [1.0, 0.0] and [s.finish_reason for s in group.samples] == ["stop", "stop"]
    assert actor.counters["env_steps"] == 4 and actor.counters["requests"] == 3


def test_a_restart_mid_conversation_reuses_the_journal_and_runs_no_step_again(client, smollm2, steps):
    """The actor stops while both conversations wait for their second turn (their tool's answers
    journaled); a new actor over the same journal sends the same requests and runs only the last steps."""
    tokenizer = load_tokenizer(smollm2)
    chat = Chat(tokenizer, chat_turn_format(smollm2, tokenizer), smollm2)
    model, first = Model(chat, hang=True), actor_for(client, chat)

    async def crash(http) -> None:
        task = asyncio.create_task(first._complete(http, first._open_group()))
        while model.hung < 2:
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(talking(first, model, crash))
    assert client.xlen(View.stream) == 0 and len(steps()) == 2 and set(model.requests) == {(0, 1), (1, 1), (0, 2), (1, 2)}
    sent_before, model.hang = dict(model.requests), False
    second = actor_for(client, chat)
    (live,) = second._replay_plan()
    complete(second, model, live)
    group = published(client)
    assert model.requests == sent_before  # the second turns' requests, sent again as they were
    for sample in group.samples:
        check_conversation(chat, model, group.prompt_ids, sample)
    assert Counter((c["index"], c["turn"]) for c in steps()) == {(0, 1): 1, (1, 1): 1, (0, 2): 1, (1, 2): 1}
    held = sum(len(ids) for index in (0, 1) for _, ids, _ in expected(chat, index)[0][:2])  # turn 1 and its answer
    counts = {k: second.counters[k] for k in ("env_steps_reused", "env_steps", "env_steps_rerun", "tokens_reused", "requests")}
    assert counts == {"env_steps_reused": 2, "env_steps": 2, "env_steps_rerun": 0, "tokens_reused": held, "requests": 2}


def test_a_turn_cut_by_a_lost_server_continues_from_its_tokens(client, smollm2, steps, monkeypatch):
    """Sample 1's second turn breaks halfway (a vLLM server lost): its next request is the
    conversation and the half it kept, and the trainer gets the same ids as without the break."""
    import rlrun.actor.loop

    monkeypatch.setattr(rlrun.actor.loop, "RETRY_DELAY_S", 0.0)
    tokenizer = load_tokenizer(smollm2)
    chat = Chat(tokenizer, chat_turn_format(smollm2, tokenizer), smollm2)
    model, actor = Model(chat, cut=(1, 2)), actor_for(client, chat)
    complete(actor, model, actor._open_group())
    group = published(client)
    for sample in group.samples:
        check_conversation(chat, model, group.prompt_ids, sample)
    turn_two = model.requests[(1, 2)]
    half = len(chat.written("6")) // 2
    assert model.requests[(1, 2, "continued")] == turn_two + group.samples[1].completion_ids[len(turn_two) - len(group.prompt_ids) :][:half]
    assert actor.counters["request_errors"] == 1 and actor.counters["tokens_kept_on_retry"] == half > 0
    assert Counter((c["index"], c["turn"]) for c in steps()) == {(0, 1): 1, (1, 1): 1, (0, 2): 1, (1, 2): 1}
