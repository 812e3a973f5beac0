"""The log of first-bucket changes of a slot, as readers read it.

Every write that adds to or lowers a slot's first buckets (``S:first``) appends an entry to
its log (``S:first:log``), numbered (``S:first:count``) and bearing a fresh token (also left in
``S:first:version``), in the same atomic step (``apply_window.lua``). A reader that remembers
where it last read applies only the entries after it; these functions say when it can't
(docs/STATE.md, "Evaluating the rules").
"""

from __future__ import annotations

from costline.connectors.redis_client import RedisClient
from costline.connectors.redis_keys import (
    decoded,
    first_count_key,
    first_log_key,
    first_seen_key,
    first_version_key,
)

# Where a slot's log of first-bucket changes stands, and its entries from the one numbered
# ARGV[1] on (the newest alone for -1, all for 0): one atomic read, so that the token, the
# count and the entries agree.
_FIRSTS_LOG = """
local count = tonumber(redis.call('GET', KEYS[3]) or '0')
local len = redis.call('LLEN', KEYS[4])
local since = tonumber(ARGV[1])
local from = len - 1
if since >= 0 then from = math.max(since - (count - len) - 1, 0) end
-- past the newest (a Redis that lost writes counts less than was read): the newest, which
-- then is not the entry last read
from = math.min(from, math.max(len - 1, 0))
return {redis.call('GET', KEYS[2]) or '', redis.call('EXISTS', KEYS[1]), count,
        redis.call('LRANGE', KEYS[4], from, -1)}
"""
# Where every slot's first buckets stand: (slot, the number of its log's last entry, that
# entry's token).
FirstsAt = tuple[tuple[str, int, str], ...]
# An entry of a slot's log: its number, its token, and the first buckets it changed (tag set
# id, slot start), or None for "read them all".
LogEntry = tuple[int, str, list[tuple[str, int]] | None]




class FirstsLog:
    """Reads a slot's log: one script call, so that its token, count and entries agree."""

    def __init__(self, redis: RedisClient) -> None:
        self._script = redis.register_script(_FIRSTS_LOG)

    def read(self, slot: str, mark: tuple[int, str] | None
             ) -> tuple[tuple[int, str] | None, list[LogEntry]]:
        """Where the slot's first buckets stand (``None``: changed without an entry), and
        its entries from the one numbered ``mark`` on (the newest alone without one)."""
        reply = self._script(keys=[first_seen_key(slot), first_version_key(slot),
                                   first_count_key(slot), first_log_key(slot)],
                             args=[mark[0] if mark is not None else -1])
        entries = [log_entry(raw) for raw in reply[3]]
        return where_firsts_stand(reply[0], int(reply[1]), int(reply[2]), entries), entries


def log_entry(raw: bytes | str) -> LogEntry:
    """An entry of a first-bucket log: "<number> <token> <how many> <tag set> <slot> ..." →
    (number, token, the changed first buckets), or ``None`` for them when it says "read them
    all"."""
    number, token, _, *changed = decoded(raw).split(" ")
    if changed == ["*"]:
        return int(number), token, None
    return int(number), token, [(changed[i], int(changed[i + 1]))
                                for i in range(0, len(changed), 2)]


def where_firsts_stand(token: bytes | str, held: int, count: int, entries: list[LogEntry]
                        ) -> tuple[int, str] | None:
    """The number and token of a slot's last log entry (number 0 and the slot's token before
    any entry). ``None`` when its first buckets changed without an entry: the token is not
    the last entry's, or buckets are held with neither entry nor token (written before
    tokens were)."""
    token = decoded(token)
    if count == 0:
        return None if held and not token else (0, token)
    if not entries or entries[-1][0] != count or entries[-1][1] != token:
        return None
    return count, token


def told_since(mark: tuple[int, str] | None, stands: tuple[int, str], entries: list[LogEntry]
                ) -> list[tuple[str, int]] | None:
    """The first buckets the entries after ``mark`` changed, up to where the slot
    ``stands``; ``None`` when that cannot be told: no mark, the marked entry gone or not the
    same (the log was cut or Redis lost it), a mark from before the log whose token moved
    (what changed then was not logged), or an entry that says "read them all"."""
    if mark is None:
        return None
    if mark == stands:
        return []
    number, token = mark
    if number > 0:
        if not entries or entries[0][:2] != mark:
            return None
        entries = entries[1:]
    elif token or stands[0] == 0 or entries[0][0] != 1:
        return None  # from before the log, or still without one: did it change unlogged?
    told: list[tuple[str, int]] = []
    for _, _, changed in entries:
        if changed is None:
            return None
        told += changed
    return told
