"""Endpoint verification (SPEC §8): the signed challenge an endpoint must
answer before a subscription on it is activated, sent to an address a
member chose, so bounded in every way a request can be."""
from __future__ import annotations

import asyncio
import datetime as dt
import hmac
import json
import secrets
import threading
from contextlib import contextmanager

from django.conf import settings
from django.core.cache import cache
from django.db import connection

from controlplane.clock import now, rfc3339, timestamp
from controlplane.errors import RateLimited, VerificationFailed
from controlplane.ratelimit import hit
from controlplane.tokens import public_id
from webhooks import crypto
from webhooks.models import Endpoint
from webhooks.services import refuse_managed

VERIFICATION_TTL = dt.timedelta(minutes=10)
VERIFY_TIMEOUT_SECONDS = 30  # longer than a request can take; the in-flight mark expires after it
FAILURE_MEMORY_SECONDS = 60
# Verifications waiting on their receivers in one process at once: each
# holds a request thread (SYNC_THREADS) for up to the transport's 15 s, and
# eight members with receivers that answered a byte every few seconds held
# every thread of a process, so every request of it waited.
_PLACES = threading.BoundedSemaphore(max(1, settings.SYNC_THREADS // 4))


@contextmanager
def _a_place():
    if not _PLACES.acquire(blocking=False):
        raise RateLimited.after(5, "This server is verifying as many receivers as it may at once; try again in a "
                                   "few seconds.")
    try:
        yield
    finally:
        _PLACES.release()


def _challenge(endpoint: Endpoint, secret: str | None, challenge: str, mcp_subscription_id: str | None):
    """The signed challenge request: Switchboard's own, or for an MCP
    receiver the Events extension's `verification` envelope, signed with
    the receiver's Standard Webhooks secret alone."""
    if endpoint.managed:
        message_id = public_id("msg_verification")
        body = json.dumps({"type": "verification", "challenge": challenge}, separators=(",", ":")).encode()
        return body, crypto.standard_headers(message_id, body, [secret], timestamp=int(timestamp()),
                                             subscription_id=mcp_subscription_id)
    message_id = public_id("whc")
    body = json.dumps({"type": "spaces.webhook.challenge", "id": message_id, "challenge": challenge,
                       "created_at": rfc3339(now())}, separators=(",", ":")).encode()
    return body, crypto.Signer(crypto.active_signing_key()).headers(message_id, body, secret=secret,
                                                                     timestamp=int(timestamp()))


def verify_endpoint(endpoint: Endpoint, *, resolver=None, mcp_subscription_id: str | None = None) -> dt.datetime:
    """Send the signed challenge, unless this owner verified the same URL and
    secret with the same challenge in the last 10 minutes (an MCP receiver
    answers the Events extension's, the others Switchboard's own: one
    proves nothing of the other). 422 VERIFICATION_FAILED with a reason.

    Each verification makes this server send a request to an address a
    member chose, so: at most one of a member's verifications is in flight
    (429), at most VERIFY_PER_HOUR a member (429), a failure is answered
    again from memory for a minute without a new request, and the request
    is made with no database connection held, by one of a process's few
    places for it (429 when they are all taken)."""
    if mcp_subscription_id is None:
        refuse_managed(endpoint)  # MCP receivers are verified by events/subscribe
    secret = crypto.open_secret(endpoint.secret)
    digest = crypto.target_digest(endpoint.url, secret)
    cached = (Endpoint.objects.owned_by(endpoint.owner_id).filter(verified_digest=digest, managed=endpoint.managed,
                                                                 verified_at__gte=now() - VERIFICATION_TTL)
              .order_by("-verified_at").values_list("verified_at", flat=True).first())
    failure_key = f"verify:failed:{endpoint.owner_id}:{int(endpoint.managed)}:{digest}"
    if cached is None:
        failed = cache.get(failure_key)
        if failed is not None and timestamp() - failed["at"] < FAILURE_MEMORY_SECONDS:
            raise VerificationFailed(details={**failed["details"], "cached": True})
        in_flight = f"verify:inflight:{endpoint.owner_id}"
        if not cache.add(in_flight, 1, VERIFY_TIMEOUT_SECONDS):
            raise RateLimited.after(5, "Another verification of yours is still running.")
        try:
            with _a_place():
                if wait := hit(f"verify:{endpoint.owner_id}", limit=settings.VERIFY_PER_HOUR, window=3600):
                    raise RateLimited.after(wait, "Too many verifications; try again later.")
                challenge = secrets.token_urlsafe(32)
                body, headers = _challenge(endpoint, secret, challenge, mcp_subscription_id)
                if not connection.in_atomic_block:
                    connection.close()  # back to the pool while the receiver takes its time
                outcome = asyncio.run(_post_once(endpoint.url, body, headers, resolver))
            try:
                _check_answer(outcome, challenge)
            except VerificationFailed as failure:
                cache.set(failure_key, {"details": failure.details, "at": timestamp()}, FAILURE_MEMORY_SECONDS)
                raise
        finally:
            cache.delete(in_flight)
        cached = now()
    Endpoint.objects.filter(pk=endpoint.pk).update(verified_at=cached, verified_digest=digest)
    endpoint.verified_at, endpoint.verified_digest = cached, digest
    return cached


async def _post_once(url, body, headers, resolver):
    from webhooks.transport import Transport  # aiohttp: only where a request is sent

    async with Transport(resolver=resolver, limit=1) as transport:
        return await transport.post(url, body, headers)


def _check_answer(outcome, challenge: str) -> None:
    if outcome.status_code is None:
        raise VerificationFailed(details={"reason": outcome.error_class})
    if not outcome.ok:
        raise VerificationFailed(details={"reason": f"http_{outcome.status_code}"})
    try:
        answer = json.loads(outcome.body)
    except (ValueError, RecursionError):  # the receiver's answer: any bytes, nested past the parser's depth too
        raise VerificationFailed(details={"reason": "not_json"}) from None
    answered = answer.get("challenge") if isinstance(answer, dict) else None
    # surrogatepass: valid JSON may hold a lone surrogate, which is a wrong answer, not a crash
    if not isinstance(answered, str) or not hmac.compare_digest(answered.encode("utf-8", "surrogatepass"),
                                                                challenge.encode()):
        raise VerificationFailed(details={"reason": "challenge_mismatch"})
