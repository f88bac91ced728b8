"""Request threads shared fairly between client addresses (controlplane.turns)."""
import asyncio

import httpx
import pytest

from controlplane.turns import FairTurns


def test_a_freed_place_goes_to_the_next_key_in_turn_not_to_the_longest_queue():
    async def scene():
        turns, served, release = FairTurns(1), [], asyncio.Event()

        async def request(key, n):
            async with turns.turn(key):
                served.append(f"{key}{n}")
                if (key, n) == ("a", 0):
                    await release.wait()

        first = asyncio.create_task(request("a", 0))  # holds the one place
        await asyncio.sleep(0)
        waiting = [asyncio.create_task(request("a", n)) for n in range(1, 5)]
        await asyncio.sleep(0)
        waiting += [asyncio.create_task(request("b", 1)), asyncio.create_task(request("c", 1))]
        await asyncio.sleep(0)
        release.set()
        await asyncio.gather(first, *waiting)
        return served

    # a's backlog came first, yet b and c each wait for one of a's, not all four
    assert asyncio.run(scene()) == ["a0", "a1", "b1", "c1", "a2", "a3", "a4"]


def test_alone_a_key_has_every_place_and_a_cancelled_waiter_passes_its_place_on():
    async def scene():
        turns, inside, gate = FairTurns(3), [], asyncio.Event()

        async def request(key):
            async with turns.turn(key):
                inside.append(key)
                await gate.wait()

        holders = [asyncio.create_task(request("a")) for _ in range(3)]
        await asyncio.sleep(0)
        assert len(inside) == 3  # one key alone: every place
        cancelled, later = asyncio.create_task(request("b")), asyncio.create_task(request("c"))
        await asyncio.sleep(0)
        cancelled.cancel()
        await asyncio.sleep(0)
        gate.set()
        await asyncio.gather(*holders, later)
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        return inside, turns.free

    inside, free = asyncio.run(scene())
    assert inside == ["a", "a", "a", "c"] and free == 3  # every place came back


@pytest.mark.django_db(transaction=True)
def test_one_addresss_backlog_of_large_reads_does_not_hold_back_another_address():
    """Through a real `serve`: one address keeps 120 anonymous reads of a
    megabyte page open; a member at another address asks who they are. It
    waited behind all of them (7 to 16 s in an outside run); it now waits
    for a thread's next turn."""
    from controlplane import services
    from controlplane.models import Member
    from inbox.services import send_message
    from tests.servers import member_token, serving

    token = member_token("alice")
    alice = Member.objects.get(handle="alice")
    space = services.create_space(slug="lab", name="Lab", visibility="open", send_policy="open", actor=alice)
    general = services.create_channel(space, "general", actor=alice)
    for n in range(100):
        send_message(general, body=f"{n:03d}" + "\x01" * 8000, actor=alice)
    with serving("--no-worker", SERVE_WORKERS="1", SYNC_THREADS="2", TRUST_PROXY_HEADERS="1",
                 RATE_LIMIT_PER_MINUTE="100000") as (base, _):
        async def scene() -> tuple[list[str], int]:
            done = []
            limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
            async with httpx.AsyncClient(base_url=base, limits=limits, timeout=120) as http:
                async def read(n):
                    page = await http.get("/v0/spaces/lab/events", params={"limit": 100},
                                          headers={"X-Forwarded-For": "198.51.100.1"})
                    assert page.status_code == 200
                    done.append(f"flood {n}")

                async def me():
                    answer = await http.get("/v0/me", headers={"X-Forwarded-For": "203.0.113.7",
                                                               "Authorization": f"Bearer {token}"})
                    assert answer.status_code == 200
                    done.append("me")

                flood = [asyncio.create_task(read(n)) for n in range(120)]
                await asyncio.sleep(1.0)  # all of them in, most of them waiting
                await asyncio.gather(me(), *flood)
            return done

        done = asyncio.run(scene())
    # then: answered among the first of the reads still waiting, not after them all
    assert done.index("me") < 40, done.index("me")
