"""Pure rules of group sampling: a sample's state and its remaining budget (staleness: `rlrun.journal.plan.is_stale`).

A sample cut short (an abort for a weight update, a server lost, a restart) is continued with
prompt + the tokens it already has, for what is left of its budget.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from rlrun.journal.records import FINAL_REASONS


@dataclass
class SampleState:
    index: int
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)  # policy version that produced each token
    finish_reason: Optional[str] = None
    journaled: int = 0  # tokens already appended to the journal
    finish_recorded: bool = False  # the journal knows it is finished

    @property
    def finished(self) -> bool:
        return self.finish_reason in FINAL_REASONS

    def append(self, token_ids: list[int], logprobs: list[float], version: int) -> None:
        self.append_all(token_ids, logprobs, [version] * len(token_ids))

    def append_all(self, token_ids: list[int], logprobs: list[float], versions: list[int]) -> None:
        self.completion_ids.extend(token_ids)
        self.logprobs.extend(logprobs)
        self.versions.extend(versions)

    def reset(self) -> None:
        """Forget every token (a dropped prefix): the sample starts again from the prompt."""
        self.completion_ids, self.logprobs, self.versions = [], [], []
        self.finish_reason = None
        self.finish_recorded = False
        self.journaled = 0


def remaining_budget(sample: SampleState, max_new_tokens: int) -> int:
    """Tokens the next request may generate: the budget less what the sample already holds."""
    return max(0, max_new_tokens - len(sample.completion_ids))


def close_if_spent(sample: SampleState, max_new_tokens: int) -> bool:
    """Finish locally as `length` a sample whose budget is spent; True if it was closed now."""
    if not sample.finished and remaining_budget(sample, max_new_tokens) == 0:
        sample.finish_reason = "length"
        return True
    return False
