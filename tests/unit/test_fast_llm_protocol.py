"""Fast-LLM's Redis messages: the documents rlrun writes and the events it reads back."""

from __future__ import annotations

import json

import pytest

from rlrun.backends.fast_llm.protocol import (
    MalformedEvent,
    TrainingFinished,
    WeightsReady,
    document,
    encode_group,
    parse_event,
    prompt_span,
)
from rlrun.streams.rollouts import Group, Sample


def _sample(index=0, completion=(7, 8, 9), logprobs=(-0.5, -1.0, -0.25), advantage=1.5) -> Sample:
    return Sample(
        index=index, completion_ids=list(completion), logprobs=list(logprobs), versions=[3] * len(completion),
        finish_reason="stop", reward=1.0, advantage=advantage,
    )


def test_document_message_matches_fast_llm_schema():
    (body,) = [json.loads(data) for data in encode_group(Group("run/0", 0, [1, 2, 3, 4], [_sample()]))]
    assert body == {
        "tokens": [1, 2, 3, 4, 7, 8, 9],
        "loss_masking_spans": [[0, 4]],  # half-open: masks exactly the 4 prompt tokens
        "advantage": 1.5,
        "old_log_probabilities": [0.0, 0.0, 0.0, 0.0, -0.5, -1.0, -0.25],
    }
    assert "schema_version" not in body
    assert len(body["old_log_probabilities"]) == len(body["tokens"])


def test_span_conventions_mask_the_same_prompt_tokens():
    tokens = list(range(10))
    begin, end = prompt_span(4, "exclusive")
    assert tokens[begin:end] == [0, 1, 2, 3]  # newer Fast-LLM: labels[begin:end] = -100
    begin, end = prompt_span(4, "inclusive")
    assert tokens[begin : end + 1] == [0, 1, 2, 3]  # older Fast-LLM: labels[start:end + 1] = -100
    assert document([5], _sample(), "inclusive")["loss_masking_spans"] == [[0, 0]]
    with pytest.raises(ValueError):
        prompt_span(0)


def test_each_observation_is_one_more_masked_span_after_the_prompt_in_either_convention():
    # prompt 3 tokens; completion m [o o] m m [o o] m: observations at [1, 3) and [5, 7)
    sample = Sample(0, [10, 11, 12, 13, 14, 15, 16, 17], [-0.5, 0.0, 0.0, -1.0, -0.25, 0.0, 0.0, -2.0], [3] * 8,
                    "stop", 1.0, 1.5, observation_spans=[[1, 3], [5, 7]])  # fmt: skip
    exclusive = document([1, 2, 3], sample, "exclusive")
    assert exclusive["loss_masking_spans"] == [[0, 3], [4, 6], [8, 10]]
    assert [exclusive["tokens"][b:e] for b, e in exclusive["loss_masking_spans"]] == [[1, 2, 3], [11, 12], [15, 16]]
    inclusive = document([1, 2, 3], sample, "inclusive")
    assert inclusive["loss_masking_spans"] == [[0, 2], [4, 5], [8, 9]]
    assert [inclusive["tokens"][b : e + 1] for b, e in inclusive["loss_masking_spans"]] == [[1, 2, 3], [11, 12], [15, 16]]
    # one old log-prob per token still: 0 on the prompt and on the observations
    assert exclusive["old_log_probabilities"] == [0.0, 0.0, 0.0, -0.5, 0.0, 0.0, -1.0, -0.25, 0.0, 0.0, -2.0]


def test_group_gives_one_document_per_sample_in_order():
    group = Group(group_id="run/0", prompt_index=0, prompt_ids=[1, 2], samples=[_sample(0, advantage=-1.0), _sample(1, completion=(4,), logprobs=(-2.0,))])
    bodies = [json.loads(data) for data in encode_group(group)]
    assert [b["advantage"] for b in bodies] == [-1.0, 1.5]
    assert bodies[1]["tokens"] == [1, 2, 4] and bodies[1]["old_log_probabilities"] == [0.0, 0.0, -2.0]


def test_mismatched_logprobs_are_refused():
    with pytest.raises(ValueError):
        document([1], _sample(completion=(1, 2), logprobs=(-1.0,)))


@pytest.mark.parametrize(
    "fields, expected",
    [
        ({"event": '{"type": "weights_ready", "step": 12}'}, WeightsReady(12, None)),
        ({b"event": b'{"type": "weights_ready", "step": 12, "documents_seen": 1043}'}, WeightsReady(12, 1043)),
        ({"event": '{"type": "weights_ready", "step": 0}'}, WeightsReady(0)),
        ({b"event": b'{"type": "training_finished"}'}, TrainingFinished()),
    ],
)
def test_both_event_shapes_are_understood(fields, expected):
    assert parse_event(fields) == expected


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"data": '{"type": "training_finished"}'},
        {"event": "not json"},
        {"event": "[1, 2]"},
        {"event": '{"type": "weights_ready"}'},
        {"event": '{"type": "weights_ready", "step": "3"}'},
        {"event": '{"type": "weights_ready", "step": true}'},
        {"event": '{"type": "weights_ready", "step": -1}'},
        {"event": '{"type": "weights_ready", "step": 3, "documents_seen": 1.5}'},
        {"event": '{"type": "training_started"}'},
        {b"event": b"\xff\xfe"},
    ],
)
def test_unknown_or_malformed_events_raise_for_the_caller_to_count(fields):
    with pytest.raises(MalformedEvent):
        parse_event(fields)
