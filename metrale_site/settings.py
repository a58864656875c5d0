"""Django settings for Metrale.

Defaults need no external service: SQLite, the local-memory cache and in-process
Celery tasks. `DATABASE_URL`, `REDIS_URL` and `CELERY_BROKER_URL` switch to
PostgreSQL, Redis and a real broker.
"""
from pathlib import Path
from urllib.parse import unquote, urlparse

from .middleware_list import Middleware
from .env import envbool, envduration_s, envfloat, envint, envjson, envlist, envstr
from .paths import PACKAGES_DIR, data_dir, metrale_home

BASE_DIR = PACKAGES_DIR
SITE_DIR = Path(__file__).resolve().parent

# Models, wheels and the kernels' cache (paths.py); DATA_DIR: the database, static files, uploads and the
# request log's default file (a checkout's var/, an installed package's METRALE_HOME).
METRALE_HOME = metrale_home()
DATA_DIR = data_dir()
DEFAULT_MODEL_NAME = "smollm2-135m-instruct"

SECRET_KEY = envstr("DJANGO_SECRET_KEY", "metrale-dev-insecure-key-change-me-in-production")
DEBUG = envbool("DJANGO_DEBUG", False)
ALLOWED_HOSTS = (envstr("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost,[::1],testserver") or "").split(",")

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "corsheaders",
    "rest_framework",
    "inference",
    "responses_api",
    "batches",
    "anthropic_api",
    "ollama_api",
    "adapters",
    "console",
]

# Django's middlewares with their hooks inline on the event loop where they do no I/O (async_middleware.py:
# a thread hop per hook otherwise); Middleware swaps in those subclasses and keeps Django's names answering `in`.
MIDDLEWARE = Middleware([
    "inference.http.middleware.ApiRequestMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "corsheaders.middleware.CorsMiddleware",
    "metrale_site.static_files.AsyncWhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
])

ROOT_URLCONF = "metrale_site.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [SITE_DIR / "templates"],  # the admin's overrides; the console's pages are its app's
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = None
ASGI_APPLICATION = "metrale_site.asgi.application"


def _database_from_url(url: str) -> dict:
    parsed = urlparse(url)
    if parsed.scheme not in ("postgres", "postgresql"):
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(f"DATABASE_URL scheme {parsed.scheme!r} is not supported")
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parsed.path.lstrip("/")) or "postgres",
        "USER": unquote(parsed.username or ""),
        "PASSWORD": unquote(parsed.password or ""),
        "HOST": parsed.hostname or "",
        "PORT": str(parsed.port or ""),
    }


_database_url = envstr("DATABASE_URL")
if _database_url:
    DATABASES = {"default": _database_from_url(_database_url)}
else:
    _sqlite_path = Path(envstr("METRALE_SQLITE_PATH", str(DATA_DIR / "metrale.sqlite3")))
    try:
        _sqlite_path.parent.mkdir(parents=True, exist_ok=True)  # var/ is not in git; METRALE_HOME on first run
    except OSError:  # a read-only data directory: `metrale` names it; SQLite's own error otherwise
        pass
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(_sqlite_path),
            # IMMEDIATE: a transaction takes the write lock when it begins, and waits up to `timeout` for
            # it. A deferred one that reads first cannot wait when it upgrades to a write while another
            # connection writes (SQLite fails at once: "database is locked", a 500 for concurrent writers).
            "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE"},
        }
    }

_redis_url = envstr("REDIS_URL")
if _redis_url:
    # django-redis (not Django's own RedisCache): the rate limiter needs its raw client for Lua.
    # KEY_PREFIX lets several deployments (or test runs) share one Redis without sharing budgets.
    CACHES = {"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": _redis_url,
                          "KEY_PREFIX": envstr("METRALE_CACHE_KEY_PREFIX", "metrale")}}
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "metrale"}}

# The channel layer: the dashboard's websocket and operator commands between replicas
# (inference/operations/replica.py). In memory within one process; channels-redis over REDIS_URL, so any
# replica's dashboard reaches every other replica.
# channels-redis waits for messages with BZPOPMIN for up to 5 s; redis-py (8.x) gives up reading a
# socket after 5 s by default, which ended every such wait with a TimeoutError: reads get 30 s here.
if _redis_url:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer",
                                  "CONFIG": {"hosts": [{"address": _redis_url, "socket_timeout": 30}],
                                             "prefix": envstr("METRALE_CACHE_KEY_PREFIX", "metrale") + ":asgi"}}}
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
# `manage.py collectstatic` (a step of `make serve` and `make test`) gathers the apps' files here;
# WhiteNoise (metrale_site/static_files.py) serves them. Without collected files the apps' own
# folders are served too (WHITENOISE_USE_FINDERS), so a server started by hand still has its CSS;
# settings_production serves only the collected, hashed and compressed copies.
STATIC_ROOT = Path(envstr("DJANGO_STATIC_ROOT", str(DATA_DIR / "static")))
STATICFILES_DIRS = []  # the console's files are its app's (console/static/console/)
WHITENOISE_USE_FINDERS = True
STORAGES = {"default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
            "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [],
    "DEFAULT_PERMISSION_CLASSES": [],
    "UNAUTHENTICATED_USER": None,
}

CELERY_BROKER_URL = envstr("CELERY_BROKER_URL")
# Without a broker, tasks run in-process (eagerly) so the default needs no service.
CELERY_TASK_ALWAYS_EAGER = CELERY_BROKER_URL is None

# Uploaded files (POST /v1/files) and batch output files: any Django storage backend
# (METRALE_FILES_STORAGE, a dotted class path; default the local folder METRALE_FILES_DIR).
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    "files": {"BACKEND": envstr("METRALE_FILES_STORAGE", "django.core.files.storage.FileSystemStorage"),
              "OPTIONS": envjson("METRALE_FILES_STORAGE_OPTIONS", None)
              or {"location": envstr("METRALE_FILES_DIR", str(DATA_DIR / "files"))}},
}
# Uploads larger than this stay on disk while they are received (Django's upload handlers).
FILE_UPLOAD_MAX_MEMORY_SIZE = 2_621_440

# Metrale's own settings, one namespace (documented in README.md).
METRALE = {
    # The models this server may serve, comma-separated: names from `manage.py pull_model`'s catalogue,
    # model folders, GGUF files (imported once on first use). Unset: METRALE_MODEL and METRALE_EMBEDDING_MODEL.
    # The first chat model is the default (inference/operations/model_specs.py; README "Models").
    "MODELS": envlist("METRALE_MODELS"),
    # Models loaded at start and never unloaded (comma-separated names; "none": none); unset: the first chat model.
    "PIN": envlist("METRALE_PIN") or None,
    # How long a model stays loaded once idle (Ollama's keep_alive: "5m", seconds, 0, negative = never),
    # and per model: name=value items, comma-separated.
    "KEEP_ALIVE": envstr("METRALE_KEEP_ALIVE", "5m"),
    "MODEL_KEEP_ALIVE": envlist("METRALE_MODEL_KEEP_ALIVE"),
    # The loaded models' resident memory (weights as measured after load, plus KV pools), e.g. 4GB; loading
    # past it unloads idle models, least recently used first. Unset: no budget.
    "MEMORY_BUDGET": envstr("METRALE_MEMORY_BUDGET"),
    # With a budget and no KV_CACHE_BYTES: each chat model's KV pool is this fraction of the budget.
    "KV_BUDGET_SHARE": envfloat("METRALE_KV_BUDGET_SHARE", 0.1),
    # Seconds a load waits for busy models to make room under the budget before it fails (503).
    "MODEL_LOAD_WAIT_S": envfloat("METRALE_MODEL_LOAD_WAIT_S", 30.0),
    # An HF-format folder (config.json, model.safetensors, tokenizer.json, ...).
    "MODEL": envstr("METRALE_MODEL", str(METRALE_HOME / "models" / DEFAULT_MODEL_NAME)),
    # The id the API reports for the model; default: the folder's name.
    "SERVED_MODEL_NAME": envstr("METRALE_SERVED_MODEL_NAME"),
    # Other names the served model answers to (comma-separated), like vLLM's extra served model names.
    "MODEL_ALIASES": envlist("METRALE_MODEL_ALIASES"),
    # Accept any `model` name in requests (as llama.cpp's server does: it reaches the base model).
    # Off (the default, as OpenAI and vLLM): another name is a 404 model_not_found, so a client
    # asking for an adapter or a swapped-out model never silently gets the base.
    "ACCEPT_ANY_MODEL_NAME": envbool("METRALE_ACCEPT_ANY_MODEL_NAME", False),
    # LoRA adapters loaded at startup: name=path pairs, comma-separated (also `serve --lora`).
    "LORA_ADAPTERS": envlist("METRALE_LORA_ADAPTERS"),
    # POST /v1/load_lora_adapter and /v1/unload_lora_adapter (operators only) exist only when on.
    "ALLOW_RUNTIME_LORA": envbool("METRALE_ALLOW_RUNTIME_LORA", False),
    # Adapter slots resident at once (0: adapters off) and the largest rank an adapter may have
    # (unset: EngineConfig's 4 and 64).
    "MAX_LORAS": envint("METRALE_MAX_LORAS", None),
    "MAX_LORA_RANK": envint("METRALE_MAX_LORA_RANK", None),
    # Seconds between two reads of the served-model setting (manage.py swap_model, the admin).
    "SWAP_POLL_S": envfloat("METRALE_SWAP_POLL_S", 2.0),
    # Sampling defaults used when neither the request nor the model's generation_config.json sets
    # a field, as a JSON object, e.g. {"temperature": 0.7, "top_p": 0.9}.
    "SAMPLING_DEFAULTS": envjson("METRALE_SAMPLING_DEFAULTS", {}),
    # Request bodies larger than this many bytes are answered 413.
    "MAX_REQUEST_BYTES": envint("METRALE_MAX_REQUEST_BYTES", 32 << 20),
    # A JSON schema in a request (response_format, structured_outputs, a tool's parameters) larger
    # than this many bytes as compact JSON is a 400 naming its field (inference/serving/schema_size.py).
    "MAX_SCHEMA_BYTES": envint("METRALE_MAX_SCHEMA_BYTES", 64 << 10),
    # The engine's settings: each unset one (None) takes inference.engine.config.EngineConfig's
    # default, the only place it is written (runtime.engine_config maps these names onto it).
    # float32, bfloat16 or float16; EngineConfig's "auto" picks float32 on CPU, bfloat16 on CUDA.
    "DTYPE": envstr("METRALE_DTYPE"),
    # "auto" (cuda when available, else cpu), "cpu" or "cuda".
    "DEVICE": envstr("METRALE_DEVICE"),
    # KV cache budget in bytes; unset: KV_CACHE_FRACTION of the available memory.
    "KV_CACHE_BYTES": envint("METRALE_KV_CACHE_BYTES", None),
    # Fraction of available memory for the KV pool when KV_CACHE_BYTES is unset (0.05).
    "KV_CACHE_FRACTION": envfloat("METRALE_KV_CACHE_FRACTION", None),
    # KV cache dtype: bfloat16 (EngineConfig's default, every device), float32 (exact), float16, int8 or auto (the model's).
    "KV_CACHE_DTYPE": envstr("METRALE_KV_CACHE_DTYPE"),
    "ENABLE_PREFIX_CACHING": envbool("METRALE_ENABLE_PREFIX_CACHING", None),
    "BLOCK_SIZE": envint("METRALE_BLOCK_SIZE", None),
    "MAX_NUM_SEQS": envint("METRALE_MAX_NUM_SEQS", None),
    "MAX_NUM_BATCHED_TOKENS": envint("METRALE_MAX_NUM_BATCHED_TOKENS", None),
    "MAX_MODEL_LEN": envint("METRALE_MAX_MODEL_LEN", None),
    # Requests that may wait for the engine; past it a 503 with Retry-After at once (unset: 0, unbounded).
    "MAX_WAITING_REQUESTS": envint("METRALE_MAX_WAITING_REQUESTS", None),
    # The linears' weight format: auto (the folder's GGUF blocks as shipped; a float folder: int8),
    # q4, q8 (GGUF blocks; a float checkpoint quantised at load), int8 (per-channel), model (the
    # folder's values exactly, float32 activations). README "Weights".
    "WEIGHTS": envstr("METRALE_WEIGHTS"),
    # An embedding model served beside the chat model on /v1/embeddings: a sentence-transformers BERT
    # folder, or the name of one pulled to METRALE_HOME/models (`manage.py pull_model all-minilm-l6-v2`).
    # Unset: /v1/embeddings answers 404 model_not_found. README "Embeddings".
    "EMBEDDING_MODEL": envstr("METRALE_EMBEDDING_MODEL"),
    # Its linears: auto (bfloat16 where the CPU multiplies it natively, else float32), float32, bfloat16.
    "EMBEDDING_WEIGHTS": envstr("METRALE_EMBEDDING_WEIGHTS", "auto"),
    # The fraction of each chat step's time that embedding work may take while chat requests run.
    "EMBEDDING_SHARE": envfloat("METRALE_EMBEDDING_SHARE", 0.35),
    # Which weights prompt rows use: same (WEIGHTS', the default) or model (exact, a second copy).
    "PREFILL_WEIGHTS": envstr("METRALE_PREFILL_WEIGHTS"),
    # torch intra-op threads for the engine; unset: torch's default.
    "NUM_THREADS": envint("METRALE_NUM_THREADS", None),
    "ADAPTIVE_THREADS": envbool("METRALE_ADAPTIVE_THREADS", True),
    # Speculative decoding from prompt lookup and Predicted Outputs (README, "Speculative decoding"):
    # "auto" (unset) drafts while it pays, "on" whenever a draft exists, "off" never. The output is
    # the same either way.
    "SPECULATIVE": envstr("METRALE_SPECULATIVE"),
    # The most draft tokens per sequence and step (unset: 8).
    "SPECULATIVE_DRAFT_TOKENS": envint("METRALE_SPECULATIVE_DRAFT_TOKENS", None),
    # The n-gram sizes prompt lookup matches (unset: 4 down to 2).
    "SPECULATIVE_NGRAM_MAX": envint("METRALE_SPECULATIVE_NGRAM_MAX", None),
    "SPECULATIVE_NGRAM_MIN": envint("METRALE_SPECULATIVE_NGRAM_MIN", None),
    # In "auto", no drafts while more sequences than this decode (unset: 8).
    "SPECULATIVE_MAX_BATCH": envint("METRALE_SPECULATIVE_MAX_BATCH", None),
    # What logprobs report (vLLM's --logprobs-mode): raw_logprobs (unset: the model's distribution, before
    # temperature, truncation, penalties and logit_bias) or processed_logprobs (the one each token was drawn from).
    "LOGPROBS_MODE": envstr("METRALE_LOGPROBS_MODE"),
    # Repetition detection for requests that set none (vLLM's repetition_detection object, as JSON:
    # {"max_pattern_size": 32, "min_pattern_size": 1, "min_count": 8}); unset: off.
    "REPETITION_DETECTION": envjson("METRALE_REPETITION_DETECTION", None),
    # Load the model when the ASGI application starts (else on first use).
    "LOAD_ON_START": envbool("METRALE_LOAD_ON_START", True),
    # Seconds a request may run when it sets no `timeout`.
    "REQUEST_TIMEOUT_S": envfloat("METRALE_REQUEST_TIMEOUT_S", 600.0),
    # Tool-call parser (hermes, qwen3_coder, llama3_json, mistral, pythonic, poolside_v1, glm47, or
    # "none"); unset: chosen from the model's chat template and model_type, hermes for a model with
    # none when a request has tools (README, "Tools and reasoning").
    "TOOL_CALL_PARSER": envstr("METRALE_TOOL_CALL_PARSER"),
    # Reasoning parser (think, mistral, glm47 and aliases, or "none"); unset: chosen from the model.
    "REASONING_PARSER": envstr("METRALE_REASONING_PARSER"),
    # Tool calls one response may make; the opener of one more ends the response.
    "MAX_TOOL_CALLS_PER_RESPONSE": envint("METRALE_MAX_TOOL_CALLS_PER_RESPONSE", 12),
    # Threads that template and tokenize prompts off the event loop (a bounded pool).
    "PREPARE_THREADS": envint("METRALE_PREPARE_THREADS", 2),
    # Log every engine step's batch composition (used by tests and the bench).
    "STEP_LOG": envbool("METRALE_STEP_LOG", None),
    # Require `Authorization: Bearer <key>` on /v1/*, /tokenize and /detokenize. Off: every
    # request runs as the built-in "default" tenant. On in settings_production.
    "REQUIRE_AUTH": envbool("METRALE_REQUIRE_AUTH", False),
    # Limits of a tenant without a tenant-wide RateLimitContext (0: not enforced; a burst of
    # None: the per-minute rate). Counted per tenant in the default cache.
    "RATE_LIMITS": {
        "RPM": envint("METRALE_RATE_LIMIT_RPM", 0),
        "TPM": envint("METRALE_RATE_LIMIT_TPM", 0),
        "BURST_RPM": envint("METRALE_RATE_LIMIT_BURST_RPM", None),
        "BURST_TPM": envint("METRALE_RATE_LIMIT_BURST_TPM", None),
        "MAX_CONCURRENT_REQUESTS": envint("METRALE_RATE_LIMIT_CONCURRENCY", 0),
        "MAX_TOKENS_PER_REQUEST": envint("METRALE_RATE_LIMIT_MAX_TOKENS_PER_REQUEST", 0),
    },
    # Stored responses and conversations are deleted this long after they were created (responses)
    # or last written (conversations): seconds, or with a unit ("30d", "12h"). Default 30 days.
    "STORE_TTL_S": envduration_s("METRALE_STORE_TTL", 30 * 86400),
    # How often expired stored items are purged (the in-process housekeeping thread, or Celery beat).
    "PURGE_INTERVAL_S": envduration_s("METRALE_PURGE_INTERVAL", 3600),
    # Every server process records a heartbeat this often (inference/operations/heartbeat.py)...
    "HEARTBEAT_INTERVAL_S": envduration_s("METRALE_HEARTBEAT_INTERVAL", 5),
    # ...and its unfinished work is taken over (failed) once it has not beaten for this long.
    # Keep it several intervals long: a process too busy to beat in time loses its work.
    "HEARTBEAT_GRACE_S": envduration_s("METRALE_HEARTBEAT_GRACE", 30),
    # On SIGTERM, running requests and background responses get this long to finish before
    # they end in-band with an error (metrale_site/drain.py).
    "SHUTDOWN_GRACE_S": envduration_s("METRALE_SHUTDOWN_GRACE", 15),
    # While a model swap that drains the old model first has no model installed, a request waits up
    # to this long for the new one (inference.http.views.ready_runtime), and at most SWAP_WAIT_MAX requests
    # wait at once; past either, 503 model_not_loaded with Retry-After.
    "SWAP_WAIT_S": envduration_s("METRALE_SWAP_WAIT", 30),
    "SWAP_WAIT_MAX": envint("METRALE_SWAP_WAIT_MAX", 64),
    # GET /metrics requires an admin key (or a staff session) when on; off: open to anyone who
    # reaches the port (as vLLM's).
    "METRICS_AUTH": envbool("METRALE_METRICS_AUTH", False),
    # The default chat model's KV cache events for KV-aware routers (vllm-router --policy kv_aware): vLLM's
    # kv-events config as JSON ({"endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558", ...}) or a
    # bare endpoint (inference/operations/kv_events.py). Unset: none published.
    "KV_EVENTS": envstr("METRALE_KV_EVENTS"),
    # A file that gets one JSON line per API request (README, "Request log"); unset: no file.
    # `manage.py serve --request-log PATH` sets it.
    "REQUEST_LOG": envstr("METRALE_REQUEST_LOG"),
    # Include request and response bodies in the file's lines (prompts and outputs: opt in).
    "REQUEST_LOG_BODIES": envbool("METRALE_REQUEST_LOG_BODIES", False),
    # Also write every request (without bodies) to the database table the admin shows
    # (inference.operations.request_log.RequestLogEntry, all replicas); on by default when REQUEST_LOG is set.
    "REQUEST_LOG_DB": envbool("METRALE_REQUEST_LOG_DB", bool(envstr("METRALE_REQUEST_LOG"))),
    # Rows of the request log table older than this are deleted (seconds or "7d"). Default 7 days.
    "REQUEST_LOG_DB_TTL_S": envduration_s("METRALE_REQUEST_LOG_DB_TTL", 7 * 86400),
    # The Files and Batch APIs (batches/). An upload to POST /v1/files may be this many bytes
    # (a 413 over it); it streams to disk, in place of MAX_REQUEST_BYTES.
    "MAX_FILE_BYTES": envint("METRALE_MAX_FILE_BYTES", 200_000_000),
    # Batch lines run at a lower priority than interactive requests: at most this many batch
    # sequences run at once per engine (unset: EngineConfig's 4)...
    "BATCH_MAX_NUM_SEQS": envint("METRALE_BATCH_MAX_NUM_SEQS", None),
    # ...and each prefills at most this many prompt tokens per engine step (unset: 64).
    "BATCH_PREFILL_CHUNK": envint("METRALE_BATCH_PREFILL_CHUNK", None),
    # Tokens (prompt + completion) one tenant's batch lines may use per UTC day; past it the
    # remaining lines fail with 429 batch_token_quota_exceeded (0: no quota).
    "BATCH_TOKENS_PER_DAY": envint("METRALE_BATCH_TOKENS_PER_DAY", 0),
    # How often a running batch looks for cancel and expiry (seconds).
    "BATCH_POLL_S": envfloat("METRALE_BATCH_POLL_S", 0.5),
    # The Celery queue batch tasks go to and `manage.py batch_worker` reads.
    "BATCH_QUEUE": envstr("METRALE_BATCH_QUEUE", "batches"),
    # An Anthropic Messages stream sends a `ping` event after this many seconds without another
    # event (a long prompt's prefill, a queue wait), so clients and proxies see the stream alive.
    "ANTHROPIC_PING_S": envduration_s("METRALE_ANTHROPIC_PING", 5),
    # Origins (comma-separated, e.g. "https://app.example.com") whose browser apps may call /v1/* and /api/*
    # with a bearer key; unset: any origin, as OpenAI's and vLLM's servers allow. The admin, the
    # playground and every other page are never cross-origin.
    "CORS_ORIGINS": envlist("METRALE_CORS_ORIGINS"),
}

# CORS (django-cors-headers) for the API routes only. No credentials: a cross-origin caller
# authenticates with its key, never with this site's session cookie.
CORS_URLS_REGEX = r"^/(v1|api)(/.*)?$"
CORS_ALLOW_ALL_ORIGINS = not METRALE["CORS_ORIGINS"]
CORS_ALLOWED_ORIGINS = METRALE["CORS_ORIGINS"]
CORS_ALLOW_METHODS = ("GET", "POST", "DELETE", "OPTIONS")
CORS_ALLOW_HEADERS = ("accept", "authorization", "content-type", "user-agent", "x-request-id",
                      "openai-organization", "openai-project", "openai-beta", "x-api-key",
                      "anthropic-version", "anthropic-beta", "anthropic-dangerous-direct-browser-access",
                      "x-stainless-arch", "x-stainless-lang", "x-stainless-os", "x-stainless-package-version",
                      "x-stainless-runtime", "x-stainless-runtime-version", "x-stainless-retry-count",
                      "x-stainless-timeout", "x-stainless-async", "x-stainless-helper-method")
CORS_EXPOSE_HEADERS = ("x-request-id", "request-id", "openai-processing-ms", "retry-after", "x-ratelimit-limit-requests",
                       "x-ratelimit-limit-tokens", "x-ratelimit-remaining-requests",
                       "x-ratelimit-remaining-tokens", "x-ratelimit-reset-requests", "x-ratelimit-reset-tokens",
                       "anthropic-ratelimit-requests-limit", "anthropic-ratelimit-requests-remaining",
                       "anthropic-ratelimit-requests-reset", "anthropic-ratelimit-tokens-limit",
                       "anthropic-ratelimit-tokens-remaining", "anthropic-ratelimit-tokens-reset")
CORS_PREFLIGHT_MAX_AGE = 600

# Batch tasks (batches/tasks.py) are acknowledged when they end, and a task whose worker died is
# given to another worker; with Redis as the broker an unacknowledged task is redelivered after
# this many seconds (METRALE_BATCH_VISIBILITY_TIMEOUT, default 1 h; RabbitMQ redelivers as soon
# as the worker's connection drops).
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": envduration_s("METRALE_BATCH_VISIBILITY_TIMEOUT", 3600)}
CELERY_TASK_ROUTES = {"batches.tasks.*": {"queue": METRALE["BATCH_QUEUE"]}}

# With a broker, `celery beat` runs the purge; without one, the server's housekeeping thread does.
CELERY_BEAT_SCHEDULE = {
    "purge-expired-stored-items": {
        "task": "responses_api.tasks.purge_expired",
        "schedule": METRALE["PURGE_INTERVAL_S"],
    },
}

# Django refuses larger bodies itself; the API middleware answers 413 first, in OpenAI's shape.
DATA_UPLOAD_MAX_MEMORY_SIZE = METRALE["MAX_REQUEST_BYTES"]

# Every line names the request it belongs to ("-" outside one): inference.http.request_context.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"request_id": {"()": "inference.http.request_context.RequestIdFilter"},
                "client_fault": {"()": "inference.http.request_context.ClientFaultFilter"},
                "model_state": {"()": "inference.operations.runtime.ModelStateFilter"}},
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s [%(request_id)s]: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain",
                             "filters": ["request_id", "client_fault"]}},
    "root": {"handlers": ["console"], "level": envstr("METRALE_LOG_LEVEL", "INFO")},
    # A 503 while the model loads or swaps is its state, not an error: ModelStateFilter drops it.
    "loggers": {"django.request": {"level": "ERROR", "filters": ["model_state"]}},
}
