"""A live daphne server on a free port, serving the imported SmolLM2, for tests with the openai SDK."""
from __future__ import annotations

import pytest

from inference.bench.live_server import LiveServer


@pytest.fixture(scope="session")
def metrale_server(smollm2_dir, tmp_path_factory):
    """A daphne server serving SmolLM2 in float32 with the step log on."""
    server = LiveServer({"METRALE_MODEL": str(smollm2_dir), "METRALE_STEP_LOG": "1",
                         "METRALE_KV_CACHE_BYTES": str(256 << 20)}, tmp_path_factory.mktemp("live"))
    server.wait_ready()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def openai_client(metrale_server):
    from openai import OpenAI

    return OpenAI(base_url=metrale_server.url + "/v1", api_key="test-key", max_retries=0, timeout=120)
