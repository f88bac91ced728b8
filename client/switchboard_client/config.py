"""Where `switchboard login` keeps tokens: `config.json` in
`$XDG_CONFIG_HOME/switchboard/` (else `~/.config/switchboard/`), one token
per host, readable by its owner only (file 0600, folder 0700).

    {"default_host": "https://switchboard.example",
     "hosts": {"https://switchboard.example": {"token": "sbt_…"}}}
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import urlsplit

from switchboard_client.errors import ConfigurationError

DEFAULT_HOST = "http://127.0.0.1:8000"


def config_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "switchboard"


def config_path() -> Path:
    return config_dir() / "config.json"


def normalize_host(host: str) -> str:
    """`127.0.0.1:8000` → `http://127.0.0.1:8000`, `example.org` → `https://example.org`:
    plain HTTP for loopback hosts only (`localhost`, `127.0.0.1`, `[::1]`)."""
    host = host.strip().rstrip("/")
    if "://" not in host:
        try:
            name = urlsplit(f"//{host}").hostname  # unlike a split on ":", understands `[::1]:8000`
        except ValueError:  # an unbalanced bracket: not a loopback host
            name = None
        local = name in ("127.0.0.1", "localhost", "::1")
        host = f"{'http' if local else 'https'}://{host}"
    return host


def load(*, repair: bool = False) -> dict:
    """The config file's contents ({} when there is none). One that cannot
    be read as the client writes it is a ConfigurationError, naming the
    file, or with `repair` (a login, which writes it again) taken as empty."""
    try:
        data = json.loads(config_path().read_text())
    except FileNotFoundError:
        return {}
    except (ValueError, UnicodeDecodeError) as error:
        data = error
    hosts = data.get("hosts", {}) if isinstance(data, dict) else None
    if isinstance(hosts, dict) and all(isinstance(h, dict) for h in hosts.values()):
        return data
    if repair:
        return {}
    why = data if isinstance(data, Exception) else "not the shape this client writes"
    raise ConfigurationError(f"{config_path()} cannot be read ({why}): run `switchboard login` to write it again")


def save(data: dict) -> Path:
    """Write the whole file, replacing it atomically, never readable by others."""
    directory = config_dir()
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    path = config_path()
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    os.chmod(temporary, 0o600)
    os.replace(temporary, path)
    return path


def store_token(host: str, token: str) -> Path:
    data = load(repair=True)
    data.setdefault("hosts", {})[host] = {"token": token}
    data["default_host"] = host
    return save(data)


def forget_token(host: str) -> bool:
    data = load()
    removed = data.get("hosts", {}).pop(host, None) is not None
    if data.get("default_host") == host:
        data.pop("default_host")
    if removed:
        save(data)
    return removed


def default_host(host: str | None = None) -> str:
    """`host`, else `$SWITCHBOARD_URL`, else the host of the last login, else the local default."""
    return normalize_host(host or os.environ.get("SWITCHBOARD_URL") or load(repair=True).get("default_host")
                          or DEFAULT_HOST)


def variable_token(base: str) -> str | None:
    """`$SWITCHBOARD_TOKEN`, for the host it belongs to only: `$SWITCHBOARD_URL`,
    else the local default (never the last login's host, which another login
    changes). A command or a base URL that names any other host gets nothing
    from it, so neither can carry the variable's token elsewhere."""
    token = os.environ.get("SWITCHBOARD_TOKEN")
    own = normalize_host(os.environ.get("SWITCHBOARD_URL") or DEFAULT_HOST)
    return token if token and normalize_host(base) == own else None


def resolve(host: str | None = None) -> tuple[str, str | None]:
    """(base URL, token): `variable_token` for its own host, where it wins
    over the stored one; else the host's stored token, if any."""
    base = default_host(host)
    return base, variable_token(base) or load().get("hosts", {}).get(base, {}).get("token")
