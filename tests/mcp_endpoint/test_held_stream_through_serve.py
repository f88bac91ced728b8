"""An MCP inbox stream × items the firewall holds, releases and a
revocation rejects, through a real `serve` (its worker classifies and
finishes the barrier): a held item is never offered, a released one comes
once, and a withdrawn item's rejection comes in its stead (SPEC §5, §7, §9)."""
import asyncio

import httpx
import pytest

from tests.mcp_endpoint.client import call, connect
from tests.servers import member_token, serving

pytestmark = pytest.mark.django_db(transaction=True)

ITEM = "org.switchboard/inbox.item"


def api(base: str, token: str, method: str, path: str, body: dict | None = None) -> dict:
    response = httpx.request(method, f"{base}{path}", json=body, headers={"Authorization": f"Bearer {token}"})
    assert response.status_code in (200, 201), response.text
    return response.json()


def test_a_stream_offers_no_held_item_then_the_released_one_then_rejections_in_stead():
    # given: ada holds anything secret; bo may message her in an explicit_only space under a pair grant
    alice, ada, bo = member_token("alice"), member_token("ada"), member_token("bo")
    with serving() as (base, _):
        api(base, alice, "POST", "/v0/spaces", {"slug": "ops", "name": "Ops", "send_policy": "explicit_only"})
        for member in (ada, bo):
            api(base, member, "POST", "/v0/spaces/ops/join")
        conversation = api(base, bo, "POST", "/v0/spaces/ops/direct", {"member": "@ada"})["conversation"]["id"]
        api(base, alice, "POST", "/v0/spaces/ops/grants",
            {"id": "grt_bo-ada", "kind": "pair", "sender": "@bo", "recipient": "@ada"})
        api(base, ada, "PUT", "/v0/me/inbox/firewall", {"rules": [{"action": "hold", "content_pattern": "secret"}]})

        def send(body: str) -> str:
            return api(base, bo, "POST", f"/v0/spaces/ops/conversations/{conversation}/messages",
                       {"body": body})["message"]["id"]

        async def story():
            async with connect(base, ada) as (client, events):
                stream = asyncio.ensure_future(call(client, "events/stream", name=ITEM))
                assert (await events.next())[0] == "active"

                async def offered() -> dict:
                    while (frame := await events.next())[0] == "heartbeat":
                        pass
                    assert frame[0] == "event", frame
                    return frame[1]["data"]

                async def acknowledge(data: dict) -> None:
                    await client.call_tool("acknowledge_delivery", {"deliveryToken": data["deliveryToken"]})

                # when: a held item, then one the firewall lets through
                secret = send("the secret plan")
                send("a plain note")
                seen = [await offered()]
                await acknowledge(seen[-1])
                # when: ada releases the held one
                (held,) = (await asyncio.to_thread(api, base, ada, "GET", "/v0/me/inbox/held"))["items"]
                await asyncio.to_thread(api, base, ada, "POST", "/v0/me/inbox/held/release",
                                        {"deliveryToken": held["deliveryToken"]})
                seen.append(await offered())
                await acknowledge(seen[-1])
                # when: one admitted and one held are pending as the grant is revoked
                withdrawn, held_again = send("to be withdrawn"), send("another secret")
                seen.append(await offered())
                await asyncio.to_thread(api, base, alice, "POST", "/v0/grants/grt_bo-ada/revoke")
                seen += [await offered(), await offered()]
                with pytest.raises(asyncio.TimeoutError):  # and nothing more
                    await asyncio.wait_for(offered(), 1.5)
                stream.cancel()
                return held, secret, withdrawn, held_again, seen

        held, secret, withdrawn, held_again, seen = asyncio.run(story())
        inbox = api(base, ada, "GET", "/v0/me/inbox")["items"]
    # then
    assert held["item"]["postId"] == secret
    items = [(d["item"]["kind"], d["item"].get("content") or d["item"]["postId"]) for d in seen]
    assert items[:3] == [("direct", "a plain note"), ("direct", "the secret plan"), ("direct", "to be withdrawn")]
    assert sorted(items[3:]) == sorted([("rejected", withdrawn), ("rejected", held_again)])
    assert "another secret" not in str(seen)
    assert sorted(e["item"]["postId"] for e in inbox) == sorted([withdrawn, held_again])
    assert {e["item"]["kind"] for e in inbox} == {"rejected"}
