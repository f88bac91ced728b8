"""Requests as values, and the two ways to run them (sync and async) with one
retry policy.

A `Call` is everything about one API request: route, path, query, body,
its Idempotency-Key (chosen once, reused by every attempt) and how to read
the answer. `retry_delay` decides, for either transport, whether a failed
attempt may be repeated and after how long:

- 429 RATE_LIMITED and 503 UNAVAILABLE: the server did nothing; always
  retried, after `Retry-After`.
- Other 5xx (not 507 MAILBOX_FULL, a definite answer), and connections that
  broke after the request was sent: retried only when a repeat cannot do
  the work twice (a read, a delete, or a write carrying its key).
- A connection that could not be made: nothing was sent; always retried.
- Any other answer is final; but a DELETE whose repeat finds nothing
  (404) after an attempt that may have run was done by that attempt.
"""
from __future__ import annotations

import asyncio
import json as jsonlib
import random
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from switchboard_client.config import normalize_host
from switchboard_client.errors import (ConfigurationError, ConnectionFailed, RequestError, ServerError, SwitchboardError,
                                      error_from_response)
from switchboard_client.routes import Route

USER_AGENT = "switchboard-client/0.1.0"
NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


def new_idempotency_key() -> str:
    """A fresh key: 36 visible ASCII characters (SPEC §2 allows 8–128)."""
    return "sbc-" + secrets.token_urlsafe(24)


@dataclass(frozen=True)
class Call:
    route: Route
    path: str
    parse: Callable[[Any], Any]
    params: dict | None = None
    json: Any = None
    idempotency_key: str | None = None
    timeout: float | None = None  # seconds; None: the client's default
    has_body: bool = field(default=False)


@dataclass(frozen=True)
class RetryPolicy:
    """At most `attempts` tries in all; waits double from `backoff` up to
    `max_backoff` with ±20% jitter, or follow `Retry-After` up to
    `max_retry_after`."""
    attempts: int = 5
    backoff: float = 0.5
    max_backoff: float = 20.0
    max_retry_after: float = 120.0

    def wait(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(max(0.0, retry_after), self.max_retry_after)
        return doubled(self.backoff, attempt - 1, self.max_backoff) * random.uniform(0.8, 1.2)


def doubled(first: float, times: int, cap: float) -> float:
    """`first` doubled `times` times, at most `cap`. The exponent is bounded:
    past 2 ** 1023 the product is no float (OverflowError), which a feed
    failing for half a day reached."""
    return min(first * 2 ** min(times, 64), cap)


NO_RETRIES = RetryPolicy(attempts=1)


def retry_delay(policy: RetryPolicy, call: Call, attempt: int, error: SwitchboardError) -> float | None:
    """Seconds to wait before trying `call` again, or None to give up with `error`."""
    if attempt >= policy.attempts:
        return None
    if isinstance(error, ConnectionFailed):
        retryable = not error.details.get("sent", True) or call.route.replay_safe
    elif error.status in (429, 503):
        retryable = True
    elif error.status is not None and error.status >= 500 and error.status != 507:
        retryable = call.route.replay_safe
    else:
        retryable = False
    return policy.wait(attempt, error.retry_after) if retryable else None


def may_have_run(error: SwitchboardError) -> bool:
    """Whether a failed attempt may have been carried out all the same: its
    connection broke after the request was sent, or a 5xx other than 503
    (the server did nothing) and 507 (a definite answer)."""
    if isinstance(error, ConnectionFailed):
        return error.details.get("sent", True)
    return error.status is not None and error.status >= 500 and error.status not in (503, 507)


def deleted_already(call: Call, error: SwitchboardError, doubtful: bool) -> bool:
    """A DELETE repeated after an attempt that may have run, and now 404:
    that attempt deleted it (reported as not found, it looked as if nothing
    had been there)."""
    return doubtful and call.route.method == "DELETE" and error.status == 404


def json_bytes(value: Any) -> bytes:
    """`value` as JSON in UTF-8, as httpx would send it; text that is not
    valid Unicode (a lone surrogate: undecodable bytes a shell handed over)
    goes escaped, for the server to refuse as `422 INVALID_BODY` (httpx
    raised UnicodeEncodeError, a traceback instead of the API's error)."""
    try:
        return jsonlib.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
    except UnicodeEncodeError:
        return jsonlib.dumps(value, separators=(",", ":"), allow_nan=False).encode()


def connection_failed(exc: httpx.TransportError) -> ConnectionFailed:
    sent = not isinstance(exc, NOT_SENT)
    return ConnectionFailed(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__,
                            details={"sent": sent, "error": type(exc).__name__})


def outcome(call: Call, response: httpx.Response) -> tuple[bool, Any]:
    """(True, parsed result) for a 2xx answer, else (False, the error). A
    2xx that is not the route's answer (a sign-in page, a proxy's) is
    `BAD_RESPONSE`; a redirect, never followed, is `REDIRECTED` with where
    it points. Neither is retried: the request may have been carried out."""
    status = response.status_code
    try:
        data = response.json() if response.content else None
    except ValueError:
        data = None
    if response.is_success:
        try:
            if response.content and data is None:  # every answer with a body is JSON
                raise ValueError("not JSON")
            return True, call.parse(data)
        except SwitchboardError as error:  # the answer says the call cannot give what it promises
            return False, error
        except (KeyError, TypeError, AttributeError, ValueError):
            kind = response.headers.get("content-type", "no content type")
            return False, ServerError(f"HTTP {status} ({kind}) is not a Switchboard answer: is the host right?",
                                      status=status, code="BAD_RESPONSE", headers=response.headers)
    if response.is_redirect:
        where = response.headers.get("location", "nowhere")
        return False, RequestError(f"HTTP {status} redirects to {where}: use that server's URL (redirects are not "
                                   "followed, so the token goes nowhere else)", status=status, code="REDIRECTED",
                                   headers=response.headers)
    return False, error_from_response(status, data, response.headers)


class _Base:
    def __init__(self, base_url: str, token: str | None, *, timeout: float, retry: RetryPolicy):
        if token is not None and not (token.isascii() and token.isprintable()):
            raise ConfigurationError("A token is printable ASCII (sbt_…): this one cannot go in a header.")
        self.base_url = normalize_host(base_url)
        self.token = token
        self.timeout = timeout
        self.retry = retry

    def request_args(self, call: Call) -> dict:
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if call.idempotency_key is not None:
            headers["Idempotency-Key"] = call.idempotency_key
        args = {"method": call.route.method, "url": f"{self.base_url}/v0/{call.path}", "headers": headers,
                "params": {k: v for k, v in (call.params or {}).items() if v is not None} or None,
                "timeout": call.timeout or self.timeout}
        if call.has_body:
            headers["Content-Type"] = "application/json"
            args["content"] = json_bytes(call.json)
        return args


class SyncTransport(_Base):
    def __init__(self, base_url, token, *, timeout, retry, http: httpx.Client | None = None,
                 sleep: Callable[[float], None] = time.sleep):
        super().__init__(base_url, token, timeout=timeout, retry=retry)
        self.http = http or httpx.Client()
        self._sleep = sleep

    def execute(self, call: Call) -> Any:
        attempt, doubtful = 0, False
        while True:
            attempt += 1
            try:
                ok, result = outcome(call, self.http.request(**self.request_args(call)))
            except httpx.TransportError as exc:
                ok, result = False, connection_failed(exc)
            if ok:
                return result
            if deleted_already(call, result, doubtful):
                return call.parse(None)
            doubtful = doubtful or may_have_run(result)
            delay = retry_delay(self.retry, call, attempt, result)
            if delay is None:
                raise result
            self._sleep(delay)

    def close(self) -> None:
        self.http.close()


class AsyncTransport(_Base):
    def __init__(self, base_url, token, *, timeout, retry, http: httpx.AsyncClient | None = None,
                 sleep: Callable[[float], Any] = asyncio.sleep):
        super().__init__(base_url, token, timeout=timeout, retry=retry)
        self.http = http or httpx.AsyncClient()
        self._sleep = sleep

    async def execute(self, call: Call) -> Any:
        attempt, doubtful = 0, False
        while True:
            attempt += 1
            try:
                ok, result = outcome(call, await self.http.request(**self.request_args(call)))
            except httpx.TransportError as exc:
                ok, result = False, connection_failed(exc)
            if ok:
                return result
            if deleted_already(call, result, doubtful):
                return call.parse(None)
            doubtful = doubtful or may_have_run(result)
            delay = retry_delay(self.retry, call, attempt, result)
            if delay is None:
                raise result
            await self._sleep(delay)

    async def close(self) -> None:
        await self.http.aclose()
