"""Setting the scene (members, spaces, subscriptions) and the load: senders,
a granted sender whose grant is revoked again and again, inbox readers,
live sockets.
"""
from __future__ import annotations

import asyncio
import base64
import json
import os
import random
import secrets

import aiohttp

from bench.chaos.common import (
    CSRF_FIELD,
    GRANT_SENDS,
    INBOX_PATHS,
    PASSWORD,
    PUSHED,
    RECIPIENTS,
    SENDERS,
    SPACE_PATHS,
    Api,
    Book,
)


def boot(env: dict[str, str]) -> None:
    os.environ.update(env)
    os.environ["DJANGO_SETTINGS_MODULE"] = "controlplane.settings"
    import django

    django.setup()
    from django.db import connections

    # This process outlives database restarts too: check a pooled connection before use.
    connections["default"].settings_dict["CONN_HEALTH_CHECKS"] = True


def members() -> dict[str, tuple[object, str]]:
    from controlplane import bearer, services

    made = {}
    names = ["owner", "g", "rg", *(f"s{i}" for i in range(SENDERS)), *(f"r{i}" for i in range(RECIPIENTS))]
    for name in names:
        member = services.create_member(f"chaos-{name}", actor=None)
        made[name] = (member, bearer.issue_credential(member, actor=None)[1])
    watcher = services.create_member("chaos-watcher", kind="human", password=PASSWORD, actor=None)
    made["watcher"] = (watcher, bearer.issue_credential(watcher, actor=None)[1])
    return made


def subscribe_webhooks(people: dict, receiver: str) -> None:
    from controlplane.models import Space
    from webhooks import mcp, services, verification

    def endpoint(owner, path):
        ep = services.create_endpoint(owner, f"{receiver}/hook/{path}", None, actor=owner)
        verification.verify_endpoint(ep)
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



async def sender(api: Api, people: dict, conversations: dict, counter, total: int, faults: asyncio.Task) -> None:
    """Sends until `total` are made and the fault schedule has run: a fault
    at a webhook step needs wakes in flight to reach it."""
    book = api.book
    while (n := next(counter)) < total or not faults.done():
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
                if status == 200:  # (also for an item a revocation barrier withdrew since the read)
                    api.book.acked[who].add(item["deliveryToken"])
                    api.book.operations["acknowledgements"] += 1
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
                        if frame.type is aiohttp.WSMsgType.ERROR:
                            # A reset connection or a missed pong (a node killed): aiohttp yields
                            # it as a message, and the page reconnects from its last frame.
                            book.socket_errors[type(frame.data).__name__] += 1
                            break
                        data = json.loads(frame.data)
                        if data["type"] == "message":
                            frames.append((data["position"], data["id"]))
                            book.last_frame_at[name] = book.elapsed()
                        elif data["type"] == "resync":
                            book.refused["socket resync"] += 1
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                pass
            if not stop.is_set():
                book.reconnects += 1
                await asyncio.sleep(0.3)


