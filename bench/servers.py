"""Server setups under test: start one as a subprocess on a free loopback
port, wait for `GET /healthz`, sample the resident memory of every process
in its tree while it runs, stop it, and summarize what it wrote to stderr.

Nothing here measures throughput; see bench/load.py and bench/feeds.py.
"""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from controlplane.processes import descendants, in_session, kill_all

ROOT = Path(__file__).resolve().parent.parent
PY = str(ROOT / ".venv" / "bin" / "python")
START_TIMEOUT = 60.0
STOP_TIMEOUT = 10.0
SAMPLE_INTERVAL = 0.1

# name -> argv with {port}; the commands are those documented in bench/README.md.
SETUPS: dict[str, list[str]] = {
    # What `manage.py serve` starts by default (the HTTP server and the worker cluster).
    "serve": [PY, str(ROOT / "manage.py"), "serve", "--bind", "127.0.0.1:{port}"],
    "daphne-1": [PY, "-m", "daphne", "-b", "127.0.0.1", "-p", "{port}", "controlplane.asgi:application"],
    "uvicorn-2w": [PY, "-m", "uvicorn", "controlplane.asgi:application", "--host", "127.0.0.1", "--port", "{port}",
                   "--workers", "2", "--no-access-log", "--log-level", "warning"],
    # Not one of the required setups: shows what --workers costs uvicorn
    # (see bench/README.md, "uvicorn and TCP_NODELAY").
    "uvicorn-1w": [PY, "-m", "uvicorn", "controlplane.asgi:application", "--host", "127.0.0.1", "--port", "{port}",
                   "--no-access-log", "--log-level", "warning"],
    # uvicorn with its fast parts named (uvloop, httptools, websockets), and granian (Rust HTTP, ASGI).
    "uvicorn-fast-2w": [PY, "-m", "uvicorn", "controlplane.asgi:application", "--host", "127.0.0.1", "--port",
                        "{port}", "--workers", "2", "--loop", "uvloop", "--http", "httptools", "--ws", "websockets-sansio",
                        "--no-access-log", "--log-level", "warning"],
    "granian-1w": [PY, "-m", "granian", "--interface", "asgi", "--host", "127.0.0.1", "--port", "{port}",
                   "--loop", "uvloop", "--log-level", "warning", "--no-access-log", "controlplane.asgi:application"],
    "granian-2w": [PY, "-m", "granian", "--interface", "asgi", "--host", "127.0.0.1", "--port", "{port}",
                   "--workers", "2", "--loop", "uvloop", "--log-level", "warning", "--no-access-log",
                   "controlplane.asgi:application"],
    "gunicorn-2w": [PY, "-m", "gunicorn", "controlplane.wsgi:application", "-b", "127.0.0.1:{port}", "-w", "2",
                    "--log-level", "warning"],
    "gunicorn-4w": [PY, "-m", "gunicorn", "controlplane.wsgi:application", "-b", "127.0.0.1:{port}", "-w", "4",
                    "--log-level", "warning"],
}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _status_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of `pid` in KiB ({} once it is gone)."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    key, value = line.split(":", 1)
                    out[key] = int(value.split()[0])
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return out


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU time `pid` has used so far."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def process_tree(root: int) -> list[int]:
    """`root` and all its descendants."""
    return [root, *descendants(root)]


@dataclass
class MemorySampler:
    """Peak VmRSS per process of a tree, sampled every SAMPLE_INTERVAL between
    start() and stop(); VmHWM (the kernel's own peak) and the CPU time each
    process used in between are kept beside it."""

    root: int
    peak_rss_kib: dict[int, int] = field(default_factory=dict)
    hwm_kib: dict[int, int] = field(default_factory=dict)
    cmdlines: dict[int, str] = field(default_factory=dict)
    cpu_first: dict[int, float] = field(default_factory=dict)
    cpu_last: dict[int, float] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def sample(self) -> None:
        for pid in process_tree(self.root):
            status = _status_kib(pid)
            if not status:
                continue
            self.cmdlines.setdefault(pid, _cmdline(pid))
            self.peak_rss_kib[pid] = max(self.peak_rss_kib.get(pid, 0), status.get("VmRSS", 0))
            self.hwm_kib[pid] = max(self.hwm_kib.get(pid, 0), status.get("VmHWM", 0))
            cpu = _cpu_seconds(pid)
            if cpu is not None:
                self.cpu_first.setdefault(pid, cpu)
                self.cpu_last[pid] = cpu

    def start(self) -> None:
        for table in (self.peak_rss_kib, self.hwm_kib, self.cpu_first, self.cpu_last):
            table.clear()
        self._stop.clear()

        def loop() -> None:
            deadline = time.monotonic() + 3600  # bounded even if stop() is never called
            while not self._stop.is_set() and time.monotonic() < deadline:
                self.sample()
                self._stop.wait(SAMPLE_INTERVAL)

        self._thread = threading.Thread(target=loop, name="rss-sampler", daemon=True)
        self._thread.start()

    def _role(self, pid: int) -> str:
        if pid == self.root:
            return "main"
        return "helper" if "resource_tracker" in self.cmdlines.get(pid, "") else "worker"

    def stop(self) -> list[dict]:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
        self.sample()
        return [{"pid": pid, "role": self._role(pid),
                 "peak_rss_mib": round(kib / 1024, 1), "vm_hwm_mib": round(self.hwm_kib.get(pid, 0) / 1024, 1),
                 "cpu_seconds": round(self.cpu_last.get(pid, 0) - self.cpu_first.get(pid, 0), 2),
                 "cmdline": self.cmdlines.get(pid, "")[:200]}
                for pid, kib in sorted(self.peak_rss_kib.items())]


TRACEBACK_HEAD = "Traceback (most recent call last):"
CHAIN_LINES = ("The above exception was the direct cause", "During handling of the above exception")
LOG_LINE_RE = re.compile(r"\b(WARNING|ERROR|CRITICAL)\b")


def tracebacks(text: str) -> list[str]:
    """Every traceback in `text`, a chained one ("The above exception…",
    "During handling…") counted once, ending at its final exception line."""
    lines, blocks, i = text.splitlines(), [], 0
    while i < len(lines):
        if lines[i] != TRACEBACK_HEAD:
            i += 1
            continue
        start = i
        while True:
            i += 1
            while i < len(lines) and lines[i].startswith((" ", "\t")):
                i += 1
            final = i  # the exception line of this part of the chain
            j = final + 1
            while j < len(lines) and not lines[j].strip():
                j += 1
            if j < len(lines) and lines[j].startswith(CHAIN_LINES):
                j += 1
                while j < len(lines) and not lines[j].strip():
                    j += 1
                if j < len(lines) and lines[j] == TRACEBACK_HEAD:
                    i = j
                    continue
            break
        blocks.append("\n".join(lines[start: final + 1]))
        i = final + 1
    return blocks


def summarize_log(text: str, limit: int = 2) -> dict:
    """What a server wrote to stderr: tracebacks (by final exception line),
    WARNING/ERROR log lines (digits masked, so repeats group), and the first
    few full tracebacks."""
    blocks = tracebacks(text)
    exceptions: dict[str, int] = {}
    for block in blocks:
        final = block.splitlines()[-1][:300]
        exceptions[final] = exceptions.get(final, 0) + 1
    log_lines: dict[str, int] = {}
    for line in text.splitlines():
        if LOG_LINE_RE.search(line) and not line.startswith((" ", "\t")):
            key = re.sub(r"\d+", "#", re.sub(r"\?\S*", "?…", line))[:200]
            log_lines[key] = log_lines.get(key, 0) + 1
    return {
        "tracebacks": len(blocks),
        "internal_server_errors": len(re.findall(r"Internal Server Error|unhandled error in API view|"
                                                 r"Error handling request", text)),
        "exceptions": exceptions,
        "log_lines": log_lines,
        "examples": blocks[:limit],
        "bytes": len(text),
    }


class Server:
    """One server setup as a context manager: started, healthy, then stopped."""

    def __init__(self, name: str, env: dict[str, str], log_dir: Path, phase: str):
        self.name = name
        self.port = free_port()
        self.argv = [a.replace("{port}", str(self.port)) for a in SETUPS[name]]
        self.env = env
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.stdout_path = log_dir / f"{phase}-{name}.stdout.log"
        self.stderr_path = log_dir / f"{phase}-{name}.stderr.log"
        self.proc: subprocess.Popen | None = None
        self.memory: MemorySampler | None = None
        self.startup_seconds: float | None = None

    def __enter__(self) -> "Server":
        self.stdout_path.parent.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            # A new session makes the server its own process group, so stopping
            # it reaches its workers and nothing else.
            self.proc = subprocess.Popen(self.argv, cwd=ROOT, env=self.env, stdout=out, stderr=err,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = round(time.monotonic() - started, 2)
        self.memory = MemorySampler(self.proc.pid)
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; see {self.stderr_path}")
            try:
                with urllib.request.urlopen(f"{self.base_url}/healthz", timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} did not answer /healthz within {START_TIMEOUT:.0f} s")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        sid = self.proc.pid  # the session this server leads (start_new_session)
        try:
            os.killpg(sid, signal.SIGTERM)
            self.proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(sid, signal.SIGKILL)
            self.proc.wait(timeout=STOP_TIMEOUT)
        except ProcessLookupError:
            pass
        # What outlived its parent (serve's children lead groups of their own): still in our session.
        kill_all(lambda: in_session(sid))

    def log_summary(self) -> dict:
        text = self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""
        return {**summarize_log(text), "stderr": str(self.stderr_path.relative_to(ROOT))}
