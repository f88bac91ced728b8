"""The `mcp` SDK's server modules, loaded without the SDK's package
`__init__` files.

`mcp/__init__.py` imports the SDK's client (and `httpx`), and
`mcp/server/__init__.py` its MCPServer framework, neither of which the
endpoint uses: 4–5 MiB of the 31 the SDK adds to a server process that
serves `/mcp` (docs/benchmarks.md). `load_lean()` registers those two
packages as plain packages before the first import from them; their
submodules import as usual. The first use of a name that only an `__init__` defines (`from mcp
import Client`, in a process that is also a client: the tests) runs that
`__init__` then, in full, so nothing else sees a difference."""
from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
import types

LEAN_PACKAGES = ("mcp", "mcp.server")
_lock = threading.RLock()


class _LeanPackage(types.ModuleType):
    """A package whose `__init__` runs on the first name it alone defines."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        submodule = f"{self.__name__}.{name}"
        if importlib.util.find_spec(submodule) is not None:
            return importlib.import_module(submodule)
        with _lock:
            if not self.__dict__.get("_lean_initialised"):
                self.__dict__["_lean_initialised"] = True
                self.__spec__.loader.exec_module(self)
        try:
            return self.__dict__[name]
        except KeyError:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}") from None


def load_lean() -> None:
    """Register LEAN_PACKAGES as packages whose `__init__` waits for a name
    it defines; nothing to do where the SDK is already imported."""
    with _lock:
        for name in LEAN_PACKAGES:
            if name in sys.modules:
                continue
            spec = importlib.util.find_spec(name)
            package = _LeanPackage(name)
            package.__spec__, package.__loader__, package.__file__ = spec, spec.loader, spec.origin
            package.__path__ = list(spec.submodule_search_locations)
            package.__package__ = name
            parent, _, child = name.rpartition(".")
            sys.modules[name] = package
            if parent:
                setattr(sys.modules[parent], child, package)
