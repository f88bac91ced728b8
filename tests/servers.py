"""Real server processes for end-to-end tests: `manage.py serve` on a free
loopback port, against the test database."""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
from django.conf import settings
from django.db import connection

from controlplane.processes import in_session, kill_all

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_database_url() -> str:
    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{db['NAME']}"
    user = db.get("USER") or "postgres"
    return f"postgres://{user}@{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}/{db['NAME']}"


def cut_every_database_connection() -> None:
    """Terminate every other session of the test database (PostgreSQL), as a
    database restart or failover does to the processes using it."""
    import psycopg

    params = connection.get_connection_params()
    with psycopg.connect(host=params.get("host"), port=params.get("port"), user=params.get("user"),
                         dbname=params["dbname"], autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                      "WHERE datname = current_database() AND pid <> pg_backend_pid()")


def server_env(**extra) -> dict:
    env = {**os.environ, "DATABASE_URL": test_database_url(), "DEBUG": "1",
           "SERVER_ADMIN_KEY": settings.SERVER_ADMIN_KEY, "RATE_LIMIT_PER_MINUTE": "0"}
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)  # set for browser tests' own process only
    env.update({k: str(v) for k, v in extra.items()})
    return env


def manage(*args, input: str | None = None, **env) -> str:
    result = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=server_env(**env), input=input,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def member_token(handle: str, *, kind: str = "agent", admin: bool = False, password: str | None = None) -> str:
    """A member and a bearer token for it, made in this process against the
    servers' database: what `createmember` and `issuecredential` do (their
    own test runs them), without starting two interpreters per member."""
    from controlplane import bearer, services

    member = services.create_member(handle, kind=kind, is_admin=admin, password=password, actor=None)
    return bearer.issue_credential(member, actor=None)[1]


def start_serving(*args, port: int | None = None, stderr=None, **env) -> subprocess.Popen:
    """`manage.py serve` on a free port (or `port`, to start a server again
    where its clients left it), in a session of its own (so that the tests
    can find everything it started); `.base_url` is its address. `stderr`:
    a file for its log (else the test run's)."""
    port = port or free_port()
    process = subprocess.Popen([sys.executable, "manage.py", "serve", "--bind", f"127.0.0.1:{port}", *args],
                               cwd=ROOT, env=server_env(**env), stdout=subprocess.PIPE, stderr=stderr, text=True,
                               start_new_session=True)
    process.base_url = f"http://127.0.0.1:{port}"
    return process


def read_until(process: subprocess.Popen, marker: str) -> list[str]:
    """The lines `process` printed up to `marker`; the rest keeps being read
    into the same list (a full pipe would stall the process)."""
    seen = []
    for line in process.stdout:
        seen.append(line)
        if marker in line:
            threading.Thread(target=lambda: seen.extend(process.stdout), daemon=True).start()
            return seen
    raise AssertionError(f"exited before printing {marker!r}:\n{''.join(seen)}")


@contextlib.contextmanager
def serving(*args, port: int | None = None, stderr=None, **env):
    """`manage.py serve` until the block ends; yields its base URL."""
    process = start_serving(*args, port=port, stderr=stderr, **env)
    base = process.base_url
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, "serve exited early"
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "serve did not become ready"
            time.sleep(0.1)
        yield base, process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                kill_all(lambda: in_session(process.pid))
                process.wait()


def left_behind(process) -> list[int]:
    """What is still running of `serve`'s session (the test starts it in a
    session of its own), however deep or re-parented: within a few seconds."""
    deadline = time.monotonic() + 10
    while (alive := in_session(process.pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive
