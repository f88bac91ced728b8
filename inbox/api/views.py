"""Messages, feeds and snapshots."""
from __future__ import annotations


from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.access import get_readable_space
from controlplane.api.fields import validated
from controlplane.api.permissions import ReadableAnonymously
from controlplane.api.schema import (
    CURSOR, IDEMPOTENCY_KEY, LIMIT, MAX_BYTES, SNAPSHOT_PAGE, WAIT_MS, errors, extend_schema,
)
from controlplane import faults
from controlplane.api.serializers import EmptyIn, envelope
from controlplane.cursors import caller_id, pack_cursor, unpack_cursor
from controlplane.errors import NotFound
from controlplane.idempotency import idempotency_key, idempotent
from inbox import collectives, feeds, reads, services
from inbox.api.longpoll import wants_wakes
from inbox.api.serializers import (AnswerIn, AnswerOut, AnswersOut, BodyPageOut, BodyParams, FeedPageOut, FeedParams,
                                   MessageOut, MessageStatusOut, ResolveIn, SendMessageIn, SnapshotOut, SnapshotParams)
from inbox.models import Message
from inbox.render import render_events, render_message_status, render_sent



def visible_message(request, message_id: str) -> Message:
    message = (Message.objects.visible_to(request.user).select_related("space", "conversation", "author", "reply_to")
               .filter(public_id=message_id).first())
    if message is None:
        raise NotFound()
    return message


class SendMessageView(APIView):
    @extend_schema(operation_id="send_message", request=SendMessageIn, parameters=[IDEMPOTENCY_KEY],
                   responses={201: envelope("message", MessageOut), 200: envelope("message", MessageOut),
                              **errors("INVALID_REQUEST", "INVALID_IDEMPOTENCY_KEY", "FORBIDDEN", "GRANT_REQUIRED",
                                       "NOT_FOUND", "IDEMPOTENCY_CONFLICT", "CONFLICT", "BODY_TOO_LARGE",
                                       "INVALID_BODY", "MAILBOX_FULL", "LIMIT_EXCEEDED")})
    def post(self, request, slug, conversation):
        key = idempotency_key(request)  # first, as on every write route
        data = validated(SendMessageIn, request.data)
        result = services.send_to(slug, conversation, body=data["body"], reply_to=data.get("reply_to"),
                                  related_paths=data.get("related_paths"), idempotency_key=key,
                                  request_approval=data["request_approval"], collective=data.get("collective"),
                                  actor=request.user)
        faults.point("send.committed")
        return Response({"message": render_sent(result.message, result.created)},
                        status=201 if result.created else 200)


class MessageView(APIView):
    @extend_schema(operation_id="get_message", responses={200: envelope("message", MessageStatusOut),
                                                          **errors("NOT_FOUND")})
    def get(self, request, message_id):
        message = visible_message(request, message_id)
        collectives.touch(message)  # a deadline passed: finished on read too
        return Response({"message": render_message_status(message)})


class AnswerView(APIView):
    @extend_schema(operation_id="answer_collective", request=AnswerIn, parameters=[IDEMPOTENCY_KEY],
                   responses={201: envelope("answer", AnswerOut), 200: envelope("answer", AnswerOut),
                              **errors("INVALID_REQUEST", "FORBIDDEN", "GRANT_REQUIRED", "NOT_FOUND", "CONFLICT",
                                       "BODY_TOO_LARGE", "INVALID_BODY", "INVALID_IDEMPOTENCY_KEY",
                                       "IDEMPOTENCY_CONFLICT")})
    # An answer that finds its operation unable to complete fails it, commits
    # that, then answers 409: in the view's own transaction the 409 would undo
    # the failure. Answers are idempotent by content, so the record can follow.
    @idempotent(atomic=False)
    def post(self, request, message_id):
        data = validated(AnswerIn, request.data)
        answered, created = reads.answer(request.user, message_id, data["body"], idempotency_key(request))
        return Response(answered, status=201 if created else 200)


class AnswersView(APIView):
    @extend_schema(operation_id="read_collective_answers",
                   responses={200: AnswersOut, **errors("INVALID_REQUEST", "FORBIDDEN", "NOT_FOUND", "CONFLICT")})
    def get(self, request, message_id):
        return Response(reads.answers(request.user, message_id))


class MessageBodyView(APIView):
    @extend_schema(operation_id="get_message_body",
                   parameters=[CURSOR, MAX_BYTES],
                   responses={200: BodyPageOut, **errors("INVALID_REQUEST", "INVALID_CURSOR", "NOT_FOUND",
                                                         "AUTHORITY_REVOKED")})
    def get(self, request, message_id):
        params = validated(BodyParams, request.query_params)
        message = visible_message(request, message_id)
        services.require_active_authority(message)
        stream, caller = f"body:{message.public_id}", caller_id(request.user)
        offset = 0
        if params.get("cursor"):
            (offset,) = unpack_cursor(params["cursor"], count=1, caller=caller, stream=stream)
        chunk, next_offset = services.body_page(message.body, offset, params["max_bytes"])
        return Response({
            "body": chunk, "total_bytes": message.body_bytes,
            "cursor": pack_cursor((next_offset,), caller=caller, stream=stream) if next_offset is not None else None,
            "has_more": next_offset is not None,
        })


HANDLING_ERRORS = errors("INVALID_REQUEST", "INVALID_IDEMPOTENCY_KEY", "FORBIDDEN", "AUTHORITY_REVOKED",
                         "NOT_FOUND", "IDEMPOTENCY_CONFLICT")


class AcknowledgeView(APIView):
    @extend_schema(operation_id="acknowledge_message", request=EmptyIn, parameters=[IDEMPOTENCY_KEY],
                   responses={200: envelope("message", MessageStatusOut), **HANDLING_ERRORS})
    @idempotent
    def post(self, request, message_id):
        validated(EmptyIn, request.data)
        message = visible_message(request, message_id)
        services.acknowledge_message(message, actor=request.user)
        return Response({"message": render_message_status(message)})


class ResolveView(APIView):
    @extend_schema(operation_id="resolve_message", request=ResolveIn, parameters=[IDEMPOTENCY_KEY],
                   responses={200: envelope("message", MessageStatusOut),
                              **errors("INVALID_REQUEST", "INVALID_IDEMPOTENCY_KEY", "FORBIDDEN",
                                       "AUTHORITY_REVOKED", "NOT_FOUND", "IDEMPOTENCY_CONFLICT", "CONFLICT",
                                       "INVALID_BODY")})
    @idempotent
    def post(self, request, message_id):
        data = validated(ResolveIn, request.data)
        message = visible_message(request, message_id)
        services.resolve_message(message, data["result"], actor=request.user)
        return Response({"message": render_message_status(message)})


def _feed_response(request, page: feeds.FeedPage, stream: str) -> Response:
    events, position, has_more = feeds.within_bytes(render_events(page.events), page)
    return Response({
        "events": events,
        "cursor": pack_cursor((position,), caller=caller_id(request.user), stream=stream),
        "has_more": has_more,
    })


def _feed_params(request, stream: str) -> tuple[int | None, int]:
    params = validated(FeedParams, request.query_params)
    after = None
    if params.get("cursor"):
        (after,) = unpack_cursor(params["cursor"], count=1, caller=caller_id(request.user), stream=stream)
    return after, params["limit"]


FEED_ERRORS = ("INVALID_REQUEST", "INVALID_CURSOR", "RESYNC_REQUIRED")


class SpaceEventsView(APIView):
    permission_classes = [ReadableAnonymously]

    @extend_schema(operation_id="space_events", parameters=[CURSOR, LIMIT, WAIT_MS],
                   responses={200: FeedPageOut, **errors(*FEED_ERRORS, "NOT_FOUND")})
    def get(self, request, slug):
        space = get_readable_space(slug, request.user)
        stream = f"space:{space.public_id}"
        after, limit = _feed_params(request, stream)
        wants_wakes(request, events_in={space.pk})
        return _feed_response(request, feeds.space_feed(space, request.user, after, limit), stream)


class InboxEventsView(APIView):
    @extend_schema(operation_id="inbox_events", parameters=[CURSOR, LIMIT, WAIT_MS],
                   responses={200: FeedPageOut, **errors(*FEED_ERRORS)})
    def get(self, request):
        after, limit = _feed_params(request, "inbox")
        wants_wakes(request, addressed={request.user.pk})
        return _feed_response(request, feeds.inbox_feed(request.user, after, limit), "inbox")


class SnapshotView(APIView):
    @extend_schema(operation_id="get_snapshot", parameters=[SNAPSHOT_PAGE], responses={200: SnapshotOut,
                                                           **errors("INVALID_REQUEST", "INVALID_CURSOR",
                                                                    "RESYNC_REQUIRED")})
    def get(self, request):
        params = validated(SnapshotParams, request.query_params)
        return Response(reads.snapshot(request.user, params.get("page")))
