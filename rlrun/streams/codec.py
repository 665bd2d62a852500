"""The message codec for rlrun's streams: compact JSON objects with a schema version, never pickle.

A reader refuses a version it does not know instead of guessing. Fast-LLM's protocol messages
carry no schema version and are encoded by that backend.
"""

from __future__ import annotations

import json

SCHEMA_VERSION = 1
_EXCERPT = 80  # characters of a bad message quoted in the error


class MalformedMessage(ValueError):
    """A message that is not a JSON object of a known schema version."""


def dumps(record: dict, error: type[ValueError]) -> str:
    """Compact JSON; NaN and infinities are refused with `error` (they are not JSON)."""
    try:
        return json.dumps(record, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except ValueError as exc:
        raise error(f"cannot encode the record as JSON: {exc}") from exc


def encode(message: dict) -> str:
    """Compact JSON for `message` (not modified), with `"schema_version": 1` added when absent."""
    if not isinstance(message, dict):
        raise TypeError(f"a message is a dict, got {type(message).__name__}")
    if "schema_version" in message:
        _check_version(message["schema_version"], message)
    return dumps({"schema_version": SCHEMA_VERSION, **message}, MalformedMessage)


def json_object(raw: str | bytes, error: type[ValueError], what: str) -> dict:
    """The JSON object in `raw` (UTF-8, no NaN/Infinity), or `error` saying why not."""
    if isinstance(raw, (bytes, bytearray)):
        try:
            raw = bytes(raw).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise error(f"{what} is not UTF-8 text: {exc}") from exc
    if not isinstance(raw, str):
        raise error(f"{what} is {type(raw).__name__}, expected str or bytes")
    try:
        value = json.loads(raw, parse_constant=_refuse_constant)
    except ValueError as exc:  # json.JSONDecodeError is a ValueError
        raise error(f"{what} is not JSON ({exc}): {excerpt(raw)}") from exc
    if not isinstance(value, dict):
        raise error(f"{what} is a JSON {type(value).__name__}, expected an object: {excerpt(raw)}")
    return value


def decode(raw: str | bytes) -> dict:
    """The message in `raw`; raises MalformedMessage saying why when it is not a valid message."""
    message = json_object(raw, MalformedMessage, "message")
    if "schema_version" not in message:
        raise MalformedMessage(f"message has no schema_version: {excerpt(str(raw))}")
    _check_version(message["schema_version"], raw)
    return message


def _check_version(version: object, context: object) -> None:
    # bool is an int in Python: `true` must not pass for 1.
    if type(version) is not int or version != SCHEMA_VERSION:
        raise MalformedMessage(
            f"unknown schema_version {version!r} (this rlrun reads version {SCHEMA_VERSION}): {excerpt(str(context))}"
        )


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")


def excerpt(text: str) -> str:
    """At most a line of `text`, for an error message."""
    return text if len(text) <= _EXCERPT else text[:_EXCERPT] + "…"
