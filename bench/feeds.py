"""Feed page latency with 1,000 and with 1,000,000 events in the log.

The log is filled with SQL (INSERT … SELECT generate_series), then read
through the API with sequential `GET …?cursor=…&limit=100` requests from
cursors in the middle of the data, each returning a full page:

- space feed of `feed-small`, whose 1,000 events are spread evenly over the
  whole position range (one every STRIDE positions);
- space feed of `feed-big`, which holds every other event of the 1M log
  (10% of them restricted to direct conversations, half of those hidden
  from the viewer): the busy-space worst case;
- the viewer's inbox feed (`/v0/me/inbox/events`): an addressee row for each
  `feed-small` event, and in the 1M log each `feed-big` event is addressed
  to one member in turn (not its author), so the viewer gets one in 16.

Stage "1k" has only the `feed-small` events; stage "1M" adds the rest. The
ratio 1M / 1k of the p50 (and p99) is the figure; the target is <= 1.3.
"""
from __future__ import annotations

import asyncio
import random
import time

import aiohttp
import psycopg

from bench.fixture import FEED_BIG, FEED_SMALL, Fixture
from bench.load import latency_summary

SMALL_EVENTS = 1_000
PAGE = 100
WARMUP_REQUESTS = 20
SEED = 20240601

_EVENT_SQL = """
INSERT INTO controlplane_event (position, kind, space_id, conversation_id, actor_id, restricted, data, created_at)
SELECT p, 'message.created', %(space)s::bigint, conv, actor, restricted,
       jsonb_build_object('message', jsonb_build_object(
           'id', 'msg_bench' || p, 'conversation', conv_public, 'space', %(slug)s::text,
           'author', '@' || (%(handles)s::text[])[1 + g %% %(n)s::bigint],
           'body', %(body)s::text, 'reply_to', NULL, 'related_paths', '[]'::jsonb, 'mentions', mentions,
           'created_at', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'), 'position', p)),
       now()
FROM (
    SELECT g, %(base)s::bigint + g AS p,
           (%(actors)s::bigint[])[1 + g %% %(n)s::bigint] AS actor,
           CASE WHEN %(restrict)s::boolean AND g %% 20 = 0 THEN %(dm_viewer)s::bigint
                WHEN %(restrict)s::boolean AND g %% 20 = 10 THEN %(dm_other)s::bigint ELSE %(channel)s::bigint END AS conv,
           CASE WHEN %(restrict)s::boolean AND g %% 20 = 0 THEN %(dm_viewer_public)s::text
                WHEN %(restrict)s::boolean AND g %% 20 = 10 THEN %(dm_other_public)s::text ELSE %(channel_public)s::text END AS conv_public,
           %(restrict)s::boolean AND g %% 10 = 0 AS restricted,
           CASE WHEN %(mentions_viewer)s::boolean THEN jsonb_build_array(%(viewer_handle)s::text) ELSE '[]'::jsonb END AS mentions
    FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g
    WHERE g %% %(stride)s::bigint {cmp} 0
) AS rows
"""

_ADDRESSEE_SQL = """
INSERT INTO controlplane_eventaddressee (event_id, member_id, space_id)
SELECT position, (%(members)s::bigint[])[1 + (position - %(base)s::bigint + 1) %% %(n)s::bigint], space_id
FROM controlplane_event WHERE space_id = %(space)s::bigint AND position > %(base)s::bigint
"""

BODY = "bench feed message: status nominal, queue drained, nothing to report, all systems go ok"


def _ids(conn, fx: Fixture) -> dict:
    """Internal ids of the fixture's spaces and conversations."""
    def one(sql, value):
        return conn.execute(sql, (value,)).fetchone()[0]

    space = "SELECT id FROM controlplane_space WHERE public_id = %s"
    conv = "SELECT id FROM controlplane_conversation WHERE public_id = %s"
    c = fx.conversations
    return {"small": one(space, fx.spaces[FEED_SMALL]["id"]), "big": one(space, fx.spaces[FEED_BIG]["id"]),
            "small_channel": one(conv, c[f"{FEED_SMALL}#general"]["id"]),
            "big_channel": one(conv, c[f"{FEED_BIG}#general"]["id"]),
            "dm_viewer": one(conv, c["dm-viewer"]["id"]), "dm_other": one(conv, c["dm-other"]["id"])}


class FeedLog:
    """Builds the two stages of the log and the cursors to read them from."""

    def __init__(self, dsn: str, fx: Fixture, total_events: int):
        self.dsn, self.fx = dsn, fx
        self.stride = max(2, total_events // SMALL_EVENTS)  # 1,000 positions per small event at 1M
        self.span = self.stride * SMALL_EVENTS
        with psycopg.connect(dsn, autocommit=True) as conn:
            self.ids = _ids(conn, fx)
            self.base = conn.execute("SELECT position FROM controlplane_loghead WHERE id = 1").fetchone()[0]
        rng = random.Random(SEED)
        # Cursors between a quarter and three quarters of the range: every page is full.
        middle = lambda: self.base + rng.randint(self.span // 4, 3 * self.span // 4)  # noqa: E731
        self.positions = [middle() for _ in range(4096)]

    def _params(self, space: str, slug: str, channel: str, restrict: bool, mentions_viewer: bool) -> dict:
        c, m = self.fx.conversations, self.fx.members
        return {"space": self.ids[space], "slug": slug, "handles": [x.handle for x in m], "n": len(m),
                "actors": [x.pk for x in m], "body": BODY, "base": self.base, "first": 1, "last": self.span,
                "stride": self.stride, "restrict": restrict, "channel": self.ids[channel],
                "channel_public": c[f"{slug}#general"]["id"], "dm_viewer": self.ids["dm_viewer"],
                "dm_other": self.ids["dm_other"], "dm_viewer_public": c["dm-viewer"]["id"],
                "dm_other_public": c["dm-other"]["id"], "mentions_viewer": mentions_viewer,
                "viewer_handle": f"@{self.fx.viewer.handle}"}

    def _finish(self, conn, started: float) -> dict:
        conn.execute("UPDATE controlplane_loghead SET position = GREATEST(position, %s) WHERE id = 1",
                     (self.base + self.span,))
        conn.execute("VACUUM (ANALYZE) controlplane_event")
        conn.execute("VACUUM (ANALYZE) controlplane_eventaddressee")
        conn.execute("CHECKPOINT")
        events, size = conn.execute("SELECT count(*), pg_total_relation_size('controlplane_event') "
                                    "FROM controlplane_event").fetchone()
        return {"events_in_log": events, "event_table_mib": round(size / 2**20, 1),
                "load_seconds": round(time.monotonic() - started, 1)}

    def load_small(self) -> dict:
        """Stage 1k: 1,000 events of feed-small at base + k·STRIDE, each
        mentioning the viewer (one addressee row each)."""
        started = time.monotonic()
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute("SET statement_timeout = '300s'")
            with conn.transaction():
                params = self._params("small", FEED_SMALL, "small_channel", False, True)
                conn.execute(_EVENT_SQL.format(cmp="="), params)
                conn.execute(_ADDRESSEE_SQL, {"members": [self.fx.viewer.pk], "base": self.base, "n": 1,
                                              "space": self.ids["small"]})
            return self._finish(conn, started)

    def load_big(self) -> dict:
        """Stage 1M: every other position of the range, in feed-big, each
        addressed to one member in turn."""
        started = time.monotonic()
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute("SET statement_timeout = '600s'")
            with conn.transaction():
                params = self._params("big", FEED_BIG, "big_channel", True, False)
                conn.execute(_EVENT_SQL.format(cmp="<>"), params)
                conn.execute(_ADDRESSEE_SQL, {"members": [m.pk for m in self.fx.members], "base": self.base,
                                              "n": len(self.fx.members), "space": self.ids["big"]})
            return self._finish(conn, started)

    def paths(self, feed: str, count: int, offset: int = 0) -> list[str]:
        """`count` request paths for `feed` ("small", "big" or "inbox")."""
        from controlplane.cursors import pack_cursor

        viewer = self.fx.viewer.public_id
        if feed == "inbox":
            prefix, stream = "/v0/me/inbox/events", "inbox"
        else:
            space = self.fx.spaces[FEED_SMALL if feed == "small" else FEED_BIG]
            prefix, stream = f"/v0/spaces/{space['slug']}/events", f"space:{space['id']}"
        return [f"{prefix}?limit={PAGE}&cursor={pack_cursor((p,), caller=viewer, stream=stream)}"
                for p in self.positions[offset: offset + count]]


async def read_pages(base_url: str, token: str, paths: list[str], *, warmup: list[str]) -> dict:
    """Sequential GETs: latency of each, and how many failed or came back short."""
    headers = {"Authorization": f"Bearer {token}"}
    latencies, errors, short, samples = [], 0, 0, []
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(base_url, headers=headers, timeout=timeout) as session:
        loop = asyncio.get_running_loop()
        for measured, batch in ((False, warmup), (True, paths)):
            for path in batch:
                began = loop.time()
                async with session.get(path) as response:
                    body = await response.json(content_type=None)
                    status = response.status
                elapsed = loop.time() - began
                if not measured:
                    continue
                if status != 200:
                    errors += 1
                    samples.append(f"{status} {str(body)[:300]}")
                    continue
                latencies.append(elapsed)
                if len(body.get("events", [])) != PAGE:
                    short += 1
    return {"requests": len(paths), "errors": errors, "short_pages": short, "error_samples": samples[:3],
            **latency_summary(latencies)}


async def run(base_url: str, dsn: str, fx: Fixture, *, requests: int, total_events: int) -> dict:
    log = FeedLog(dsn, fx, total_events)
    token = fx.viewer.token
    warm = lambda feed: log.paths(feed, WARMUP_REQUESTS, offset=len(log.positions) - WARMUP_REQUESTS)  # noqa: E731
    result = {"page": PAGE, "stride": log.stride, "stages": {}}

    stage = result["stages"]["1k"] = log.load_small()
    for feed in ("small", "inbox"):
        stage[feed] = await read_pages(base_url, token, log.paths(feed, requests), warmup=warm(feed))

    stage = result["stages"]["1M"] = log.load_big()
    for feed in ("small", "big", "inbox"):
        stage[feed] = await read_pages(base_url, token, log.paths(feed, requests), warmup=warm(feed))

    def ratio(feed_1m: str, feed_1k: str, key: str) -> float | None:
        a, b = result["stages"]["1M"][feed_1m].get(key), result["stages"]["1k"][feed_1k].get(key)
        return round(a / b, 2) if a and b else None

    result["ratios"] = {
        f"{name}_{key}": ratio(big, small, key)
        for name, big, small in (("space_small", "small", "small"), ("space_big", "big", "small"),
                                 ("inbox", "inbox", "inbox"))
        for key in ("p50_ms", "p99_ms")
    }
    return result
