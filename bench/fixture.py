"""The data every benchmark shares: members with credentials (created with
the real management commands, in-process), and spaces, channels and direct
conversations (created through the HTTP API of whichever server is up first).

Measures nothing.
"""
from __future__ import annotations

import io
import os
import sys
from dataclasses import dataclass, field

import aiohttp

from bench.servers import ROOT

SEND_SPACE = "bench"
FEED_SMALL = "feed-small"  # 1,000 events spread over the whole log
FEED_BIG = "feed-big"      # every other event of the 1,000,000-event log


def boot_django(env: dict[str, str]) -> None:
    """Set up Django in this process with the servers' environment (for the
    management commands and for building cursors)."""
    os.environ.update(env)
    os.environ["DJANGO_SETTINGS_MODULE"] = "controlplane.settings"
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def shutdown_django() -> None:
    from django.db import connections

    for connection in connections.all(initialized_only=True):
        connection.close()
        if hasattr(connection, "close_pool"):
            connection.close_pool()


@dataclass
class Member:
    handle: str
    public_id: str
    token: str
    pk: int = 0


@dataclass
class Fixture:
    members: list[Member]
    spaces: dict[str, dict] = field(default_factory=dict)         # slug -> rendered space
    conversations: dict[str, dict] = field(default_factory=dict)  # label -> rendered conversation

    @property
    def viewer(self) -> Member:
        """Whose feeds the feed benchmark reads."""
        return self.members[1]


def create_members(count: int) -> Fixture:
    from django.core.management import call_command

    from controlplane.models import Member as MemberModel

    members = []
    for i in range(count):
        handle = f"bench{i:02d}"
        out = io.StringIO()
        call_command("createmember", handle, kind="agent", stdout=out)
        public_id = out.getvalue().strip()
        out = io.StringIO()
        call_command("issuecredential", handle, stdout=out)
        members.append(Member(handle, public_id, out.getvalue().strip(),
                              MemberModel.objects.get(public_id=public_id).pk))
    return Fixture(members)


class ApiError(RuntimeError):
    pass


async def api(session: aiohttp.ClientSession, base_url: str, member: Member, method: str, path: str,
              body: dict | None = None, expect: tuple[int, ...] = (200, 201)) -> dict:
    headers = {"Authorization": f"Bearer {member.token}"}
    async with session.request(method, base_url + path, json=body if body is not None else {},
                               headers=headers) as response:
        data = await response.json(content_type=None)
        if response.status not in expect:
            raise ApiError(f"{method} {path} as @{member.handle}: {response.status} {data}")
        return data


async def _space(session, base_url, fx: Fixture, slug: str, joiners: list[Member]) -> None:
    owner = fx.members[0]
    data = await api(session, base_url, owner, "POST", "/v0/spaces",
                     {"slug": slug, "name": slug, "visibility": "open", "send_policy": "open"})
    fx.spaces[slug] = data["space"]
    for member in joiners:
        await api(session, base_url, member, "POST", f"/v0/spaces/{slug}/join")
    data = await api(session, base_url, owner, "POST", f"/v0/spaces/{slug}/channels", {"name": "general"})
    fx.conversations[f"{slug}#general"] = data["conversation"]


async def ensure_spaces(base_url: str, fx: Fixture) -> None:
    """Create the send space and the two feed spaces once (idempotent per run)."""
    if fx.spaces:
        return
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await _space(session, base_url, fx, SEND_SPACE, fx.members[1:])
        await _space(session, base_url, fx, FEED_SMALL, fx.members[1:])
        await _space(session, base_url, fx, FEED_BIG, fx.members[1:])
        # Direct conversations in the big feed space: one the viewer takes part
        # in, one it does not (its events are hidden from the viewer's feed).
        m = fx.members
        data = await api(session, base_url, m[1], "POST", f"/v0/spaces/{FEED_BIG}/direct", {"member": f"@{m[2].handle}"})
        fx.conversations["dm-viewer"] = data["conversation"]
        data = await api(session, base_url, m[3], "POST", f"/v0/spaces/{FEED_BIG}/direct", {"member": f"@{m[4].handle}"})
        fx.conversations["dm-other"] = data["conversation"]
