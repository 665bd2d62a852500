"""The finished-group message the actor publishes and the trainer consumes (JSON, versioned): per
completion token, the behaviour log-prob vLLM reported and the policy version that produced it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

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
