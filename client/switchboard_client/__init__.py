"""The Switchboard client: `Client` and `AsyncClient` for the API, typed
results and errors, `WakeReceiver` for signed wakes, and the `switchboard`
command line (cli.py). See docs/client.md."""
from switchboard_client import errors, models
from switchboard_client.client import AsyncClient, Client
from switchboard_client.errors import (AuthError, ConflictError, ConnectionFailed, NotFoundError, RateLimitError,
                                       RequestError, ResyncRequired, ServerError, SwitchboardError)
from switchboard_client.feeds import AsyncFeed, DrainError, DrainReport, Feed
from switchboard_client.receiver import MemoryWakeStore, Reply, SQLiteWakeStore, Wake, WakeReceiver, WakeStore
from switchboard_client.routes import ROUTES, Route
from switchboard_client.transport import NO_RETRIES, RetryPolicy
from switchboard_client.verify import InvalidWake, SigningKeysUnavailable, WakeVerifier, fetch_signing_keys

__version__ = "0.1.0"
__all__ = [
    "AsyncClient", "AsyncFeed", "AuthError", "Client", "ConflictError", "ConnectionFailed", "DrainError",
    "DrainReport", "Feed", "InvalidWake", "MemoryWakeStore", "NO_RETRIES", "NotFoundError", "ROUTES",
    "RateLimitError", "Reply", "RequestError", "ResyncRequired", "RetryPolicy", "Route", "SQLiteWakeStore",
    "ServerError", "SigningKeysUnavailable", "SwitchboardError", "Wake", "WakeReceiver", "WakeStore",
    "WakeVerifier", "errors", "fetch_signing_keys", "models",
]
