"""The one place a Redis URL becomes a client, for the gateway and the workers alike.

- `redis://[user:password@]host:port/db` (and `rediss://`, `unix://`): one Redis server.
- `redis+cluster://[user:password@]host:port` (and `rediss+cluster://`): a Redis Cluster, reached through
  any one of its nodes (the client discovers the rest and follows slot moves):
  `redis.asyncio.cluster.RedisCluster`.

An operator who outgrows one Redis changes only this URL. Every multi-key operation (the Lua scripts,
the transactions) names keys of one hash tag (`{specroute}`, see docs/redis-layout.md), so a cluster
serves each of them from one slot. Pub/sub works unchanged: a cluster's PUBLISH reaches every node.

The names before the hash tag (`specroute:policy`, ...) are moved once by `migrate_legacy_names`, which
every gateway runs at start and `specroute redis migrate` runs by hand.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


def is_cluster(url: str) -> bool:
    """Whether `url` names a Redis Cluster (`redis+cluster://` or `rediss+cluster://`)."""
    return urlsplit(url).scheme.lower() in CLUSTER_SCHEMES


def node_url(url: str) -> str:
    """`url` with a cluster scheme replaced by the plain one redis-py parses (the path's database
    number dropped: a cluster has only database 0)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in CLUSTER_SCHEMES:
        return url
    return urlunsplit(parts._replace(scheme=CLUSTER_SCHEMES[scheme], path=""))


def connect(url: str, **kw: Any) -> Any:
    """An asyncio client for `url`: `redis.asyncio.Redis`, or `RedisCluster` for a cluster URL.
    `kw`: connection options both take (socket timeouts, `retry`, `health_check_interval`)."""
    if is_cluster(url):
        from redis.asyncio.cluster import RedisCluster

        return RedisCluster.from_url(node_url(url), **kw)
    import redis.asyncio as aredis

    return aredis.Redis.from_url(url, **kw)


def connect_sync(url: str, **kw: Any) -> Any:
    """The blocking client for `url` (tools and benchmarks): `redis.Redis` or `redis.cluster.RedisCluster`."""
    import redis

    if is_cluster(url):
        from redis.cluster import RedisCluster

        return RedisCluster.from_url(node_url(url), **kw)
    return redis.Redis.from_url(url, **kw)


async def migrate_legacy_names(client: Any) -> tuple[int, list[str]]:
    """Move every key under the names before the hash tag (`specroute:<rest>`) to `{specroute}:<rest>`
    (DUMP, RESTORE with its remaining TTL, DEL: this works across a cluster's slots too); returns how
    many moved and the keys left in place because their new name already exists (never overwritten).
    The rate limiter's counters (`specroute:rl:{<key name>}`, hash-tagged by key name, two minutes
    long) keep their names. Idempotent: every gateway runs it at start, before it reads anything."""
    from redis.exceptions import ResponseError

    from specroute.contracts.feedback import LEGACY_PREFIX, PREFIX

    moved, kept = 0, []
    old_names = [k.decode() if isinstance(k, bytes) else str(k)
                 async for k in client.scan_iter(match=LEGACY_PREFIX + "*", count=500)]
    for old in sorted(set(old_names)):
        if old.startswith(LEGACY_PREFIX + "rl:"):
            continue
        new = PREFIX + old[len(LEGACY_PREFIX):]
        data = await client.dump(old)
        if data is None:   # gone meanwhile (another gateway moved it)
            continue
        ttl = await client.pttl(old)
        try:
            await client.restore(new, max(int(ttl), 0), data)
        except ResponseError as exc:
            if "BUSYKEY" not in str(exc):
                raise
            kept.append(old)
            continue
        await client.delete(old)
        moved += 1
    return moved, kept


def main(argv: list[str]) -> int:
    """`specroute redis migrate [--redis-url URL]`: `migrate_legacy_names` once, from the command line."""
    import argparse
    import asyncio
    import os

    p = argparse.ArgumentParser(prog="specroute redis", description="Redis maintenance")
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("migrate", help="move keys named before the `{specroute}` hash tag to their new names")
    m.add_argument("--redis-url", default=os.environ.get("REDIS_URL"), help="default: $REDIS_URL")
    a = p.parse_args(argv)
    if not a.redis_url:
        p.error("give --redis-url (or set REDIS_URL)")

    async def run() -> tuple[int, list[str]]:
        client = connect(a.redis_url, socket_timeout=10.0, socket_connect_timeout=5.0)
        try:
            return await migrate_legacy_names(client)
        finally:
            await client.aclose()

    moved, kept = asyncio.run(run())
    print(f"moved {moved} keys to the {{specroute}} hash tag" +
          (f"; left {len(kept)} whose new name exists: {', '.join(kept)}" if kept else ""))
    return 0
