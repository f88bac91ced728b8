"""The apps are layered (docs/architecture.md, "Layers"): each imports only
the apps below it, so the import graph between apps has no cycle.

Every import counts, including those inside functions, and so does a
string naming another app's module ("webhooks.tasks.deliver" handed to a
task queue is a dependency too). The composition root (settings, urls,
asgi, wsgi, the socket routing) wires every app together and is exempt;
migrations are generated and exempt.
"""
from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APPS = ["controlplane", "inbox", "grants", "coordination", "webhooks", "web", "mcp_endpoint"]
COMPOSITION_ROOT = {"controlplane/settings.py", "controlplane/urls.py", "controlplane/asgi.py",
                    "controlplane/wsgi.py", "web/routing.py"}
# What each app may import: the diagram in docs/architecture.md.
ALLOWED = {
    "controlplane": set(),
    "inbox": {"controlplane"},
    "grants": {"controlplane", "inbox"},
    "coordination": {"controlplane", "inbox"},
    "webhooks": {"controlplane", "inbox", "coordination"},
    "web": {"controlplane", "inbox", "grants", "coordination", "webhooks"},
    "mcp_endpoint": {"controlplane", "inbox", "grants", "coordination", "webhooks"},
}
DOTTED = re.compile(rf"^({'|'.join(APPS)})\.([a-z_]+)(\.[a-z_]+)*$")


def _names_a_module(text: str) -> str | None:
    """The app a dotted string names a module of ("inbox.tasks.x"), if any."""
    match = DOTTED.match(text)
    if match is None:
        return None
    app, first = match.group(1), match.group(2)
    return app if (ROOT / app / f"{first}.py").exists() or (ROOT / app / first).is_dir() else None


def _dependencies(source: str) -> list[tuple[str, int, str]]:
    """(app, line, what) for every import and module-naming string."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if app := _names_a_module(node.value):
                found.append((app, node.lineno, repr(node.value)))
            continue
        for name in names:
            if name.split(".")[0] in APPS:
                found.append((name.split(".")[0], node.lineno, name))
    return found


def import_graph() -> dict[tuple[str, str], list[str]]:
    """(from app, to app) → where, over every module of every app."""
    graph: dict[tuple[str, str], list[str]] = defaultdict(list)
    for app in APPS:
        for path in sorted((ROOT / app).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if relative in COMPOSITION_ROOT or "/migrations/" in relative:
                continue
            for target, line, what in _dependencies(path.read_text()):
                if target != app:
                    graph[(app, target)].append(f"{relative}:{line} {what}")
    return graph


def _cycle(edges: set[tuple[str, str]]) -> list[str] | None:
    """One cycle among `edges`, as the apps along it, or None."""
    following = defaultdict(set)
    for a, b in edges:
        following[a].add(b)
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(app: str, path: list[str]) -> list[str] | None:
        state[app] = 1
        for nxt in sorted(following[app]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt, path + [nxt])):
                return found
        state[app] = 2
        return None

    for app in sorted(following):
        if app not in state and (found := visit(app, [app])):
            return found
    return None


def test_the_finder_sees_imports_in_functions_and_module_strings():
    # given: a module with a top-level import, one inside a function and a task path
    source = ("from inbox.models import Message\n"
              "def f():\n    from webhooks import outbox\n"
              "    kick('grants.tasks.expire_and_recover')\n"
              "    send('inbox.available')\n")
    # when / then: all three dependencies are found; a message type is no module
    assert [(app, line) for app, line, _ in _dependencies(source)] == [("inbox", 1), ("webhooks", 3), ("grants", 4)]


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({("a", "b"), ("b", "c"), ("c", "a")}) == ["a", "b", "c", "a"]
    assert _cycle({("a", "b"), ("b", "c"), ("a", "c")}) is None


def test_no_cycle_between_apps():
    graph = import_graph()
    cycle = _cycle(set(graph))
    assert cycle is None, "import cycle between apps: " + " → ".join(cycle) + "\n" + "\n".join(
        f"{a} → {b}: {where[0]}" for (a, b), where in graph.items() if a in cycle and b in cycle)


def test_each_app_imports_only_the_apps_below_it():
    # given: the documented layering
    assert _cycle({(a, b) for a, below in ALLOWED.items() for b in below}) is None
    # when
    graph = import_graph()
    # then
    breaches = [f"{a} → {b}: {', '.join(where)}" for (a, b), where in sorted(graph.items()) if b not in ALLOWED[a]]
    assert not breaches, "\n".join(breaches)


WALL_CLOCK = re.compile(r"\btime\.time\(|\bdatetime\.now\(|\bdt\.datetime\.now\(|\btimezone\.now\(|\bdate\.today\(")


def test_only_the_clock_reads_the_time_of_day():
    # given: every app module but the clock itself and the stand-alone example receiver
    exempt = {"controlplane/clock.py", "webhooks/example_receiver.py"}
    # when
    readers = [f"{path.relative_to(ROOT)}:{n}" for app in APPS for path in sorted((ROOT / app).rglob("*.py"))
               if path.relative_to(ROOT).as_posix() not in exempt and "/migrations/" not in path.as_posix()
               for n, line in enumerate(path.read_text().splitlines(), 1) if WALL_CLOCK.search(line)]
    # then: controlplane.clock.now()/timestamp() are the clock tests can move
    assert not readers, readers


def test_the_web_processes_load_no_http_client_and_no_mcp_sdk_until_they_need_them():
    # The ASGI application (every app, the admin, the URL rules) imports the
    # URL rules (webhooks.destinations), not aiohttp: about 7 MiB per web
    # process that never verifies an endpoint; and the MCP endpoint loads
    # the SDK at its first request, not at import: about 27 MiB per process
    # that never serves /mcp (docs/benchmarks.md, rounds four and five).
    import os
    import subprocess
    import sys

    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "controlplane.settings", "DEBUG": "1"}
    script = ("import sys, controlplane.asgi; from django.urls import get_resolver; get_resolver().url_patterns; "
              "print(sorted({m.split('.')[0] for m in sys.modules} & {'aiohttp', 'mcp', 'mcp_types'}))")
    loaded = subprocess.run([sys.executable, "-c", script],
                            cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]"


def test_the_fault_matrix_reads_the_settings_only_once_it_has_set_its_environment():
    # The settings module reads the environment when it is imported: imported
    # with the serve command (for one helper), the fault matrix's driver read
    # the default SQLite database before it set its PostgreSQL one.
    import subprocess
    import sys

    script = "import sys, bench.chaos.run; print('controlplane.settings' in sys.modules)"
    loaded = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.strip()
    assert loaded == "False"


def test_the_web_processes_load_no_schema_generator_nor_unused_renderers_until_asked():
    # drf-spectacular's generator imports django.test and unittest: 3 MiB of
    # every process (docs/benchmarks.md, round sixteen). The views' schema
    # annotations wait for it (controlplane.api.schema); the schema still has
    # them (tests/client/test_routes.py reads their operation ids).
    import os
    import subprocess
    import sys

    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "controlplane.settings", "DEBUG": "1"}
    watched = "('unittest', 'django.test', 'drf_spectacular.openapi', 'drf_spectacular.generators', 'yaml', 'pygments')"
    script = ("import sys, controlplane.asgi; from django.urls import get_resolver; get_resolver().url_patterns; "
              f"print(sorted(m for m in {watched} if m in sys.modules)); "
              "from django.test import Client; status = Client().get('/v0/schema/').status_code; "
              f"print(status, sorted(m for m in {watched} if m in sys.modules))")
    served, asked = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                                   check=True).stdout.strip().splitlines()
    assert served == "[]"
    # and: the schema's YAML renderer loads PyYAML when asked (controlplane.apps hides it
    # from Django REST framework's compatibility module only)
    assert asked == "200 ['django.test', 'drf_spectacular.generators', 'drf_spectacular.openapi', 'unittest', 'yaml']"


def test_the_mcp_endpoint_loads_the_sdks_server_modules_without_its_client_or_framework():
    # The SDK's package __init__ files import its client and its MCPServer
    # framework: a few MiB of every process that serves /mcp
    # (mcp_endpoint.sdk). A later import of those names still works. The
    # arguments' schemas are compiled by fastjsonschema (mcp_endpoint.schemas):
    # jsonschema would cost about 3 MiB more.
    import os
    import subprocess
    import sys

    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "controlplane.settings", "DEBUG": "1"}
    script = ("import sys, django; django.setup(); from mcp_endpoint.endpoint import mcp_endpoint; "
              "mcp_endpoint._new_manager(); from mcp_endpoint import events, tools; "
              "print(sorted(m for m in sys.modules if m.startswith(('mcp.client', 'mcp.server.mcpserver', "
              "'jsonschema')))); "
              "from mcp import Client; import mcp.server, mcp.types; "
              "print(Client.__module__, mcp.server.MCPServer.__module__, mcp.types.Tool.__name__)")
    lean, later = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                                 check=True).stdout.strip().splitlines()
    assert lean == "[]"
    assert later == "mcp.client.client mcp.server.mcpserver.server Tool"
