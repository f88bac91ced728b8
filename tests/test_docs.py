"""The walk-throughs run as written.

Every ```sh block of the documents below runs in one bash shell per
document (`set -eo pipefail`), from a folder laid out like the checkout
(`.venv` and `manage.py` linked, `var/` its own), against a fresh `make run`
started with the settings `make receiver` prints. Each document's
expected-output comments (a `# …` line right after a command, `…` standing
for anything) must appear in its output, in order. The documents run in the
README's order on SQLite and in reverse on PostgreSQL, so CI, which runs the
suite on both, has every pair meet in both orders and every document run on
both databases (one order per database keeps the suite's time down).

The one rewrite: the default addresses (127.0.0.1:8000 for Switchboard,
localhost:8443 for the receiver) become free ports, so a developer's own
`make run` can keep running.
"""
from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
from pathlib import Path

import psycopg
import pytest
from django.conf import settings

from controlplane.processes import in_session
from tests.servers import ROOT, free_port, read_until
from tests.servers import test_database_url as suite_database_url  # not collected as a test

WALK_THROUGHS = ["docs/api.md", "docs/inbox.md", "docs/grants.md", "docs/tasks.md", "docs/collectives.md", "docs/webhooks.md", "docs/web.md"]
STEP_TIMEOUT = 120


def sh_blocks(document: str) -> list[str]:
    return re.findall(r"^```sh\n(.*?)^```", (ROOT / document).read_text(), flags=re.M | re.S)


def expected_outputs(block: str) -> list[str]:
    """`# …` lines that directly follow a command line: what it prints."""
    lines = block.splitlines()
    return [line[2:] for before, line in zip(lines, lines[1:])
            if line.startswith("# ") and before.strip() and not before.lstrip().startswith("#")]


def missing_output(expected: list[str], output: str) -> str | None:
    """The first expected line not found after the previous one, if any."""
    lines, at = output.splitlines(), 0
    for text in expected:
        pattern = re.compile(".*?".join(re.escape(part) for part in text.split("…")))
        while at < len(lines) and not pattern.search(lines[at]):
            at += 1
        if at == len(lines):
            return text
        at += 1
    return None


def fresh_database() -> tuple[str | None, callable]:
    """(DATABASE_URL, drop): a new PostgreSQL database beside the suite's when
    the suite runs on PostgreSQL, else None (make run's own SQLite file in
    the new var/)."""
    url = suite_database_url()
    if not url.startswith("postgres://"):
        return None, lambda: None
    server, name = url.rsplit("/", 1)
    name = f"{name}_walkthrough"

    def run(sql: str) -> None:
        with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
            conn.execute(sql)

    run(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    run(f'CREATE DATABASE "{name}"')
    return f"{server}/{name}", lambda: run(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def in_a_terminal() -> None:
    """A command started at a terminal's prompt: Ctrl-C at its default, even
    where the suite runs with it ignored (started in the background by a
    script), which its processes would inherit and never stop for."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupt(process: subprocess.Popen) -> None:
    """Ctrl-C, as a terminal sends it: to the whole foreground group."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGINT)
    process.wait(30)


@pytest.mark.parametrize("order", ["reverse" if settings.IS_POSTGRES else "readme"])
def test_every_walk_through_runs_as_written(order, tmp_path):
    # given: a checkout-like folder, `make receiver`, then `make run` with what it printed
    work = tmp_path / "checkout"
    (work / "var").mkdir(parents=True)
    for name in (".venv", "manage.py"):
        (work / name).symlink_to(ROOT / name)
    port, receiver_port = free_port(), free_port()
    base = f"http://127.0.0.1:{port}"
    database_url, drop_database = fresh_database()
    env = {k: v for k, v in os.environ.items()
           if k not in {"DEBUG", "SERVER_ADMIN_KEY", "DATABASE_URL", "DJANGO_SETTINGS_MODULE"}}
    env.update(SWITCHBOARD_VAR_DIR=str(work / "var"), SWITCHBOARD_BIND=f"127.0.0.1:{port}",
               SWITCHBOARD_PUBLIC_URL=base, **({"DATABASE_URL": database_url} if database_url else {}))
    receiver_args = f"--port {receiver_port} --dir {work / 'var' / 'receiver'} --switchboard {base}"
    receiver = subprocess.Popen(["make", "-s", "-C", str(ROOT), "receiver", f"RECEIVER_ARGS={receiver_args}"],
                                env=env, stdout=subprocess.PIPE, text=True, start_new_session=True,
                                preexec_fn=in_a_terminal)
    server = None
    try:
        printed = "".join(read_until(receiver, "Ctrl-C stops"))
        restart_with = shlex.split(re.search(r"^\s+(WEBHOOK_\S+.*) make run$", printed, re.M).group(1))
        env.update(item.split("=", 1) for item in restart_with)
        assert env["WEBHOOK_ALLOW_PRIVATE_NETWORKS"] == "1" and Path(env["WEBHOOK_CA_BUNDLE"]).is_file()
        server = subprocess.Popen(["make", "-s", "-C", str(ROOT), "run"], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                  preexec_fn=in_a_terminal)
        server_output = read_until(server, "Switchboard is serving at")
        assert "password:" in "".join(server_output)  # the first admin's, printed once
        documents = WALK_THROUGHS if order == "readme" else WALK_THROUGHS[::-1]
        for document in documents:
            blocks = sh_blocks(document)
            assert blocks, f"{document} has no sh block"
            script = "set -eo pipefail\n" + "\n".join(blocks)
            script = script.replace("127.0.0.1:8000", f"127.0.0.1:{port}").replace(
                "localhost:8443", f"localhost:{receiver_port}")
            # when
            result = subprocess.run(["bash", "-c", script], cwd=work, env=env, capture_output=True, text=True,
                                    timeout=STEP_TIMEOUT)
            # then
            output = result.stdout + result.stderr + "\n--- make run printed:\n" + "".join(server_output[-50:])
            assert result.returncode == 0, f"{document} failed:\n{output}"
            assert "Traceback" not in result.stdout + result.stderr, f"{document}:\n{output}"
            missing = missing_output([e for b in blocks for e in expected_outputs(b)], result.stdout)
            assert missing is None, f"{document}: expected {missing!r} in:\n{output}"
    finally:
        for process in (server, receiver):
            if process is not None:
                interrupt(process)
        drop_database()
    assert in_session(server.pid) == [] and in_session(receiver.pid) == []
