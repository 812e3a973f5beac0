"""Every Redis client costline uses is built here, for a single Redis or Valkey and for a Redis
Cluster alike, from the one ``COSTLINE_REDIS_URL``::

    redis = connect(settings.redis_url)                      # redis.Redis | RedisCluster
    redis = connect_async(settings.redis_url)                # the same from redis.asyncio
    redis = connect(url, timeout_s=30, connect_timeout_s=5)  # a command's own patience

The URL names one server either way, so it needs no marker: building a client asks that
server ``CLUSTER INFO`` once. A node of a Redis Cluster answers it, and the client is
redis-py's cluster client, which learns the other nodes and their slots from that node; a
single server refuses it ("cluster support disabled"; a user without the right to ask counts
as single too, as a cluster client would need that right), and the client is a plain one.
Both are built at start-up: the question is one blocking round trip, also for
``connect_async``.

A cluster client sends a command of one key to the node serving the key's slot, and refuses
commands, scripts and transactions whose keys lie in different slots. costline's keys that
are written together share a hash tag; reads across slots are pipelined, and a cluster client
splits a pipeline by node.

When Redis fails, a plain client raises redis-py's ``RedisError``; a cluster client also
raises ``RedisClusterException``, which is not one, when none of its nodes answers (or they
serve no slot for a key). ``FAILURES`` names both; ``UNAVAILABLE`` the failures that mean
Redis is away for now (down, restarting, loading its data) rather than refusing a command. A
``RedisClusterException`` counts as away: redis-py also raises it for keys of different slots
in one command, which costline's keys never are, and ``ClusterUrlError`` (one too) only when a
client is built.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeAlias

from redis import Redis
from redis.asyncio import Redis as AsyncRedis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster
from redis.connection import ConnectionPool, parse_url
from redis.exceptions import (
    BusyLoadingError,
    ClusterDownError,
    ConnectionError,
    RedisClusterException,
    RedisError,
    ResponseError,
    TimeoutError,
)

RedisClient: TypeAlias = Redis | RedisCluster
AsyncRedisClient: TypeAlias = AsyncRedis | AsyncRedisCluster

FAILURES = (RedisError, RedisClusterException)
UNAVAILABLE = (
    ConnectionError, TimeoutError, BusyLoadingError, ClusterDownError, RedisClusterException,
)

TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 5.0
# redis-py reads these from a rediss:// URL's query and opens the files at connect time.
TLS_FILES = ("ssl_ca_certs", "ssl_ca_path", "ssl_certfile", "ssl_keyfile")


class ClusterUrlError(RedisClusterException):
    """A Redis Cluster answered at a URL that a cluster client cannot use as it is."""


def check_url(url: str) -> None:
    """``ValueError`` with a message of ours when redis-py cannot use ``url``: its own (e.g.
    ``Port could not be cast to integer value as 's3cr'``) can quote the password."""
    try:
        options = _options(url)
    except ValueError:
        raise ValueError(
            "not a Redis URL: redis://, rediss:// or unix://, with any of : / ? # @ in "
            "the user name or password percent-encoded") from None
    tls_options = sorted(key for key in options if key.startswith("ssl_"))
    if tls_options and not url.startswith("rediss://"):
        # redis-py would fail only at the first command, with a TypeError.
        raise ValueError(f"{', '.join(tls_options)} in the Redis URL need a rediss:// URL")
    for key in TLS_FILES:
        if key in options and not Path(options[key]).exists():
            raise ValueError(f"{key} in the Redis URL: no such file {options[key]}")


def connect(url: str, *, timeout_s: float = TIMEOUT_S,
            connect_timeout_s: float = CONNECT_TIMEOUT_S) -> RedisClient:
    """A client of the Redis, Valkey or Redis Cluster at ``url``.

    ``timeout_s`` bounds each command's answer, ``connect_timeout_s`` each connection, so a
    Redis that never answers fails a command instead of hanging it. Raises ``ValueError`` for
    a URL redis-py cannot read, ``ClusterUrlError`` for a cluster named in a way a cluster
    client cannot use, and one of ``FAILURES`` when the server does not answer.
    """
    if is_cluster(url, timeout_s=timeout_s, connect_timeout_s=connect_timeout_s):
        _check_cluster_url(url)
        return RedisCluster.from_url(url, socket_timeout=timeout_s,
                                     socket_connect_timeout=connect_timeout_s)
    return Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=connect_timeout_s)


def connect_async(url: str, *, timeout_s: float = TIMEOUT_S,
                  connect_timeout_s: float = CONNECT_TIMEOUT_S,
                  health_check_s: float = 0) -> AsyncRedisClient:
    """``connect``'s asyncio twin (same arguments and errors). ``health_check_s`` > 0 checks
    a connection idle that long with a PING before using it again.

    Whether ``url`` names a cluster is asked with a blocking round trip: build the client
    when starting, not per request."""
    if is_cluster(url, timeout_s=timeout_s, connect_timeout_s=connect_timeout_s):
        _check_cluster_url(url)
        return AsyncRedisCluster.from_url(url, socket_timeout=timeout_s,
                                          socket_connect_timeout=connect_timeout_s,
                                          health_check_interval=health_check_s)
    return AsyncRedis.from_url(url, socket_timeout=timeout_s,
                               socket_connect_timeout=connect_timeout_s,
                               health_check_interval=health_check_s)


def connect_node(url: str, *, timeout_s: float = TIMEOUT_S,
                 connect_timeout_s: float = CONNECT_TIMEOUT_S) -> Redis:
    """A plain client of the one server at ``url``, in database 0, also when it is a node of
    a cluster: for questions about that server (PING, INFO, CLUSTER INFO), such as the local
    stack asks, not for costline's keys."""
    check_url(url)
    options = {**_options(url), "db": 0, "socket_timeout": timeout_s,
               "socket_connect_timeout": connect_timeout_s}
    return Redis.from_pool(ConnectionPool(**options))


def is_cluster(url: str, *, timeout_s: float = TIMEOUT_S,
               connect_timeout_s: float = CONNECT_TIMEOUT_S) -> bool:
    """Whether the server at ``url`` is a node of a Redis Cluster (one round trip)."""
    with connect_node(url, timeout_s=timeout_s, connect_timeout_s=connect_timeout_s) as node:
        return _answers_as_cluster(node)


def _answers_as_cluster(client: Redis) -> bool:
    """A cluster node answers ``CLUSTER INFO``; a single server refuses it, as does a server
    whose user may not ask (a cluster client would need that right too). Not answering at
    all, a refused login or a server still loading its data raise."""
    try:
        client.cluster("info")
    except ResponseError:  # not a ConnectionError (which loading and a refused login are)
        return False
    return True


def _check_cluster_url(url: str) -> None:
    """What a single server allows and a cluster does not, said in one line."""
    options = _options(url)
    if "path" in options:
        raise ClusterUrlError(
            "a Redis Cluster answers on this unix socket, but a cluster client reaches its "
            "nodes over TCP: give one node as redis:// or rediss://host:port")
    if options.get("db", 0) != 0:
        raise ClusterUrlError(
            f"a Redis Cluster has only database 0, the Redis URL names {options['db']}")


def _options(url: str) -> dict[str, Any]:
    """The connection options redis-py reads from ``url``."""
    return dict(parse_url(url))  # type: ignore[no-untyped-call]
