"""/mcp under a server's start and stop: the lifespan that starts and
stops the SDK's transport, and a stopping `serve` that ends its streams
and long-polls with an answer."""
import asyncio
import time

import httpx
import pytest

from tests.mcp_endpoint.client import call, connect
from tests.mcp_endpoint.test_end_to_end import ITEM, bearer, token_for
from tests.servers import serving

pytestmark = pytest.mark.django_db(transaction=True)


def test_under_uvicorn_the_lifespan_starts_and_stops_the_transport():
    import signal
    import subprocess
    import sys

    from tests.servers import ROOT, free_port, server_env

    ada = token_for("ada")
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "uvicorn", "controlplane.asgi:application", "--host", "127.0.0.1",
                               "--port", str(port), "--lifespan", "on"], cwd=ROOT, env=server_env(),
                              stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert server.poll() is None, server.stderr.read()
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.1)

        async def story():
            async with connect(base, ada) as (client, _):
                return [tool.name for tool in (await client.list_tools()).tools]

        tools = asyncio.run(story())
    finally:
        server.send_signal(signal.SIGINT)
        _, stderr = server.communicate(timeout=20)
    assert "read_inbox" in tools
    assert "Application startup complete" in stderr and "Application shutdown complete" in stderr
    assert "Traceback" not in stderr


def test_a_server_shutting_down_ends_streams_with_a_final_frame_and_answers_long_polls():
    """uvicorn waits 5 s for open responses, then cancels them: a stream
    ended with no `terminated` frame, a long-poll with no answer, and the
    log had an error for each."""
    import signal

    ada = token_for("ada")
    with serving("--no-worker") as (base, process):
        async def story():
            async with connect(base, ada) as (client, events):
                stream = asyncio.ensure_future(call(client, "events/stream", name=ITEM))
                assert (await events.next())[0] == "active"
                polling = asyncio.ensure_future(asyncio.to_thread(
                    httpx.get, f"{base}/v0/me/inbox/events", params={"wait_ms": 30_000}, headers=bearer(ada),
                    timeout=30))
                await asyncio.sleep(0.5)  # the long-poll waits
                # when
                process.send_signal(signal.SIGINT)
                frame = await events.next(timeout=10)
                return frame, await asyncio.wait_for(polling, 10), await asyncio.wait_for(stream, 10)

        (kind, params), polled, result = asyncio.run(story())
    # then: a final frame that says why, the stream's own answer, and the long-poll answered
    assert kind == "terminated" and params["error"]["data"] == {"reason": "shutdown"}
    assert "_meta" in result
    assert polled.status_code == 200 and polled.json()["events"] == []
