"""The matrix's own PostgreSQL cluster, which it can crash-restart."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from controlplane.cluster import free_port


def _pg_bin(name: str) -> str:
    found = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))
    return str(found[-1]) if found else name


class Postgres:
    """A throwaway PostgreSQL cluster; `restart` is a crash (immediate stop)."""

    def __init__(self, work: Path):
        self.dir, self.port = work / "pg", free_port()
        self.log = self.dir / "log"  # the server's own (a deadlock's detail names both statements)
        self.as_owner = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def _run(self, *argv: str) -> None:
        subprocess.run([*self.as_owner, *argv], check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c max_connections=300"
        self._run(_pg_bin("pg_ctl"), "-D", str(self.dir / "data"), "-o", options, "-l", str(self.log),
                  "-w", "-t", "60", "start")

    def init(self) -> str:
        self.dir.mkdir()
        if self.as_owner:
            shutil.chown(self.dir, "postgres")
        self._run(_pg_bin("initdb"), "-D", str(self.dir / "data"), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        self.start()
        self._run(_pg_bin("createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "chaos")
        return f"postgres://postgres@127.0.0.1:{self.port}/chaos"

    def crash_restart(self) -> None:
        self._run(_pg_bin("pg_ctl"), "-D", str(self.dir / "data"), "-m", "immediate", "-w", "stop")
        self.start()

    def stop(self) -> None:
        subprocess.run([*self.as_owner, _pg_bin("pg_ctl"), "-D", str(self.dir / "data"), "-m", "immediate",
                        "-w", "stop"], capture_output=True, timeout=60)


