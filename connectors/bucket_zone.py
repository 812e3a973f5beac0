"""The time zone a namespace's daily buckets are named in, recorded in its meta hash.

A daily bucket is named by a local date (``costline.connectors.redis_keys``), so a reader must
choose
buckets in the zone they were written in, not in its own. The worker records its zone before
it counts anything and refuses to count in another one: changing ``COSTLINE_TIMEZONE`` under
existing buckets would otherwise split days across two calendars without anyone noticing.
"""

from __future__ import annotations

from costline.connectors.redis_client import RedisClient
from costline.connectors.redis_keys import meta_key

ZONE_FIELD = "bucket_timezone"


class ZoneMismatch(Exception):
    """The namespace's daily buckets are named in another zone than the one configured."""

    def __init__(self, namespace: str, recorded: str, configured: str) -> None:
        super().__init__(
            f"namespace {namespace!r} keeps its daily buckets in time zone {recorded!r}, but "
            f"COSTLINE_TIMEZONE is {configured!r}: set COSTLINE_TIMEZONE back to {recorded!r} "
            "(a rule's timezone and spend --tz still choose the zone of a period), or use "
            "a new namespace (COSTLINE_NAMESPACE) for the new zone")
        self.recorded, self.configured = recorded, configured


def claim(redis: RedisClient, namespace: str, zone: str) -> None:
    """Record ``zone`` for the namespace unless one is recorded; refuse a different one.

    HSETNX makes the first worker's zone the namespace's for good, so two workers that start
    together with different settings cannot both win.
    """
    key = meta_key(namespace)
    redis.hsetnx(key, ZONE_FIELD, zone)
    found = recorded(redis, namespace)
    if found is not None and found != zone:
        raise ZoneMismatch(namespace, found, zone)


def recorded(redis: RedisClient, namespace: str) -> str | None:
    """The zone the namespace's daily buckets are named in, or None before any worker ran."""
    raw = redis.hget(meta_key(namespace), ZONE_FIELD)
    if raw is None:
        return None
    return raw.decode() if isinstance(raw, bytes) else str(raw)
