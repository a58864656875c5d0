"""System checks for auth, rate limiting, the parser settings, the engine settings, the model folder and the
KV event settings (ids metrale.W001, W002, W003, E001, E002, E003)."""
from django.core.checks import Error, Warning, register
from django.core.cache import caches
from django.urls import URLPattern, URLResolver, get_resolver

from ..tenancy.ratelimiting.store import is_shared_atomically
from ..serving.errors import OPENAI

# Paths that must go through inference.http.api.openai_endpoint (reference/metrale-behaviour.md 2.2).
GUARDED_PREFIXES = ("v1/", "api/", "tokenize", "detokenize")


@register()
def check_rate_limit_cache(app_configs, **kwargs):
    """W001: the default cache cannot debit budgets atomically across processes."""
    cache = caches["default"]
    if is_shared_atomically(cache):
        return []
    return [Warning(
        f"The default cache ({type(cache).__name__}) has no atomic check-and-debit across "
        "processes; rate limits are exact only within one process.",
        hint="Set REDIS_URL (django-redis) to share limits between server processes.",
        id="metrale.W001")]


def site_routes(resolver=None, prefix=""):
    """(route, view) for every URL pattern of the site, included URL configurations walked, in
    resolution order (a route as Django writes it: `v1/models/<path:model_id>`)."""
    resolver = resolver or get_resolver()
    for entry in resolver.url_patterns:
        route = prefix + str(entry.pattern)
        if isinstance(entry, URLResolver):
            yield from site_routes(entry, route)
        elif isinstance(entry, URLPattern):
            yield route, entry.callback


def guarded_routes():
    """(route, view) for every URL under the guarded prefixes."""
    return ((route, view) for route, view in site_routes() if route.lstrip("^").startswith(GUARDED_PREFIXES))


@register()
def check_guarded_routes(app_configs, **kwargs):
    """W002: a /v1/*, /api/* (Ollama's), /tokenize or /detokenize view that skips auth and rate limiting (neither
    api.openai_endpoint nor api.operator_endpoint), or one URL
    whose method views (api.by_method) answer in different error shapes (the route has one shape,
    which every layer reads from its view: inference.http.error_shapes)."""
    problems = []
    for route, view in guarded_routes():
        if not (getattr(view, "openai_endpoint", False) or getattr(view, "operator_endpoint", False)):
            problems.append(Warning(f"The view for {route!r} is not wrapped by inference.http.api.openai_endpoint: it "
                                    "skips auth, rate limits and the x-ratelimit-* headers.", id="metrale.W002"))
        shapes = {getattr(v, "error_shape", OPENAI) for v in getattr(view, "method_views", {}).values()}
        if len(shapes) > 1:
            problems.append(Warning(f"The method views of {route!r} answer in different error shapes "
                                    f"({', '.join(sorted(getattr(s, 'name', '?') for s in shapes))}): a route "
                                    "has one error shape.", id="metrale.W002"))
    return problems


@register()
def check_parser_settings(app_configs, **kwargs):
    """E001: METRALE_TOOL_CALL_PARSER or METRALE_REASONING_PARSER names no known parser."""
    from ..serving.text_setup import check_parser_names

    return [Error(problem, id="metrale.E001") for problem in check_parser_names()]


@register()
def check_engine_settings(app_configs, **kwargs):
    """E002: an engine setting (METRALE_DTYPE, METRALE_WEIGHTS, ...) the engine cannot use.
    W003: a configured model's folder (or GGUF file) is missing or unreadable. Only a warning: on a fresh
    machine `migrate` runs before `pull_model` has fetched the model, and must not be blocked."""
    from inference.engine.config import ConfigError
    from inference.engine.model_folder import ModelFolder
    from inference.operations.runtime import engine_config

    try:
        config = engine_config()
    except ConfigError as exc:
        return [Error(f"The engine settings are invalid: {exc}.", hint="See the settings table in README.md.",
                      id="metrale.E002")]
    from inference.operations.model_specs import CHAT, configured_specs

    problems = []
    for spec in configured_specs():
        if spec.gguf is not None and not (spec.folder / "config.json").is_file():
            if not spec.gguf.is_file():
                problems.append((spec, f"the GGUF file {spec.gguf} does not exist"))
            continue
        if spec.kind != CHAT:
            if not (spec.folder / "config.json").is_file():
                problems.append((spec, f"{spec.folder / 'config.json'} does not exist"))
            continue
        folder = ModelFolder.load(spec.folder)
        try:
            folder.model_config
        except ConfigError as exc:
            problems.append((spec, str(exc)))
        if not (folder.path / "tokenizer.json").is_file():
            problems.append((spec, f"{folder.path / 'tokenizer.json'} does not exist"))
    return [Warning(f"The model {spec.name} ({spec.source}) cannot be served: {problem}.",
                    hint="Run `manage.py pull_model NAME` (make serve pulls SmolLM2), or point METRALE_MODELS "
                         "(or METRALE_MODEL) at an HF-format folder or a GGUF file.", id="metrale.W003")
            for spec, problem in problems]


@register()
def check_kv_events_setting(app_configs, **kwargs):
    """E003: METRALE_KV_EVENTS is neither an endpoint nor a JSON object of vLLM's kv-events config fields."""
    from django.conf import settings

    from .kv_events import KVEventsConfig

    try:
        KVEventsConfig.parse(settings.METRALE.get("KV_EVENTS"))
    except (ValueError, TypeError) as exc:
        return [Error(f"METRALE_KV_EVENTS is invalid: {exc}.", hint='Give an endpoint (tcp://*:5557) or vLLM\'s '
                      'kv-events config as JSON, e.g. {"endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}.',
                      id="metrale.E003")]
    return []
