"""One uvicorn process of `serve`, on a listening socket `serve` made:
`python -m controlplane.uvicorn_process FD`.

`serve` binds one socket per server process, all in one SO_REUSEPORT group
(`controlplane.management.commands.serve.listening_sockets`), so the kernel
spreads new connections over the processes. uvicorn's own `--workers`
shares one socket: whichever process woke first accepted every connection
of a burst, and a client's keep-alive connections, made together, could all
land on one process while the other idled (docs/benchmarks.md, round
twenty-two). uvicorn's `--fd` takes its socket for a Unix one, so the socket
is handed to uvicorn's server directly, as its own workers get theirs.
"""
from __future__ import annotations

import socket
import sys

import uvicorn

APP = "controlplane.asgi:application"
# What `uvicorn APP --loop uvloop --http httptools --ws websockets-sansio ...` sets.
OPTIONS = {"loop": "uvloop", "http": "httptools", "ws": "websockets-sansio", "lifespan": "on",
           "timeout_graceful_shutdown": 5, "access_log": False, "log_level": "warning"}


def main(fd: int) -> None:
    listening = socket.socket(fileno=fd)  # family and type read from the descriptor
    uvicorn.Server(uvicorn.Config(APP, **OPTIONS)).run(sockets=[listening])


if __name__ == "__main__":
    main(int(sys.argv[1]))
