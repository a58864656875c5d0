"""Live daphne servers on free ports, serving the imported SmolLM2, shared by the tests that need a real server
(tests/e2e with the openai SDK, tests/browser with Chromium): one with auth off, and one with
METRALE_REQUIRE_AUTH on whose tenants and keys are made with manage.py. A pytest plugin (tests/conftest.py
loads it), so each server starts at most once per test session whichever folders use it."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from inference.bench.live_server import ROOT, LiveServer


@pytest.fixture(scope="session")
def metrale_server(smollm2_dir, tmp_path_factory):
    """A daphne server serving SmolLM2 in float32 with the step log on, all-MiniLM-L6-v2 beside it, and
    the request log written to `server.request_log` (a JSON-lines file)."""
    from tests.conftest import pulled_minilm

    workdir = tmp_path_factory.mktemp("live")
    server = LiveServer({"METRALE_MODEL": str(smollm2_dir), "METRALE_STEP_LOG": "1",
                         "METRALE_KV_CACHE_BYTES": str(256 << 20),
                         "METRALE_EMBEDDING_MODEL": str(pulled_minilm()),
                         "METRALE_REQUEST_LOG": str(workdir / "requests.jsonl")}, workdir)
    server.request_log = workdir / "requests.jsonl"
    server.wait_ready()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def openai_client(metrale_server):
    from openai import OpenAI

    return OpenAI(base_url=metrale_server.url + "/v1", api_key="test-key", max_retries=0, timeout=120)


def manage(server: LiveServer, *args: str, env: dict[str, str] | None = None) -> str:
    """Run `manage.py ARGS` against `server`'s database (with extra environment `env`); its stdout."""
    env = {**os.environ, "METRALE_SQLITE_PATH": str(server.db), **(env or {})}
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, check=True,
                          capture_output=True, text=True).stdout


@pytest.fixture(scope="session")
def auth_server(smollm2_dir, tmp_path_factory):
    """A daphne server serving SmolLM2 with METRALE_REQUIRE_AUTH on, and `keys`: a new API key for each
    of the tenants "owner" and "other", made with manage.py create_tenant / create_api_key against its
    database while the model loads."""
    server = LiveServer({"METRALE_MODEL": str(smollm2_dir), "METRALE_REQUIRE_AUTH": "1",
                         "METRALE_KV_CACHE_BYTES": str(64 << 20)}, tmp_path_factory.mktemp("live-auth"))
    try:
        server.keys = {}
        for name in ("owner", "other"):
            manage(server, "create_tenant", name)
            server.keys[name] = manage(server, "create_api_key", name, "--name", "e2e").strip()
        server.wait_ready()
    except BaseException:
        server.stop()
        raise
    yield server
    server.stop()


@pytest.fixture(scope="session")
def tenant_client(auth_server):
    """tenant_client(name) -> an openai.OpenAI client calling the auth server with tenant `name`'s key
    ("owner" or "other")."""
    from openai import OpenAI

    def make(name: str):
        return OpenAI(base_url=auth_server.url + "/v1", api_key=auth_server.keys[name], max_retries=0,
                      timeout=120)
    return make
