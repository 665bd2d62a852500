"""The finished-group message the actor publishes and the trainer consumes (JSON, versioned).

One message per group on the trainer's input stream. Its samples carry, per completion token,
the behaviour log-prob vLLM reported and the policy version that produced the token, so the
trainer can use them as old log-probs and measure policy lag.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

SCHEMA_VERSION = 1


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

    @property
    def mean_reward(self) -> float:
        return sum(s.reward for s in self.samples) / len(self.samples)

    def to_dict(self) -> dict:
        return {"schema_version": SCHEMA_VERSION, **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict) -> "Group":
        if not isinstance(data, dict):
            raise MalformedGroup("a group message must be a JSON object")
        if data.get("schema_version") != SCHEMA_VERSION:
            raise MalformedGroup(f"unknown schema_version {data.get('schema_version')!r} (expected {SCHEMA_VERSION})")
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
        for s in group.samples:
            if not (len(s.completion_ids) == len(s.logprobs) == len(s.versions)):
                raise MalformedGroup(f"sample {s.index} of {group.group_id}: tokens, logprobs and versions differ in length")
        if not group.samples:
            raise MalformedGroup(f"group {group.group_id} has no samples")
        return group
