"""Keyset pagination with opaque cursors for plain lists."""
from __future__ import annotations

from controlplane.api.fields import CursorField, QueryIntegerField, validated
from controlplane.cursors import caller_id, pack_cursor, unpack_cursor
from rest_framework import serializers

MAX_LIMIT = 100
DEFAULT_LIMIT = 50


class PageParams(serializers.Serializer):
    cursor = CursorField(required=False)
    limit = QueryIntegerField(required=False, min_value=1, max_value=MAX_LIMIT, default=DEFAULT_LIMIT)


def paginate(request, queryset, *, stream: str, render=None, render_rows=None, params: dict | None = None) -> dict:
    """One page of `queryset` in pk order: `{"items", "cursor", "has_more"}`,
    each row rendered by `render`, or the page's rows at once by
    `render_rows` (for what one query can look up for all of them).
    `params`: the query, if the view validated it (with a PageParams of its
    own that has its filters too)."""
    if params is None:
        params = validated(PageParams, request.query_params)
    caller = caller_id(request.user)
    after = 0
    if params.get("cursor"):
        (after,) = unpack_cursor(params["cursor"], count=1, caller=caller, stream=stream)
    rows = list(queryset.filter(pk__gt=after).order_by("pk")[: params["limit"] + 1])
    has_more = len(rows) > params["limit"]
    rows = rows[: params["limit"]]
    last = rows[-1].pk if rows else after
    items = render_rows(rows) if render_rows is not None else [render(r) for r in rows]
    return {"items": items, "cursor": pack_cursor((last,), caller=caller, stream=stream),
            "has_more": has_more}
