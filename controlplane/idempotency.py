"""Idempotency-Key for creating POST and PATCH requests.

The key is scoped to the caller and the route (method and path). The first
successful (2xx) response is stored in the same transaction as the change it
describes, so a retry either finds both or neither. The same key with the
same request replays the original status and body; with a different request
it is 409 IDEMPOTENCY_CONFLICT. Failed requests change nothing and are not
stored, so they may be retried with the same key.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import re
from contextlib import nullcontext
from functools import wraps

from django.db import IntegrityError, transaction
from rest_framework.response import Response

from controlplane.clock import now
from controlplane.db import advisory_lock
from controlplane.errors import IdempotencyConflict, InvalidIdempotencyKey
from controlplane.keys import purpose_key
from controlplane.models import IdempotencyRecord

_KEY_RE = re.compile(r"[\x21-\x7e]{8,128}")
RETENTION = dt.timedelta(hours=48)  # the contract promises at least 24 hours


def is_valid_key(key) -> bool:
    """The one rule for an idempotency key, wherever it comes from (header,
    form field, grant body): 8–128 visible ASCII characters."""
    return isinstance(key, str) and _KEY_RE.fullmatch(key) is not None


def idempotency_key(request) -> str | None:
    """The request's Idempotency-Key, None when absent; 400 when malformed."""
    key = request.META.get("HTTP_IDEMPOTENCY_KEY")
    if key is None:
        return None
    if not is_valid_key(key) or _given_twice(request):
        raise InvalidIdempotencyKey()
    return key


def _given_twice(request) -> bool:
    """Whether the header came more than once. Django joins repeated headers
    with a comma, into what passes for one valid key; an ASGI request (what
    `serve` runs) still has them apart in its scope."""
    headers = getattr(request, "scope", {}).get("headers", ())
    return sum(name == b"idempotency-key" for name, _ in headers) > 1


def request_fingerprint(request) -> str:
    """A keyed hash of the canonical body: bodies hold secrets (a receiver's
    `whsec_…`), and a plain hash stored beside the key could be guessed at."""
    canonical = json.dumps(request.data, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hmac.new(purpose_key("idempotency-fingerprint"), canonical.encode(), hashlib.sha256).hexdigest()


def _replay(record: IdempotencyRecord, fingerprint: str) -> Response:
    if record.fingerprint != fingerprint:
        raise IdempotencyConflict()
    return Response(json.loads(record.body), status=record.status_code)


def idempotent(view_method=None, *, secret_fields: tuple[str, ...] = (), atomic: bool = True):
    """Decorate a DRF view method that creates or changes state.

    `secret_fields` of the response body are never stored: a replay answers
    them as null (a token is shown once, and never kept in plain text).

    With `atomic` (the default) the view runs in one transaction, and its
    record is stored in it. A view whose work is several transactions (a
    revocation barrier's batches) or waits on the network (an endpoint's
    challenge) takes `atomic=False`: its record is stored after its work,
    so such a view must be idempotent by nature (a concurrent duplicate
    with the same key may do the work again, and finds it done)."""
    if view_method is None:
        return lambda method: idempotent(method, secret_fields=secret_fields, atomic=atomic)

    @wraps(view_method)
    def wrapper(self, request, *args, **kwargs):
        key = idempotency_key(request)
        if key is None or request.user is None:
            return view_method(self, request, *args, **kwargs)
        scope = f"{request.method} {request.path}"
        fingerprint = request_fingerprint(request)
        lookup = {"owner": request.user, "scope": scope, "key": key}
        record = IdempotencyRecord.objects.filter(**lookup).first()
        if record is not None:
            return _replay(record, fingerprint)
        try:
            with transaction.atomic() if atomic else nullcontext():
                if atomic:
                    # A request with the same key at once waits for this one, then replays it: without a
                    # turn, it ran into what the first had made (a taken slug: 409) and answered that.
                    advisory_lock(f"idempotency {request.user.pk} {scope} {key}")
                    if (record := IdempotencyRecord.objects.filter(**lookup).first()) is not None:
                        return _replay(record, fingerprint)
                response = view_method(self, request, *args, **kwargs)
                if 200 <= response.status_code < 300:
                    stored = {**response.data, **{name: None for name in secret_fields if name in response.data}}
                    IdempotencyRecord.objects.create(**lookup, fingerprint=fingerprint,
                                                     status_code=response.status_code,
                                                     body=json.dumps(stored, ensure_ascii=False))
        except IntegrityError:
            # A concurrent request with the same key committed first.
            record = IdempotencyRecord.objects.filter(**lookup).first()
            if record is None:
                raise
            return _replay(record, fingerprint)
        return response

    return wrapper


def purge_idempotency_records() -> int:
    deleted, _ = IdempotencyRecord.objects.filter(created_at__lt=now() - RETENTION).delete()
    return deleted
