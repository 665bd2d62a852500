"""Conversations (environment.step) without processes: the pure rules of rlrun/actor/conversation.py,
a sample's conversation state (rlrun/actor/sampling.py), how a conversation is written in the
journal's records and folded back (rlrun/journal/records.py, `fold_group`), and how a replay keeps
it (`plan_replay(conversations=True)`, `resume(conversations=True)`)."""

from __future__ import annotations

import json

import pytest

from rlrun.actor.conversation import Limits, Outcome, fits, is_last_turn, messages_for, outcome_of, turn_budget
from rlrun.actor.replay import resume
from rlrun.actor.sampling import SampleState
from rlrun.journal.plan import Action, plan_replay
from rlrun.journal.records import CorruptRecord, GroupHeader, GroupRecord, LogEntry, SampleRecord
from rlrun.journal.store import fold_group
from rlrun.task.environment import Step
from rlrun.task.turns import parse_tool_calls

# 3 model turns, 20 tokens after the prompt, 8 per model turn, observations cut at 4.
LIMITS = Limits(max_turns=3, max_total_tokens=20, max_turn_tokens=8, max_observation_tokens=4)


def state(n: int, turn_start: int = 0, turn_ends=(), observations=(), finish=None) -> SampleState:
    """A sample holding tokens 0..n-1 (version 7 each), in the given turn."""
    sample = SampleState(0, list(range(n)), [-0.5] * n, [7] * n, finish_reason=finish)
    sample.turn_start, sample.turn_ends, sample.observations = turn_start, [list(t) for t in turn_ends], [dict(o) for o in observations]
    return sample


# --- a turn's budget, the last turn, what a step's answer does ----------------------------------------


@pytest.mark.parametrize(
    "n, turn_start, budget",
    [
        (0, 0, 8),  # a first turn: the turn's limit
        (5, 0, 3),  # 5 of the turn's 8 spent
        (10, 10, 8),  # a new turn after an observation: the whole turn's limit again
        (16, 14, 4),  # 2 in this turn, but only 4 of the conversation's 20 left
        (20, 18, 0),  # the conversation's budget spent
        (23, 20, 0),  # never negative
        (14, 6, 0),  # the turn's 8 spent
    ],
)
def test_a_turns_budget_is_the_turns_within_the_conversations(n, turn_start, budget):
    assert turn_budget(state(n, turn_start), LIMITS) == budget


def test_the_last_turn_by_the_turn_limit_or_by_the_tokens_left():
    two = [[3, "stop"], [9, "stop"]]
    assert not is_last_turn(state(9, turn_ends=two), LIMITS)
    assert is_last_turn(state(12, turn_ends=[*two, [12, "stop"]]), LIMITS)  # max_turns=3 reached
    assert is_last_turn(state(20, turn_ends=two), LIMITS)  # 2 turns, but no token left for a third
    assert not is_last_turn(state(19, turn_ends=two), LIMITS)


@pytest.mark.parametrize(
    "step, last, expected",
    [
        (Step(done=True, reward=0.5), False, Outcome(finish_reason="stop", reward=0.5)),
        (Step(done=True, reward=0.5), True, Outcome(finish_reason="stop", reward=0.5)),
        (Step(done=True), False, Outcome(finish_reason="stop", reward=0.0)),  # done without a reward: 0
        (Step(observation="7"), True, Outcome(finish_reason="length", reward=0.0)),  # a last turn's observation ends it
        (Step(observation="7", reward=0.25), True, Outcome(finish_reason="length", reward=0.25)),
    ],
)
def test_done_or_the_last_turn_ends_the_conversation_with_its_reward(step, last, expected):
    assert outcome_of(step, last) == expected


def test_an_observation_before_the_last_turn_goes_on():
    step = Step(observation="7", role="tool", name="add", reward=0.25)
    outcome = outcome_of(step, last=False)
    assert outcome.observation is step and outcome.finish_reason is None and outcome.reward == 0.0


def test_an_observation_fits_only_with_room_for_a_token_of_the_next_turn():
    assert fits(state(15), 4, LIMITS)  # 19: one token left for the next turn
    assert not fits(state(15), 5, LIMITS)  # 20: none left
    assert not fits(state(20), 0, LIMITS)


# --- the messages the environment is shown ------------------------------------------------------------

TEXTS = {1: "Let me add. ", 2: '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>', 3: "The sum is ", 4: "5", 5: "!"}


def decode(ids: list[int]) -> str:
    """A stand-in tokenizer's decode: model tokens from TEXTS; observation tokens (50+) as <obs>."""
    return "".join(TEXTS.get(i, "<obs>") for i in ids)


def test_messages_show_each_turn_with_its_calls_and_each_observation_in_order():
    sample = SampleState(0, [1, 2, 50, 51, 3, 4, 60, 5])
    sample.turn_ends = [[2, "stop"], [6, "stop"], [8, "length"]]
    sample.observations = [
        {"role": "tool", "content": "5", "name": "add", "truncated": False, "start": 2, "end": 4},
        {"role": "user", "content": "Sure?", "name": None, "truncated": False, "start": 6, "end": 7},
        {"done": True, "reward": 1.0, "start": 8, "end": 8},  # the last step has no tokens: not shown
    ]
    prompt = [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "2+3?"}]
    messages = messages_for(prompt, sample, decode, parse_tool_calls)
    assert messages == [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "2+3?"},
        {"role": "assistant", "content": TEXTS[1] + TEXTS[2], "tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}]},
        {"role": "tool", "content": "5", "name": "add"},
        {"role": "assistant", "content": "The sum is 5"},  # no call: no tool_calls key
        {"role": "user", "content": "Sure?"},  # no name: no name key
        {"role": "assistant", "content": "!"},
    ]
    assert "<obs>" not in json.dumps(messages), "an observation's tokens were decoded into a model turn"
    messages[0]["content"] = "changed"
    assert prompt[0]["content"] == "Use tools.", "the row's prompt was shared with the messages"


def test_a_text_prompt_is_the_users_message_and_a_turn_awaiting_its_step_is_the_last_message():
    sample = SampleState(0, [3, 4])
    sample.end_turn("stop")
    assert messages_for("2+3=", sample, decode, parse_tool_calls) == [
        {"role": "user", "content": "2+3="},
        {"role": "assistant", "content": "The sum is 5"},
    ]


# --- a sample's conversation state ----------------------------------------------------------------------


def test_a_turns_end_and_its_observation_move_the_conversation_on():
    sample = SampleState(0)
    sample.append([1, 2, 3], [-0.1, -0.2, -0.3], 4)
    assert not sample.step_due
    sample.end_turn("stop")
    assert sample.step_due and sample.turn_ends == [[3, "stop"]] and not sample.turn_end_recorded
    sample.observe([50, 51], {"role": "tool", "content": "5"})
    assert not sample.step_due and sample.turn_end is None
    assert sample.completion_ids == [1, 2, 3, 50, 51]
    assert sample.logprobs[3:] == [0.0, 0.0] and sample.versions[3:] == [4, 4]  # never sampled: log-prob 0, the turn's version
    assert sample.observations == [{"role": "tool", "content": "5", "start": 3, "end": 5}]
    assert sample.turn_start == 5 and sample.observation_spans == [[3, 5]]
    sample.append([4], [-0.4], 5)
    sample.end_turn("length")
    sample.finish_reason = "length"
    assert not sample.step_due, "a finished conversation awaits no step"
    sample.reset()
    assert (sample.turn_ends, sample.observations, sample.turn_start, sample.turn_end, sample.observation_spans) == ([], [], 0, None, [])


TOOL = {"role": "tool", "content": "5", "name": "add", "truncated": False}


@pytest.mark.parametrize(
    "n, turn_ends, observations, pending",
    [
        (3, [[3, "stop"]], [], "stop"),  # the first turn's end journaled, no answer: its step was cut
        (5, [[3, "stop"]], [{**TOOL, "start": 3, "end": 5}], None),  # answered; the next turn not begun
        (6, [[3, "stop"]], [{**TOOL, "start": 3, "end": 5}], None),  # answered; the next turn under way
        (7, [[3, "stop"], [7, "length"]], [{**TOOL, "start": 3, "end": 5}], "length"),  # the second turn's step was cut
        (2, [], [], None),  # a first turn under way
    ],
)
def test_take_conversation_finds_an_interrupted_step_exactly_when_a_turn_ended_after_the_last_observation(n, turn_ends, observations, pending):
    sample = state(n)
    sample.take_conversation(turn_ends, observations)
    assert sample.turn_end == pending and sample.step_interrupted == (pending is not None)
    assert sample.step_due == (pending is not None)
    assert sample.turn_end_recorded == (pending is not None), "a journaled turn end would be journaled again"
    assert sample.turn_start == (5 if observations else 0)
    assert sample.turn_ends == turn_ends and sample.observations == observations
    assert sample.reward is None


def test_take_conversation_keeps_the_reward_of_a_done_step_and_copies_what_it_is_given():
    observations = [{**TOOL, "start": 3, "end": 5}, {"done": True, "reward": 0.75, "start": 7, "end": 7}]
    turn_ends = [[3, "stop"], [7, "stop"]]
    sample = state(7, finish="stop")
    sample.take_conversation(turn_ends, observations)
    assert sample.reward == 0.75
    assert sample.turn_end is None and not sample.step_interrupted and not sample.step_due
    assert sample.turn_start == 5 and sample.observation_spans == [[3, 5]]
    sample.observations[0]["content"] = "changed"
    sample.turn_ends.append([9, "stop"])
    assert observations[0]["content"] == "5" and turn_ends == [[3, "stop"], [7, "stop"]]
    unrewarded = state(7, finish="stop")
    unrewarded.take_conversation(turn_ends, [{**TOOL, "start": 3, "end": 5}, {"done": True, "reward": None, "start": 7, "end": 7}])
    assert unrewarded.reward is None


# --- the journal's records ----------------------------------------------------------------------------------


def test_log_entries_with_a_turn_end_or_an_observation_round_trip():
    ended = LogEntry("append", 1, 4, [7, 8], [-0.5, -0.25], 3, turn_end="length")
    observed = LogEntry("append", 1, 6, [50], [0.0], 3, observation={"role": "tool", "content": "5", "name": "add", "truncated": True})
    done = LogEntry("append", 1, 7, [], [], 0, observation={"done": True, "reward": 0.5})
    for entry in (ended, observed, done):
        assert LogEntry.from_json(entry.to_json()) == entry
    assert json.loads(ended.to_json())["turn_end"] == "length" and "observation" not in json.loads(ended.to_json())
    plain = json.loads(LogEntry("append", 1, 0, [7], [-0.5], 3).to_json())
    assert "turn_end" not in plain and "observation" not in plain  # an append of one turn pays no bytes for them


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("turn_end", "abort", "turn_end must be one of"),
        ("turn_end", 3, "turn_end must be one of"),
        ("observation", "5", "observation must be an object"),
        ("observation", [{"content": "5"}], "observation must be an object"),
    ],
)
def test_a_bad_turn_end_or_observation_is_a_corrupt_record(field, value, message):
    data = {"schema_version": 1, "kind": "append", "index": 1, "offset": 0, "token_ids": [7], "logprobs": [-0.5], "version": 2, field: value}
    with pytest.raises(CorruptRecord, match=message):
        LogEntry.from_json(json.dumps(data))


def _entry(index, offset, tokens, version=1, **conversation) -> str:
    return LogEntry("append", index, offset, tokens, [-0.5] * len(tokens), version, **conversation).to_json()


def _fields(header: GroupHeader, **samples) -> dict:
    fields = {"header": header.to_json(), "state": "open", "size": str(header.group_size), "cursor": str(header.cursor)}
    for i in range(header.group_size):
        fields |= {f"{i}:state": "pending", f"{i}:len": "0"}
    return fields | samples


def test_fold_rebuilds_turn_ends_and_observations_at_their_offsets_and_a_reset_clears_them():
    header = GroupHeader("r/0", 0, 0, [1], 2, 40)
    tool = {"role": "tool", "content": "5", "name": "add", "truncated": False}
    entries = [
        _entry(0, 0, [1, 2]),
        _entry(0, 2, [3], turn_end="stop"),  # the turn's last tokens carry its end
        _entry(1, 0, [9, 9], turn_end="length"),
        _entry(0, 3, [50, 51], observation=tool),
        _entry(0, 5, [4, 5]),
        _entry(0, 7, [], turn_end="length"),  # a turn ended with no new tokens (its budget spent)
        LogEntry("reset", 1).to_json(),  # sample 1 starts again: its conversation is forgotten
        _entry(1, 0, [8]),
        _entry(0, 7, [], observation={"done": True, "reward": 1.0}),  # the last step: no tokens
    ]
    fields = _fields(header, **{"0:state": "finished", "0:finish": "length", "0:len": "7", "1:state": "generating", "1:len": "1"})
    group, problems = fold_group("r/0", fields, entries)
    assert problems == []
    first, second = group.samples
    assert first.token_ids == [1, 2, 3, 50, 51, 4, 5] and first.finish_reason == "length"
    assert first.turn_ends == [[3, "stop"], [7, "length"]]
    assert first.observations == [{**tool, "start": 3, "end": 5}, {"done": True, "reward": 1.0, "start": 7, "end": 7}]
    assert second == SampleRecord("r/0", 1, "generating", [8], [-0.5], [1])  # no turn_ends, no observations


# --- replaying a conversation --------------------------------------------------------------------------------


def _conversation_group(versions: list[int], turn_ends, observations, budget=8, state="generating", finish=None) -> GroupRecord:
    n = len(versions)
    record = SampleRecord("run/0", 0, state, list(range(n)), [-0.5] * n, list(versions), finish, turn_ends, observations)
    return GroupRecord("run/0", 0, 40, [1, 2, 3], 1, budget, [record])


def test_a_conversations_prefix_is_never_dropped_as_stale_a_samples_still_is():
    record = _conversation_group([0, 0, 0, 1, 1], [[3, "stop"]], [{**TOOL, "start": 3, "end": 5}], budget=16)
    old = plan_replay([record], current_version=50, max_prefix_staleness=2)
    assert old.groups[0].samples[0].action is Action.RESTART and old.counters.tokens_dropped_stale == 5
    kept = plan_replay([record], current_version=50, max_prefix_staleness=2, conversations=True)
    (planned,) = kept.groups[0].samples
    assert planned.action is Action.CONTINUE and planned.prefix_versions == [0, 0, 0, 1, 1]
    assert kept.counters.prefixes_dropped_stale == kept.counters.tokens_dropped_stale == 0
    assert planned.turn_ends == [[3, "stop"]] and planned.observations == [{**TOOL, "start": 3, "end": 5}]
    planned.observations[0]["content"] = "changed"
    assert record.samples[0].observations[0]["content"] == "5", "the plan shares the records' observations"


def test_resume_keeps_a_spent_conversation_open_and_restores_its_interrupted_step():
    """All 8 tokens of the budget held, the last turn's end journaled, its step cut by the crash."""
    record = _conversation_group([2] * 8, [[3, "stop"], [8, "length"]], [{**TOOL, "start": 3, "end": 5}])
    single = resume(plan_replay([record], current_version=2, max_prefix_staleness=2))
    assert single.groups[0].samples[0].finish_reason == "length", "a sample of one turn is closed when its budget is spent"
    resumed = resume(plan_replay([record], current_version=2, max_prefix_staleness=2, conversations=True), conversations=True)
    (sample,) = resumed.groups[0].samples
    assert not sample.finished, "a spent conversation was closed before its environment answered its last turn"
    assert sample.step_due and sample.step_interrupted and sample.turn_end == "length" and sample.turn_end_recorded
    assert sample.turn_start == 5 and sample.observation_spans == [[3, 5]]
    assert (resumed.tokens_reused, resumed.samples_continued, resumed.resets) == (8, 1, [])
    assert sample.journaled == 8


def test_resume_keeps_a_finished_conversation_with_its_reward_and_no_step_due():
    observations = [{**TOOL, "start": 3, "end": 5}, {"done": True, "reward": 0.5, "start": 6, "end": 6}]
    record = _conversation_group([2] * 6, [[3, "stop"], [6, "stop"]], observations, state="finished", finish="stop")
    (sample,) = resume(plan_replay([record], current_version=9, max_prefix_staleness=0, conversations=True), conversations=True).groups[0].samples
    assert sample.finished and sample.finish_recorded and sample.reward == 0.5
    assert not sample.step_due and not sample.step_interrupted


# --- take_step: a step's answer applied to the sample (the pool a stand-in: tests/integration runs real ones) -----


class Answers:
    """A step pool that answers each call with the next of `answers` (a CallFailed is raised)."""

    def __init__(self, *answers, rerun: bool = True) -> None:
        self.answers, self.conventions, self.calls = list(answers), [rerun], []

    async def call(self, index, call):
        self.calls.append(call)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


class Characters:
    """Each character one id: what the observation's ids are, visibly."""

    end_of_turn_ids = (99,)

    def truncate(self, content: str, max_tokens: int):
        return (content, False) if len(content) <= max_tokens else (content[:max_tokens] + "~", True)

    def observation_ids(self, observation, model_stopped: bool):
        return ([] if model_stopped else [99]) + [ord(c) for c in observation.content]


ROOMY = Limits(max_turns=3, max_total_tokens=200, max_turn_tokens=8, max_observation_tokens=100)


def stepped(pool: Answers, sample: SampleState, limits: Limits = ROOMY):
    import asyncio
    from collections import Counter

    from rlrun.actor.conversation import Conversations, take_step
    from rlrun.task.tasks import Problem

    counters: Counter = Counter()
    talk = Conversations(pool, Characters(), limits, [], timeout_s=5.0)
    asyncio.run(take_step(talk, sample, Problem("hi", {"answer": "4"}), "run/1", lambda ids: "".join(map(str, ids)), counters))
    return counters


def ended_turn(n: int = 3, stopped: bool = True) -> SampleState:
    sample = state(n - 1)
    sample.append_all([99 if stopped else 5], [-0.5], [7])
    sample.end_turn("stop" if stopped else "length")
    return sample


def test_an_observation_is_appended_as_rendered_and_the_next_turn_starts_after_it():
    sample = ended_turn()
    counters = stepped(Answers({"observation": "ab", "role": "tool", "name": "t", "done": False, "reward": None}), sample)
    assert sample.completion_ids[3:] == [97, 98] and sample.logprobs[3:] == [0.0, 0.0] and sample.turn_start == 5
    assert sample.observations == [{"role": "tool", "content": "ab", "name": "t", "truncated": False, "start": 3, "end": 5}]
    assert not sample.finished and counters["env_steps"] == 1


def test_a_turn_not_ended_by_the_end_of_turn_id_is_closed_by_the_observation():
    sample = ended_turn(stopped=False)
    sample.turn_end = "stop"  # a stop on another id (Qwen's <|endoftext|>): not the template's end
    stepped(Answers({"observation": "a", "role": "tool", "name": None, "done": False, "reward": None}), sample)
    assert sample.completion_ids[3:] == [99, 97]


def test_a_long_observation_is_cut_and_counted_and_one_that_leaves_no_room_ends_the_conversation():
    sample = ended_turn()
    counters = stepped(Answers({"observation": "abcdefg", "role": "user", "name": None, "done": False, "reward": None}), sample, LIMITS)
    assert sample.observations[-1]["content"] == "abcd~" and counters["observations_truncated"] == 1
    full = ended_turn(n=16)
    stepped(Answers({"observation": "abcd", "role": "user", "name": None, "done": False, "reward": None}), full, LIMITS)
    assert full.finish_reason == "length" and full.reward == 0.0 and full.completion_ids == ended_turn(n=16).completion_ids


@pytest.mark.parametrize(
    "answer, text, counted",
    [
        ("timeout", "the step timed out after 5 s", "env_step_timeouts"),
        ("interrupted", "the call was interrupted (the run restarted) and is not run again", "env_steps_interrupted"),
    ],
)
def test_a_timeout_or_a_lost_step_that_must_not_run_twice_is_told_to_the_model(answer, text, counted):
    from rlrun.task.pool import CallFailed

    sample = ended_turn()
    counters = stepped(Answers(CallFailed(answer, "detail")), sample)
    assert sample.observations[-1]["content"] == text and counters[counted] == 1 and not sample.finished


def test_a_step_that_raised_ends_the_conversation_with_reward_zero():
    from rlrun.task.pool import CallFailed

    sample = ended_turn()
    counters = stepped(Answers(CallFailed("error", "Traceback ...")), sample)
    assert sample.finished and sample.reward == 0.0 and counters["env_step_errors"] == 1
    assert sample.observations[-1] == {"done": True, "reward": 0.0, "start": 3, "end": 3}


def test_an_interrupted_step_is_run_again_only_where_the_function_allows_it():
    again, never = ended_turn(), ended_turn()
    again.step_interrupted = never.step_interrupted = True
    done = {"observation": None, "role": "tool", "name": None, "done": True, "reward": 1.0}
    counts = stepped(Answers(done), again)
    assert again.reward == 1.0 and counts["env_steps_rerun"] == 1
    refused = Answers(done, rerun=False)
    counts = stepped(refused, never)
    assert refused.calls == [] and counts["env_steps_interrupted"] == 1 and not never.finished
    assert never.observations[-1]["content"].startswith("the call was interrupted")
