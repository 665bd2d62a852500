"""Reading one of rlrun's streams incrementally: each call returns what arrived since the last.

`StreamTail(stream, field, start_id).poll(client)` does one non-blocking XREAD from the last id
seen and decodes every message's `field` with the codec. Malformed messages (not JSON, no or an
unknown schema_version, the field missing) are returned with their id and the reason, never
raised, and never stop the ones after them. The position survives a lost connection: the caller
may reconnect (or Redis restart from its AOF, which keeps stream ids) and poll again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlrun.streams.codec import MalformedMessage, decode

BATCH = 500  # messages read per poll at most; a slow poll just reads the rest on the next one


@dataclass
class Polled:
    messages: list[tuple[str, dict]] = field(default_factory=list)  # (id, decoded message)
    malformed: list[tuple[str, str]] = field(default_factory=list)  # (id, why)


class StreamTail:
    def __init__(self, stream: str, field_name: str, start_id: str = "0-0") -> None:
        self.stream = stream
        self.field = field_name
        self.last_id = start_id  # messages with a larger id are new; XREAD is exclusive

    def poll(self, client, count: int = BATCH) -> Polled:
        """The messages after `last_id` (at most `count`); advances `last_id` past them.
        Raises only what the client raises (Redis unreachable): then nothing was consumed."""
        reply = client.xread({self.stream: self.last_id}, count=count)
        out = Polled()
        for _stream, messages in reply or []:
            for message_id, fields in messages:
                self.last_id = message_id
                raw = (fields or {}).get(self.field)
                if raw is None:
                    out.malformed.append((message_id, f"no {self.field!r} field (fields: {sorted(fields or {})})"))
                    continue
                try:
                    out.messages.append((message_id, decode(raw)))
                except MalformedMessage as exc:
                    out.malformed.append((message_id, str(exc)))
        return out
