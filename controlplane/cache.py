"""The cache on Redis (REDIS_URL): Django's backend, keeping its clients.

Django's `RedisCacheClient.get_client` builds a new `redis.Redis` for every
cache operation, and each one fills a table of about 170 response
callbacks: on the API's hot routes that was more CPU than the rate limit's
round trip itself. A `redis.Redis` is safe to share (its connection pool
hands each command a connection), so this client keeps one per pool.

Django's cache handler also keeps its backends per context, not per
thread: under ASGI every request builds its own backend, and with it its
own client and connection pools, so every request that counted a rate
limit opened a new connection to Redis. The client and its pools are
kept once per process and configuration instead (redis-py's pools are
thread-safe, and start afresh in a forked child).
"""
from __future__ import annotations

import threading

from django.core.cache.backends import redis
from django.utils.functional import cached_property


class _Client(redis.RedisCacheClient):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._clients = {}

    def get_client(self, key=None, *, write=False):
        pool = self._get_connection_pool(write)
        client = self._clients.get(id(pool))
        if client is None:
            client = self._clients[id(pool)] = self._client(connection_pool=pool)
        return client


_clients: dict[tuple, _Client] = {}
_clients_lock = threading.Lock()


class RedisCache(redis.RedisCache):
    @cached_property
    def _cache(self):
        key = (tuple(self._servers), repr(sorted(self._options.items())))
        if (client := _clients.get(key)) is None:
            with _clients_lock:
                client = _clients.setdefault(key, _Client(self._servers, **self._options))
        return client


def raw_redis(name: str):
    """The default cache's Redis client and the full key for `name` (its
    prefix and version applied), for values kept outside Django's pickling;
    None where the cache is not on Redis."""
    from django.core.cache import DEFAULT_CACHE_ALIAS, caches

    cache = caches[DEFAULT_CACHE_ALIAS]
    if not isinstance(cache, redis.RedisCache):
        return None
    key = cache.make_and_validate_key(name)
    return cache._cache.get_client(key, write=True), key
