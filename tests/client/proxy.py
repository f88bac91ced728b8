"""A real TCP proxy on 127.0.0.1 in front of a server, which can lose
answers: the request reaches the server, the server answers, and the
proxy drops the connection instead of passing the answer on (what a
crashed load balancer or a cut network does after the work was done)."""
from __future__ import annotations

import re
import socket
import threading
from dataclasses import dataclass, field


@dataclass
class LossyProxy:
    upstream: tuple[str, int]
    drop_answers: int = 0  # how many connections lose their first answer
    requests: list[bytes] = field(default_factory=list)  # the head of each request seen
    port: int = 0

    def __post_init__(self):
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def idempotency_keys(self) -> list[str]:
        return [m.group(1).decode() for head in self.requests
                if (m := re.search(rb"(?im)^idempotency-key: *(\S+)", head))]

    def _accept(self):
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                drop = self.drop_answers > 0
                self.drop_answers -= drop
            threading.Thread(target=self._serve, args=(client, drop), daemon=True).start()

    def _serve(self, client: socket.socket, drop: bool):
        upstream = socket.create_connection(self.upstream)
        answered = threading.Event()

        def forward_answers():
            try:
                while data := upstream.recv(65536):
                    answered.set()
                    if drop:
                        break  # the server answered: lose it
                    client.sendall(data)
            except OSError:
                pass
            finally:
                for s in (client, upstream):
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    s.close()

        threading.Thread(target=forward_answers, daemon=True).start()
        try:
            while data := client.recv(65536):
                if re.match(rb"[A-Z]+ /", data):
                    self.requests.append(data.split(b"\r\n\r\n", 1)[0])
                upstream.sendall(data)
        except OSError:
            pass

    def close(self):
        self._listener.close()
