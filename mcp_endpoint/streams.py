"""What an `events/stream` consumer listens to while it waits: the commits
its source's interest names (`mcp_endpoint.sources.interest`: the
committing process wakes them at once), its inbox's nudges (the mailbox
announces every admission and acknowledgement to the member's inbox
group), the member's suspension (`session.ended` to the
member's group, as for their live pages), the revocation of the credential
that opened it (`credential.revoked` to the credential's group), and, for the inbox events,
whether a newer consumer took over.

One consumer owns a member's stream of an inbox event at a time, on any
server process: a new one, once it listens to the owner group and its first
read succeeded (a refused request ends nobody), announces a claim (an
order and a random token) there over the channel layer. An older consumer
that hears a newer claim ends with `terminated`; a newer one that hears an
older claim announces its own again, for an older consumer that joined the
group after the newer one announced. Claims are ordered the same way
everywhere, by a counter on Redis where the deployment shares one (so that
processes' clocks cannot disagree), else by this process's clock; so of
two that start together exactly one survives. A replaced consumer's cleanup
only removes its own channel, so however late it fails, it never ends its
replacement.

The listener outlives a lost channel layer: it listens again once the layer
answers (1 s, doubling to LOST_SECONDS), joins its groups again, announces
its claim again and reads its member's and credential's state again (their
news may have gone while it was deaf), and wakes the stream to read.

A member holds at most MAX_PER_MEMBER streams in all (`Places`): counted
on Redis where the deployment shares one (every process's streams), else
in the process, which is then the whole deployment.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import logging
import secrets
import time

from channels.layers import get_channel_layer

from controlplane.cache import raw_redis
from controlplane.db import db_call
from controlplane.errors import warn_of
from controlplane.live import Interest, credential_group, log_watcher, member_group
from controlplane.models import Credential, Member
from controlplane.topics import Memberships, stop_task
from inbox.mailbox import inbox_group
from webhooks.mcp import ITEM, PENDING

logger = logging.getLogger("switchboard.mcp")

CLAIM = "mcp.stream.claim"
# Streams one member may hold open: each is a task that reads again on
# every nudge (for space events, on every commit in the space).
MAX_PER_MEMBER = 8
# On Redis a stream's place lasts this long unless renewed (every third of
# it while the stream is open): a killed process's places free themselves.
PLACE_SECONDS = 60
LOST_SECONDS = 15  # the longest wait before a listener that lost its channel layer listens again
_leaving: set[asyncio.Task] = set()  # stopped streams leaving their groups, after a cancelled stop


class TooManyStreams(Exception):
    pass


# KEYS[1]: a member's places, a sorted set (stream token → end of its
# place, by Redis's own clock, so that processes' clocks cannot disagree).
_NOW = "local t = redis.call('TIME') local now = tonumber(t[1]) + tonumber(t[2]) / 1000000 "
# ARGV: seconds a place lasts, the most places, the new place's token.
_TAKE = _NOW + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), ARGV[3])
redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[1])))
return 1
"""
# A renewal places a place that lapsed meanwhile (Redis unreachable for
# longer) again: its stream is open. But not one given back (KEYS[2], the
# tokens given back, for as long as a place lasts): a renewal already on
# its way when its stream stopped (the task cancelled, its call not) would
# hold a place for nobody. ARGV: seconds a place lasts, the token.
_RENEW = _NOW + """
if redis.call('ZSCORE', KEYS[2], ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), ARGV[2])
redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[1])))
return 1
"""
_GIVE_BACK = _NOW + """
redis.call('ZREM', KEYS[1], ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[1]), ARGV[2])
redis.call('EXPIRE', KEYS[2], math.ceil(tonumber(ARGV[1])))
return 1
"""


class Places:
    """Each member's open streams, at most MAX_PER_MEMBER: on Redis where
    the deployment shares it (a script checks and places at once; the
    calls go to a worker thread), else counted in this process, on its
    event loop."""

    def __init__(self) -> None:
        self._here: collections.Counter[int] = collections.Counter()

    @staticmethod
    def _shared(member_pk: int):
        return raw_redis(f"mcp-streams:{member_pk}")

    @staticmethod
    def _given_back(member_pk: int) -> str:
        return raw_redis(f"mcp-streams-gone:{member_pk}")[1]

    def on_redis(self) -> bool:
        return self._shared(0) is not None

    async def take(self, member_pk: int, token: str) -> bool:
        if (shared := self._shared(member_pk)) is None:
            if self._here[member_pk] >= MAX_PER_MEMBER:
                return False
            self._here[member_pk] += 1
            return True
        client, key = shared
        taking = asyncio.get_running_loop().run_in_executor(
            None, client.eval, _TAKE, 1, key, PLACE_SECONDS, MAX_PER_MEMBER, token)
        try:
            return bool(await asyncio.shield(taking))
        except asyncio.CancelledError:
            # The script may still place it: give it back once it has.
            taking.add_done_callback(lambda done: done.cancelled() or done.exception() is not None
                                     or not done.result() or self.give_back(member_pk, token))
            raise

    async def renew(self, member_pk: int, token: str) -> None:
        if (shared := self._shared(member_pk)) is not None:
            client, key = shared
            await asyncio.to_thread(client.eval, _RENEW, 2, key, self._given_back(member_pk), PLACE_SECONDS, token)

    def give_back(self, member_pk: int, token: str) -> asyncio.Future | None:
        """On the event loop, without waiting (a stream cancelled with its
        client cannot wait): on Redis the place goes on a worker thread,
        whose future this returns to wait for if one can; a failure leaves
        the place to lapse after PLACE_SECONDS."""
        if (shared := self._shared(member_pk)) is None:
            self._here[member_pk] -= 1
            if self._here[member_pk] <= 0:
                del self._here[member_pk]
            return None
        client, key = shared
        giving = asyncio.get_running_loop().run_in_executor(
            None, client.eval, _GIVE_BACK, 2, key, self._given_back(member_pk), PLACE_SECONDS, token)
        giving.add_done_callback(lambda done: done.cancelled() or done.exception() is None or logger.warning(
            "could not give back a stream's place; it lapses", exc_info=done.exception()))
        return giving


places = Places()


# KEYS[1]: the claims' counter, never below Redis's clock in microseconds:
# a Redis that lost it (restarted, evicted) goes on past every claim made
# before, where a bare counter would start again at 1 below them.
_NEXT_CLAIM = """
local t = redis.call('TIME')
local floor = tonumber(t[1]) * 1000000 + tonumber(t[2])
local n = redis.call('INCR', KEYS[1])
if n < floor then
  redis.call('SET', KEYS[1], string.format('%d', floor))
  n = floor
end
return n
"""


async def _claim_order() -> int:
    """A claim's place in the order of claims: on Redis where the deployment
    shares one (one clock and a counter for all processes), else this
    process's clock (the deployment is then this process)."""
    if (shared := raw_redis("mcp-stream-claims")) is None:
        return time.time_ns() // 1000
    client, key = shared
    return await asyncio.to_thread(client.eval, _NEXT_CLAIM, 1, key)


class StreamOwner:
    def __init__(self, member, source, arguments: dict, credential_id: str | None = None) -> None:
        self.inbox = source.name in (ITEM, PENDING)
        digest = hashlib.sha256(source.stream_key(arguments).encode()).hexdigest()[:16]
        self.owner_group = f"mcp-stream.{member.public_id}.{digest}"
        self.groups = [member_group(member)] + ([self.owner_group, inbox_group(member)] if self.inbox else [])
        if credential_id is not None:
            self.groups.append(credential_group(credential_id))
        self.member_pk, self.credential_id = member.pk, credential_id
        self.counted = False
        self.token = secrets.token_hex(8)  # its place's, and its claim's
        self.claim: tuple[int, str] | None = None  # once announced
        self._renewal: asyncio.Task | None = None
        self.replaced = asyncio.Event()
        self.suspended = asyncio.Event()
        self.revoked = asyncio.Event()
        self.nudged = asyncio.Event()
        self._layer = get_channel_layer()
        self._channel: str | None = None
        self._listener: asyncio.Task | None = None
        self._memberships: Memberships | None = None
        self._interest: Interest | None = None

    async def start(self) -> None:
        """Raises TooManyStreams past the member's MAX_PER_MEMBER. A start
        that fails midway (the channel layer lost) undoes itself: its place,
        its renewal and its groups go with it."""
        if not await places.take(self.member_pk, self.token):
            raise TooManyStreams()
        self.counted = True
        if places.on_redis():
            self._renewal = asyncio.get_running_loop().create_task(self._renew())
        if self._layer is None:
            return
        try:
            self._channel = await self._layer.new_channel()
            self._memberships = Memberships(self._layer, self._channel)
            await self._memberships.join(*self.groups)
            self._listener = asyncio.get_running_loop().create_task(self._listen())
        except BaseException:
            await self.stop()
            raise

    async def take_over(self) -> None:
        """For an inbox event, after `start` and the stream's first read:
        claim the member's stream, which ends any older consumer."""
        if not self.inbox or self._layer is None:
            return
        self.claim = (await _claim_order(), self.token)
        await self._announce()

    async def _announce(self) -> None:
        await self._layer.group_send(self.owner_group, {"type": CLAIM, "at": self.claim[0], "token": self.claim[1]})

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(PLACE_SECONDS / 3)
            try:
                await places.renew(self.member_pk, self.token)
            except Exception:
                warn_of(logger, "could not renew a stream's place; trying again later")

    async def _listen(self) -> None:
        lost_for = 0.0
        while True:
            try:
                if lost_for:
                    await asyncio.sleep(lost_for)
                    await self._listen_again()
                message = await self._layer.receive(self._channel)
            except Exception:
                warn_of(logger, "a stream lost its channel layer; listening again shortly")
                lost_for = min(2 * lost_for, LOST_SECONDS) if lost_for else 1.0
                continue
            lost_for = 0.0
            await self._hear(message)

    async def _listen_again(self) -> None:
        """After a lost channel layer: what the stream may not have heard."""
        await self._memberships.rejoin()
        if self.claim is not None and not self.replaced.is_set():
            await self._announce()
        if (ending := await db_call(why_ended)(self.member_pk, self.credential_id)) is not None:
            getattr(self, ending).set()
        self.nudged.set()

    async def _hear(self, message: dict) -> None:
        if message.get("type") == CLAIM:
            heard = (message["at"], message["token"])
            if self.claim is None or heard == self.claim:
                return  # not claimed yet (its claim will be newer), or its own
            if heard > self.claim:
                self.replaced.set()
            elif not self.replaced.is_set():  # an older consumer that did not hear this one
                try:
                    await self._announce()
                except Exception:
                    warn_of(logger, "could not announce a stream's claim again")
        elif message.get("type") == "session.ended":
            self.suspended.set()
        elif message.get("type") == "credential.revoked":
            self.revoked.set()
        else:
            self.nudged.set()

    def watch(self, **interest) -> None:
        """Before the first read: wake for the commits this
        `controlplane.live.Interest` (its arguments) names, besides the
        nudges. A lost nudge is found by the process's log watcher (its look
        at the log head), not by a re-read of every stream."""
        self._interest = log_watcher.watch(**interest)

    async def wait(self, timeout: float) -> str | None:
        """Until something may have changed (a nudge; for space events, a
        commit the interest names) or `timeout`. Then why the stream must
        end, if it must: "replaced" (a newer consumer took over),
        "suspended" (the member) or "revoked" (the credential that opened it)."""
        waiters = [asyncio.ensure_future(e.wait()) for e in (self.replaced, self.suspended, self.revoked, self.nudged)]
        if self._interest is not None:
            waiters.append(asyncio.ensure_future(log_watcher.wait(self._interest.event, timeout)))
        try:
            await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
        self.nudged.clear()
        if self._interest is not None:
            self._interest.event.clear()  # before the caller reads: a commit during its read wakes the next wait
        return self.ending()

    def ending(self) -> str | None:
        """Why the stream must end, if it must, without waiting (see `wait`),
        or "shutdown" (the server is shutting down)."""
        for ending in ("replaced", "suspended", "revoked"):
            if getattr(self, ending).is_set():
                return ending
        return "shutdown" if log_watcher.closing else None

    async def stop(self) -> None:
        # Everything is started before the first wait: the SDK ends a stream
        # whose client went by cancelling it, which interrupts this there.
        # The listener stops and the groups are left by a task of their own
        # (a channel left in them got a copy of every message, renewed hourly).
        if self._interest is not None:
            log_watcher.unwatch(self._interest)
            self._interest = None
        if self._renewal is not None:
            self._renewal.cancel()
            self._renewal = None
        giving = None
        if self.counted:
            self.counted = False
            giving = places.give_back(self.member_pk, self.token)
        listener, memberships, self._listener, self._memberships = self._listener, self._memberships, None, None
        leaving = asyncio.get_running_loop().create_task(_leave(listener, memberships))
        _leaving.add(leaving)
        leaving.add_done_callback(_leaving.discard)
        for step in (leaving, giving):  # a stop that is not cancelled ends with both done
            if step is not None:
                with contextlib.suppress(Exception):
                    await asyncio.shield(step)


async def _leave(listener: asyncio.Task | None, memberships: Memberships | None) -> None:
    if listener is not None:
        await stop_task(listener)
    if memberships is not None:
        await memberships.leave()


def why_ended(member_pk: int, credential_id: str | None) -> str | None:
    """Why a stream must end though it heard nothing: its member was
    suspended, or its credential revoked, while it was not listening (before
    it joined their groups, or while its channel layer was lost). None: neither."""
    if not Member.objects.filter(pk=member_pk, status=Member.Status.ACTIVE).exists():
        return "suspended"
    if credential_id is not None and not Credential.objects.filter(public_id=credential_id).exists():
        return "revoked"
    return None
