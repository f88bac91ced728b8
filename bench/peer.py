"""The peer product: matrix-synapse's sends/s beside Switchboard's, with the same
client and concurrency as bench/load.py's `send_load`.

Synapse (VERSION) is installed into its own virtualenv outside the repository
($SYNAPSE_VENV, default /tmp/switchboard-bench-synapse/venv, reused if it has it)
and runs as one process on a fresh PostgreSQL database `synapse_bench`, dropped
at the end. Its traffic stays on 127.0.0.1: no federation, key servers, stats,
URL previews, email or push; rate limits are out of reach. `clients` users (the
shared-secret admin registration API) share one public room; each sends one
~100-byte message at a time on its own keep-alive connection with
`PUT /_matrix/client/v3/rooms/{room}/send/m.room.message/{txnId}` (a unique txnId,
Matrix's Idempotency-Key). sends/s, p50/p99 and errors count the requests that
complete inside the measured window after the warm-up; beside them the Synapse
process's peak RSS and CPU. Run: `.venv/bin/python bench/peer.py --clients 16 --seconds 8`.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import hmac
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from urllib.parse import quote

ROOT = Path(__file__).resolve().parent.parent
# As in bench/run.py: run as a script, bench/ must not shadow installed packages.
sys.path[:] = [str(ROOT)] + [p for p in sys.path if Path(p or ".").resolve() not in (ROOT, ROOT / "bench")]

import aiohttp  # noqa: E402
import psycopg  # noqa: E402
from psycopg.conninfo import conninfo_to_dict  # noqa: E402

from bench.load import message_body, request_load  # noqa: E402
from bench.servers import MemorySampler, free_port, summarize_log  # noqa: E402

VERSION = "1.163.2"
DB_NAME = "synapse_bench"
SERVER_NAME = "bench.localhost"
DEFAULT_VENV = Path("/tmp/switchboard-bench-synapse/venv")
BASE_PYTHONS = ("/root/.pyenv/versions/3.11.7/bin/python", "python3.11")
START_TIMEOUT = 120.0
STOP_TIMEOUT = 10.0
UNLIMITED = {"per_second": 1_000_000, "burst_count": 1_000_000}
RATE_LIMITS = {**dict.fromkeys(("rc_message", "rc_registration", "rc_registration_token_validity", "rc_admin_redaction",
                                "rc_joins_per_room", "rc_key_requests", "rc_3pid_validation", "rc_third_party_invite",
                                "rc_media_create", "rc_delayed_event_mgmt", "rc_room_creation", "rc_reports",
                                "rc_user_directory", "rc_profile"), UNLIMITED),
               "rc_login": dict.fromkeys(("address", "account", "failed_attempts"), UNLIMITED),
               "rc_joins": dict.fromkeys(("local", "remote"), UNLIMITED), "rc_presence": {"per_user": UNLIMITED},
               "rc_invites": dict.fromkeys(("per_room", "per_user", "per_issuer"), UNLIMITED)}
DROP_DB = f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)"
CREATE_DB = f"CREATE DATABASE {DB_NAME} ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"


# --- the virtualenv and the database ------------------------------------------------

def ensure_venv(venv: Path, log: Path) -> dict:
    """Synapse VERSION in `venv`, installed from PyPI unless already there."""
    python = venv / "bin" / "python"
    if python.exists() and any(venv.glob(f"lib/python*/site-packages/matrix_synapse-{VERSION}.dist-info")):
        return {"venv": str(venv), "reused": True, "install_seconds": 0.0}
    started = time.monotonic()
    base = next((p for p in BASE_PYTHONS if shutil.which(p)), BASE_PYTHONS[-1])
    with open(log, "wb") as out:
        for argv in ([base, "-m", "venv", str(venv)],
                     [str(python), "-m", "pip", "install", f"matrix-synapse=={VERSION}", "psycopg2-binary"]):
            subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, check=True, timeout=900)
    return {"venv": str(venv), "reused": False, "install_seconds": round(time.monotonic() - started, 1)}


def admin_sql(dsn_admin: str, *statements: str) -> None:
    with psycopg.connect(dsn_admin, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


# --- the homeserver ----------------------------------------------------------------

def write_config(workdir: Path, port: int, dsn_admin: str, secret: str, log_path: Path) -> Path:
    """homeserver.yaml (written as JSON, which YAML reads) and its logging config."""
    pg = conninfo_to_dict(dsn_admin)
    seed = base64.b64encode(secrets.token_bytes(32)).decode().rstrip("=")
    (workdir / "signing.key").write_text(f"ed25519 a_bench {seed}\n")
    (workdir / "log.yaml").write_text(json.dumps({
        "version": 1, "disable_existing_loggers": False,
        "formatters": {"plain": {"format": "%(asctime)s %(name)s %(levelname)s %(message)s"}},
        "handlers": {"file": {"class": "logging.FileHandler", "filename": str(log_path), "formatter": "plain"}},
        "root": {"level": "WARNING", "handlers": ["file"]}}))
    config = {
        "server_name": SERVER_NAME, "public_baseurl": f"http://127.0.0.1:{port}/",
        "pid_file": str(workdir / "homeserver.pid"), "signing_key_path": str(workdir / "signing.key"),
        "media_store_path": str(workdir / "media"), "log_config": str(workdir / "log.yaml"),
        # The client API (with /_synapse/admin) on loopback; no federation or metrics listener.
        "listeners": [{"port": port, "bind_addresses": ["127.0.0.1"], "type": "http", "tls": False,
                       "x_forwarded": False, "resources": [{"names": ["client"], "compress": False}]}],
        "database": {"name": "psycopg2", "args": {  # Synapse's default pool, 5 to 10 connections
            "user": pg.get("user", "postgres"), "host": pg.get("host", "127.0.0.1"), "port": int(pg.get("port", 5432)),
            "dbname": DB_NAME, "cp_min": 5, "cp_max": 10}},
        # Nothing leaves the machine: no federation, key servers, stats, previews, email or push.
        "federation_domain_whitelist": [], "trusted_key_servers": [], "suppress_key_server_warning": True,
        "report_stats": False, "enable_metrics": False, "url_preview_enabled": False, "push": {"enabled": False},
        "enable_registration": False, "registration_shared_secret": secret, "bcrypt_rounds": 4,
        "macaroon_secret_key": secrets.token_hex(32), "form_secret": secrets.token_hex(32), **RATE_LIMITS}
    (path := workdir / "homeserver.yaml").write_text(json.dumps(config, indent=1))
    return path


def wait_ready(proc: subprocess.Popen, base_url: str, stderr_path: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"synapse exited with {proc.returncode}; see {stderr_path}")
        try:
            with urllib.request.urlopen(f"{base_url}/_matrix/client/versions", timeout=2):
                return  # urlopen raises on anything but 2xx
        except OSError:  # URLError, refused, timed out
            pass
        time.sleep(0.2)
    raise RuntimeError(f"synapse did not answer /_matrix/client/versions within {START_TIMEOUT:.0f} s")


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to its process group, SIGKILL after STOP_TIMEOUT."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=STOP_TIMEOUT)
    except ProcessLookupError:
        pass


# --- users, the room and the load ------------------------------------------------------

async def call(session: aiohttp.ClientSession, method: str, url: str, token: str | None = None,
               body: dict | None = None) -> dict:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with session.request(method, url, headers=headers, json=body) as r:
        if r.status != 200:
            raise RuntimeError(f"{method} {url}: {r.status} {(await r.text())[:300]}")
        return await r.json()


async def prepare(base_url: str, secret: str, names: list[str], run_id: str) -> tuple[list[str], str]:
    """A user for each name, made with the shared secret, and one public room they all joined."""
    tokens, register = [], f"{base_url}/_synapse/admin/v1/register"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        for name in names:
            nonce, password = (await call(session, "GET", register))["nonce"], secrets.token_hex(8)
            mac = hmac.new(secret.encode(), b"\x00".join(s.encode() for s in (nonce, name, password, "notadmin")),
                           hashlib.sha1).hexdigest()
            body = {"nonce": nonce, "username": name, "password": password, "admin": False, "mac": mac}
            tokens.append((await call(session, "POST", register, body=body))["access_token"])
        room = (await call(session, "POST", f"{base_url}/_matrix/client/v3/createRoom", tokens[0],
                           {"preset": "public_chat", "name": f"bench {run_id}"}))["room_id"]
        for token in tokens[1:]:
            await call(session, "POST", f"{base_url}/_matrix/client/v3/join/{quote(room, safe='')}", token, {})
    return tokens, room


async def send_load(base_url: str, room: str, tokens: list[str], handles: list[str], *, clients: int,
                    warmup: float, seconds: float, run_id: str) -> dict:
    """bench.load's loop and counting, with Matrix's send request."""
    url = f"{base_url}/_matrix/client/v3/rooms/{quote(room, safe='')}/send/m.room.message"

    def request(i: int, n: int) -> tuple[str, str, dict, str]:
        headers = {"Authorization": f"Bearer {tokens[i % len(tokens)]}", "Content-Type": "application/json"}
        body = json.dumps({"msgtype": "m.text", "body": message_body(i, n, handles)})
        return "PUT", f"{url}/bench-{run_id}-{i}-{n}", headers, body

    result = await request_load(request, clients=clients, warmup=warmup, seconds=seconds, ok="200")
    return {**result, "idempotency_keys": "txnId"}


def run(dsn_admin: str, out_dir: Path, *, clients: int, warmup: float, seconds: float) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    venv = Path(os.environ.get("SYNAPSE_VENV") or DEFAULT_VENV)
    result: dict = {"product": "matrix-synapse", "version": VERSION, **ensure_venv(venv, out_dir / "peer-install.log")}
    port, secret, run_id = free_port(), secrets.token_hex(16), secrets.token_hex(4)
    base_url = f"http://127.0.0.1:{port}"
    log_path, stderr_path = out_dir / "peer-synapse.log", out_dir / "peer-synapse.stderr.log"
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"}}
    workdir = Path(tempfile.mkdtemp(prefix="synapse-bench-"))
    admin_sql(dsn_admin, DROP_DB, CREATE_DB)
    proc = None
    try:
        config = write_config(workdir, port, dsn_admin, secret, log_path)
        started = time.monotonic()
        with open(stderr_path, "wb") as err:
            proc = subprocess.Popen([str(venv / "bin" / "python"), "-m", "synapse.app.homeserver", "-c", str(config)],
                                    cwd=workdir, env=env, stdout=err, stderr=err, stdin=subprocess.DEVNULL,
                                    start_new_session=True)  # its own process group, for stop()
        wait_ready(proc, base_url, stderr_path)
        result["startup_seconds"] = round(time.monotonic() - started, 2)
        started = time.monotonic()
        names = [f"bench-{i}" for i in range(clients)]
        tokens, room = asyncio.run(prepare(base_url, secret, names, run_id))
        result["setup_seconds"] = round(time.monotonic() - started, 2)
        sampler = MemorySampler(proc.pid)
        sampler.start()
        try:
            result["sends"] = asyncio.run(send_load(base_url, room, tokens, names, clients=clients,
                                                    warmup=warmup, seconds=seconds, run_id=run_id))
        finally:
            memory = sampler.stop()
        main = next((m for m in memory if m["role"] == "main"), {})
        result.update(processes=memory, peak_rss_mib=main.get("peak_rss_mib"), cpu_seconds=main.get("cpu_seconds"),
                      cpu_percent=round(100 * main.get("cpu_seconds", 0) / (warmup + seconds), 1))
    finally:
        if proc is not None:
            stop(proc)
        admin_sql(dsn_admin, DROP_DB)
        shutil.rmtree(workdir, ignore_errors=True)
    text = "".join(p.read_text(errors="replace") for p in (log_path, stderr_path) if p.exists())
    result["server_log"] = {**summarize_log(text), "files": [str(log_path), str(stderr_path)]}
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=16, help="concurrent clients, one user each (default 16)")
    p.add_argument("--seconds", type=float, default=8.0, help="measured seconds (default 8)")
    p.add_argument("--warmup", type=float, default=1.0, help="warm-up seconds before the measurement (default 1)")
    p.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres",
                   help="PostgreSQL connection that may create and drop databases")
    args = p.parse_args(argv)
    if args.clients < 1 or args.seconds <= 0 or args.warmup < 0:
        p.error("--clients and --seconds must be positive, --warmup not negative")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop synapse and drop the database on the way out
    out_dir = ROOT / "bench" / "results" / (time.strftime("%Y%m%d-%H%M%S") + "-peer")
    result = run(args.dsn, out_dir, clients=args.clients, warmup=args.warmup, seconds=args.seconds)
    (out_dir / "peer.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
