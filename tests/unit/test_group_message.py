"""The finished-group message (rlrun/streams/rollouts.py): a multi-turn sample's observation spans
survive the codec, an older actor's message without them reads as none, a malformed one is refused."""

from __future__ import annotations

import pytest

from rlrun.streams.codec import decode, encode
from rlrun.streams.rollouts import Group, MalformedGroup, Sample


def message(**sample_fields) -> dict:
    sample = {"index": 0, "completion_ids": [3, 4, 5, 6, 7, 8], "logprobs": [-0.5, 0.0, 0.0, -0.2, 0.0, -0.1],
              "versions": [2, 2, 2, 3, 3, 3], "finish_reason": "stop", "reward": 1.0, "advantage": 0.5, **sample_fields}  # fmt: skip
    return {"schema_version": 1, "group_id": "run/0", "prompt_index": 0, "prompt_ids": [1, 2], "samples": [sample]}


def test_observation_spans_survive_the_round_trip():
    group = Group.from_dict(message(observation_spans=[[1, 3], [4, 5]]))
    assert group.samples[0].observation_spans == [[1, 3], [4, 5]]
    assert Group.from_dict(decode(encode(group.to_dict())), vocab_size=32) == group


def test_a_message_without_the_key_has_no_observations():
    (sample,) = Group.from_dict(message(), vocab_size=32).samples
    assert sample.observation_spans == []
    assert sample.sampled(sample.versions) == sample.versions


def test_sampled_keeps_the_models_tokens_in_order():
    (sample,) = Group.from_dict(message(observation_spans=[[1, 3], [4, 5]])).samples
    assert sample.sampled(sample.completion_ids) == [3, 6, 8]
    assert sample.sampled(sample.versions) == [2, 3, 3]
    (sample,) = Group.from_dict(message(observation_spans=[[0, 2], [2, 6]])).samples  # adjacent spans are allowed
    assert sample.sampled(sample.completion_ids) == []


@pytest.mark.parametrize(
    "spans, reason",
    [
        (None, "must be a list"),
        ([[1, 3, 5]], "not a \\[start, end\\) pair"),
        ([1, 3], "not a \\[start, end\\) pair"),
        ([[0.0, 2]], "not a \\[start, end\\) pair"),
        ([[True, 2]], "not a \\[start, end\\) pair"),
        ([[2, 2]], "empty or outside"),
        ([[3, 1]], "empty or outside"),
        ([[-1, 2]], "empty or outside"),
        ([[4, 7]], "empty or outside the 6 completion tokens"),
        ([[0, 3], [2, 4]], "overlaps"),
        ([[4, 5], [1, 3]], "overlaps or precedes"),
    ],
)
def test_a_malformed_observation_span_is_refused_with_the_reason(spans, reason):
    with pytest.raises(MalformedGroup, match=f"sample 0 of run/0: .*{reason}"):
        Group.from_dict(message(observation_spans=spans))


def test_an_unknown_sample_field_is_still_refused():
    with pytest.raises(MalformedGroup, match="observation_span"):
        Group.from_dict(message(observation_span=[[1, 2]]))
