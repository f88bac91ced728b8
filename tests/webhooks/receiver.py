"""A real HTTPS receiver on 127.0.0.1 for webhook tests, with a throwaway
certificate authority (the server processes trust it via WEBHOOK_CA_BUNDLE)."""
from __future__ import annotations

import json
import ssl
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from webhooks.example_receiver import make_ca_and_certificate


@dataclass
class Received:
    path: str
    headers: dict
    body: bytes
    at: float

    def json(self) -> dict:
        return json.loads(self.body)


@dataclass
class Receiver:
    """Records every POST. `respond(received)` decides the answer: by
    default a challenge is echoed and a wake gets 202."""

    port: int
    requests: list[Received] = field(default_factory=list)
    respond: object = None
    arrived: threading.Condition = field(default_factory=threading.Condition)

    def url(self, path: str = "/hook", host: str = "localhost") -> str:
        return f"https://{host}:{self.port}{path}"

    def answer(self, received: Received) -> tuple[int, dict, bytes]:
        if self.respond is not None:
            return self.respond(received)
        body = received.json()
        if body.get("type") == "spaces.webhook.challenge":
            return 200, {"Content-Type": "application/json"}, json.dumps({"challenge": body["challenge"]}).encode()
        return 202, {"Content-Type": "application/json"}, b"{}"

    def wakes(self) -> list[Received]:
        return [r for r in self.requests if r.json().get("type") != "spaces.webhook.challenge"]

    def wait_for(self, predicate, timeout: float = 30.0) -> list[Received]:
        deadline = time.monotonic() + timeout
        with self.arrived:
            while not predicate(self.requests):
                remaining = deadline - time.monotonic()
                assert remaining > 0, f"timed out; received {len(self.requests)} request(s)"
                self.arrived.wait(remaining)
            return list(self.requests)


def serve_receiver(directory: Path):
    """Start a receiver; returns (receiver, CA bundle path, stop())."""
    ca, chain, key = make_ca_and_certificate(directory)
    receiver = Receiver(port=0)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):  # noqa: N802 - the stdlib's name
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            received = Received(self.path, dict(self.headers.items()), body, time.time())
            with receiver.arrived:
                receiver.requests.append(received)
                receiver.arrived.notify_all()
            status, headers, payload = receiver.answer(received)
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    class Server(ThreadingHTTPServer):
        request_queue_size = 512  # many concurrent connections from several workers

        def handle_error(self, request, client_address):
            # A client that stopped reading (the transport's cap on a response's size) is the test's point.
            if not isinstance(sys.exc_info()[1], (ConnectionError, ssl.SSLEOFError)):
                super().handle_error(request, client_address)

    server = Server(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(chain, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    receiver.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    def stop():
        server.shutdown()
        server.server_close()

    return receiver, ca, stop
