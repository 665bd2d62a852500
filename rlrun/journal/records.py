"""The token journal's records (the replay plan's input, the token log's entries): typed, versioned
JSON (never pickle). Parsing raises `CorruptRecord` (a ValueError) saying what is wrong.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Optional

from rlrun.streams.codec import dumps, json_object

SCHEMA_VERSION = 1

SAMPLE_STATES = ("pending", "generating", "finished")
FINAL_REASONS = ("stop", "length")  # finish reasons that end a sample; "abort" does not


class CorruptRecord(ValueError):
    """A journal record that is not valid JSON of a known schema version and shape."""


def _check_header(data: dict, kind: str) -> None:
    version = data.get("schema_version")
    if type(version) is not int or version != SCHEMA_VERSION:
        raise CorruptRecord(
            f"{kind} record has unknown schema_version {version!r} (this rlrun reads version {SCHEMA_VERSION})"
        )
    if data.get("kind") != kind:
        raise CorruptRecord(f"expected a {kind} record, got kind {data.get('kind')!r}")


def _field(data: dict, name: str, kind: str) -> Any:
    if name not in data:
        raise CorruptRecord(f"{kind} record has no {name!r}")
    return data[name]


def _int(value: Any, what: str, minimum: int | None = 0) -> int:
    if type(value) is not int:  # bool is an int in Python: `true` must not pass
        raise CorruptRecord(f"{what} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise CorruptRecord(f"{what} must be >= {minimum}, got {value}")
    return value


def _str(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise CorruptRecord(f"{what} must be a non-empty string, got {value!r}")
    return value


def _int_list(value: Any, what: str) -> list[int]:
    if not isinstance(value, list) or any(type(v) is not int or v < 0 for v in value):
        raise CorruptRecord(f"{what} must be a list of integers >= 0")
    return value


@dataclass(frozen=True)
class SampleRecord:
    """One sample of a group: the tokens it holds so far and where it stands."""

    group_id: str
    index: int  # position in its group
    state: str  # pending | generating | finished
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # sampled-token logprob, one per token
    versions: list[int] = field(default_factory=list)  # policy version that produced each token
    finish_reason: Optional[str] = None  # "stop" | "length" once finished, else None
    # A conversation (environment.step): where its model turns ended (token counts), and what the
    # environment answered: each observation's payload with the [start, end) of its tokens; the
    # last step's (done, reward) has no tokens. Empty for a sample of one turn.
    turn_ends: list[list] = field(default_factory=list)  # [token count, "stop" | "length"] per ended turn
    observations: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        what = f"sample {self.group_id!r}#{self.index}"
        _str(self.group_id, "group_id")
        _int(self.index, f"{what}: index")
        if self.state not in SAMPLE_STATES:
            raise CorruptRecord(f"{what}: unknown state {self.state!r} (one of {SAMPLE_STATES})")
        if not (len(self.token_ids) == len(self.logprobs) == len(self.versions)):
            raise CorruptRecord(f"{what}: token_ids, logprobs and versions differ in length")
        if self.state == "pending" and self.token_ids:
            raise CorruptRecord(f"{what}: pending but holds {len(self.token_ids)} tokens")
        if self.state == "finished" and self.finish_reason not in FINAL_REASONS:
            raise CorruptRecord(f"{what}: finished with finish_reason {self.finish_reason!r} (one of {FINAL_REASONS})")
        if self.state in ("pending", "generating") and self.finish_reason is not None:
            raise CorruptRecord(f"{what}: {self.state} but has finish_reason {self.finish_reason!r}")

    @property
    def finished(self) -> bool:
        return self.state == "finished"


@dataclass(frozen=True)
class GroupHeader:
    """The part of a group fixed when it is opened."""

    group_id: str  # ours: "<run>/<cursor>"
    cursor: int  # position in the prompt order (0 = first group handed out)
    prompt_index: int  # index into the problem set
    prompt_ids: list[int]
    group_size: int
    max_new_tokens: int  # completion budget of every sample

    def __post_init__(self) -> None:
        what = f"group {self.group_id!r}"
        _str(self.group_id, "group_id")
        _int(self.cursor, f"{what}: cursor")
        _int(self.prompt_index, f"{what}: prompt_index")
        _int_list(self.prompt_ids, f"{what}: prompt_ids")
        _int(self.group_size, f"{what}: group_size", minimum=1)
        _int(self.max_new_tokens, f"{what}: max_new_tokens", minimum=1)

    def to_json(self) -> str:
        record = {"schema_version": SCHEMA_VERSION, "kind": "group_header", **header_fields(self)}
        return dumps(record, CorruptRecord)

    @classmethod
    def from_json(cls, raw: str | bytes) -> "GroupHeader":
        data = json_object(raw, CorruptRecord, "group_header record")
        _check_header(data, "group_header")
        return cls(**{name: _field(data, name, "group_header") for name in HEADER_FIELDS})  # __post_init__ checks types


@dataclass(frozen=True)
class GroupRecord:
    """An open group of samples for one prompt, as the journal holds it."""

    group_id: str
    cursor: int
    prompt_index: int
    prompt_ids: list[int]
    group_size: int
    max_new_tokens: int
    samples: list[SampleRecord]

    def __post_init__(self) -> None:
        GroupHeader(**header_fields(self))  # validates the fixed part
        what = f"group {self.group_id!r}"
        if len(self.samples) != self.group_size:
            raise CorruptRecord(f"{what}: {len(self.samples)} samples, expected {self.group_size}")
        for position, sample in enumerate(self.samples):
            if sample.index != position or sample.group_id != self.group_id:
                raise CorruptRecord(f"{what}: sample at position {position} is {sample.group_id!r}#{sample.index}")

    @property
    def header(self) -> GroupHeader:
        return GroupHeader(**header_fields(self))

    @classmethod
    def from_header(cls, header: GroupHeader, samples: list[SampleRecord]) -> "GroupRecord":
        return cls(**header_fields(header), samples=samples)


HEADER_FIELDS = tuple(f.name for f in fields(GroupHeader))  # the one list of a header's fields


def header_fields(header: GroupHeader | GroupRecord) -> dict:
    """The fields a group's header and its record share."""
    return {name: getattr(header, name) for name in HEADER_FIELDS}


@dataclass(frozen=True)
class LogEntry:
    """One entry of a group's token log: `append` tokens of policy `version` at `offset`, or `reset`.
    An append may also carry `relabel`: `[start, end, version]` runs that set the versions of the
    sample's tokens in [start, end) (the finish of a sample whose earlier tokens were journaled with
    a provisional version, before vLLM said which weights sampled them). In a conversation an
    append may also say that the model's turn ended with its tokens (`turn_end`: the reason), or
    that its tokens render the environment's `observation` (its payload: what the step returned,
    so the step is never run again; no tokens for the last step, which carries the reward)."""

    kind: str  # "append" | "reset"
    index: int
    offset: int = 0
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    version: int = 0
    relabel: list[list[int]] = field(default_factory=list)
    turn_end: Optional[str] = None
    observation: Optional[dict] = None

    def to_json(self) -> str:
        if self.kind == "reset":
            record = {"kind": "reset", "index": self.index}
        else:
            record = asdict(self)
            for optional in ("relabel", "turn_end", "observation"):
                if record[optional] is None or record[optional] == []:
                    del record[optional]  # most appends: none of these, no bytes for them
        return dumps({"schema_version": SCHEMA_VERSION, **record}, CorruptRecord)

    @classmethod
    def from_json(cls, raw: str | bytes) -> "LogEntry":
        data = json_object(raw, CorruptRecord, "log entry record")
        kind = data.get("kind")
        if kind not in ("append", "reset"):
            raise CorruptRecord(f"log entry has unknown kind {kind!r} (append or reset)")
        _check_header(data, kind)
        index = _int(_field(data, "index", kind), f"{kind} index")
        if kind == "reset":
            return cls(kind="reset", index=index)
        what = f"append to sample {index}"
        token_ids = _int_list(_field(data, "token_ids", kind), f"{what}: token_ids")
        logprobs = _field(data, "logprobs", kind)
        numbers = isinstance(logprobs, list) and all(type(v) in (int, float) for v in logprobs)
        if not numbers or not all(math.isfinite(v) for v in logprobs):
            raise CorruptRecord(f"{what}: logprobs must be a list of finite numbers")
        if len(token_ids) != len(logprobs):
            raise CorruptRecord(f"{what}: token_ids and logprobs differ in length ({len(token_ids)}, {len(logprobs)})")
        relabel = data.get("relabel", [])
        runs = isinstance(relabel, list) and all(
            isinstance(run, list) and len(run) == 3 and all(type(v) is int and v >= 0 for v in run) and run[0] <= run[1]
            for run in relabel
        )
        if not runs:
            raise CorruptRecord(f"{what}: relabel must be a list of [start, end, version] with 0 <= start <= end")
        return cls(
            kind="append",
            index=index,
            offset=_int(_field(data, "offset", kind), f"{what}: offset"),
            token_ids=token_ids,
            logprobs=[float(v) for v in logprobs],
            version=_int(_field(data, "version", kind), f"{what}: version"),
            relabel=[list(run) for run in relabel],
            turn_end=_turn_end(data.get("turn_end"), what),
            observation=_observation(data.get("observation"), what),
        )


def _turn_end(value: Any, what: str) -> Optional[str]:
    if value is not None and value not in FINAL_REASONS:
        raise CorruptRecord(f"{what}: turn_end must be one of {FINAL_REASONS}, got {value!r}")
    return value


def _observation(value: Any, what: str) -> Optional[dict]:
    if value is not None and not isinstance(value, dict):
        raise CorruptRecord(f"{what}: observation must be an object, got {value!r}")
    return value


def version_runs(versions: list[int]) -> list[list[int]]:
    """`versions` as [start, end, version] runs (what a relabel carries)."""
    runs: list[list[int]] = []
    for position, version in enumerate(versions):
        if runs and runs[-1][2] == version:
            runs[-1][1] = position + 1
        else:
            runs.append([position, position + 1, version])
    return runs
