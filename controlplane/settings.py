"""Switchboard settings, read from the environment (docs/configuration.md)."""
from __future__ import annotations

import math
import os
from pathlib import Path
from urllib.parse import urlsplit

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from controlplane.binds import bind, public_url
from controlplane.keys import derive_key, development_checkout, load_root_key, private_dir, redis_namespace

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("SWITCHBOARD_VAR_DIR", BASE_DIR / "var"))


def env_bool(name: str, default: bool = False) -> bool:
    """A yes or no from the environment (1/0, true/false, yes/no, on/off;
    empty: the default): anything else stops the process with one line,
    where `TRUST_PROXY_HEADERS=y` quietly meant no."""
    value = (os.environ.get(name) or "").strip().lower()
    if not value:
        return default
    if value not in {"1", "true", "yes", "on", "0", "false", "no", "off"}:
        raise ImproperlyConfigured(f"{name} is 1 or 0 (true/false, yes/no, on/off), not {value!r}.")
    return value in {"1", "true", "yes", "on"}


def env_int(name: str, default: int, *, minimum: int = 0, maximum: int | None = None) -> int:
    """A whole number from the environment: anything else, or one below
    `minimum` (or above `maximum`), stops the process with one line saying
    which and why."""
    number = _env_number(name, default, int, "a whole number", minimum, "")
    if maximum is not None and number > maximum:
        raise ImproperlyConfigured(f"{name} must be at most {maximum}, not {number}.")
    return number


# A span past which a date cannot be computed from today (Python's dates end
# at year 9999): a hundred years, for settings counted in days, hours or seconds.
CENTURY_DAYS = 36_500


def env_seconds(name: str, default: float, *, minimum: float, maximum: float | None = None) -> float:
    """A number of seconds from the environment, at least `minimum` (and at
    most `maximum`)."""
    seconds = _env_number(name, default, float, "a number of seconds", minimum, " seconds")
    if maximum is not None and seconds > maximum:
        raise ImproperlyConfigured(f"{name} must be at most {maximum} seconds, not {seconds:g}.")
    return seconds


def _env_number(name: str, default, parse, kind: str, minimum, unit: str):
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        number = parse(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be {kind}, not {value!r}.") from None
    if not number >= minimum:  # (NaN too)
        raise ImproperlyConfigured(f"{name} must be at least {minimum}{unit}, not {value}.")
    if not math.isfinite(number):  # a wait of `inf` never ends
        raise ImproperlyConfigured(f"{name} must be finite, not {value}.")
    return number


DEBUG = env_bool("DEBUG", development_checkout(VAR_DIR))
SERVER_ADMIN_KEY = load_root_key(debug=DEBUG, var_dir=VAR_DIR)
SECRET_KEY = derive_key(SERVER_ADMIN_KEY, "django-secret-key", 48).hex()
# Every Redis name of this deployment (channel layer, cache, task queue) is
# under this prefix: deployments that share a Redis server (each with its own
# root key) never see each other's messages or take each other's tasks.
REDIS_NAMESPACE = redis_namespace(SERVER_ADMIN_KEY)

SWITCHBOARD_BIND = bind()
# `serve`: the ASGI server (uvicorn, granian or daphne) and its processes
# (0: one per core with REDIS_URL, else 1).
SERVE_SERVERS = ("uvicorn", "granian", "daphne")
SERVE_SERVER = os.environ.get("SERVE_SERVER", "").strip() or "uvicorn"
if SERVE_SERVER not in SERVE_SERVERS:
    raise ImproperlyConfigured(f"SERVE_SERVER is {', '.join(SERVE_SERVERS[:-1])} or {SERVE_SERVERS[-1]}, "
                               f"not {SERVE_SERVER!r}.")
SERVE_WORKERS = env_int("SERVE_WORKERS", 0)
# A uvicorn process of `serve` whose event loop has not beaten for this
# long is killed and started again on its socket (controlplane.uvicorn_process);
# 0: never, else at least 3 (the processes beat once a second).
MIN_HEALTHCHECK_SECONDS = 3
SERVE_HEALTHCHECK_SECONDS = env_int("SERVE_HEALTHCHECK_SECONDS", 10)
if 0 < SERVE_HEALTHCHECK_SECONDS < MIN_HEALTHCHECK_SECONDS:
    raise ImproperlyConfigured(f"SERVE_HEALTHCHECK_SECONDS must be 0 (no health check) or at least "
                               f"{MIN_HEALTHCHECK_SECONDS}, not {SERVE_HEALTHCHECK_SECONDS}.")

# Default: where SWITCHBOARD_BIND serves (bootstrap's links named port 8000 whatever it was);
# `serve --bind` and `cluster --bind` set it for their processes.
SWITCHBOARD_PUBLIC_URL = public_url()
WEBHOOK_ALLOW_PRIVATE_NETWORKS = env_bool("WEBHOOK_ALLOW_PRIVATE_NETWORKS", False)
WEBHOOK_CA_BUNDLE = os.environ.get("WEBHOOK_CA_BUNDLE") or None
if WEBHOOK_CA_BUNDLE is not None and not os.path.isfile(WEBHOOK_CA_BUNDLE):
    raise ImproperlyConfigured(f"WEBHOOK_CA_BUNDLE names no file: {WEBHOOK_CA_BUNDLE!r}.")
# How long a worker holds a wake it is sending before another may take it
# again; keep it above the 15 s request timeout.
WEBHOOK_LEASE_SECONDS = env_int("WEBHOOK_LEASE_SECONDS", 60, minimum=1, maximum=CENTURY_DAYS * 86400)
CLAIM_TTL_HOURS = env_int("CLAIM_TTL_HOURS", 24, maximum=CENTURY_DAYS * 24)
EVENT_RETENTION_DAYS = env_int("EVENT_RETENTION_DAYS", 30, maximum=CENTURY_DAYS)  # 0: keep every event
RATE_LIMIT_PER_MINUTE = env_int("RATE_LIMIT_PER_MINUTE", 12000)  # per member
# Live page sockets and waiting long-polls one member may hold open in one
# server process at once (controlplane.holding); 0: no cap.
WAITS_PER_MEMBER = env_int("WAITS_PER_MEMBER", 100)
CREDENTIALS_PER_HOUR = env_int("CREDENTIALS_PER_HOUR", 10)  # new credentials per member
# With Redis: how long a process may reuse a bearer lookup while no member
# or credential has changed (controlplane.api.authentication); 0 turns it off.
CREDENTIAL_CACHE_SECONDS = env_int("CREDENTIAL_CACHE_SECONDS", 5)
# How much of one recipient's 10 MiB mailbox one sender's pending items may fill.
# At least room for the largest item (a collective request of 8 KiB to 64
# members, escaped: about 51 KiB): below it, a sender's largest could never
# be delivered.
MAILBOX_SENDER_SHARE = env_int("MAILBOX_SENDER_SHARE", 2 * 1024 * 1024, minimum=64 * 1024)
VERIFY_PER_HOUR = env_int("VERIFY_PER_HOUR", 30)  # webhook endpoint verifications per member
# Sign-in attempts per 15 minutes (the web app and the admin).
SIGNIN_PER_ACCOUNT = env_int("SIGNIN_PER_ACCOUNT", 10)
SIGNIN_PER_ADDRESS = env_int("SIGNIN_PER_ADDRESS", 50)
REDIS_URL = os.environ.get("REDIS_URL") or None
if REDIS_URL and urlsplit(REDIS_URL).scheme not in ("redis", "rediss", "unix"):
    raise ImproperlyConfigured("REDIS_URL is redis://, rediss:// or unix:// (redis://host:6379/0), "
                               f"not {REDIS_URL.split('@')[-1]!r}.")
# A waiting long-poll re-reads at least this often, in case a wake was lost
# (or, without Redis, came from another process).
FEED_RECHECK_SECONDS = env_seconds("FEED_RECHECK_SECONDS", 1.0, minimum=0.05, maximum=3600.0)
# An MCP events/stream sends a heartbeat frame at least this often (SEP-3415: every 30 s at most).
MCP_HEARTBEAT_SECONDS = min(30.0, env_seconds("MCP_HEARTBEAT_SECONDS", 15.0, minimum=0.1))
# A live page's socket hears a heartbeat at least this often, and the page
# replaces a socket silent for 2.5 times as long (web/static/web/app.js).
LIVE_HEARTBEAT_SECONDS = min(60.0, env_seconds("LIVE_HEARTBEAT_SECONDS", 25.0, minimum=0.1))

# --- production: hosts, TLS, proxies ------------------------------------------
_public = urlsplit(SWITCHBOARD_PUBLIC_URL)
# The liveness and readiness probes (controlplane.health): load balancers
# probe them by address, so neither the host check nor the HTTPS redirect
# applies to them.
PROBE_PATHS = ("/healthz", "/readyz")
# Requests must name the public host (HostCheck: the probes are exempt); in
# development any host will do.
ALLOWED_HOSTS = ([h.strip() for h in os.environ.get("ALLOWED_HOSTS", "").split(",") if h.strip()]
                 or (["*"] if DEBUG else [_public.hostname or "localhost"]))
CSRF_TRUSTED_ORIGINS = [SWITCHBOARD_PUBLIC_URL]
# Only behind a proxy that sets them (and strips clients' own): the scheme
# from X-Forwarded-Proto, the client address from X-Forwarded-For.
TRUST_PROXY_HEADERS = env_bool("TRUST_PROXY_HEADERS", False)
if TRUST_PROXY_HEADERS:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# Read whether they apply or not: a bad value is told at once, not on the day the URL becomes https://.
_hsts = (env_int("SECURE_HSTS_SECONDS", 365 * 24 * 3600), env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", True),
         env_bool("SECURE_HSTS_PRELOAD", True))
if _public.scheme == "https" and not DEBUG:
    if not TRUST_PROXY_HEADERS:
        # serve speaks plain HTTP: TLS ends at a proxy, and without its header
        # every request would be redirected to the URL it came in on.
        raise ImproperlyConfigured("An https:// SWITCHBOARD_PUBLIC_URL means a TLS-terminating proxy in front: set "
                                   "TRUST_PROXY_HEADERS=1, with the proxy setting X-Forwarded-Proto and "
                                   "X-Forwarded-For (replacing the client's own).")
    SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = True
    SECURE_SSL_REDIRECT = True
    SECURE_REDIRECT_EXEMPT = [f"^{path.lstrip('/')}$" for path in PROBE_PATHS]
    SECURE_HSTS_SECONDS, SECURE_HSTS_INCLUDE_SUBDOMAINS, SECURE_HSTS_PRELOAD = _hsts
if WEBHOOK_ALLOW_PRIVATE_NETWORKS and not DEBUG:
    # It lets any member make this server call internal addresses (SSRF).
    raise ImproperlyConfigured("WEBHOOK_ALLOW_PRIVATE_NETWORKS is for development and tests only; "
                               "unset it, or set DEBUG=1 on a development machine.")

INSTALLED_APPS = [
    "controlplane.admin_app.SwitchboardAdminConfig",  # django.contrib.admin, for active admin members only
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "django_q",
    "django_htmx",
    "controlplane",
    "inbox",
    "grants",
    "coordination",
    "webhooks",
    "web",
    "mcp_endpoint",
]

# Short and async-capable: every sync layer costs a thread hop under ASGI.
MIDDLEWARE = [
    "controlplane.middleware.RequestId",
    "controlplane.middleware.api_answers_no_store",
    "controlplane.middleware.HostCheck",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "web.pages.content_security_policy",
    "web.errors.ServiceUnavailable",
]

# Database sessions that name their user: suspension ends them (controlplane.sessions).
SESSION_ENGINE = "controlplane.sessions"

ROOT_URLCONF = "controlplane.urls"
ASGI_APPLICATION = "controlplane.asgi.application"
WSGI_APPLICATION = "controlplane.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "web.context.member",
            ],
        },
    },
]

# --- database -------------------------------------------------------------
private_dir(VAR_DIR)
# DEBUG pages show settings: these hold passwords, and are hidden there.
DEFAULT_EXCEPTION_REPORTER_FILTER = "controlplane.errors.ReporterFilter"
DATABASE_URL = os.environ.get("DATABASE_URL") or f"sqlite:///{VAR_DIR / 'switchboard.sqlite3'}"
try:
    _db = dj_database_url.parse(DATABASE_URL)
except ValueError as error:  # (an unknown scheme too)
    raise ImproperlyConfigured("DATABASE_URL is postgres://user@host:5432/name or sqlite:///path, not that: " + (
        "its scheme is unknown." if isinstance(error, dj_database_url.UnknownSchemeError) else f"{error}.")) from None
if _db["ENGINE"] not in ("django.db.backends.sqlite3", "django.db.backends.postgresql"):
    # dj-database-url knows mysql:// and others, which failed later, naming a driver instead of the variable.
    raise ImproperlyConfigured("DATABASE_URL is postgres://user@host:5432/name or sqlite:///path, not that: "
                               "only PostgreSQL and SQLite are supported.")
# PostgreSQL's pool and prepared statements: read on SQLite too, so a bad value is told at once.
_pool = (env_int("DB_POOL_MIN", 2), env_int("DB_POOL_MAX", 16, minimum=1))
if _pool[0] > _pool[1]:
    raise ImproperlyConfigured("DB_POOL_MIN must be at most DB_POOL_MAX.")
_prepare_threshold = env_int("DB_PREPARE_THRESHOLD", 5)
if _db["ENGINE"] == "django.db.backends.sqlite3":
    _db["OPTIONS"] = {
        # Writers take the lock at BEGIN, so they queue instead of failing
        # with "database is locked" when they upgrade a read lock.
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA busy_timeout=30000;",
    }
    # A file (not memory) so end-to-end tests' server processes share it;
    # one per test run, so two runs in one checkout never clobber each other.
    _db["TEST"] = {"NAME": str(VAR_DIR / f"test_switchboard_{os.getpid()}.sqlite3")}
elif _db["ENGINE"] == "django.db.backends.postgresql":
    # Under ASGI every request runs in a fresh thread, so CONN_MAX_AGE
    # cannot reuse connections; a process-wide pool does.
    _db["CONN_MAX_AGE"] = 0
    _db.setdefault("OPTIONS", {})["pool"] = {"min_size": _pool[0], "max_size": _pool[1], "timeout": 10}
    # A statement run DB_PREPARE_THRESHOLD times on a connection is prepared
    # on it (server-side binding): PostgreSQL plans it once per connection,
    # not on every run, and planning the hot paths' small queries cost more
    # than running them. 0 turns it off (client-side binding), for a
    # transaction-mode pooler in front of PostgreSQL that cannot keep them.
    if _prepare_threshold:
        _db["OPTIONS"].update(server_side_binding=True, prepare_threshold=_prepare_threshold)
DATABASES = {"default": _db}
# Threads per server process for sync request work (controlplane.handlers):
# calls overlap their database waits; Python itself runs one at a time.
SYNC_THREADS = env_int("SYNC_THREADS", 8, minimum=1)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
IS_POSTGRES = _db["ENGINE"] == "django.db.backends.postgresql"

# --- channels, cache, tasks -----------------------------------------------
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            # channels-redis blocks 5 s per receive; redis-py's default 5 s
            # read timeout would cut every idle receive short.
            "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": 30}], "prefix": REDIS_NAMESPACE},
        }
    }
    CACHES = {
        "default": {
            "BACKEND": "controlplane.cache.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": REDIS_NAMESPACE,
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    # The rate limits' counters live here: Django's default of 300 entries let a
    # flood of new ones push others' out (a sign-in throttle forgot its guesses).
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache",
                          "OPTIONS": {"MAX_ENTRIES": 100_000}}}

Q_LOG_LEVEL = os.environ.get("Q_LOG_LEVEL", "").strip().upper() or "WARNING"
if Q_LOG_LEVEL not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
    raise ImproperlyConfigured(f"Q_LOG_LEVEL is DEBUG, INFO, WARNING, ERROR or CRITICAL, not {Q_LOG_LEVEL!r}.")
Q_CLUSTER = {
    "name": REDIS_NAMESPACE,
    "workers": env_int("Q_WORKERS", 2, minimum=1),
    # django-q2's `retry` is a redelivery timeout, not a backoff: keep
    # timeout < retry; our own retry policy lives in our rows.
    "timeout": 60,
    "retry": 120,
    "ack_failures": True,
    "max_attempts": 1,
    "catch_up": False,
    "save_limit": 1000,
    "log_level": Q_LOG_LEVEL,
}
if REDIS_URL:
    Q_CLUSTER["redis"] = REDIS_URL
else:
    Q_CLUSTER["orm"] = "default"
    Q_CLUSTER["poll"] = 0.5

# --- auth, API --------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "/app/login/"
LOGIN_REDIRECT_URL = "/app/"
LOGOUT_REDIRECT_URL = "/app/login/"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "controlplane.api.authentication.BearerTokenAuthentication",
        "controlplane.api.authentication.MemberSessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["controlplane.api.permissions.IsMember"],
    "DEFAULT_THROTTLE_CLASSES": ["controlplane.api.throttling.MemberRateThrottle"],
    "DEFAULT_PARSER_CLASSES": ["controlplane.api.parsers.StrictJSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "controlplane.api.negotiation.JsonWhateverAccepted",
    "EXCEPTION_HANDLER": "controlplane.errors.api_exception_handler",
    "DEFAULT_SCHEMA_CLASS": "controlplane.api.openapi.SwitchboardAutoSchema",
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Switchboard API",
    "DESCRIPTION": "Durable, addressed messaging between people and AI agents.",
    "VERSION": "0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "SCHEMA_PATH_PREFIX": r"/v0",
    "PREPROCESSING_HOOKS": ["controlplane.api.openapi.apply_annotations"],
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums",
                             "controlplane.api.openapi.add_body_limit"],
    "ENUM_NAME_OVERRIDES": {
        "MemberKindEnum": "controlplane.models.Member.Kind",
        "ConversationKindEnum": ["channel", "direct", "group"],
        "GrantKindEnum": "grants.models.Grant.Kind",
        "GrantStatusEnum": "grants.models.Grant.Status",
        "ApprovalStatusEnum": "grants.models.ApprovalRequest.Status",
    },
}

# Message bodies are 8 KiB; nothing legitimate needs more than this.
DATA_UPLOAD_MAX_MEMORY_SIZE = 256 * 1024

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True
STATIC_URL = "/static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
CSRF_FAILURE_VIEW = "web.errors.csrf_failure"

# `plain` for people at a terminal; `json` (one object a line, with the
# request id and structured fields) for log collectors (docs/observability.md).
LOG_FORMAT = os.environ.get("LOG_FORMAT", "plain").strip().lower()
if LOG_FORMAT not in {"plain", "json"}:
    raise ImproperlyConfigured(f"LOG_FORMAT is plain or json, not {LOG_FORMAT!r}.")
LOG_LEVEL = os.environ.get("LOG_LEVEL", "").strip().upper()
if LOG_LEVEL not in {"", "DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
    raise ImproperlyConfigured(f"LOG_LEVEL is DEBUG, INFO, WARNING, ERROR or CRITICAL, not {LOG_LEVEL!r}.")
# DEBUG is for Switchboard's own loggers: libraries log whole answers at
# DEBUG (sse_starlette every chunk of an MCP answer, delivery tokens and
# message bodies in it), so theirs stay at INFO at most.
LIBRARY_LOG_LEVEL = "INFO" if LOG_LEVEL == "DEBUG" else LOG_LEVEL or "WARNING"
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
                   "json": {"()": "controlplane.tracing.JsonFormatter"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT}},
    "root": {"handlers": ["console"], "level": LIBRARY_LOG_LEVEL},
    "loggers": {
        **{name: {"level": LOG_LEVEL or ("INFO" if name == "switchboard" else "WARNING"), "propagate": True}
           for name in ("switchboard", "controlplane", "inbox", "grants", "webhooks", "coordination",
                        "mcp_endpoint", "web")},
        # django-q2 sets its own level only where nothing has a handler.
        "django-q": {"level": Q_LOG_LEVEL, "propagate": True},
        # 4xx answers are the API working as specified, not server warnings.
        "django": {"handlers": ["console"], "level": "WARNING", "propagate": False},
        "django.request": {"handlers": ["console"], "level": "ERROR", "propagate": False},
    },
}
