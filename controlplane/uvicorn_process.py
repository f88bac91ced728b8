"""One uvicorn process of `serve`, on a listening socket `serve` made:
`python -m controlplane.uvicorn_process SOCKET_FD READY_FD`.

`serve` binds one socket per server process, all in one SO_REUSEPORT group
(`controlplane.management.commands.serve.listening_sockets`), whose
program spreads new connections over the processes. uvicorn's own `--workers`
shares one socket: whichever process woke first accepted every connection
of a burst, and a client's keep-alive connections, made together, could all
land on one process while the other idled (docs/benchmarks.md, round
twenty-two). uvicorn's `--fd` takes its socket for a Unix one, so the socket
is handed to uvicorn's server directly, as its own workers get theirs.

Once it listens, the process writes a byte to READY_FD: `serve` is ready
when every one of its processes is, not when the first one answers. Then
its event loop writes a byte there every BEAT_SECONDS, and `serve` starts
another process on the socket when the beats stop for
SERVE_HEALTHCHECK_SECONDS: a loop that never comes back (a call that
blocks it, a deadlock) holds every request and WebSocket of the process.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import socket
import sys

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

APP = "controlplane.asgi:application"
# A request's head (its request line and headers): httptools sets no limit
# on its size and uvicorn no deadline for it, so one connection could send
# hundreds of MiB of one header, held in memory before any limit of ours
# ran, or drip one out for ever.
HEAD_MAX_BYTES = 64 * 1024
HEAD_SECONDS = 10.0
# A request's body must have arrived within BODY_SECONDS of its head (else
# 408, and the connection closes): read before any credential or rate limit
# is looked at, a body dripped a byte at a time held its connection, a file
# descriptor and its buffers for ever, for anyone. 8 KiB of message and the
# largest body a route takes need far less.
BODY_SECONDS = 30.0
# An answer its client does not read: a connection whose writes stay paused
# (more than the transport's high-water mark unsent) this long is dropped,
# and with it the answer it held (a feed page, up to a MiB, for anyone).
WRITE_SECONDS = 20.0
# After a 431, what the client is still sending is read and dropped this
# long before the connection closes: closed with unread data, the client
# would get a reset, and perhaps never read the answer.
LINGER_SECONDS = 1.0


class BoundedHead(HttpToolsProtocol):
    """uvicorn's httptools protocol, whose requests' heads must fit in
    HEAD_MAX_BYTES (else 431, and the connection closes) and arrive within
    HEAD_SECONDS (else the connection closes; uvicorn closes idle keep-alive
    connections itself).

    A head is counted by the reads that continue it: the read it starts in
    may end the body of the request before it, so it counts for nothing,
    and a head may take one read more than HEAD_MAX_BYTES before it is
    refused. Its time runs from that read, or from the connection for its
    first request. A pipelined request's head waits while the request
    before it is answered (uvicorn stops reading then): its time runs, and
    its 431 is sent, once that answer has gone."""

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self.head_bytes, self.head_open, self.refused, self.head_timer = 0, False, False, None
        self.body_timer = self.write_timer = None
        self.refusal: tuple[bytes, str, dict] | None = None
        self._time_the_head()

    def connection_lost(self, exc) -> None:
        self._head_done()
        self.body_timer = _cancelled(self.body_timer)
        self.write_timer = _cancelled(self.write_timer)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return  # read and dropped until the connection closes (LINGER_SECONDS)
        continued = self.head_open
        super().data_received(data)
        if not self.head_open or self.transport.is_closing():
            return
        if continued:
            self.head_bytes += len(data)
        if self.head_bytes > HEAD_MAX_BYTES:
            self._refuse_when_answered(b"431 Request Header Fields Too Large", "The request's headers are too large.",
                                       {"max_bytes": HEAD_MAX_BYTES})
        else:
            self._time_the_head()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.head_bytes, self.head_open = 0, True

    def on_headers_complete(self) -> None:
        self._head_done()
        super().on_headers_complete()
        # Its body's time runs while it is read: not for an upgrade (the socket's
        # protocol takes over), nor while it waits behind a pipelined answer.
        if not self.parser.should_upgrade() and not self.pipeline:
            self.body_timer = self.loop.call_later(BODY_SECONDS, self._body_too_slow)

    def on_message_complete(self) -> None:
        self.body_timer = _cancelled(self.body_timer)
        super().on_message_complete()

    def _body_too_slow(self) -> None:
        self.body_timer = None
        if self.cycle is None or self.cycle.response_started:
            self.transport.close()  # answered without it (a 401 before the body): nothing more to wait for
            return
        self.cycle.keep_alive = False
        self.refused, self.refusal = True, (b"408 Request Timeout", "The request's body did not arrive in time.",
                                            {"seconds": BODY_SECONDS})
        self._refuse()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self.write_timer is None:
            self.write_timer = self.loop.call_later(WRITE_SECONDS, self.transport.abort)

    def resume_writing(self) -> None:
        super().resume_writing()
        self.write_timer = _cancelled(self.write_timer)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.refused and not self._answering():
            self._refuse()
        elif self.head_open:
            self._time_the_head()
        elif self._answering() and self.cycle.more_body and self.body_timer is None:
            # A pipelined request uvicorn just started, its body still to come.
            self.body_timer = self.loop.call_later(BODY_SECONDS, self._body_too_slow)

    def _answering(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    def _time_the_head(self) -> None:
        if self.head_timer is None and not self._answering():
            self.head_timer = self.loop.call_later(HEAD_SECONDS, self.transport.close)

    def _head_done(self) -> None:
        self.head_open = False
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def send_400_response(self, msg: str) -> None:
        """What httptools cannot parse (a control character in a header, a
        Content-Length that is not a number, one beside Transfer-Encoding):
        uvicorn answers it at once in plain text, and closes; here in the
        contract's shape, as a 431 is."""
        self._refuse_when_answered(b"400 Bad Request", "The request is not valid HTTP/1.1.", {})

    def _refuse_when_answered(self, status: bytes, message: str, details: dict) -> None:
        """Refuse the request being read, once the answer to the one before
        it (pipelined) has gone; what the client still sends is dropped."""
        self._head_done()
        self.refused, self.refusal = True, (status, message, details)
        if self._answering():
            self.flow.pause_reading()  # (resumed when the answer has gone, then read and dropped)
        else:
            self._refuse()

    def _refuse(self) -> None:
        from controlplane.errors import error_body  # (the application has loaded Django by now)

        status, message, details = self.refusal
        body = json.dumps(error_body("INVALID_REQUEST", message, details)).encode()
        self.transport.write(b"HTTP/1.1 %s\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (status, len(body), body))
        self.loop.call_later(LINGER_SECONDS, self.transport.close)


def _cancelled(timer) -> None:
    if timer is not None:
        timer.cancel()


# What `uvicorn APP --loop uvloop --http httptools --ws websockets-sansio ...` sets, with heads bounded (BoundedHead).
# The live pages' sockets are one-way (the composer posts over HTTP): a frame
# from a browser larger than WS_MAX_BYTES closes its socket (1009) before it
# is buffered, where uvicorn would take 16 MiB.
WS_MAX_BYTES = 4096
OPTIONS = {"loop": "uvloop", "http": BoundedHead, "ws": "websockets-sansio", "ws_max_size": WS_MAX_BYTES,
           "lifespan": "on", "timeout_graceful_shutdown": 5, "access_log": False, "log_level": "warning",
           # Django reads proxy headers, and only with TRUST_PROXY_HEADERS: uvicorn's own default took
           # X-Forwarded-For and -Proto from any connection of loopback, a local proxy passing clients' through.
           "proxy_headers": False}
BEAT_SECONDS = 1.0


class Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, ready_fd: int) -> None:
        super().__init__(config)
        self.ready_fd = ready_fd
        self.beats: asyncio.Task | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)  # exits with status 3 if the application cannot start
        if self.started:
            os.set_blocking(self.ready_fd, False)  # a full pipe must never stop the loop
            self.beats = asyncio.create_task(self.beat())
        else:
            os.close(self.ready_fd)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """First, every waiter is told (controlplane.live.LogWatcher.close):
        long-polls answer and MCP streams send their final frame while their
        connections may still take it."""
        from controlplane.live import log_watcher

        log_watcher.close()
        await super().shutdown(sockets=sockets)

    async def beat(self) -> None:
        """b"1" now (it listens), and again every BEAT_SECONDS while the loop runs."""
        try:
            while True:
                with contextlib.suppress(BlockingIOError):  # serve reads them all at its next look
                    os.write(self.ready_fd, b"1")
                await asyncio.sleep(BEAT_SECONDS)
        except OSError:  # serve stopped reading: it is stopping this process too
            pass
        finally:
            os.close(self.ready_fd)


def main(socket_fd: int, ready_fd: int) -> None:
    os.set_inheritable(ready_fd, False)  # what the application starts must not hold serve's pipe
    # Every connection holds a file descriptor: as many as the system lets this
    # process have (systemd's soft limit is 1,024, its hard one far more).
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):  # (an unlimited hard limit cannot be a soft one)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    listening = socket.socket(fileno=socket_fd)  # family and type read from the descriptor
    Server(uvicorn.Config(APP, **OPTIONS), ready_fd).run(sockets=[listening])


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
