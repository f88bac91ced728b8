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
import os
import socket
import sys

import uvicorn

APP = "controlplane.asgi:application"
# What `uvicorn APP --loop uvloop --http httptools --ws websockets-sansio ...` sets.
# The live pages' sockets are one-way (the composer posts over HTTP): a frame
# from a browser larger than WS_MAX_BYTES closes its socket (1009) before it
# is buffered, where uvicorn would take 16 MiB.
WS_MAX_BYTES = 4096
OPTIONS = {"loop": "uvloop", "http": "httptools", "ws": "websockets-sansio", "ws_max_size": WS_MAX_BYTES,
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
    listening = socket.socket(fileno=socket_fd)  # family and type read from the descriptor
    Server(uvicorn.Config(APP, **OPTIONS), ready_fd).run(sockets=[listening])


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
