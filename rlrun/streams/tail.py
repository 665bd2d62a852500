"""Reading one of rlrun's streams incrementally: each `poll` returns what arrived since the last
(one non-blocking XREAD, each message's `field` decoded with the codec). Malformed messages are
returned with their id and the reason, never raised. The position survives a lost connection or
a Redis restarted from its AOF (which keeps stream ids).
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
        """The messages after `last_id` (at most `count`); raises only what the client raises."""
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
