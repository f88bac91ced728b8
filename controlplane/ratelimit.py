"""Fixed-window rate limits in the cache (local memory in the embedded
deployment, Redis when REDIS_URL is set): the one counter every limit uses,
the API's per-member limit, credential creation and the web app's sign-in
and actions alike."""
from __future__ import annotations

import functools
import ipaddress
import unicodedata

from django.conf import settings
from django.core.cache import DEFAULT_CACHE_ALIAS, caches
from django.core.cache.backends.redis import RedisCache
from django.http import HttpResponse

from controlplane.clock import timestamp
from controlplane.errors import RateLimited


def client_address(request) -> str:
    """The client's address: the peer's, or with TRUST_PROXY_HEADERS the
    last address the proxy appended to X-Forwarded-For (the ones before it
    come from the client and prove nothing)."""
    return _address(request.META.get("HTTP_X_FORWARDED_FOR", ""), request.META.get("REMOTE_ADDR", ""))


def scope_address(scope: dict) -> str:
    """`client_address` for an ASGI application Django's handler does not serve (`/mcp`)."""
    forwarded = dict(scope.get("headers") or []).get(b"x-forwarded-for", b"").decode("latin-1")
    return _address(forwarded, (scope.get("client") or ("",))[0])


def _address(forwarded_for: str, peer: str) -> str:
    if settings.TRUST_PROXY_HEADERS:
        forwarded = [a.strip() for a in forwarded_for.split(",") if a.strip()]
        if forwarded:
            return forwarded[-1]
    return peer


def address_wait(address: str) -> float | None:
    """Count one request against a client address's RATE_LIMIT_PER_MINUTE:
    an anonymous caller's, and one refused for its credential (none,
    unknown, revoked, suspended), so guessing credentials is throttled as
    anonymous reading is."""
    return hit(f"ip:{source(address)}", limit=settings.RATE_LIMIT_PER_MINUTE, window=MEMBER_WINDOW)


def hit(key: str, *, limit: int, window: int, now: float | None = None) -> float | None:
    """Count one hit on `key` in the window of `window` seconds that holds
    `now` (default: the current one). None while within `limit` (0 or less:
    no limit); otherwise the seconds until the window ends (the Retry-After)."""
    if limit <= 0:
        return None
    now = timestamp() if now is None else now
    return _wait(_count(_slot(key, window, now), window * 2), limit, window, now)


def give_back(key: str, *, window: int, now: float) -> None:
    """Take back a hit `hit` counted on `key` at `now`; nothing when its
    window's count is gone."""
    try:
        caches[DEFAULT_CACHE_ALIAS].decr(_slot(key, window, now))
    except ValueError:
        pass


def _slot(key: str, window: int, now: float) -> str:
    return f"rl:{key}:{window}:{int(now // window)}"


def _wait(count: int, limit: int, window: int, now: float) -> float | None:
    return None if count <= limit else window - (now % window)


def _count(slot: str, ttl: int) -> int:
    """One more hit on `slot`, which lives `ttl` seconds from its first.
    On Redis one round trip (every API request pays it): SET NX with the
    expiry, then INCR, in one transaction. Elsewhere add, else incr."""
    backend = caches[DEFAULT_CACHE_ALIAS]
    if isinstance(backend, RedisCache):
        return _count_on_redis(backend, slot, ttl)[0]
    if backend.add(slot, 1, ttl):
        return 1
    try:
        return backend.incr(slot)
    except ValueError:  # expired between add and incr
        backend.add(slot, 1, ttl)
        return 1


def _count_on_redis(backend, slot: str, ttl: int, read: str | None = None) -> tuple[int, bytes | None]:
    key = backend.make_and_validate_key(slot)
    pipeline = backend._cache.get_client(key, write=True).pipeline()
    pipeline.set(key, 0, ex=ttl, nx=True).incr(key)
    if read is not None:
        pipeline.get(read)
    _, count, *value = pipeline.execute()
    return count, (value[0] if value else None)


MEMBER_WINDOW = 60


def member_request_wait(member) -> float | None:
    """Count one API request or web action of `member` against their
    RATE_LIMIT_PER_MINUTE: one budget, however many credentials and tabs."""
    return hit(f"mem:{member.public_id}", limit=settings.RATE_LIMIT_PER_MINUTE, window=MEMBER_WINDOW)


def member_request_wait_reading(public_id: str, read: str) -> tuple[float | None, bytes | None]:
    """`member_request_wait` for the member `public_id`, on Redis, and the
    raw value of the Redis key `read` in the same round trip (the bearer
    check's epoch: one round trip for both on every API request)."""
    backend = caches[DEFAULT_CACHE_ALIAS]
    limit = settings.RATE_LIMIT_PER_MINUTE
    if limit <= 0:
        return None, backend._cache.get_client(read, write=True).get(read)
    now = timestamp()
    count, value = _count_on_redis(backend, _slot(f"mem:{public_id}", MEMBER_WINDOW, now), MEMBER_WINDOW * 2,
                                  read)
    return _wait(count, limit, MEMBER_WINDOW, now), value


SIGNIN_WINDOW = 15 * 60
# An account takes this many times SIGNIN_PER_ACCOUNT attempts from all
# addresses together: one address that guesses cannot lock its owner out.
SIGNIN_ACCOUNT_EVERYWHERE = 10


def source(address: str) -> str:
    """Whom a client address's budgets count against (anonymous requests,
    refused credentials, sign-in, long-poll places): the address, or for
    IPv6 its /64 (one host is commonly given a whole /64 to pick from)."""
    try:
        parsed = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address
    if parsed.version == 6 and parsed.ipv4_mapped is None:
        return str(ipaddress.ip_network(f"{parsed}/64", strict=False))
    return address


def _signin_counters(request) -> list[tuple[str, int]]:
    """The sign-in counters a POST to a sign-in view counts against, with
    their limits: its client address's, the account it names from that
    address, and that account from every address."""
    # The name as the sign-in form resolves it (NFKC, as Django's UsernameField), folded: "ａnn" is "ann"'s count.
    account = unicodedata.normalize("NFKC", str(request.POST.get("username", ""))).strip().casefold()[:64]
    address = source(client_address(request))
    return [(f"signin:ip:{address}", settings.SIGNIN_PER_ADDRESS),
            (f"signin:user:{account}:{address}", settings.SIGNIN_PER_ACCOUNT),
            (f"signin:user:{account}", settings.SIGNIN_PER_ACCOUNT * SIGNIN_ACCOUNT_EVERYWHERE)]


def signin_wait(request, now: float) -> float | None:
    """Count a sign-in attempt at `now` against its client address
    (SIGNIN_PER_ADDRESS per 15 minutes), the account it names from that
    address (SIGNIN_PER_ACCOUNT) and that account from every address
    (SIGNIN_ACCOUNT_EVERYWHERE times as many); the seconds to wait when any
    is spent, else None. An address that is spent counts nothing more: its
    refused attempts make no counters (each new name made two, and without
    Redis a flood of names pushed others' counters out of the cache)."""
    (address, address_limit), *accounts = _signin_counters(request)
    if spent := hit(address, limit=address_limit, window=SIGNIN_WINDOW, now=now):
        return spent
    waits = [hit(key, limit=limit, window=SIGNIN_WINDOW, now=now) for key, limit in accounts]
    return max((w for w in waits if w is not None), default=None)


def signin_succeeded(request, now: float) -> None:
    """Give the account back the attempt counted at `now` that signed in:
    an owner who signs in often is not guessing. The address keeps it, or
    signing in to an account of one's own would buy guesses at others'."""
    for key, limit in _signin_counters(request)[1:]:
        if limit > 0:
            give_back(key, window=SIGNIN_WINDOW, now=now)


def throttle_signin(view):
    """A sign-in view (the web app's, the admin's) whose POSTs are counted
    by `signin_wait`: past a limit, 429 with Retry-After, and the password
    is not even checked. One that signs in is given back to its account
    (`signin_succeeded`)."""
    @functools.wraps(view)
    def wrapper(request, *args, **kwargs):
        if request.method != "POST":
            return view(request, *args, **kwargs)
        now = timestamp()
        if wait := signin_wait(request, now):
            error = RateLimited.after(wait, "Too many sign-in attempts. Wait a few minutes, then try again.")
            response = HttpResponse(f"<!doctype html><title>Too many attempts</title><p>{error.message}</p>",
                                    status=429)
            response["Retry-After"] = error.headers["Retry-After"]
            return response
        response = view(request, *args, **kwargs)
        if response.status_code == 302 and request.user.is_authenticated:
            signin_succeeded(request, now)
        return response
    return wrapper
