"""Pure rules of group sampling: a sample's state, its remaining budget, the policy version of
each of its tokens (staleness: `rlrun.journal.plan.is_stale`) and what a failed request leaves
kept (`count_kept`).

A sample cut short (a server lost, a restart) is continued with prompt + the tokens it already
has, for what is left of its budget. A weight update cuts nothing: vLLM keeps the request and
says, on its last chunk, which weights sampled which tokens (`token_versions`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

from rlrun.journal.records import FINAL_REASONS, SampleRecord

if TYPE_CHECKING:
    from rlrun.actor.vllm_client import VersionSpan


@dataclass
class SampleState:
    index: int
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)  # policy version that produced each token
    finish_reason: Optional[str] = None
    journaled: int = 0  # tokens already appended to the journal
    finish_recorded: bool = False  # the journal knows it is finished
    relabel_pending: bool = False  # versions of journaled tokens changed since they were appended
    kept_counted: int = 0  # of its tokens, those already counted as kept (reused, not generated again)
    # A conversation (environment.step): its tokens after the prompt are model turns and the
    # observations between them. `turn_end` is set when a model turn ended and the environment
    # has not answered it yet (recorded in the journal with the turn's last tokens).
    turn_start: int = 0  # where the current model turn began
    turn_ends: list[list] = field(default_factory=list)  # [where, how] each model turn ended
    observations: list[dict] = field(default_factory=list)  # the environment's answers, with their [start, end)
    turn_end: Optional[str] = None
    turn_end_recorded: bool = False
    step_interrupted: bool = False  # the journal holds the turn's end but not its step's answer: a crash cut the step
    reward: Optional[float] = None  # the environment's, once it said done

    @property
    def step_due(self) -> bool:
        """A model turn ended and the environment has yet to answer it."""
        return not self.finished and self.turn_end is not None

    @property
    def observation_spans(self) -> list[list[int]]:
        return [[o["start"], o["end"]] for o in self.observations if o["end"] > o["start"]]

    @property
    def finished(self) -> bool:
        return self.finish_reason in FINAL_REASONS

    def append(self, token_ids: list[int], logprobs: list[float], version: int) -> None:
        """`version`: provisional (the policy published when the request was sent) until `relabel`."""
        self.append_all(token_ids, logprobs, [version] * len(token_ids))

    def relabel(self, start: int, versions: list[int]) -> None:
        """The versions of tokens [start, start + len(versions)), as vLLM reported them."""
        end = start + len(versions)
        if self.versions[start : min(end, self.journaled)] != versions[: max(0, self.journaled - start)]:
            self.relabel_pending = True  # the journal holds provisional versions for some of them
        self.versions[start:end] = versions

    def append_all(self, token_ids: list[int], logprobs: list[float], versions: list[int]) -> None:
        self.completion_ids.extend(token_ids)
        self.logprobs.extend(logprobs)
        self.versions.extend(versions)

    def reset(self) -> None:
        """Forget every token (a dropped prefix): the sample starts again from the prompt."""
        self.completion_ids, self.logprobs, self.versions = [], [], []
        self.finish_reason = None
        self.finish_recorded = False
        self.relabel_pending = False
        self.journaled = 0
        self.kept_counted = 0
        self.turn_start, self.turn_ends, self.observations = 0, [], []
        self.turn_end, self.turn_end_recorded, self.reward, self.step_interrupted = None, False, None, False

    def end_turn(self, reason: str) -> None:
        """The model's turn ended (`reason`: stop or length); the environment answers it next."""
        self.turn_end, self.turn_end_recorded = reason, False
        self.turn_ends.append([len(self.completion_ids), reason])

    def observe(self, token_ids: list[int], payload: dict) -> None:
        """The environment's answer and the tokens it renders to: the next turn starts after them.
        Never sampled: log-prob 0, and the version of the turn they answer (the trainer masks them)."""
        start = len(self.completion_ids)
        version = self.versions[-1] if self.versions else 0
        self.append_all(list(token_ids), [0.0] * len(token_ids), [version] * len(token_ids))
        self.observations.append({**payload, "start": start, "end": len(self.completion_ids)})
        self.turn_start, self.turn_end, self.step_interrupted = len(self.completion_ids), None, False
        self.kept_counted = max(self.kept_counted, len(self.completion_ids))  # finished turns are never at risk

    def take_conversation(self, turn_ends: list[list], observations: list[dict]) -> None:
        """A conversation as the journal holds it: a turn that ended after the last observation
        was recorded awaits its step (interrupted); a final step's payload holds the reward."""
        self.turn_ends, self.observations = list(turn_ends), [dict(o) for o in observations]
        answered = max((o["start"] for o in self.observations), default=-1)
        self.turn_start = max((o["end"] for o in self.observations if o["end"] > o["start"]), default=0)
        pending = [how for end, how in self.turn_ends if end > answered and end == len(self.completion_ids)]
        self.turn_end, self.turn_end_recorded = (pending[-1], True) if pending and not self.finished else (None, False)
        self.step_interrupted = self.turn_end is not None
        final = [o for o in self.observations if o.get("done")]
        self.reward = float(final[-1]["reward"]) if final and final[-1].get("reward") is not None else None

    def take_journal(self, stored: Optional[SampleRecord]) -> None:
        """Become what the journal holds of this sample (nothing when `stored` is None): its view
        wins when the two disagree. Tokens it keeps that were counted as kept stay counted."""
        counted = self.kept_counted
        self.reset()
        if stored is not None:
            self.append_all(stored.token_ids, stored.logprobs, stored.versions)
            self.finish_reason, self.finish_recorded = stored.finish_reason, stored.finished
            self.take_conversation(stored.turn_ends, stored.observations)
        self.journaled = len(self.completion_ids)
        self.kept_counted = min(counted, self.journaled)


@dataclass
class LiveGroup:
    """A group the actor is generating: its samples share the prompt and the budget it was opened with."""

    group_id: str
    cursor: int
    prompt_index: int
    prompt_ids: list[int]
    max_new_tokens: int
    samples: list[SampleState]


def remaining_budget(sample: SampleState, max_new_tokens: int) -> int:
    """Tokens the next request may generate: the budget less what the sample already holds."""
    return max(0, max_new_tokens - len(sample.completion_ids))


def close_if_spent(sample: SampleState, max_new_tokens: int) -> bool:
    """Finish locally as `length` a sample whose budget is spent; True if it was closed now."""
    if not sample.finished and remaining_budget(sample, max_new_tokens) == 0:
        sample.finish_reason = "length"
        return True
    return False


def count_kept(sample: SampleState) -> int:
    """The tokens of an unfinished sample kept for its next request (a request failed) that were
    not counted as kept before, now counted: each kept token counts once, however many retries."""
    if sample.step_due:  # a conversation's turn that ended whole: its tokens were never at risk
        sample.kept_counted = len(sample.completion_ids)
        return 0
    if sample.finished:
        return 0
    new = max(0, len(sample.completion_ids) - sample.kept_counted)
    sample.kept_counted = len(sample.completion_ids)
    return new


def token_versions(spans: "list[VersionSpan] | None", length: int, provisional: int) -> list[int]:
    """The policy version of each of a request's `length` output tokens, from vLLM's spans. A token
    no span covers, or whose span's label is not a version (a server labels the weights it loaded
    at its start "default"), keeps `provisional`: the version published when the request was sent,
    which is never newer than the weights that served it (the trainer publishes only after every
    server loaded them)."""
    versions = [provisional] * length
    for span in spans or []:
        if span.label.isdigit():
            for k in range(max(0, span.start), min(length, span.end)):
                versions[k] = int(span.label)
    return versions
