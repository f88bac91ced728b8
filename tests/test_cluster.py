"""`manage.py cluster` (docs/deploy.md): two nodes and a worker behind its
proxy, on PostgreSQL + Redis, as the deployment docs describe it."""
import asyncio
import json
import signal
import socket
import subprocess
import sys

import aiohttp
import httpx
import pytest

from controlplane.processes import in_session, kill_all
from tests.servers import ROOT, free_port, member_token, read_until, server_env

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_two_nodes_behind_the_proxy_serve_one_deployment():
    alice = {"Authorization": f"Bearer {token('alice')}"}
    port = free_port()
    process = subprocess.Popen([sys.executable, "manage.py", "cluster", "--bind", f"127.0.0.1:{port}", "--nodes", "2",
                                "--workers", "1"], cwd=ROOT, env=server_env(), stdout=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        banner = read_until(process, "serving at")[-1]
        node_ports = [int(p) for p in banner.split("ports ")[1].split(")")[0].split(", ")]
        base = f"http://127.0.0.1:{port}"
        # given: a channel, and a live page on the first node
        httpx.post(f"{base}/v0/spaces", json={"slug": "lab", "name": "Lab"}, headers=alice)
        channel = httpx.post(f"{base}/v0/spaces/lab/channels", json={"name": "general"}, headers=alice).json()
        # when: the proxy spreads requests over both nodes, and a send goes straight to the second
        answered = {httpx.get(f"{base}/readyz").status_code for _ in range(4)}
        sent = asyncio.run(frame_on(node_ports[0], node_ports[1], channel["conversation"]["id"], alice))
        # then: both ready; the send through one node reached the socket on the other
        assert answered == {200}
        assert sent["type"] == "message" and sent["id"] == sent["sent"]
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            kill_all(lambda: in_session(process.pid))
            raise
    assert process.returncode == 0
    assert not in_session(process.pid)  # nodes and workers stopped with it


def test_a_port_in_use_is_one_line_and_leaves_nothing_behind():
    """It was a traceback (serve says `cannot listen on …`)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run([sys.executable, "manage.py", "cluster", "--bind", f"127.0.0.1:{port}", "--nodes",
                                 "1", "--workers", "0"], cwd=ROOT, env=server_env(), capture_output=True, text=True,
                                timeout=120, start_new_session=True)
    assert result.returncode == 1 and f"cannot listen on 127.0.0.1:{port}" in result.stderr
    assert "Traceback" not in result.stderr, result.stderr


def token(handle: str) -> str:
    return member_token(handle, kind="human", password="cluster-password-0123456789")


async def frame_on(socket_port: int, send_port: int, conversation: str, auth: dict) -> dict:
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        login = f"http://127.0.0.1:{socket_port}/app/login/"
        async with http.get(login) as response:
            form = (await response.text()).split('name="csrfmiddlewaretoken" value="')[1].split('"')[0]
        async with http.post(login, data={"username": "alice", "password": "cluster-password-0123456789",
                                          "csrfmiddlewaretoken": form}, headers={"Referer": login},
                             allow_redirects=False) as response:
            assert response.status == 302
        async with http.ws_connect(f"ws://127.0.0.1:{socket_port}/ws/conversations/{conversation}/?after=0") as ws:
            while json.loads((await ws.receive(timeout=10)).data)["type"] != "live":
                pass
            async with http.post(f"http://127.0.0.1:{send_port}/v0/spaces/lab/conversations/{conversation}/messages",
                                 json={"body": "across nodes"}, headers=auth) as response:
                assert response.status == 201
                message_id = (await response.json())["message"]["id"]
            return {**json.loads((await ws.receive(timeout=10)).data), "sent": message_id}
