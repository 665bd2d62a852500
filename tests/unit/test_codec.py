"""The stream message codec: compact versioned JSON in, the same dict out, clear refusals."""

from __future__ import annotations

import json
import math

import pytest

from rlrun.streams.codec import SCHEMA_VERSION, MalformedMessage, decode, encode


def test_round_trip_keeps_the_message_and_adds_the_schema_version():
    message = {"group": "run/3", "tokens": [1, 2, 3], "advantage": -0.5, "text": "π ≈ 3.14"}
    decoded = decode(encode(message))
    assert decoded == {**message, "schema_version": SCHEMA_VERSION}
    # a message written by this schema version reads back as it was written
    assert decode('{"schema_version":1,"group":"run/3"}') == {"schema_version": 1, "group": "run/3"}


def test_encode_is_compact_json_and_does_not_touch_the_callers_dict():
    message = {"a": [1, 2], "b": {"c": None}}
    raw = encode(message)
    assert raw == '{"schema_version":1,"a":[1,2],"b":{"c":null}}'
    assert message == {"a": [1, 2], "b": {"c": None}}


def test_encode_keeps_a_matching_schema_version_and_refuses_another():
    assert json.loads(encode({"schema_version": 1, "x": 1})) == {"schema_version": 1, "x": 1}
    with pytest.raises(MalformedMessage, match="schema_version"):
        encode({"schema_version": 2})


def test_encode_refuses_nan_and_non_dicts():
    with pytest.raises(MalformedMessage):
        encode({"advantage": math.nan})
    with pytest.raises(TypeError):
        encode([1, 2])  # type: ignore[arg-type]


def test_decode_accepts_bytes():
    assert decode(encode({"k": "é"}).encode()) == {"schema_version": 1, "k": "é"}
    assert decode(bytearray(b'{"schema_version":1}')) == {"schema_version": 1}


def test_malformed_message_is_caught_as_a_value_error():
    with pytest.raises(ValueError, match="not JSON"):  # callers that catch ValueError catch it
        decode("not json")


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("not json", "not JSON"),
        ("", "not JSON"),
        ('{"schema_version": 1', "not JSON"),
        (b"\xff\xfe", "not UTF-8"),
        ('{"schema_version": 1, "x": NaN}', "not JSON"),
        ("[1, 2]", "JSON list, expected an object"),
        ('"text"', "JSON str, expected an object"),
        ("3", "JSON int, expected an object"),
        ("null", "JSON NoneType, expected an object"),
        ('{"x": 1}', "no schema_version"),
        ('{"schema_version": 2}', "unknown schema_version 2"),
        ('{"schema_version": "1"}', "unknown schema_version '1'"),
        ('{"schema_version": true}', "unknown schema_version True"),
        ('{"schema_version": 1.0}', "unknown schema_version 1.0"),
    ],
)
def test_decode_refuses_with_a_reason(raw, reason):
    with pytest.raises(MalformedMessage) as caught:
        decode(raw)
    assert reason in str(caught.value)


def test_decode_refuses_other_types():
    with pytest.raises(MalformedMessage, match="expected str or bytes"):
        decode(123)  # type: ignore[arg-type]


def test_error_quotes_a_short_excerpt_of_a_long_message():
    raw = "x" * 10_000
    with pytest.raises(MalformedMessage) as caught:
        decode(raw)
    assert len(str(caught.value)) < 300
