"""The fault matrix (`make chaos`): the scale-out topology under load while
faults are injected, then a count, from the database and the receivers'
logs, of what was lost, duplicated, stuck or out of order.

Topology (all on loopback, in a scratch directory): a PostgreSQL cluster and
a Redis of its own (so they can be crash-restarted without touching anything
else on the machine), two `serve` nodes behind a round-robin proxy, two
worker processes, and one HTTPS receiver (bench/chaos_receiver.py) with ok,
slow, flaky (500), throttling (429 + Retry-After), timing-out and gone (410)
paths. A supervisor restarts whatever dies.

Load: senders with idempotency keys (direct messages and channel posts;
a retry after any failure reuses the key), inbox readers that acknowledge,
space and inbox webhook subscriptions on every receiver path, MCP push
subscriptions (a 2xx acknowledges), a granted sender whose grant is revoked
again and again (the revocation barrier), and live sockets on each node.

Faults, in a cycle: SIGKILL of a node (at a random moment, and right after a
send committed), of a worker (at a random moment, after its receivers
answered and before it recorded, and inside the record transaction), of the
timer, and of the node running a revocation barrier between its steps;
PostgreSQL crash-restarted; Redis killed and started empty; a worker's
clock jumped past leases and expiries and back. Processes die at exact
points through controlplane.faults, armed per process.

    python -m bench.chaos [--sends 10000] [--faults 30] [--out DIR]

Exit status 1 if any count in the table is not zero.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import random
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from controlplane.cluster import Child, Proxy, Supervisor, free_port, node_command, worker_command  # noqa: E402

PY = sys.executable
PASSWORD = "chaos-watcher-password-0123456789"
CSRF_FIELD = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')
SENDERS = 6
RECIPIENTS = 7        # r0–r2 read and acknowledge, r3–r4 take pushes, r5–r6 are never read
READERS = ("r0", "r1", "r2", "rg")
PUSHED = {"r3": "ok", "r4": "sometimes"}
UNREAD = ("r5", "r6")
SPACE_PATHS = ("ok", "slow", "flaky", "throttle", "timeout", "gone")
INBOX_PATHS = {"r0": "ok", "r1": "flaky", "r2": "throttle", "r5": "timeout", "r6": "ok"}
CONCURRENCY = 16
GRANT_SENDS = 5       # messages under each grant before it is revoked
LEASE_SECONDS = 20    # webhook claim leases (longer than any request); short, so a killed claim returns soon
CLOCK_JUMP_SECONDS = 25 * 3600  # past every lease: webhook claims (seconds), MCP subscriptions (24 h)
SETTLE_TIMEOUT = 420.0
FAULTS = ("node", "clock", "worker", "send.committed", "webhooks.answered", "webhooks.record", "webhooks.timer",
          "barrier.step", "postgres", "redis")


# ---------------------------------------------------------------- services

def _pg_bin(name: str) -> str:
    found = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))
    return str(found[-1]) if found else name


class Postgres:
    """A throwaway PostgreSQL cluster; `restart` is a crash (immediate stop)."""

    def __init__(self, work: Path):
        self.dir, self.port = work / "pg", free_port()
        self.as_owner = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def _run(self, *argv: str) -> None:
        subprocess.run([*self.as_owner, *argv], check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c max_connections=300"
        self._run(_pg_bin("pg_ctl"), "-D", str(self.dir / "data"), "-o", options, "-l", str(self.dir / "log"),
                  "-w", "-t", "60", "start")

    def init(self) -> str:
        self.dir.mkdir()
        if self.as_owner:
            shutil.chown(self.dir, "postgres")
        self._run(_pg_bin("initdb"), "-D", str(self.dir / "data"), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        self.start()
        self._run(_pg_bin("createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "chaos")
        return f"postgres://postgres@127.0.0.1:{self.port}/chaos"

    def crash_restart(self) -> None:
        self._run(_pg_bin("pg_ctl"), "-D", str(self.dir / "data"), "-m", "immediate", "-w", "stop")
        self.start()

    def stop(self) -> None:
        subprocess.run([*self.as_owner, _pg_bin("pg_ctl"), "-D", str(self.dir / "data"), "-m", "immediate",
                        "-w", "stop"], capture_output=True, timeout=60)


# ---------------------------------------------------------------- bookkeeping

@dataclass
class Book:
    """What the clients saw; compared with the database at the end."""

    accepted: dict[str, str] = field(default_factory=dict)        # idempotency key -> message id
    targets: dict[str, tuple[str, str]] = field(default_factory=dict)  # key -> (sender, conversation)
    refused: Counter = field(default_factory=Counter)  # 4xx that a correct send never gets
    retries: int = 0
    acked: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))  # member -> tokens
    withdrawn: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))  # 404: a barrier took it
    frames: dict[str, list[tuple[int, str]]] = field(default_factory=lambda: defaultdict(list))  # socket -> frames
    reconnects: int = 0
    faults: Counter = field(default_factory=Counter)
    faults_missed: Counter = field(default_factory=Counter)
    grants: list[str] = field(default_factory=list)
    operations: Counter = field(default_factory=Counter)


class Api:
    def __init__(self, session: aiohttp.ClientSession, base: str, book: Book):
        self.session, self.base, self.book = session, base, book

    async def call(self, token: str, method: str, path: str, body: dict | None = None, *, key: str | None = None,
                   retry: bool = True, ok: tuple[int, ...] = (200, 201)) -> tuple[int, dict]:
        """The call, retried after connection errors, 5xx and 429 (same key) until it is answered otherwise."""
        headers = {"Authorization": f"Bearer {token}"}
        if key:
            headers["Idempotency-Key"] = key
        while True:
            try:
                async with self.session.request(method, self.base + path, json=body, headers=headers) as response:
                    data = await response.json(content_type=None)
                    if response.status in ok or not retry or (response.status < 500 and response.status != 429):
                        return response.status, data or {}
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
                pass
            self.book.retries += 1
            await asyncio.sleep(0.2)


# ---------------------------------------------------------------- setup (in this process, through Django)

def boot(env: dict[str, str]) -> None:
    os.environ.update(env)
    os.environ["DJANGO_SETTINGS_MODULE"] = "controlplane.settings"
    import django

    django.setup()
    from django.db import connections

    # This process outlives database restarts too: check a pooled connection before use.
    connections["default"].settings_dict["CONN_HEALTH_CHECKS"] = True


def members() -> dict[str, tuple[object, str]]:
    from controlplane import services

    made = {}
    names = ["owner", "g", "rg", *(f"s{i}" for i in range(SENDERS)), *(f"r{i}" for i in range(RECIPIENTS))]
    for name in names:
        member = services.create_member(f"chaos-{name}", actor=None)
        made[name] = (member, services.issue_credential(member, actor=None)[1])
    watcher = services.create_member("chaos-watcher", kind="human", password=PASSWORD, actor=None)
    made["watcher"] = (watcher, services.issue_credential(watcher, actor=None)[1])
    return made


def subscribe_webhooks(people: dict, receiver: str) -> None:
    from controlplane.models import Space
    from webhooks import mcp, services

    def endpoint(owner, path):
        ep = services.create_endpoint(owner, f"{receiver}/hook/{path}", None, actor=owner)
        services.verify_endpoint(ep)
        return ep

    owner = people["owner"][0]
    space = Space.objects.get(slug="chaos")
    for path in SPACE_PATHS:
        services.create_subscription(owner, endpoint(owner, f"{path}/space").public_id, space=space,
                                     debounce_ms=0, activate=True)
    for who, path in INBOX_PATHS.items():
        member = people[who][0]
        services.create_subscription(member, endpoint(member, f"{path}/inbox-{who}").public_id, debounce_ms=0,
                                     activate=True)
    for who, path in PUSHED.items():
        secret = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
        mcp.subscribe(people[who][0], mcp.ITEM, {}, f"{receiver}/hook/{path}/mcp-{who}", secret, ttl_ms=None)


async def spaces(api: Api, people: dict) -> dict[str, str]:
    """Spaces, the channel and the direct conversations; label -> conversation id."""
    token = {name: t for name, (_, t) in people.items()}
    conversations = {}
    await api.call(token["owner"], "POST", "/v0/spaces", {"slug": "chaos", "name": "chaos", "visibility": "open",
                                                          "send_policy": "open"})
    for name in token:
        if name not in ("owner", "g", "rg"):
            await api.call(token[name], "POST", "/v0/spaces/chaos/join")
    _, data = await api.call(token["owner"], "POST", "/v0/spaces/chaos/channels", {"name": "general"})
    conversations["#general"] = data["conversation"]["id"]
    for s in range(SENDERS):
        for r in range(RECIPIENTS):
            _, data = await api.call(token[f"s{s}"], "POST", "/v0/spaces/chaos/direct",
                                     {"member": f"@chaos-r{r}"})
            conversations[f"s{s}>r{r}"] = data["conversation"]["id"]
    await api.call(token["owner"], "POST", "/v0/spaces", {"slug": "guarded", "name": "guarded",
                                                          "visibility": "open", "send_policy": "explicit_only"})
    for name in ("g", "rg"):
        await api.call(token[name], "POST", "/v0/spaces/guarded/join")
    _, data = await api.call(token["g"], "POST", "/v0/spaces/guarded/direct", {"member": "@chaos-rg"})
    conversations["g>rg"] = data["conversation"]["id"]
    return conversations


# ---------------------------------------------------------------- load

async def sender(api: Api, people: dict, conversations: dict, counter, total: int) -> None:
    book = api.book
    while (n := next(counter)) < total:
        s, r = random.randrange(SENDERS), random.randrange(RECIPIENTS)
        label = "#general" if random.random() < 0.3 else f"s{s}>r{r}"
        key = f"chaos-{n:06d}"
        book.targets[key] = (f"s{s}", label)
        path = f"/v0/spaces/chaos/conversations/{conversations[label]}/messages"
        status, data = await api.call(people[f"s{s}"][1], "POST", path, {"body": f"chaos {key}"}, key=key)
        if status in (200, 201):
            book.accepted[key] = data["message"]["id"]
        else:
            book.refused[f"send {status} {data.get('error', {}).get('code')}"] += 1


async def granted(api: Api, people: dict, conversations: dict, stop: asyncio.Event) -> None:
    """Grant g → rg, send under it, revoke; again and again."""
    book, owner, g = api.book, people["owner"][1], people["g"][1]
    path = f"/v0/spaces/guarded/conversations/{conversations['g>rg']}/messages"
    n = 0
    while not stop.is_set():
        grant = f"grt_chaos{n}"
        status, data = await api.call(owner, "POST", "/v0/spaces/guarded/grants",
                                      {"id": grant, "kind": "pair", "sender": "@chaos-g", "recipient": "@chaos-rg"})
        if status not in (200, 201):
            book.refused[f"grant {status}"] += 1
            return
        book.grants.append(grant)
        for i in range(GRANT_SENDS):
            key = f"chaos-g{n:04d}-{i}"
            book.targets[key] = ("g", "g>rg")
            status, data = await api.call(g, "POST", path, {"body": f"chaos {key}"}, key=key)
            if status in (200, 201):
                book.accepted[key] = data["message"]["id"]
            else:
                book.refused[f"granted send {status}"] += 1
        status, _ = await api.call(owner, "POST", f"/v0/grants/{grant}/revoke")
        if status != 200:
            book.refused[f"revoke {status}"] += 1
        book.operations["revocations"] += 1
        n += 1
        await asyncio.sleep(0.3)


async def reader(api: Api, who: str, token: str, stop: asyncio.Event) -> None:
    """Read the inbox from the start, acknowledge every item; until stopped and empty."""
    while True:
        cursor, seen = None, 0
        while True:
            status, page = await api.call(token, "GET", "/v0/me/inbox" + (f"?cursor={cursor}" if cursor else ""))
            if status != 200:
                api.book.refused[f"read {status}"] += 1
                break
            for item in page["items"]:
                status, _ = await api.call(token, "POST", "/v0/me/inbox/acknowledge",
                                           {"deliveryToken": item["deliveryToken"]})
                if status == 200:
                    api.book.acked[who].add(item["deliveryToken"])
                    api.book.operations["acknowledgements"] += 1
                elif status == 404 and who == "rg":  # withdrawn by a revocation barrier since the read
                    api.book.withdrawn[who].add(item["deliveryToken"])
                else:
                    api.book.refused[f"ack {status}"] += 1
            seen += len(page["items"])
            cursor = page.get("nextCursor")
            if not cursor:
                break
        if stop.is_set() and not seen:
            return
        await asyncio.sleep(0.2 if not seen else 0)


async def sign_in(base: str) -> str:
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        async with http.get(f"{base}/app/login/") as response:
            form = CSRF_FIELD.search(await response.text()).group(1)
        async with http.post(f"{base}/app/login/", allow_redirects=False, headers={"Referer": f"{base}/app/login/"},
                             data={"username": "chaos-watcher", "password": PASSWORD,
                                   "csrfmiddlewaretoken": form}) as response:
            assert response.status == 302, f"sign-in: {response.status}"
            return response.cookies["sessionid"].value


async def socket(name: str, base: str, session_id: str, conversation: str, book: Book, stop: asyncio.Event) -> None:
    """A live page on one node: reconnects from its last frame until stopped."""
    frames = book.frames[name]
    async with aiohttp.ClientSession() as http:
        while not stop.is_set():
            after = frames[-1][0] if frames else 0
            try:
                async with http.ws_connect(f"{base.replace('http', 'ws')}/ws/conversations/{conversation}/"
                                           f"?after={after}", headers={"Cookie": f"sessionid={session_id}"},
                                           heartbeat=10) as ws:
                    async for frame in ws:
                        if stop.is_set():
                            break
                        data = json.loads(frame.data)
                        if data["type"] == "message":
                            frames.append((data["position"], data["id"]))
                        elif data["type"] == "resync":
                            book.refused["socket resync"] += 1
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                pass
            if not stop.is_set():
                book.reconnects += 1
                await asyncio.sleep(0.3)


# ---------------------------------------------------------------- faults

class Faults:
    def __init__(self, nodes: list[Child], workers: list[Child], pg: Postgres, redis: Child, book: Book):
        self.nodes, self.workers = nodes, workers
        self.pg, self.redis, self.book = pg, redis, book

    @staticmethod
    def directory(child: Child) -> Path:
        return Path(child.env["SWITCHBOARD_FAULTS"])

    async def arm(self, point: str, candidates: list[Child], wait: float = 15.0) -> bool:
        """Arm `point` in every candidate; the first to reach it dies, the others are disarmed."""
        files = [self.directory(c) / point for c in candidates]
        for f in files:
            f.touch()
        deadline = time.monotonic() + wait
        try:
            while time.monotonic() < deadline:
                if any(not f.exists() for f in files):
                    return True
                await asyncio.sleep(0.05)
            return False
        finally:
            for f in files:
                f.unlink(missing_ok=True)

    async def inject(self, kind: str) -> bool:
        if kind == "node":
            random.choice(self.nodes).kill()
        elif kind == "worker":
            random.choice(self.workers).kill()
        elif kind in ("send.committed", "barrier.step"):
            return await self.arm(kind, self.nodes)
        elif kind in ("webhooks.answered", "webhooks.record", "webhooks.timer"):
            return await self.arm(kind, self.workers)
        elif kind == "postgres":
            await asyncio.to_thread(self.pg.crash_restart)
        elif kind == "redis":
            self.redis.kill()  # the supervisor starts it again, empty
        elif kind == "clock":
            # A worker's clock jumps a day ahead, it claims and leases by it,
            # and dies holding claims; restarted, its clock is right.
            worker = random.choice(self.workers)
            skew = self.directory(worker) / "clock-skew"
            skew.write_text(str(CLOCK_JUMP_SECONDS))
            try:
                return await self.arm("webhooks.answered", [worker])
            finally:
                skew.unlink()
        return True

    async def run(self, count: int, interval: float, stop: asyncio.Event) -> None:
        """Inject `count` faults, cycling through the kinds; one armed and not
        reached is not counted and is tried again later in the cycle."""
        schedule = [FAULTS[i % len(FAULTS)] for i in range(count)]
        tries = 0
        while schedule and not stop.is_set() and tries < 2 * count:
            kind = schedule.pop(0)
            tries += 1
            await asyncio.sleep(interval * random.uniform(0.5, 1.5))
            hit = await self.inject(kind)
            (self.book.faults if hit else self.book.faults_missed)[kind] += 1
            if not hit:
                schedule.append(kind)
            print(f"  fault: {kind}{'' if hit else ' (armed, not reached: tried again later)'}", flush=True)


async def supervise(supervisor: Supervisor, stop: asyncio.Event) -> None:
    while not stop.is_set():
        for child in supervisor.tick():
            print(f"  restarted {child.name}", flush=True)
        await asyncio.sleep(0.1)


# ---------------------------------------------------------------- the checks

def settled(people: dict) -> tuple[bool, str]:
    """Nothing left to send: every delivery of an active subscription finished
    and covering its head, pushed inboxes drained, no barrier unfinished."""
    from django.db import connections

    from grants.models import Grant
    from inbox.models import InboxItem
    from webhooks.models import Delivery, Subscription

    connections.close_all()
    open_ = Delivery.objects.filter(state__in=["open", "pending", "sending"],
                                    subscription__status=Subscription.Status.ACTIVE).count()
    if open_:
        return False, f"{open_} deliveries unfinished"
    pushed = InboxItem.objects.filter(member__in=[people[w][0] for w in PUSHED], state="pending").count()
    if pushed:
        return False, f"{pushed} pushed items pending"
    if Grant.objects.filter(status=Grant.Status.REVOKING).exists():
        return False, "a barrier unfinished"
    return True, ""


def behind(heads: dict[str, int]) -> list[str]:
    """Active subscriptions whose last wake ends before the last event their
    owner's feed shows (`heads`: subscription id -> that position)."""
    from django.db import connections
    from django.db.models import Max

    from webhooks.models import Subscription

    connections.close_all()
    late = []
    for subscription in Subscription.objects.filter(status="active", public_id__in=list(heads)).annotate(
            through=Max("deliveries__through_position")):
        if heads[subscription.public_id] > max(subscription.through or 0, subscription.activation_position or 0):
            late.append(subscription.public_id)
    return late


async def feed_heads(api: Api, people: dict) -> dict[str, int]:
    """The last position each wake subscription's owner reads in the feed it
    wakes for: the independent oracle of what its wakes must cover."""
    from webhooks.models import Subscription

    rows = await asyncio.to_thread(lambda: list(Subscription.objects.exclude(kind="item").values_list(
        "public_id", "kind", "owner__handle")))
    tokens = {member.handle: token for member, token in people.values()}
    heads = {}
    for public_id, kind, handle in rows:
        path = "/v0/spaces/chaos/events" if kind == "space" else "/v0/me/inbox/events"
        cursor, head = None, 0
        while True:
            status, page = await api.call(tokens[handle], "GET", f"{path}?limit=100"
                                          + (f"&cursor={cursor}" if cursor else ""))
            head = max([head, *(e["position"] for e in page.get("events", []))])
            cursor = page.get("cursor")
            if not page.get("has_more"):
                break
        heads[public_id] = head
    return heads


def check(book: Book, people: dict, conversations: dict, receiver_log: Path,
          heads: dict[str, int]) -> dict[str, Counter]:
    from django.db import connections
    from django.db.models import Sum

    from grants.models import Grant
    from inbox.models import InboxItem, Mailbox, Message
    from webhooks.models import Delivery, Subscription

    connections.close_all()
    lost, duplicated, stuck, disorder = Counter(), Counter(), Counter(), Counter()

    # Sends: each key stored once, as the message its client was given.
    stored = defaultdict(list)
    for key, public_id in Message.objects.filter(idempotency_key__startswith="chaos-").values_list(
            "idempotency_key", "public_id"):
        stored[key].append(public_id)
    for key, public_id in book.accepted.items():
        if not stored.get(key):
            lost["sends"] += 1
        elif stored[key] != [public_id]:
            duplicated["sends"] += 1
    duplicated["sends"] += sum(len(ids) - 1 for key, ids in stored.items() if len(ids) > 1 and key in book.accepted)
    lost["sends (never accepted)"] += len(set(book.targets) - set(book.accepted))

    # Inboxes: each accepted direct message is exactly one item of its
    # recipient, in conversation order; acknowledged what was acknowledged.
    messages = {m.public_id: m for m in Message.objects.filter(public_id__in=book.accepted.values())}
    items = defaultdict(list)
    for item in InboxItem.objects.filter(message__public_id__in=list(messages)).select_related("message").order_by("pk"):
        items[item.message.public_id].append(item)
    for key, public_id in book.accepted.items():
        label = book.targets[key][1]
        if label == "#general":
            continue
        found = items.get(public_id, [])
        if not found:
            lost["inbox items"] += 1
        elif len(found) > 1:
            duplicated["inbox items"] += len(found) - 1
    by_member = defaultdict(list)
    for found in items.values():
        for item in found:
            by_member[item.member_id].append(item)
    for member_items in by_member.values():
        last = {}
        for item in sorted(member_items, key=lambda i: i.pk):
            if item.message.position < last.get(item.conversation_id, -1):
                disorder["inbox items"] += 1
            last[item.conversation_id] = item.message.position
    tokens = {t: s for t, s in InboxItem.objects.filter(member__in=[p[0] for p in people.values()])
              .values_list("token", "state")}
    for who, acked in book.acked.items():
        lost["acknowledgements"] += sum(tokens.get(t) != "acknowledged" for t in acked)
    for who, withdrawn in book.withdrawn.items():  # a 404 only for what a barrier rejected
        lost["acknowledgements"] += sum(tokens.get(t) != "rejected" for t in withdrawn)
    read = {people[w][0].pk for w in (*READERS, *PUSHED)}
    for who in UNREAD:
        member = people[who][0]
        lost["pending items"] += InboxItem.objects.filter(member=member).exclude(state="pending").count()
    pending_read = InboxItem.objects.filter(member_id__in=read, state="pending", admission="admitted").count()
    stuck["unacknowledged items"] += pending_read

    # Pushed items: acknowledged exactly when the receiver answered 2xx for them.
    answered = defaultdict(set)
    received_ids = defaultdict(set)
    for line in receiver_log.read_text().splitlines():
        entry = json.loads(line)
        received_ids[entry["path"]].add(entry["id"])
        if entry["mcp"] and 200 <= entry["status"] < 300 and not entry["late"]:
            answered[entry["path"]].add(entry["event"])
    for who, path in PUSHED.items():
        member = people[who][0]
        acked = {"evt_" + t[4:] for t in InboxItem.objects.filter(member=member, state="acknowledged")
                 .values_list("token", flat=True)}
        got = answered[f"/hook/{path}/mcp-{who}"]
        lost["pushed items"] += len(acked - got)
        stuck["pushed items"] += len(got - acked)

    # Wakes: per subscription, ranges chained from its activation with no gap
    # or overlap, each delivered one received, the head covered.
    for subscription in Subscription.objects.exclude(kind="item").select_related("endpoint"):
        path = "/" + subscription.endpoint.url.split("/", 3)[3]
        position = subscription.activation_position
        for delivery in Delivery.objects.filter(subscription=subscription, replay_of=None).order_by("after_position",
                                                                                                      "pk"):
            if delivery.after_position > position:
                lost["wake ranges"] += 1
            elif delivery.after_position < position:
                duplicated["wake ranges"] += 1
            position = delivery.through_position
            if delivery.state == "delivered" and delivery.public_id not in received_ids[path]:
                lost["wakes received"] += 1
            if delivery.state == "sending":
                stuck["deliveries sending"] += 1
    lost["events covered"] += len(behind(heads))
    gone = Subscription.objects.filter(endpoint__url__contains="/hook/gone/").first()
    if gone is not None and not (gone.status == "suspended" and gone.terminal):
        stuck["410 not suspended"] += 1

    # Barriers: every grant terminal; nothing it authorized left pending.
    stuck["barriers"] += Grant.objects.filter(public_id__in=book.grants, status=Grant.Status.REVOKING).count()
    stuck["revoked items pending"] += InboxItem.objects.filter(grant__public_id__in=book.grants,
                                                               grant__status="revoked", state="pending").count()

    # Live sockets: every frame of #general, once each, in order.
    general = list(Message.objects.filter(conversation__public_id=conversations["#general"])
                   .order_by("position").values_list("public_id", flat=True))
    for name, frames in book.frames.items():
        ids = [public_id for _, public_id in frames]
        positions = [p for p, _ in frames]
        duplicated["socket frames"] += len(ids) - len(set(ids))
        lost["socket frames"] += len(set(general) - set(ids))
        disorder["socket frames"] += sum(b <= a for a, b in zip(positions, positions[1:]))

    # Mailbox counters: the pending bytes they count.
    for mailbox in Mailbox.objects.all():
        actual = (InboxItem.objects.filter(member_id=mailbox.member_id, state="pending").exclude(admission="held")
                  .aggregate(total=Sum("content_bytes"))["total"] or 0)
        if actual != mailbox.pending_bytes:
            lost["mailbox counters"] += 1

    book.operations["sends"] = len(book.accepted)
    book.operations["wakes delivered"] = Delivery.objects.filter(state="delivered", subscription__kind__in=[
        "space", "inbox"]).count()
    book.operations["items pushed"] = Delivery.objects.filter(state="delivered", subscription__kind="item").count()
    book.operations["socket frames"] = sum(len(f) for f in book.frames.values())
    book.operations["items"] = InboxItem.objects.count()
    book.operations["attempts"] = Delivery.objects.aggregate(n=Sum("attempts"))["n"] or 0
    return {"lost": lost, "duplicated": duplicated, "stuck": stuck, "out of order": disorder}


# ---------------------------------------------------------------- the run

async def drive(args, work: Path, env: dict, people: dict, supervisor: Supervisor, nodes: list[Child],
                workers: list[Child], pg: Postgres, redis: Child, receiver: str, book: Book) -> dict:
    proxy = Proxy([("127.0.0.1", int(n.argv[n.argv.index("--bind") + 1].rsplit(":", 1)[1])) for n in nodes])
    proxy_port = free_port()
    await proxy.start("127.0.0.1", proxy_port)
    base = f"http://127.0.0.1:{proxy_port}"
    node_bases = [f"http://{n.argv[n.argv.index('--bind') + 1]}" for n in nodes]
    stop_super = asyncio.Event()
    super_task = asyncio.create_task(supervise(supervisor, stop_super))
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        api = Api(session, base, book)
        conversations = await spaces(api, people)
        await asyncio.to_thread(subscribe_webhooks, people, receiver)
        session_id = await sign_in(node_bases[0])
        stop_load, stop_sockets = asyncio.Event(), asyncio.Event()
        sockets = [asyncio.create_task(socket(f"socket@node{i}", b, session_id, conversations["#general"], book,
                                              stop_sockets)) for i, b in enumerate(node_bases)]
        stop_readers = asyncio.Event()
        readers = [asyncio.create_task(reader(api, who, people[who][1], stop_readers)) for who in READERS]
        grants = asyncio.create_task(granted(api, people, conversations, stop_load))
        counter = iter(range(10 ** 9))
        started = time.monotonic()
        senders = [asyncio.create_task(sender(api, people, conversations, counter, args.sends))
                   for _ in range(CONCURRENCY)]
        faults = Faults(nodes, workers, pg, redis, book)
        stop_faults = asyncio.Event()
        faults_task = asyncio.create_task(faults.run(args.faults, args.fault_interval, stop_faults))
        progress = asyncio.create_task(_progress(book, args.sends))
        await asyncio.gather(*senders)
        load_seconds = time.monotonic() - started
        await faults_task  # the schedule runs to its end
        progress.cancel()
        stop_load.set()
        await grants
        print(f"  load done: {len(book.accepted)} sends in {load_seconds:.0f} s; settling", flush=True)
        deadline = time.monotonic() + SETTLE_TIMEOUT
        heads = {}
        while True:
            try:
                done, why = await asyncio.to_thread(settled, people)
                if done:
                    heads = await feed_heads(api, people)
                    late = await asyncio.to_thread(behind, heads)
                    done, why = not late, f"{', '.join(late)} behind"
            except Exception as exc:  # the database restarting: look again
                done, why = False, repr(exc)
            if done or time.monotonic() > deadline:
                break
            await asyncio.sleep(2)
        if not done:
            print(f"  not settled after {SETTLE_TIMEOUT:.0f} s: {why}", flush=True)
        stop_readers.set()  # each reads on until a pass finds nothing
        await asyncio.gather(*readers)
        await _sockets_caught_up(book, conversations, len(nodes))
        stop_sockets.set()
        for task in sockets:
            task.cancel()
        await asyncio.gather(*sockets, return_exceptions=True)
    stop_super.set()
    await super_task
    await proxy.close()
    return {"load_seconds": round(load_seconds, 1)}, conversations, heads


async def _progress(book: Book, total: int) -> None:
    while True:
        await asyncio.sleep(10)
        print(f"  {len(book.accepted)}/{total} sends, {book.operations['acknowledgements']} acks, "
              f"{book.retries} retries", flush=True)


async def _sockets_caught_up(book: Book, conversations: dict, sockets: int, timeout: float = 60) -> None:
    from inbox.models import Message

    def last() -> int:
        from django.db import connections

        connections.close_all()
        m = Message.objects.filter(conversation__public_id=conversations["#general"]).order_by("-position").first()
        return m.position if m else 0

    head = await asyncio.to_thread(last)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(book.frames) == sockets and all(f and f[-1][0] >= head for f in book.frames.values()):
            return
        await asyncio.sleep(0.5)


def table(book: Book, counts: dict[str, Counter]) -> tuple[str, int]:
    rows = ["| | count |", "| --- | ---: |"]
    rows += [f"| fault: {kind} | {book.faults[kind]} |" for kind in FAULTS]
    rows.append(f"| faults injected | {sum(book.faults.values())} |")
    rows.append(f"| points armed and not reached (tried again) | {sum(book.faults_missed.values())} |")
    rows += [f"| {name} | {value} |" for name, value in book.operations.items()]
    rows.append(f"| client retries | {book.retries} |")
    rows.append(f"| socket reconnects | {book.reconnects} |")
    bad = 0
    for heading, counter in counts.items():
        total = sum(counter.values())
        bad += total
        detail = ", ".join(f"{k} {v}" for k, v in counter.items() if v)
        rows.append(f"| **{heading}** | **{total}**{' (' + detail + ')' if detail else ''} |")
    refused = sum(book.refused.values())
    bad += refused
    rows.append(f"| **refused** | **{refused}**{' (' + dict(book.refused).__repr__() + ')' if refused else ''} |")
    return "\n".join(rows), bad


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sends", type=int, default=10_000)
    parser.add_argument("--faults", type=int, default=30)
    parser.add_argument("--fault-interval", type=float, default=6.0, help="mean seconds between faults")
    parser.add_argument("--out", type=Path, default=None, help="keep logs and the result here")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--keep", action="store_true", help="leave the database running and the scratch directory")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(10 ** 6)
    random.seed(seed)
    work = Path(tempfile.mkdtemp(prefix="switchboard-chaos-"))
    os.chmod(work, 0o755)
    out = args.out or work
    out.mkdir(parents=True, exist_ok=True)
    print(f"chaos: {args.sends} sends, {args.faults} faults, seed {seed}, logs in {out}", flush=True)
    pg = Postgres(work)
    supervisor = Supervisor()
    database_url = None
    try:
        database_url = pg.init()
        redis_port = free_port()
        redis = supervisor.add(Child("redis", ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1",
                                               "--save", "", "--appendonly", "no"], dict(os.environ),
                                     out / "redis.log"))
        from webhooks.example_receiver import make_ca_and_certificate

        ca, cert, key = (str(p) for p in make_ca_and_certificate(work))
        receiver_port = free_port()
        receiver_log = out / "receiver.jsonl"
        supervisor.add(Child("receiver", [PY, "-m", "bench.chaos_receiver", cert, key, str(receiver_port),
                                          str(receiver_log)], dict(os.environ), out / "receiver.log"))
        env = {"DATABASE_URL": database_url, "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0", "DEBUG": "1",
               "SERVER_ADMIN_KEY": secrets.token_urlsafe(32), "RATE_LIMIT_PER_MINUTE": "0",
               "WEBHOOK_ALLOW_PRIVATE_NETWORKS": "1", "WEBHOOK_CA_BUNDLE": ca, "LOG_LEVEL": "WARNING",
               "WEBHOOK_LEASE_SECONDS": str(LEASE_SECONDS), "SWITCHBOARD_VAR_DIR": str(work / "var")}
        child_env = {k: v for k, v in os.environ.items() if k != "DJANGO_ALLOW_ASYNC_UNSAFE"} | env
        subprocess.run([PY, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=child_env, check=True)
        boot(env)
        people = members()
        nodes, workers = [], []
        for name, argv in [(f"node{i}", node_command(free_port())) for i in range(2)] + \
                          [(f"worker{i}", worker_command()) for i in range(2)]:
            faults_dir = work / "faults" / name
            faults_dir.mkdir(parents=True)
            child = supervisor.add(Child(name, argv, {**child_env, "SWITCHBOARD_FAULTS": str(faults_dir)},
                                         out / f"{name}.log"))
            (nodes if name.startswith("node") else workers).append(child)
        _wait_ready([f"http://{n.argv[n.argv.index('--bind') + 1]}" for n in nodes])
        book = Book()
        figures, conversations, heads = asyncio.run(drive(args, work, env, people, supervisor, nodes, workers, pg, redis,
                                                   f"https://127.0.0.1:{receiver_port}", book))
        counts = check(book, people, conversations, receiver_log, heads)
        text, bad = table(book, counts)
        print(text)
        (out / "result.md").write_text(f"seed {seed}, {figures}\n\n{text}\n")
        (out / "result.json").write_text(json.dumps({"seed": seed, **figures, "faults": book.faults,
                                                     "operations": book.operations,
                                                     **{k: v for k, v in counts.items()}}, indent=1))
        return 1 if bad else 0
    finally:
        supervisor.stop()
        if args.keep:
            print(f"kept: PostgreSQL at {database_url}, data in {work}")
        else:
            pg.stop()
            shutil.rmtree(work, ignore_errors=True)


def _wait_ready(bases: list[str], timeout: float = 60) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    for base in bases:
        while True:
            try:
                with urllib.request.urlopen(f"{base}/healthz", timeout=1) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"{base} did not become ready")
            time.sleep(0.2)


if __name__ == "__main__":
    sys.exit(main())
