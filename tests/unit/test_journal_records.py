"""Journal records: JSON round trips of what Redis stores (headers, log entries), and clear
refusals of corrupt records."""

from __future__ import annotations

import json

import pytest

from rlrun.journal.records import (
    SCHEMA_VERSION,
    CorruptRecord,
    GroupHeader,
    GroupRecord,
    LogEntry,
    SampleRecord,
)
from rlrun.journal.store import fold_group


def _sample(**overrides) -> SampleRecord:
    fields = dict(
        group_id="run/3", index=1, state="generating", token_ids=[11, 12, 13],
        logprobs=[-0.1, -2.5e-7, -13.0], versions=[2, 2, 3], finish_reason=None,
    )
    return SampleRecord(**{**fields, **overrides})


def _group() -> GroupRecord:
    return GroupRecord(
        group_id="run/3", cursor=3, prompt_index=17, prompt_ids=[5, 6, 7], group_size=2,
        max_new_tokens=16,
        samples=[
            _sample(index=0, state="finished", finish_reason="stop"),
            _sample(index=1),
        ],
    )


# --- round trips -------------------------------------------------------------------------------


def _entry(**overrides) -> dict:
    """An append log entry as JSON data, with `overrides`."""
    data = {"schema_version": 1, "kind": "append", "index": 1, "offset": 0, "token_ids": [11, 12, 13],
            "logprobs": [-0.1, -2.5e-7, -13.0], "version": 2}  # fmt: skip
    return data | overrides


def test_log_entries_round_trip_exactly():
    append = LogEntry("append", index=2, offset=5, token_ids=[1, 2], logprobs=[-0.1, -1 / 3], version=7)
    raw = append.to_json()
    assert json.loads(raw)["schema_version"] == SCHEMA_VERSION == 1
    assert LogEntry.from_json(raw) == append
    assert LogEntry.from_json(raw).logprobs[1] == -1 / 3  # floats survive bit for bit
    reset = LogEntry("reset", index=1)
    assert LogEntry.from_json(reset.to_json()) == reset
    assert json.loads(reset.to_json()) == {"schema_version": 1, "kind": "reset", "index": 1}


def test_header_round_trip_and_a_group_holds_its_header():
    header = GroupHeader("r/0", 0, 4, [1, 2], 3, 8)
    assert GroupHeader.from_json(header.to_json()) == header
    assert json.loads(header.to_json()) == {
        "schema_version": 1, "kind": "group_header", "group_id": "r/0", "cursor": 0, "prompt_index": 4,
        "prompt_ids": [1, 2], "group_size": 3, "max_new_tokens": 8,
    }  # fmt: skip
    assert _group().header == GroupHeader("run/3", 3, 17, [5, 6, 7], 2, 16)
    assert GroupRecord.from_header(_group().header, _group().samples) == _group()


def test_records_are_json_never_pickle():
    for raw in (GroupHeader("r/0", 0, 4, [1, 2], 3, 8).to_json(), LogEntry("reset", 0).to_json()):
        assert raw.startswith("{") and json.loads(raw)["schema_version"] == 1


# --- corrupt records ---------------------------------------------------------------------------


@pytest.mark.parametrize("parse", [GroupHeader.from_json, LogEntry.from_json])
def test_not_json_is_refused_with_a_clear_reason(parse):
    with pytest.raises(CorruptRecord, match="not JSON"):
        parse('{"schema_version": 1, "kind": ')
    with pytest.raises(CorruptRecord, match="expected an object"):
        parse("[1, 2]")
    with pytest.raises(CorruptRecord, match="not UTF-8"):
        parse(b"\xff\xfe")


def test_unknown_schema_version_is_refused():
    for bad in (2, 0, "1", True, None):
        with pytest.raises(CorruptRecord, match=r"unknown schema_version .* reads version 1"):
            LogEntry.from_json(json.dumps(_entry(schema_version=bad)))
    header = json.loads(GroupHeader("r/0", 0, 4, [1, 2], 3, 8).to_json()) | {"schema_version": 9}
    with pytest.raises(CorruptRecord, match="unknown schema_version 9"):
        GroupHeader.from_json(json.dumps(header))


def test_a_record_of_another_kind_is_refused():
    with pytest.raises(CorruptRecord, match="expected a group_header record, got kind 'reset'"):
        GroupHeader.from_json(LogEntry("reset", 0).to_json())
    with pytest.raises(CorruptRecord, match="unknown kind 'truncate'"):
        LogEntry.from_json('{"schema_version":1,"kind":"truncate","index":0}')


@pytest.mark.parametrize(
    "field, value",
    [("token_ids", [1, 2]), ("logprobs", [-1.0]), ("versions", [1, 2, 3, 4])],
)
def test_tokens_logprobs_and_versions_of_different_lengths_are_refused(field, value):
    with pytest.raises(CorruptRecord, match="differ in length"):
        _sample(**{field: value})


def test_log_entry_with_misaligned_logprobs_is_refused():
    with pytest.raises(CorruptRecord, match="differ in length"):
        LogEntry.from_json(json.dumps(_entry(token_ids=[1, 2], logprobs=[-1.0])))


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("token_ids", [1, "2"], "token_ids must be a list of integers"),
        ("token_ids", [1, True], "token_ids must be a list of integers"),
        ("token_ids", [-1, 2, 3], "token_ids must be a list of integers"),
        ("logprobs", [-1.0, None, 0.0], "logprobs must be a list of finite numbers"),
        ("version", 1.5, "version must be an integer"),
        ("offset", -1, "offset must be >= 0"),
        ("index", "1", "index must be an integer"),
        ("index", -1, "index must be >= 0"),
    ],
)
def test_wrong_types_in_a_log_entry_are_refused_naming_the_field(field, value, message):
    with pytest.raises(CorruptRecord, match=message):
        LogEntry.from_json(json.dumps(_entry(**{field: value})))


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("index", -1, "index must be >= 0"),
        ("group_id", "", "group_id must be a non-empty string"),
        ("state", "lost", "unknown state 'lost'"),
    ],
)
def test_wrong_values_in_a_sample_are_refused_naming_the_field(field, value, message):
    with pytest.raises(CorruptRecord, match=message):
        _sample(**{field: value})


@pytest.mark.parametrize("field, value", [("cursor", "3"), ("group_size", 0), ("prompt_ids", [1, None])])
def test_wrong_types_in_a_header_are_refused_naming_the_field(field, value):
    header = json.loads(GroupHeader("r/0", 0, 4, [1, 2], 3, 8).to_json()) | {field: value}
    with pytest.raises(CorruptRecord, match=field):
        GroupHeader.from_json(json.dumps(header))


def test_nan_and_infinity_are_refused():
    raw = json.dumps(_entry()).replace("-13.0", "NaN")
    with pytest.raises(CorruptRecord, match="NaN is not valid JSON"):
        LogEntry.from_json(raw)
    with pytest.raises(CorruptRecord, match="cannot encode"):
        LogEntry("append", 0, 0, [1, 2, 3], [-1.0, float("-inf"), 0.0], 0).to_json()


def test_a_missing_field_is_named():
    data = _entry()
    del data["version"]
    with pytest.raises(CorruptRecord, match="no 'version'"):
        LogEntry.from_json(json.dumps(data))
    header = json.loads(GroupHeader("r/0", 0, 4, [1, 2], 3, 8).to_json())
    del header["prompt_ids"]
    with pytest.raises(CorruptRecord, match="no 'prompt_ids'"):
        GroupHeader.from_json(json.dumps(header))


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"state": "pending"}, "pending but holds 3 tokens"),
        ({"state": "finished", "finish_reason": None}, "finished with finish_reason None"),
        ({"state": "finished", "finish_reason": "abort"}, "finished with finish_reason 'abort'"),
        ({"state": "generating", "finish_reason": "stop"}, "generating but has finish_reason"),
    ],
)
def test_inconsistent_states_are_refused(overrides, message):
    with pytest.raises(CorruptRecord, match=message):
        _sample(**overrides)


def test_group_shape_is_checked():
    group = _group()
    fixed = {name: getattr(group, name) for name in ("group_id", "cursor", "prompt_index", "prompt_ids", "group_size")}
    with pytest.raises(CorruptRecord, match=": 1 samples, expected 2"):
        GroupRecord(**fixed, max_new_tokens=16, samples=group.samples[:1])
    with pytest.raises(CorruptRecord, match="sample at position 0"):
        GroupRecord(**fixed, max_new_tokens=16, samples=group.samples[::-1])
    with pytest.raises(CorruptRecord, match="max_new_tokens must be >= 1"):
        GroupRecord(**fixed, max_new_tokens=0, samples=group.samples)


# --- folding a group's log (what the store reads back) ------------------------------------------


def _fields(header: GroupHeader, **samples) -> dict:
    fields = {"header": header.to_json(), "state": "open", "size": str(header.group_size), "cursor": str(header.cursor)}
    for i in range(header.group_size):
        fields |= {f"{i}:state": "pending", f"{i}:len": "0"}
    return fields | samples


def _append(index, offset, tokens, version=0):
    return LogEntry("append", index, offset, tokens, [-0.5 - t for t in tokens], version).to_json()


def test_fold_rebuilds_samples_from_appends_and_resets():
    header = GroupHeader("r/0", 0, 0, [1], 2, 8)
    entries = [_append(0, 0, [1, 2], 1), _append(1, 0, [9], 1), _append(0, 2, [3], 2), LogEntry("reset", 1).to_json(), _append(1, 0, [7, 8], 3)]
    fields = _fields(header, **{"0:state": "finished", "0:finish": "stop", "0:len": "3", "1:state": "generating", "1:len": "2"})
    group, problems = fold_group("r/0", fields, entries)
    assert problems == []
    assert group.samples[0] == SampleRecord("r/0", 0, "finished", [1, 2, 3], [-1.5, -2.5, -3.5], [1, 1, 2], "stop")
    assert group.samples[1] == SampleRecord("r/0", 1, "generating", [7, 8], [-7.5, -8.5], [3, 3])


def test_fold_reads_a_corrupt_sample_as_empty_and_says_why():
    header = GroupHeader("r/0", 0, 0, [1], 3, 8)
    entries = [
        _append(0, 0, [1, 2]),
        '{"schema_version":1,"kind":"append","index":1,"offset":0,"token_ids":[1,2],"logprobs":[-1.0]',  # cut off
        _append(2, 0, [5]),
        _append(2, 3, [6]),  # a gap
    ]
    fields = _fields(header, **{"0:state": "generating", "0:len": "2", "1:state": "generating", "1:len": "2", "2:state": "generating", "2:len": "2"})
    group, problems = fold_group("r/0", fields, entries)
    assert group.samples[0].token_ids == [1, 2]  # untouched by the others' corruption
    assert group.samples[1] == SampleRecord("r/0", 1, "pending")
    assert group.samples[2] == SampleRecord("r/0", 2, "pending")
    assert problems[0].startswith("log entry 1: log entry record is not JSON")
    assert "sample 1: the log holds 0 tokens but the recorded length is '2'" in problems
    assert "sample 2: log entry 3 appends at offset 3 to a sample of 1 tokens" in problems
    assert len(problems) == 3


def test_fold_blames_a_readable_but_invalid_entry_on_its_sample():
    header = GroupHeader("r/0", 0, 0, [1], 2, 8)
    bad = '{"schema_version":2,"kind":"append","index":1,"offset":0,"token_ids":[1],"logprobs":[-1.0],"version":0}'
    fields = _fields(header, **{"0:state": "generating", "0:len": "1", "1:state": "generating", "1:len": "1"})
    group, problems = fold_group("r/0", fields, [_append(0, 0, [4]), bad])
    assert group.samples[0].token_ids == [4] and group.samples[1].token_ids == []
    assert problems == ["sample 1: log entry 1: append record has unknown schema_version 2 (this rlrun reads version 1)"]


def test_fold_reports_a_log_that_disagrees_with_the_recorded_length():
    header = GroupHeader("r/0", 0, 0, [1], 1, 8)
    group, problems = fold_group("r/0", _fields(header, **{"0:state": "generating", "0:len": "5"}), [_append(0, 0, [1, 2])])
    assert group.samples[0].token_ids == []
    assert problems == ["sample 0: the log holds 2 tokens but the recorded length is '5'"]


def test_fold_refuses_a_group_with_a_bad_header():
    with pytest.raises(CorruptRecord, match="has no record"):
        fold_group("r/0", {}, [])
    with pytest.raises(CorruptRecord, match="not JSON"):
        fold_group("r/0", {"header": "{oops", "state": "open"}, [])


# --- relabel: the versions vLLM reported for tokens journaled before it said -----------------------
def test_an_append_that_relabels_round_trips_and_one_that_does_not_carries_no_relabel_key():
    entry = LogEntry("append", 0, 4, [9], [-0.5], 6, relabel=[[0, 2, 5], [2, 4, 6]])
    assert LogEntry.from_json(entry.to_json()) == entry
    assert "relabel" not in json.loads(LogEntry("append", 0, 0, [1], [-0.1], 3).to_json())


@pytest.mark.parametrize("relabel", [[[2, 1, 5]], [[0, 1]], [[0, 1, -1]], "0-1", [[0, True, 5]]])
def test_a_malformed_relabel_is_a_corrupt_record(relabel):
    raw = json.loads(LogEntry("append", 0, 0, [1], [-0.1], 3).to_json()) | {"relabel": relabel}
    with pytest.raises(CorruptRecord, match="relabel"):
        LogEntry.from_json(json.dumps(raw))


def test_fold_applies_a_relabel_to_the_tokens_journaled_before_it():
    header = GroupHeader("r/0", 0, 0, [1], 1, 8)
    entries = [_append(0, 0, [1, 2, 3], 5),
               LogEntry("append", 0, 3, [4], [-4.5], 6, relabel=[[0, 1, 5], [1, 3, 6]]).to_json()]  # fmt: skip
    fields = _fields(header, **{"0:state": "finished", "0:finish": "length", "0:len": "4"})
    group, problems = fold_group("r/0", fields, entries)
    assert problems == [] and group.samples[0].versions == [5, 6, 6, 6]


def test_fold_reads_a_relabel_beyond_the_sample_as_damage_to_that_sample():
    header = GroupHeader("r/0", 0, 0, [1], 1, 8)
    entries = [_append(0, 0, [1, 2], 5), LogEntry("append", 0, 2, [], [], 0, relabel=[[0, 3, 6]]).to_json()]
    group, problems = fold_group("r/0", _fields(header, **{"0:state": "generating", "0:len": "2"}), entries)
    assert group.samples[0] == SampleRecord("r/0", 0, "pending")
    assert problems == ["sample 0: log entry 1 relabels tokens [0, 3) of a sample of 2 tokens"]


def test_version_runs_are_what_a_relabel_carries():
    from rlrun.journal.records import version_runs

    assert version_runs([]) == []
    assert version_runs([3, 3, 4, 4, 4, 3]) == [[0, 2, 3], [2, 5, 4], [5, 6, 3]]
