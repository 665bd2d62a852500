"""The finished-group message the actor publishes and the trainer consumes (JSON, versioned): per
completion token, the behaviour log-prob vLLM reported and the policy version that produced it, and
which completion tokens are observations (multi-turn: tool results, environment feedback) that the
model did not sample and the loss must not train on.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from rlrun.streams.codec import SCHEMA_VERSION


class MalformedGroup(ValueError):
    """A message on the trainer's stream that is not a valid group."""


@dataclass(frozen=True)
class Sample:
    index: int  # position in its group
    completion_ids: list[int]
    logprobs: list[float]  # behaviour log-prob of each completion token
    versions: list[int]  # policy version that produced each completion token
    finish_reason: str  # "stop" (end of sequence) or "length" (budget spent)
    reward: float
    advantage: float
    # [start, end) offsets into completion_ids of observation tokens, sorted and disjoint: their
    # logprobs (0.0) and versions are never read. Empty for a single-turn sample; a message without
    # the key (an older actor) reads as []. Schema version unchanged: an older reader refuses the
    # unknown key (MalformedGroup), never trains on observations. Last: positional constructors work.
    observation_spans: list[list[int]] = field(default_factory=list)

    def sampled(self, values: list) -> list:
        """The entries of `values` (one per completion token: ids, logprobs, versions) at the
        tokens the model sampled, in order: the observations' left out."""
        if not self.observation_spans:
            return list(values)
        kept, start = [], 0
        for begin, end in self.observation_spans:
            kept += values[start:begin]
            start = end
        return kept + values[start:]


@dataclass(frozen=True)
class Group:
    group_id: str  # ours, never vLLM's: "<run>/<prompt cursor>"
    prompt_index: int  # index into the problem set
    prompt_ids: list[int]
    samples: list[Sample]

    def to_dict(self) -> dict:
        return {"schema_version": SCHEMA_VERSION, **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict, vocab_size: int | None = None) -> "Group":
        """The group in a message `codec.decode` read, every field type-checked (and with `vocab_size`
        every token id), so that one that passed cannot crash the trainer's step; else MalformedGroup."""
        try:
            samples = [Sample(**s) for s in data["samples"]]
            group = cls(
                group_id=str(data["group_id"]),
                prompt_index=int(data["prompt_index"]),
                prompt_ids=[int(t) for t in data["prompt_ids"]],
                samples=samples,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise MalformedGroup(f"bad group message: {exc}") from None
        if not group.samples:
            raise MalformedGroup(f"group {group.group_id} has no samples")
        if not group.prompt_ids:
            raise MalformedGroup(f"group {group.group_id} has an empty prompt")
        for s in group.samples:
            _check_sample(group.group_id, s)
        if vocab_size is not None:
            ids = list(group.prompt_ids) + [t for s in group.samples for t in s.completion_ids]
            if min(ids) < 0 or max(ids) >= vocab_size:
                raise MalformedGroup(f"group {group.group_id}: token id outside the model's vocabulary of {vocab_size}")
        return group


def _check_sample(group_id: str, s: Sample) -> None:
    what = f"sample {s.index!r} of {group_id}"

    def ints(values) -> bool:
        return isinstance(values, list) and all(type(v) is int and v >= 0 for v in values)

    def number(value) -> bool:
        return type(value) in (int, float) and math.isfinite(value)

    if type(s.index) is not int:
        raise MalformedGroup(f"{what}: index must be an integer")
    if not ints(s.completion_ids) or not ints(s.versions):
        raise MalformedGroup(f"{what}: completion_ids and versions must be lists of integers >= 0")
    if not isinstance(s.logprobs, list) or not all(number(v) for v in s.logprobs):
        raise MalformedGroup(f"{what}: logprobs must be a list of finite numbers")
    if not (len(s.completion_ids) == len(s.logprobs) == len(s.versions)):
        raise MalformedGroup(f"{what}: tokens, logprobs and versions differ in length")
    if not number(s.reward) or not number(s.advantage):
        raise MalformedGroup(f"{what}: reward and advantage must be finite numbers")
    if not isinstance(s.finish_reason, str):
        raise MalformedGroup(f"{what}: finish_reason must be a string")
    _check_spans(what, s.observation_spans, len(s.completion_ids))


def _check_spans(what: str, spans: object, length: int) -> None:
    """Observation spans as `Sample` defines them: [start, end) integer pairs within the
    completion's `length` tokens, each non-empty, sorted and not overlapping (adjacent is allowed)."""
    if not isinstance(spans, list):
        raise MalformedGroup(f"{what}: observation_spans must be a list of [start, end) pairs")
    previous_end = 0
    for span in spans:
        if not (isinstance(span, list) and len(span) == 2 and all(type(v) is int for v in span)):
            raise MalformedGroup(f"{what}: observation span {span!r} is not a [start, end) pair of integers")
        start, end = span
        if not 0 <= start < end <= length:
            raise MalformedGroup(
                f"{what}: observation span {span!r} is empty or outside the {length} completion tokens"
            )
        if start < previous_end:
            raise MalformedGroup(f"{what}: observation span {span!r} overlaps or precedes the one before it")
        previous_end = end
