# The README's two commands (serve, test), the benchmark, the fuzz campaign and the long soak. Every step is idempotent.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8000

SOAK_S ?= 600

.PHONY: serve test bench fuzz soak install migrate model static browser cluster cluster-stop

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "torch==2.13.0"
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

migrate: install
	$(PY) manage.py migrate --noinput

# The three catalogue models `make serve` names (each pulled once into METRALE_HOME, then found there); Gemma 3
# 270M comes under the Gemma Terms of Use, which pull_model prints.
model: install
	$(PY) manage.py pull_model smollm2-135m-instruct
	$(PY) manage.py pull_model all-minilm-l6-v2
	$(PY) manage.py pull_model gemma-3-270m

# The admin's and the console's CSS and JavaScript, gathered into STATIC_ROOT for WhiteNoise.
static: install
	$(PY) manage.py collectstatic --noinput -v 0

# The browser tests (tests/browser) drive Debian's chromium through Playwright; nothing downloads a
# browser. Installed once (apt-get as root, or through sudo); the package lists are refreshed only
# when the install fails without it.
CHROMIUM := /usr/bin/chromium
APT_GET := $(if $(filter 0,$(shell id -u)),,sudo )apt-get
CHROMIUM_PACKAGES := chromium chromium-driver
$(CHROMIUM):
	DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y --no-install-recommends $(CHROMIUM_PACKAGES) || \
	  { $(APT_GET) update && DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y --no-install-recommends $(CHROMIUM_PACKAGES); }

browser: $(CHROMIUM)

# Without a model setting in the environment, SmolLM2 (the default), all-MiniLM-L6-v2 and Gemma 3 270M, each by
# its name, loaded on its first request (README "Many models behind one endpoint").
SERVE_MODELS := $(if $(METRALE_MODELS)$(METRALE_MODEL)$(METRALE_EMBEDDING_MODEL),,smollm2-135m-instruct,all-minilm-l6-v2,gemma-3-270m)

serve: migrate model static
	$(if $(SERVE_MODELS),METRALE_MODELS=$(SERVE_MODELS) )$(PY) manage.py serve --host $(HOST) --port $(PORT)

# REPLICAS replicas on the production settings (PostgreSQL and Redis on this machine; DATABASE_URL, REDIS_URL
# point elsewhere) behind vllm-router with kv_aware routing on PORT, and a Celery worker for batches
# (README, "Scaling out"); `make cluster-stop` ends them.
REPLICAS ?= 2
cluster: install model
	$(PY) manage.py cluster start --replicas $(REPLICAS) --host $(HOST) --port $(PORT)

cluster-stop: install
	$(PY) manage.py cluster stop

# The suite in TEST_WORKERS processes (pytest-xdist), a file's tests in one of them (their module and session
# fixtures started once there); the 30 slowest durations printed at the end. Bytecode is written even where the
# environment sets PYTHONDONTWRITEBYTECODE: without .pyc files every test process and every server the tests
# start compiles the project's modules again (each worker's collection took 26 s instead of 12 on a 2-vCPU EPYC),
# and pytest rewrites every test module's asserts anew.
TEST_WORKERS ?= 2
test: migrate model static browser
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --durations=30

# `make bench LLAMA_CPP_URL=http://127.0.0.1:8013 LLAMA_CPP_PID=<its pid>` adds the side-by-side with
# llama.cpp's llama-server on the same GGUF (README, "Speed").
LLAMA_CPP_URL ?=
LLAMA_CPP_PID ?= 0
# `make bench LLAMA_SERVER_BIN=... EMBEDDING_GGUF=...` adds llama-server --embeddings on the embedding model
# converted by llama.cpp's convert_hf_to_gguf.py (README, "Embeddings").
LLAMA_SERVER_BIN ?=
EMBEDDING_GGUF ?=
bench: migrate model
	$(PY) manage.py bench $(if $(LLAMA_CPP_URL),--llama-cpp-url $(LLAMA_CPP_URL) --llama-cpp-pid $(LLAMA_CPP_PID))
	$(PY) manage.py bench_speculative
	$(PY) manage.py bench_perplexity
	$(PY) manage.py bench_embeddings $(if $(LLAMA_SERVER_BIN),--llama-server $(LLAMA_SERVER_BIN) --gguf $(EMBEDDING_GGUF))
	$(PY) manage.py bench_router

# The reliability soak (tests/faults/test_soak.py) for SOAK_S seconds; `make test` runs a short one.
soak: migrate model
	METRALE_SOAK_S=$(SOAK_S) $(PY) -m pytest -p no:cacheprovider -s tests/faults/test_soak.py

# A long fuzz campaign against a live daphne with the real model (loopback only); prints its figures.
FUZZ_REQUESTS ?= 20000
FUZZ_TIME_S ?= 3600
fuzz: migrate model
	$(PY) -m tests.fuzz.campaign --requests $(FUZZ_REQUESTS) --time-s $(FUZZ_TIME_S)
