"""`switchboard`: the API from a shell. See docs/client.md.

Exit codes (by error class, see errors.py):
  0 ok                     4 not found (NOT_FOUND, UNKNOWN_*, RESYNC_REQUIRED)
  1 usage or other error   5 conflict (*_CONFLICT, LIMIT_EXCEEDED, MAILBOX_FULL)
  2 bad request (4xx)      6 rate limited (RATE_LIMITED)
  3 auth (401, 403)        7 server or connection (5xx, UNAVAILABLE, no answer)
"""
from __future__ import annotations

import argparse
import getpass
import json
import sys

from switchboard_client import config
from switchboard_client.argv import joined_cursors, next_page_command
from switchboard_client.client import Client
from switchboard_client.errors import ConfigurationError, SwitchboardError
from switchboard_client.models import Page, as_dict

EXIT_OK, EXIT_USAGE = 0, 1


class UsageError(Exception):
    pass


class Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own exit code 2 would read as "bad request"
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


# --- output
def emit(args, result, rows=None, columns=()) -> None:
    """`--json`: the API's JSON; else a table of `rows(result)` under `columns`,
    and for a page with more after it, the command that shows the next."""
    if args.json:
        print(json.dumps(as_dict(result), indent=2, ensure_ascii=False))
    elif rows is None:
        print(result)
    else:
        table(list(rows(result)), columns)
        if isinstance(result, Page) and result.has_more and result.cursor:
            print(f"more: {next_page_command(result.cursor)}", file=sys.stderr)


def table(rows: list[tuple], columns: tuple[str, ...]) -> None:
    if not rows:
        print("(none)")
        return
    cells = [tuple("" if c is None else str(c) for c in row) for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(columns)]
    for row in [columns, *cells]:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())


def short(text, width: int = 60) -> str:
    text = " ".join(str(text or "").split())
    return text if len(text) <= width else text[: width - 1] + "…"


def client_for(args) -> Client:
    base, token = config.resolve(args.host)
    if token is None:
        raise UsageError(f"not logged in to {base}: run `switchboard login --host {base}`")
    return Client(base, token)


# --- commands
def cmd_login(args) -> None:
    host = config.default_host(args.host)
    token = args.token
    if token is None:
        token = getpass.getpass("Token: ") if sys.stdin.isatty() else sys.stdin.readline()
    token = token.strip()
    if not token:
        raise UsageError("no token given (--token, or on stdin)")
    with Client(host, token) as client:
        member = client.me()  # a bad token stops here, and nothing is stored
    path = config.store_token(host, token)
    if args.json:
        print(json.dumps({"host": host, "member": member.raw, "config": str(path)}, indent=2))
    else:
        print(f"Logged in to {host} as {member.handle}; the token is kept in {path}")


def cmd_logout(args) -> None:
    host = config.default_host(args.host)
    print(f"Logged out of {host}" if config.forget_token(host) else f"Not logged in to {host}")


def cmd_whoami(args) -> None:
    with client_for(args) as client:
        member = client.me()
    emit(args, member, lambda m: [(m.handle, m.kind, m.id, "admin" if m.is_admin else "")],
         ("HANDLE", "KIND", "ID", ""))


def conversation_ref(client: Client, space: str, ref: str) -> str:
    """`@handle` opens the direct conversation; `cnv_…` and `#name` as they are; a bare word is a channel."""
    if ref.startswith("@"):
        return client.open_direct(space, ref).id
    return ref if ref.startswith(("cnv_", "#")) else f"#{ref}"


def cmd_send(args) -> None:
    # Bytes that are not UTF-8 go on as the command line's do (surrogates), for the server to refuse (422).
    body = sys.stdin.buffer.read().decode("utf-8", "surrogateescape") if args.body in (None, "-") else args.body
    with client_for(args) as client:
        conversation = conversation_ref(client, args.space, args.conversation)
        message = client.send(args.space, conversation, body, reply_to=args.reply_to,
                              related_paths=args.related_path or None,
                              request_approval=True if args.request_approval else None,
                              idempotency_key=args.idempotency_key)
    emit(args, message, lambda m: [(m.id, m.conversation, m.position, ", ".join(m.mentions or ()))],
         ("MESSAGE", "CONVERSATION", "POSITION", "MENTIONS"))


def _entry_row(entry) -> tuple:
    item = entry.item or {}
    where = item.get("conversation") or item.get("space") or ""
    content = item.get("content") if "content" in item else item.get("reason") or item.get("status") or ""
    return entry.token, item.get("kind"), item.get("sender") or "", where, short(content)


def cmd_inbox(args) -> None:
    with client_for(args) as client:
        page = client.held_items(cursor=args.cursor) if args.held else client.read_inbox(cursor=args.cursor)
    emit(args, page, lambda p: [_entry_row(e) for e in p.items], ("TOKEN", "KIND", "FROM", "WHERE", "CONTENT"))


def cmd_ack(args) -> None:
    done = []
    try:
        with client_for(args) as client:
            for token in args.tokens:
                client.acknowledge(token)
                done.append(token)
                if not args.json:
                    print(f"acknowledged {token}")
    finally:  # with --json, what was acknowledged before a refusal is said too
        if args.json:
            print(json.dumps({"acknowledged": done}))


def _event_line(event) -> str:
    data = event.data or {}
    message = data.get("message") if isinstance(data.get("message"), dict) else None
    detail = short(message.get("body")) if message else short(json.dumps(data, ensure_ascii=False), 80)
    return "  ".join(str(x) for x in (event.position, event.kind, event.space or "-", event.conversation or "-",
                                      event.actor or "-", detail))


FEED_LIMIT = 100  # the most events a feed page holds (SPEC §6)


def cmd_tail(args) -> None:
    if bool(args.space) == bool(args.inbox):
        raise UsageError("tail takes --space SLUG or --inbox")
    with client_for(args) as client:
        # With --count, pages of no more than are left to print: a feed's
        # cursor moves once its page is handed out whole, and one printed
        # mid-page gave back the same events, run after run.
        feed = client.iter_feed(space=args.space, inbox=args.inbox, after=args.after, wait_ms=args.wait_ms,
                                limit=min(args.count, FEED_LIMIT) if args.count else None)
        seen = 0
        try:
            for event in feed:
                print(json.dumps(event.raw, ensure_ascii=False) if args.json else _event_line(event), flush=True)
                seen += 1
                if args.count and seen >= args.count:
                    break
                if args.count:
                    feed.limit = min(args.count - seen, FEED_LIMIT)
        except KeyboardInterrupt:
            pass
        finally:
            # None before the first page came; the one it was given, when it read nothing more (a bad cursor too)
            if feed.cursor not in (None, args.after):
                print(f"cursor: {feed.cursor}", file=sys.stderr, flush=True)  # resume with --after


def cmd_spaces(args) -> None:
    with client_for(args) as client:
        if args.action == "create":
            result = client.create_space(args.slug, args.name, visibility=args.visibility,
                                         send_policy=args.send_policy)
        elif args.action == "join":
            result = client.join_space(args.slug)
            return emit(args, result, lambda m: [(args.slug, m.role, m.status)], ("SPACE", "ROLE", "STATUS"))
        elif args.action == "members":
            result = client.space_members(args.slug, cursor=args.cursor)
            return emit(args, result, lambda p: [(m.member, m.role, m.status) for m in p.items],
                        ("MEMBER", "ROLE", "STATUS"))
        elif args.action == "show":
            result = client.space(args.slug)
        else:
            result = client.my_spaces(cursor=args.cursor)
            return emit(args, result, lambda p: [(s.slug, s.name, s.visibility, s.role, s.status) for s in p.items],
                        ("SLUG", "NAME", "VISIBILITY", "ROLE", "STATUS"))
    emit(args, result, lambda s: [(s.slug, s.name, s.visibility, s.send_policy, s.archived)],
         ("SLUG", "NAME", "VISIBILITY", "SEND POLICY", "ARCHIVED"))


GRANT_COLUMNS = ("ID", "KIND", "SENDER", "RECIPIENT", "STATUS", "GENERATION", "EXPIRES")


def _grant_row(g) -> tuple:
    return g.id, g.kind, g.sender or "*", g.recipient or "*", g.status, g.generation, g.expires_at or ""


def cmd_grants(args) -> None:
    with client_for(args) as client:
        if args.action == "create":
            result = client.create_grant(args.space, args.id, args.kind, sender=args.sender, recipient=args.recipient,
                                         message_key=args.message_key, expires_at=args.expires_at)
        elif args.action == "show":
            result = client.grant(args.id)
        elif args.action == "revoke":
            result = client.revoke_grant(args.id)
        else:
            result = client.grants(args.space, cursor=args.cursor)
            return emit(args, result, lambda p: [_grant_row(g) for g in p.items], GRANT_COLUMNS)
    emit(args, result, lambda g: [_grant_row(g)], GRANT_COLUMNS)


APPROVAL_COLUMNS = ("ID", "STATUS", "SPACE", "SENDER", "RECIPIENTS", "BODY")


def _approval_row(r) -> tuple:
    return r.id, r.status, r.space, r.sender, ", ".join(r.recipients or ()), short(r.body, 40)


def cmd_approvals(args) -> None:
    with client_for(args) as client:
        if args.action == "show":
            result = client.approval_request(args.id)
        elif args.action == "approve":
            result = client.approve(args.id)
        elif args.action == "deny":
            result = client.deny(args.id, args.reason)
        else:
            result = client.approval_requests(status=args.status, cursor=args.cursor)
            return emit(args, result, lambda p: [_approval_row(r) for r in p.items], APPROVAL_COLUMNS)
    emit(args, result, lambda r: [_approval_row(r)], APPROVAL_COLUMNS)


SUBSCRIPTION_COLUMNS = ("ID", "SCOPE", "SPACE", "ENDPOINT", "STATUS", "DEBOUNCE MS")


def _subscription_row(s) -> tuple:
    return s.id, s.scope, s.space or "", s.endpoint_id, s.status, s.debounce_ms


def cmd_webhooks(args) -> None:
    endpoint_columns = ("ID", "URL", "SECRET", "VERIFIED")

    def endpoint_row(e):
        return e.id, e.url, "yes" if e.has_secret else "no", e.verified_at or "no"

    with client_for(args) as client:
        action = args.action or "endpoints"
        if action == "endpoints":
            listed = client.endpoints(cursor=getattr(args, "cursor", None))  # (none without the action's name)
            return emit(args, listed, lambda p: [endpoint_row(e) for e in p.items], endpoint_columns)
        if action == "add":
            return emit(args, client.create_endpoint(args.url, secret=args.secret), lambda e: [endpoint_row(e)],
                        endpoint_columns)
        if action == "verify":
            verified_at = client.verify_endpoint(args.endpoint)
            return print(json.dumps({"verified_at": verified_at}) if args.json else f"verified at {verified_at}")
        if action == "subscriptions":
            page = (client.space_subscriptions(args.space, cursor=args.cursor) if args.space
                    else client.inbox_subscriptions(cursor=args.cursor))
            return emit(args, page, lambda p: [_subscription_row(s) for s in p.items], SUBSCRIPTION_COLUMNS)
        if action == "subscribe":
            if bool(args.space) == bool(args.inbox):
                raise UsageError("subscribe takes --space SLUG or --inbox")
            if args.space:
                created = client.create_space_subscription(args.space, args.endpoint, debounce_ms=args.debounce_ms)
            else:
                created = client.create_inbox_subscription(args.endpoint, debounce_ms=args.debounce_ms)
            try:
                activation = client.activate_subscription(created.id, space=args.space)
            except SwitchboardError:  # an endpoint not verified, say: leave no inactive subscription behind
                client.delete_subscription(created.id, space=args.space)
                raise
            if args.json:
                return print(json.dumps(activation.raw, indent=2))
            table([_subscription_row(activation.subscription)], SUBSCRIPTION_COLUMNS)
            return print(f"activation cursor: {activation.activation_cursor}")
        if action in ("pause", "resume"):
            updated = client.update_subscription(args.subscription, space=args.space,
                                                 status="paused" if action == "pause" else "active")
            return emit(args, updated, lambda s: [_subscription_row(s)], SUBSCRIPTION_COLUMNS)
        if action == "deliveries":
            return emit(args, client.deliveries(args.subscription, cursor=args.cursor), lambda p: [
                (d.id, d.state, len(d.attempts or ()), d.attempts[-1].status_code if d.attempts else "",
                 d.created_at) for d in p.items], ("ID", "STATE", "ATTEMPTS", "LAST STATUS", "CREATED"))
        if action == "replay":
            delivery = client.replay_delivery(args.delivery)
            return emit(args, delivery, lambda d: [(d.id, d.state, d.replay_of)], ("ID", "STATE", "REPLAY OF"))


# --- the parser
def build_parser() -> Parser:
    common = Parser(add_help=False)
    common.add_argument("--host", default=argparse.SUPPRESS,
                        help="the server (default: $SWITCHBOARD_URL, else the last login's, else 127.0.0.1:8000)")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print the API's JSON")
    parser = Parser(prog="switchboard", description="Switchboard from the command line.", parents=[common],
                    epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    def command(name, handler, help_text):
        sub = commands.add_parser(name, parents=[common], help=help_text, description=help_text)
        sub.set_defaults(handler=handler)
        return sub

    login = command("login", cmd_login, "store a token for a host (from --token, else read from stdin)")
    login.add_argument("--token", help="the sbt_… token (prefer stdin: a command line is visible to others)")
    command("logout", cmd_logout, "forget the host's token")
    command("whoami", cmd_whoami, "who the stored token is")

    send = command("send", cmd_send, "send a message")
    send.add_argument("space")
    send.add_argument("conversation", help="cnv_… id, #channel (or a bare channel name), or @handle (direct)")
    send.add_argument("body", nargs="?", help="the text; - or nothing reads stdin")
    send.add_argument("--reply-to")
    send.add_argument("--related-path", action="append")
    send.add_argument("--request-approval", action="store_true", help="ask an admin when a grant is missing")
    send.add_argument("--idempotency-key", help="reuse to retry a send safely (default: a fresh key)")

    inbox = command("inbox", cmd_inbox, "pending inbox items")
    inbox.add_argument("--cursor")
    inbox.add_argument("--held", action="store_true", help="items the firewall holds instead")

    ack = command("ack", cmd_ack, "acknowledge inbox items by delivery token")
    ack.add_argument("tokens", nargs="+", metavar="TOKEN")

    tail = command("tail", cmd_tail, "follow a space's feed or your inbox feed (long-polling)")
    tail.add_argument("--space")
    tail.add_argument("--inbox", action="store_true")
    tail.add_argument("--after", help="the cursor to start after (default: the oldest retained event)")
    tail.add_argument("--count", type=int, help="stop after this many events")
    tail.add_argument("--wait-ms", type=int, default=30_000)

    spaces = command("spaces", cmd_spaces, "your spaces (and: create, join, show, members)")
    spaces.add_argument("--cursor")
    actions = spaces.add_subparsers(dest="action", parser_class=Parser)
    create = actions.add_parser("create", parents=[common])
    create.add_argument("slug")
    create.add_argument("name")
    create.add_argument("--visibility", choices=["open", "request", "private"])
    create.add_argument("--send-policy", choices=["open", "explicit_only"])
    for name in ("join", "show"):
        actions.add_parser(name, parents=[common]).add_argument("slug")
    members = actions.add_parser("members", parents=[common])
    members.add_argument("slug")
    members.add_argument("--cursor")

    grants = command("grants", cmd_grants, "grants of a space (and: create, show, revoke)")
    actions = grants.add_subparsers(dest="action", parser_class=Parser, required=True)
    listing = actions.add_parser("list", parents=[common])
    listing.add_argument("space")
    listing.add_argument("--cursor")
    create = actions.add_parser("create", parents=[common])
    create.add_argument("space")
    create.add_argument("id", help="grt_… (chosen by you)")
    create.add_argument("--kind", required=True, choices=["project", "pair", "one_message"])
    create.add_argument("--sender")
    create.add_argument("--recipient")
    create.add_argument("--message-key", help="a one-message grant's Idempotency-Key")
    create.add_argument("--expires-at")
    for name in ("show", "revoke"):
        actions.add_parser(name, parents=[common]).add_argument("id")

    approvals = command("approvals", cmd_approvals, "approval requests (and: show, approve, deny)")
    approvals.add_argument("--status", choices=["pending", "approved", "denied"])
    approvals.add_argument("--cursor")
    actions = approvals.add_subparsers(dest="action", parser_class=Parser)
    for name in ("show", "approve"):
        actions.add_parser(name, parents=[common]).add_argument("id")
    deny = actions.add_parser("deny", parents=[common])
    deny.add_argument("id")
    deny.add_argument("--reason", required=True)

    webhooks = command("webhooks", cmd_webhooks, "endpoints, subscriptions, deliveries")
    actions = webhooks.add_subparsers(dest="action", parser_class=Parser)
    actions.add_parser("endpoints", parents=[common], help="your endpoints").add_argument("--cursor")
    add = actions.add_parser("add", parents=[common], help="register an endpoint")
    add.add_argument("url")
    add.add_argument("--secret", help="a whsec_… Standard Webhooks secret")
    actions.add_parser("verify", parents=[common], help="send the signed challenge").add_argument("endpoint")
    subs = actions.add_parser("subscriptions", parents=[common], help="your inbox (or a space's) subscriptions")
    subs.add_argument("--space")
    subs.add_argument("--cursor")
    subscribe = actions.add_parser("subscribe", parents=[common], help="create and activate a subscription")
    subscribe.add_argument("--endpoint", required=True)
    subscribe.add_argument("--space")
    subscribe.add_argument("--inbox", action="store_true")
    subscribe.add_argument("--debounce-ms", type=int)
    for name in ("pause", "resume"):
        sub = actions.add_parser(name, parents=[common])
        sub.add_argument("subscription")
        sub.add_argument("--space", help="for a space subscription")
    deliveries = actions.add_parser("deliveries", parents=[common])
    deliveries.add_argument("subscription")
    deliveries.add_argument("--cursor")
    actions.add_parser("replay", parents=[common]).add_argument("delivery")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(joined_cursors(sys.argv[1:] if argv is None else argv))
    args.host = getattr(args, "host", None)
    args.json = getattr(args, "json", False)
    try:
        args.handler(args)
    except SwitchboardError as error:
        if args.json:
            print(json.dumps({"error": {"status": error.status, "code": error.code, "message": error.message,
                                        "details": error.details, "retry_after": error.retry_after}}),
                  file=sys.stderr)
        else:
            extra = f" {json.dumps(error.details)}" if error.details else ""
            retry = f" (retry after {error.retry_after:g} s)" if error.retry_after else ""
            print(f"switchboard: {error}{retry}{extra}", file=sys.stderr)
        return error.exit_code
    except (UsageError, ConfigurationError) as error:
        print(f"switchboard: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
