"""Pure rules of group sampling: a sample's state, its remaining budget, advantages of a group.

A sample is generated in one or more requests: the first asks for the whole group at once; a
sample cut short (vLLM paused with abort for a weight update, or a server lost) is continued
with prompt + the tokens it already has, for what is left of its budget.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

FINISHED_REASONS = ("stop", "length")


@dataclass
class SampleState:
    index: int
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish_reason: Optional[str] = None
    requests: int = 0  # requests that contributed tokens (1 = never continued)

    @property
    def finished(self) -> bool:
        return self.finish_reason in FINISHED_REASONS

    def append(self, token_ids: list[int], logprobs: list[float], version: int) -> None:
        self.completion_ids.extend(token_ids)
        self.logprobs.extend(logprobs)
        self.versions.extend([version] * len(token_ids))


def remaining_budget(sample: SampleState, max_new_tokens: int) -> int:
    """Tokens the next request may generate: the budget less what the sample already holds."""
    return max(0, max_new_tokens - len(sample.completion_ids))


def close_if_spent(sample: SampleState, max_new_tokens: int) -> None:
    """A sample whose budget is spent is finished locally as `length`, without a request."""
    if not sample.finished and remaining_budget(sample, max_new_tokens) == 0:
        sample.finish_reason = "length"
