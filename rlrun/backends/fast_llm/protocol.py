"""Fast-LLM's Redis protocol: the documents rlrun writes and the events Fast-LLM writes back.

Fast-LLM's messages, not rlrun's (no schema_version): one document per sample on
`trainer.fast_llm.stream` (`document`), the events `weights_ready` and `training_finished` (anything
else raises `MalformedEvent`). Where Fast-LLM reads and writes them: docs/architecture.md.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, Optional, TypeGuard, Union

from rlrun.streams.codec import excerpt, json_object
from rlrun.streams.rollouts import Group, Sample

EVENT_FIELD = "event"  # Fast-LLM's REDIS_TRAINING_FIELD

SpanEnd = Literal["exclusive", "inclusive"]


class MalformedEvent(ValueError):
    """A message on Fast-LLM's events stream that is not an event rlrun understands."""


@dataclass(frozen=True)
class WeightsReady:
    step: int  # optimizer steps completed; the policy version of the weights that follow
    documents_seen: Optional[int] = None  # documents consumed so far (not sent by every Fast-LLM version)


@dataclass(frozen=True)
class TrainingFinished:
    """Fast-LLM's training loop ended (also after an interrupt: not proof that train_iters was reached)."""


Event = Union[WeightsReady, TrainingFinished]


def prompt_span(prompt_length: int, span_end: SpanEnd = "exclusive") -> list[int]:
    """The loss-masking span covering the first `prompt_length` tokens, in `span_end` convention."""
    if prompt_length < 1:
        raise ValueError("a document needs a prompt of at least one token")
    return [0, prompt_length if span_end == "exclusive" else prompt_length - 1]


def document(prompt_ids: list[int], sample: Sample, span_end: SpanEnd = "exclusive") -> dict:
    """The Fast-LLM document of one sample (plain data, before JSON): the loss masks the prompt
    and each observation (multi-turn tokens the model did not sample), one span each."""
    if len(sample.logprobs) != len(sample.completion_ids):
        raise ValueError(
            f"sample {sample.index}: {len(sample.completion_ids)} tokens but {len(sample.logprobs)} log-probs"
        )
    shift = len(prompt_ids)  # completion offsets to document positions
    last = 0 if span_end == "exclusive" else 1  # an inclusive span ends on its last token, not after it
    observations = [[shift + start, shift + end - last] for start, end in sample.observation_spans]
    return {
        "tokens": [int(t) for t in prompt_ids] + [int(t) for t in sample.completion_ids],
        "loss_masking_spans": [prompt_span(len(prompt_ids), span_end), *observations],
        "advantage": float(sample.advantage),
        "old_log_probabilities": [0.0] * len(prompt_ids) + [float(lp) for lp in sample.logprobs],
    }


def encode_group(group: Group, span_end: SpanEnd = "exclusive") -> list[str]:
    """One document per sample of `group`, in sample order: the JSON of each message's `data` field."""
    documents = (document(group.prompt_ids, sample, span_end) for sample in group.samples)
    return [json.dumps(body, separators=(",", ":"), allow_nan=False) for body in documents]


def parse_event(fields: Mapping) -> Event:
    """The event in one `fast_llm_events` entry (its field map, str or bytes keys and values)."""
    raw = None
    for key, value in fields.items():
        if (key.decode("utf-8", "replace") if isinstance(key, (bytes, bytearray)) else key) == EVENT_FIELD:
            raw = value
    if raw is None:
        raise MalformedEvent(f"no '{EVENT_FIELD}' field in {excerpt(str(fields))}")
    body = json_object(raw, MalformedEvent, "event")
    kind = body.get("type")
    if kind == "training_finished":
        return TrainingFinished()
    if kind == "weights_ready":
        step = body.get("step")
        if not _is_count(step):
            raise MalformedEvent(f"weights_ready without a valid step: {excerpt(str(body))}")
        seen = body.get("documents_seen")
        if seen is not None and not _is_count(seen):
            raise MalformedEvent(f"weights_ready with an invalid documents_seen: {excerpt(str(body))}")
        return WeightsReady(step=step, documents_seen=seen)
    raise MalformedEvent(f"unknown event type {kind!r}: {excerpt(str(body))}")


def _is_count(value: object) -> TypeGuard[int]:
    return type(value) is int and value >= 0  # bool is an int in Python: refuse `true`
