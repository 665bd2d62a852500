"""The token journal in Redis: groups, their samples' tokens, the prompt cursor, delivery marks.

Every change is one Lua script: atomic on the server and in the AOF (one MULTI/EXEC block, which
a truncated AOF drops whole). Appends name the offset they expect, so a retried append is never
stored twice; delivery publishes to the trainer's stream and marks delivered in one script.

Key layout, under `prefix` (one journal per actor), which carries the hash tag of the stream the
journal delivers into (`names.journal_prefix`), so on a Redis Cluster every key a script touches
lives in one slot:

    <prefix>cursor            string  groups opened so far = the next prompt cursor
    <prefix>open              zset    group_id -> cursor, groups not yet delivered
    <prefix>delivered         zset    group_id -> cursor, delivered markers (see trim_delivered)
    <prefix>quarantine        zset    group_id -> cursor, taken out of `open`: unreadable header
    <prefix>group:<group_id>  hash    header (GroupHeader JSON), state (open|delivered), size, cursor,
                                      per sample i "<i>:state" (pending|generating|finished),
                                      "<i>:len", "<i>:finish"; delivered: state, cursor, stream_id
    <prefix>log:<group_id>    list    the append-only token log (LogEntry JSON); deleted on delivery

The hash holds what the scripts check (lengths, states); the log holds the tokens. A sample
whose log is unreadable or disagrees with the hash is reported and read as holding no tokens
(`fold_group`), never trained on. This module knows nothing about HTTP, vLLM or RL maths.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, cast

import redis

from rlrun.journal.records import (
    FINAL_REASONS,
    CorruptRecord,
    GroupHeader,
    GroupRecord,
    LogEntry,
    SampleRecord,
)
from rlrun.streams.names import GROUPS_STREAM, hash_tag, journal_prefix

log = logging.getLogger(__name__)

KEY_PREFIX = journal_prefix(GROUPS_STREAM)  # the journal of the one actor of an hf run
OPEN_GROUP_ATTEMPTS = 8  # cursor compare-and-set retries before giving up (another writer)
_TRIM_BATCH = 500


class JournalError(Exception):
    """An operation the journal refuses."""


class UnknownGroup(JournalError):
    """The group is not in the journal (never opened, or its delivered marker was trimmed)."""


class NotFinished(JournalError):
    """A group cannot be delivered while some of its samples are unfinished."""


class CursorConflict(JournalError):
    """Another writer kept moving the prompt cursor: two actors share one journal."""


@dataclass(frozen=True)
class WriteResult:
    """The answer to an append or a finish. `reason`: "ok", "duplicate" (offset behind the
    sample), "gap" (beyond it), "finished", "delivered" or "unknown"; `length` after the call."""

    accepted: bool
    length: int
    reason: str


@dataclass(frozen=True)
class Append:
    """One sample's tokens, all of policy `version`; with `finish_reason` the sample is finished too;
    `relabel` ([start, end, version] runs) sets the versions of tokens it already holds (LogEntry)."""

    group_id: str
    index: int
    expected_offset: int  # the sample's length before these tokens
    token_ids: Sequence[int]
    logprobs: Sequence[float]
    version: int
    finish_reason: str | None = None
    relabel: Sequence[Sequence[int]] = ()
    turn_end: str | None = None  # a conversation's model turn ended with these tokens
    observation: dict | None = None  # these tokens render the environment's answer (LogEntry)


class LoadResult(NamedTuple):
    groups: list[GroupRecord]  # open groups, in cursor order
    corrupt: list[tuple[str, str]]  # (key, reason) for every corrupt record met


# CAS on the cursor: the group for cursor n is written in the same step that moves the cursor to
# n + 1, so a crash leaves either both or neither.
# KEYS: cursor, group hash, open zset. ARGV: n, group_id, header JSON, group size.
_OPEN_GROUP = """
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
if cur ~= tonumber(ARGV[1]) then return {'conflict', cur} end
if redis.call('EXISTS', KEYS[2]) == 1 then return {'exists', cur} end
local size = tonumber(ARGV[4])
local fields = {'header', ARGV[3], 'state', 'open', 'size', ARGV[4], 'cursor', ARGV[1]}
for i = 0, size - 1 do
  fields[#fields + 1] = i .. ':state'
  fields[#fields + 1] = 'pending'
  fields[#fields + 1] = i .. ':len'
  fields[#fields + 1] = '0'
end
redis.call('HSET', KEYS[2], unpack(fields))
redis.call('ZADD', KEYS[3], ARGV[1], ARGV[2])
redis.call('SET', KEYS[1], cur + 1)
return {'ok', cur}
"""

# A batch of appends, each checked on its own against its sample's length, each optionally
# finishing its sample (one round trip for a whole request's tokens and finishes). Repeating a
# finish (no tokens, same length, same reason) is accepted: a retry. An entry with no tokens is
# logged only when it says something besides its tokens (a relabel, a turn's end, an observation).
# KEYS: (group hash, group log) per append. ARGV: (index, expected offset, n, entry, finish
# reason or "", "1" if it must be logged without tokens else "") per append.
_APPEND = """
local out = {}
for a = 1, #KEYS / 2 do
  local h, lg = KEYS[2 * a - 1], KEYS[2 * a]
  local i = ARGV[6 * a - 5]
  local off, n = tonumber(ARGV[6 * a - 4]), tonumber(ARGV[6 * a - 3])
  local fin = ARGV[6 * a - 1]
  local says = ARGV[6 * a] ~= ''
  local st = redis.call('HMGET', h, 'state', i .. ':state', i .. ':len', i .. ':finish')
  local status, len = 'ok', 0
  if not st[1] then status = 'unknown'
  elseif st[1] ~= 'open' then status = 'delivered'
  elseif not st[2] then status = 'unknown'
  else
    len = tonumber(st[3])
    if st[2] == 'finished' then
      -- the same finish again, with no tokens at the same length, is a retry: accepted
      if not (n == 0 and off == len and fin ~= '' and fin == st[4]) then status = 'finished' end
    elseif off < len then status = 'duplicate'
    elseif off > len then status = 'gap'
    else
      if n > 0 or says then redis.call('RPUSH', lg, ARGV[6 * a - 2]) end
      if n > 0 then
        len = len + n
        redis.call('HSET', h, i .. ':len', len, i .. ':state', 'generating')
      end
      if fin ~= '' then redis.call('HSET', h, i .. ':state', 'finished', i .. ':finish', fin) end
    end
  end
  out[#out + 1] = status
  out[#out + 1] = len
end
return out
"""

# KEYS: group hash, group log. ARGV: index, reset entry.
_RESET = """
local i = ARGV[1]
local st = redis.call('HMGET', KEYS[1], 'state', i .. ':state')
if not st[1] then return 'unknown' end
if st[1] ~= 'open' then return 'delivered' end
if not st[2] then return 'unknown' end
redis.call('RPUSH', KEYS[2], ARGV[2])
redis.call('HSET', KEYS[1], i .. ':state', 'pending', i .. ':len', '0')
redis.call('HDEL', KEYS[1], i .. ':finish')
return 'ok'
"""

# Publish and mark delivered in one step. KEYS: group hash, group log, open zset, delivered
# zset, stream. ARGV: group_id, then one or more messages (rlrun's trainer takes one message per
# group; Fast-LLM one document per sample).
_DELIVER = """
local st = redis.call('HMGET', KEYS[1], 'state', 'size', 'cursor', 'stream_id')
if not st[1] then return {'unknown', ''} end
if st[1] == 'delivered' then return {'delivered', st[4] or ''} end
local size = tonumber(st[2])
local names = {}
for i = 0, size - 1 do names[#names + 1] = i .. ':state' end
local states = redis.call('HMGET', KEYS[1], unpack(names))
local unfinished = {}
for i = 1, size do
  if states[i] ~= 'finished' then unfinished[#unfinished + 1] = tostring(i - 1) end
end
if #unfinished > 0 then return {'unfinished', table.concat(unfinished, ',')} end
local id = ''
for k = 2, #ARGV do id = redis.call('XADD', KEYS[5], '*', 'data', ARGV[k]) end
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('HSET', KEYS[1], 'state', 'delivered', 'cursor', st[3], 'stream_id', id)
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('ZADD', KEYS[4], st[3], ARGV[1])
return {'ok', id}
"""


class Journal:
    """One actor's token journal; a second writer is detected (cursor compare-and-set), never merged."""

    def __init__(self, client: redis.Redis, prefix: str = KEY_PREFIX) -> None:
        if not client.get_encoder().decode_responses:
            raise ValueError("the journal needs a client with decode_responses=True (see connect)")
        if hash_tag(prefix) == prefix:
            raise ValueError(
                f"journal prefix {prefix!r} has no hash tag: on a Redis Cluster its keys would land in "
                "different slots and its scripts fail (use rlrun.streams.names.journal_prefix)"
            )
        self.client = client
        self.prefix = prefix
        self._open_group = client.register_script(_OPEN_GROUP)
        self._append = client.register_script(_APPEND)
        self._reset = client.register_script(_RESET)
        self._deliver = client.register_script(_DELIVER)

    def key(self, name: str) -> str:
        """One of the journal's keys: `cursor`, `open`, `group:<group_id>`, ... (the layout above)."""
        return self.prefix + name

    def cursor(self) -> int:
        """Groups opened so far: the cursor the next `open_group` hands out."""
        return int(self.client.get(self.key("cursor")) or 0)

    def open_group(
        self,
        prompt_index_for: Callable[[int], int],
        prompt_ids_for: Callable[[int], list[int]],
        *,
        group_size: int,
        max_new_tokens: int,
        run: str,
        cursor_hint: int | None = None,
    ) -> GroupRecord:
        """Hand out the next prompt: a new group `"<run>/<cursor>"` with every sample pending, written
        only if the cursor has not moved since it was read (compare-and-set: a crash leaves both or
        neither). `cursor_hint` saves reading the cursor; a wrong one costs a try, never a wrong group."""
        cursor = self.cursor() if cursor_hint is None else cursor_hint
        for _ in range(OPEN_GROUP_ATTEMPTS):
            prompt_index = prompt_index_for(cursor)
            header = GroupHeader(
                group_id=f"{run}/{cursor}",
                cursor=cursor,
                prompt_index=prompt_index,
                prompt_ids=[int(t) for t in prompt_ids_for(prompt_index)],
                group_size=group_size,
                max_new_tokens=max_new_tokens,
            )
            status, current = self._open_group(
                keys=[self.key("cursor"), self.key(f"group:{header.group_id}"), self.key("open")],
                args=[cursor, header.group_id, header.to_json(), group_size],
            )
            if status == "ok":
                samples = [SampleRecord(header.group_id, i, "pending") for i in range(group_size)]
                return GroupRecord.from_header(header, samples)
            if status == "exists":
                raise JournalError(
                    f"group {header.group_id} is already in the journal although the cursor is "
                    f"{current}: the journal's keys were edited by hand, or two runs share one "
                    f"run name and Redis."
                )
            if cursor_hint is None or cursor != cursor_hint:  # a stale hint is not another writer
                log.warning("prompt cursor moved from %d to %s while opening a group; retrying", cursor, current)
            cursor = int(current)
        raise CursorConflict(
            f"the prompt cursor kept moving while opening a group ({OPEN_GROUP_ATTEMPTS} tries): "
            f"another actor is writing this journal ({self.prefix}). Stop it."
        )

    def append_many(self, appends: Sequence[Append]) -> list[WriteResult]:
        """Several appends in one round trip and one atomic step, each judged on its own, in order."""
        if not appends:
            return []
        keys: list[str] = []
        args: list[str | int] = []
        for item in appends:
            what = f"append to {item.group_id}#{item.index}"
            if len(item.token_ids) != len(item.logprobs):
                raise ValueError(f"{what}: {len(item.token_ids)} token ids but {len(item.logprobs)} logprobs")
            if item.finish_reason is not None and item.finish_reason not in FINAL_REASONS:
                raise ValueError(f"finish_reason {item.finish_reason!r} does not end a sample (one of {FINAL_REASONS})")
            tokens = [int(t) for t in item.token_ids]
            logprobs = [float(p) for p in item.logprobs]
            relabel = [[int(v) for v in run] for run in item.relabel]
            if item.turn_end is not None and item.turn_end not in FINAL_REASONS:
                raise ValueError(f"turn_end {item.turn_end!r} does not end a turn (one of {FINAL_REASONS})")
            entry = LogEntry(
                "append",
                item.index,
                item.expected_offset,
                tokens,
                logprobs,
                int(item.version),
                relabel,
                item.turn_end,
                dict(item.observation) if item.observation is not None else None,
            )
            says = relabel or item.turn_end is not None or item.observation is not None
            keys += [self.key(f"group:{item.group_id}"), self.key(f"log:{item.group_id}")]
            args += [
                item.index,
                item.expected_offset,
                len(tokens),
                entry.to_json(),
                item.finish_reason or "",
                "1" if says else "",
            ]
        reply = self._append(keys=keys, args=args)
        return [
            WriteResult(accepted=reply[k] == "ok", length=int(reply[k + 1]), reason=reply[k])
            for k in range(0, len(reply), 2)
        ]

    def reset(self, group_id: str, index: int) -> None:
        """Drop a sample's tokens (stale or corrupt) before it is generated again: pending, length 0."""
        keys = [self.key(f"group:{group_id}"), self.key(f"log:{group_id}")]
        status = self._reset(keys=keys, args=[index, LogEntry(kind="reset", index=index).to_json()])
        if status == "unknown":
            raise UnknownGroup(f"cannot reset sample {index} of {group_id}: no such open group or sample")
        if status == "delivered":
            raise JournalError(f"cannot reset sample {index} of {group_id}: the group is delivered")

    def deliver(self, group_id: str, stream: str, messages: Sequence[str]) -> str | None:
        """Publish `messages` (field `data`, in order) to `stream` and mark the group delivered,
        atomically. The last stream id; None when delivered already; raises NotFinished or UnknownGroup."""
        if hash_tag(stream) != hash_tag(self.prefix):
            raise ValueError(
                f"stream {stream!r} is not in the slot of journal {self.prefix!r}: on a Redis Cluster the "
                f"delivery script could not publish and mark in one step (use journal_prefix({stream!r}))"
            )
        status, detail = self._deliver(
            keys=[
                self.key(f"group:{group_id}"),
                self.key(f"log:{group_id}"),
                self.key("open"),
                self.key("delivered"),
                stream,
            ],
            args=[group_id, *messages],
        )
        if status == "ok":
            return detail
        if status == "delivered":
            return None
        if status == "unfinished":
            raise NotFinished(f"cannot deliver {group_id}: samples {detail} are not finished")
        raise UnknownGroup(f"cannot deliver {group_id}: it is not in the journal")

    def quarantine(self, group_id: str) -> None:
        """Move an open group whose header is unreadable from `open` to the quarantine set (its
        prompt is skipped; its keys stay for a person to read); a group not open is left alone."""
        with self.client.pipeline(transaction=True) as pipe:
            pipe.zscore(self.key("open"), group_id)
            pipe.zrem(self.key("open"), group_id)
            cursor, removed = pipe.execute()
        if removed:
            self.client.zadd(self.key("quarantine"), {group_id: cursor})

    def quarantined(self) -> list[str]:
        """Groups taken out of replay because their header was unreadable, in cursor order."""
        return cast("list[str]", self.client.zrange(self.key("quarantine"), 0, -1))  # decode_responses=True

    def trim_delivered(self, keep_last: int) -> int:
        """Delete the delivered markers older than the last `keep_last` cursors; returns how many."""
        below = self.cursor() - keep_last
        delivered = self.key("delivered")
        deleted = 0
        while True:
            old = cast("list[str]", self.client.zrangebyscore(delivered, "-inf", f"({below}", start=0, num=_TRIM_BATCH))
            if not old:
                return deleted
            with self.client.pipeline(transaction=True) as pipe:
                pipe.delete(*(self.key(f"group:{g}") for g in old))
                pipe.zrem(delivered, *old)
                pipe.execute()
            deleted += len(old)

    def load_open_groups(self) -> LoadResult:
        """Every open group, in one consistent snapshot, in cursor order. A group whose header is
        corrupt is reported and left out; a corrupt sample is reported and read as pending."""
        group_ids = cast("list[str]", self.client.zrange(self.key("open"), 0, -1))  # decode_responses=True
        groups: list[GroupRecord] = []
        corrupt: list[tuple[str, str]] = []
        for group_id, (fields, entries) in zip(group_ids, self._read(group_ids)):
            try:
                group, problems = fold_group(group_id, fields, entries)
            except CorruptRecord as exc:
                corrupt.append((self.key(f"group:{group_id}"), str(exc)))
                continue
            corrupt += [(self.key(f"log:{group_id}"), reason) for reason in problems]
            groups.append(group)
        groups.sort(key=lambda g: g.cursor)
        return LoadResult(groups, corrupt)

    def read_group(self, group_id: str) -> tuple[GroupRecord | None, list[str]]:
        """One open group and the problems met reading it, as `load_open_groups` reads it (None
        when delivered or unknown); raises CorruptRecord when its header cannot be read."""
        ((fields, entries),) = self._read([group_id])
        if not fields or fields.get("state") == "delivered":
            return None, []
        return fold_group(group_id, fields, entries)

    def _read(self, group_ids: list[str]) -> list[tuple[dict, list]]:
        """Each group's hash and token log, read in one transaction (one consistent snapshot)."""
        if not group_ids:
            return []
        with self.client.pipeline(transaction=True) as pipe:
            for group_id in group_ids:
                pipe.hgetall(self.key(f"group:{group_id}"))
                pipe.lrange(self.key(f"log:{group_id}"), 0, -1)
            replies = pipe.execute()
        return list(zip(replies[::2], replies[1::2]))


# --- folding a group's hash and log into a record (pure) ---------------------------------------


def fold_group(group_id: str, fields: dict[str, str], entries: list[str]) -> tuple[GroupRecord, list[str]]:
    """The open group held by its hash `fields` and token log `entries`, and the problems met.
    Raises CorruptRecord when the group cannot be read (no hash, bad header, not open); a sample
    whose entries are unreadable or disagree with the hash is returned pending, its reason listed."""
    if not fields:
        raise CorruptRecord(f"group {group_id} is listed as open but has no record")
    if "header" not in fields:
        raise CorruptRecord(f"group {group_id} has no header")
    header = GroupHeader.from_json(fields["header"])
    if header.group_id != group_id:
        raise CorruptRecord(f"group {group_id}: its header names {header.group_id}")
    if fields.get("state") != "open":
        raise CorruptRecord(f"group {group_id} is listed as open but its state is {fields.get('state')!r}")
    size = header.group_size
    tokens: list[list[int]] = [[] for _ in range(size)]
    logprobs: list[list[float]] = [[] for _ in range(size)]
    versions: list[list[int]] = [[] for _ in range(size)]
    turn_ends: list[list[list]] = [[] for _ in range(size)]
    observations: list[list[dict]] = [[] for _ in range(size)]
    bad: list[str | None] = [None] * size
    problems: list[str] = []

    for position, raw in enumerate(entries):
        try:
            entry = LogEntry.from_json(raw)
        except CorruptRecord as exc:
            # An entry that names no sample is reported and skipped: if it was one of ours, the
            # offsets after it or the recorded lengths no longer agree, and that sample is caught.
            index = _index_of(raw)
            if index is not None and 0 <= index < size:
                bad[index] = bad[index] or f"log entry {position}: {exc}"
            else:
                problems.append(f"log entry {position}: {exc}; skipped")
            continue
        i = entry.index
        if not 0 <= i < size:
            problems.append(f"log entry {position} names sample {i} of a group of {size}; ignored")
            continue
        if entry.kind == "reset":
            tokens[i], logprobs[i], versions[i], bad[i] = [], [], [], None
            turn_ends[i], observations[i] = [], []
            continue
        if bad[i]:
            continue
        if entry.offset != len(tokens[i]):
            bad[i] = f"log entry {position} appends at offset {entry.offset} to a sample of {len(tokens[i])} tokens"
            continue
        if entry.observation is not None:
            observations[i].append(
                {**entry.observation, "start": len(tokens[i]), "end": len(tokens[i]) + len(entry.token_ids)}
            )
        tokens[i] += entry.token_ids
        logprobs[i] += entry.logprobs
        versions[i] += [entry.version] * len(entry.token_ids)
        if entry.turn_end is not None:
            turn_ends[i].append([len(tokens[i]), entry.turn_end])
        for start, end, version in entry.relabel:
            if end > len(tokens[i]):
                bad[i] = f"log entry {position} relabels tokens [{start}, {end}) of a sample of {len(tokens[i])} tokens"
                break
            versions[i][start:end] = [version] * (end - start)

    samples = []
    for i in range(size):
        state, length, finish = fields.get(f"{i}:state"), fields.get(f"{i}:len"), fields.get(f"{i}:finish")
        reason = bad[i]
        if reason is None and (length is None or not length.isdigit() or int(length) != len(tokens[i])):
            reason = f"the log holds {len(tokens[i])} tokens but the recorded length is {length!r}"
        sample = None
        if reason is None:
            try:
                sample = SampleRecord(
                    group_id,
                    i,
                    state,  # type: ignore[arg-type]  # None (no state field) is refused by SampleRecord's own check
                    tokens[i],
                    logprobs[i],
                    versions[i],
                    finish if state == "finished" else None,
                    turn_ends[i],
                    observations[i],
                )
            except CorruptRecord as exc:
                reason = str(exc)
        if sample is None:
            problems.append(f"sample {i}: {reason}")
            sample = SampleRecord(group_id, i, "pending")
        samples.append(sample)
    return GroupRecord.from_header(header, samples), problems


def _index_of(raw: str) -> int | None:
    """The sample index an unreadable log entry names, if it names one."""
    try:
        index = json.loads(raw).get("index")
    except (ValueError, AttributeError):
        return None
    return index if type(index) is int else None
