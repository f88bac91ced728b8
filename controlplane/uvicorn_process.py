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

Once it listens, the process writes a byte to READY_FD and closes it:
`serve` is ready when every one of its processes is, not when the first
one answers.
"""
from __future__ import annotations

import contextlib
import os
import socket
import sys

import uvicorn

APP = "controlplane.asgi:application"
# What `uvicorn APP --loop uvloop --http httptools --ws websockets-sansio ...` sets.
OPTIONS = {"loop": "uvloop", "http": "httptools", "ws": "websockets-sansio", "lifespan": "on",
           "timeout_graceful_shutdown": 5, "access_log": False, "log_level": "warning"}


class Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, ready_fd: int) -> None:
        super().__init__(config)
        self.ready_fd = ready_fd

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)  # exits with status 3 if the application cannot start
        if self.started:
            with contextlib.suppress(OSError):  # serve stopped waiting: it is stopping this process too
                os.write(self.ready_fd, b"1")
            os.close(self.ready_fd)


def main(socket_fd: int, ready_fd: int) -> None:
    listening = socket.socket(fileno=socket_fd)  # family and type read from the descriptor
    Server(uvicorn.Config(APP, **OPTIONS), ready_fd).run(sockets=[listening])


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
