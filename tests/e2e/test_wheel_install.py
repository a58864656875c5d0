"""The package as a user installs it: the wheel built from this checkout, installed into a fresh venv (no checkout
on its path), `metrale serve` started from an empty temporary directory on a free port with the default
configuration (the 4-bit SmolLM2 GGUF as pulled), the README's first example run as written against it with the
openai SDK, then the server stopped with SIGTERM.

METRALE_HOME is a temporary folder whose models/ and kernels/ are links to the session's (the pulled model and the
compiled kernels, the same sources so the same cache entry); the database, static files and everything else
`metrale serve` writes stay in the temporary folder. The wheel is installed without its dependencies; the fresh
venv reaches this environment's installed ones through a path file (its own site-packages first, so the wheel's
packages are the ones imported, and this checkout's editable install is not: a path file's folder is not a site
folder, its own path files are not read), and `pip check` proves that what the wheel declares is satisfied there.
Unpacking torch again into every fresh venv cost a test worker about a minute and proved nothing more.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import site
import subprocess
import sys
import tarfile
import time
import tomllib
from pathlib import Path

import httpx
import pytest

from inference.bench.live_server import free_port

ROOT = Path(__file__).resolve().parents[2]
SMOLLM2 = "smollm2-135m-instruct"


def packaged_sources(into: Path) -> Path:
    """A copy of what the wheel is built from (pyproject.toml, README.md and the packages pyproject lists), so
    the build writes nothing into the checkout."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = [p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]]
    into.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, into / name)
    for package in packages:
        shutil.copytree(ROOT / package, into / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return into


def readme_first_example() -> str:
    """The first Python block of README.md's "Using it" section, as written."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Using it"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the fresh venv's bin/, the sdist, seconds for build + venv + install). The README's `python -m build`
    (with this environment's setuptools: no isolated build environment to download) makes the sdist and, from
    it, the wheel."""
    from django.conf import settings

    if not (Path(settings.METRALE_HOME) / "models" / SMOLLM2 / "config.json").is_file():
        pytest.skip(f"{SMOLLM2} is not pulled (make test pulls it)")
    work = tmp_path_factory.mktemp("wheel")
    started = time.monotonic()
    src = packaged_sources(work / "src")
    built = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(work / "dist"), str(src)],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    [wheel], [sdist] = (work / "dist").glob("metrale-*.whl"), (work / "dist").glob("metrale-*.tar.gz")
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    pip = subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-compile",
                          "--no-deps", "--no-index", str(wheel)], capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stdout[-2000:] + pip.stderr[-3000:]
    own_site = subprocess.run([python, "-c", "import site; print(site.getsitepackages()[0])"], check=True,
                              capture_output=True, text=True).stdout.strip()
    (Path(own_site) / "metrale-test-dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    check = subprocess.run([sys.executable, "-m", "pip", "--python", python, "check"], capture_output=True,
                           text=True, timeout=300)
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-2000:]
    return venv / "bin", sdist, time.monotonic() - started


def clean_env(home: Path) -> dict[str, str]:
    """This environment without the project's own variables (settings, model, paths), METRALE_HOME at `home`."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("METRALE_", "DJANGO_", "PYTHON")) and k != "VIRTUAL_ENV"}
    return {**env, "METRALE_HOME": str(home)}


@pytest.fixture(scope="module")
def served(installed, tmp_path_factory):
    """`metrale serve --port P` from an empty directory: (its base URL, the process, the home folder)."""
    from django.conf import settings

    bin_dir = installed[0]
    home = tmp_path_factory.mktemp("metrale-home")
    for name in ("models", "kernels"):
        (Path(settings.METRALE_HOME) / name).mkdir(parents=True, exist_ok=True)
        (home / name).symlink_to(Path(settings.METRALE_HOME) / name)
    cwd = tmp_path_factory.mktemp("empty")
    port = free_port()
    log = open(home / "serve.log", "w")
    proc = subprocess.Popen([str(bin_dir / "metrale"), "serve", "--port", str(port)], cwd=cwd,
                            env=clean_env(home), stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, (home / "serve.log").read_text()[-3000:]
            assert time.monotonic() < deadline, (home / "serve.log").read_text()[-3000:]
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        yield url, proc, home
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()


def test_the_wheel_holds_every_app_and_runs_from_site_packages(installed):
    bin_dir, sdist, seconds = installed
    print(f"sdist and wheel built, installed into a fresh venv in {seconds:.1f} s")
    code = ("import importlib, inference, pathlib; print(pathlib.Path(inference.__file__).parent.parent); "
            "[importlib.import_module(a + '.apps') for a in "
            "('inference', 'responses_api', 'batches', 'anthropic_api', 'ollama_api', 'adapters', 'console')]")
    site = Path(subprocess.run([str(bin_dir / "python"), "-c", code], check=True, capture_output=True, text=True,
                               cwd="/", env=clean_env(Path("/nonexistent"))).stdout.strip())
    assert site.name == "site-packages" and bin_dir.parent in site.parents
    for path in ("inference/engine/kernels/decode_layer.c", "inference/engine/kernels/decode_layer.h",
                 "inference/engine/kernels/layout.c", "console/templates/console/index.html",
                 "console/static/console/sse.js", "metrale_site/templates/admin/base_site.html",
                 "batches/migrations/0001_initial.py", "adapters/migrations/0001_initial.py"):
        assert (site / path).is_file(), path
    with tarfile.open(sdist) as archive:
        names = set(archive.getnames())
    top = sdist.name.removesuffix(".tar.gz")
    assert {f"{top}/inference/engine/kernels/layout.c", f"{top}/console/static/console/sse.js"} <= names


def test_a_read_only_data_directory_is_named(installed, tmp_path):
    bin_dir = installed[0]
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    proc = subprocess.run([str(bin_dir / "metrale"), "manage", "check"], capture_output=True, text=True,
                          env=clean_env(blocked / "home"), cwd=tmp_path, timeout=120)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr == f"metrale: the data directory {blocked / 'home'} is not writable (Not a directory); " \
                          "set METRALE_HOME to a writable folder\n"


def test_the_readmes_first_example_as_written_ends_within_its_max_tokens(served, monkeypatch):
    """The README's first example, its base_url pointed at this server's port, run with the openai SDK; each chunk
    it reads is kept (and the usage asked for with stream_options, which changes nothing it generates)."""
    import openai
    from openai import OpenAI

    url, _, home = served
    example = readme_first_example()
    max_tokens = int(re.search(r"max_tokens=(\d+)", example).group(1))
    assert 'base_url="http://127.0.0.1:8000/v1"' in example
    chunks = []

    class Recorded(OpenAI):
        def __init__(self, **kwargs):
            super().__init__(**{**kwargs, "base_url": url + "/v1", "max_retries": 0, "timeout": 120})
            create = self.chat.completions.create

            def recorded(**request):
                for chunk in create(**request, stream_options={"include_usage": True}):
                    chunks.append(chunk)
                    if chunk.choices:
                        yield chunk
            self.chat.completions.create = recorded

    monkeypatch.setattr(openai, "OpenAI", Recorded)  # what the example's `from openai import OpenAI` gets
    printed = []
    exec(compile(example, "README.md", "exec"),
         {"print": lambda *a, **k: printed.append("".join(map(str, a))), "__name__": "readme"})
    text = "".join(printed)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    usage = chunks[-1].usage
    assert finish in (["stop"], ["length"]) and text.strip()
    assert 0 < usage.completion_tokens <= max_tokens
    print(f"README example: {usage.completion_tokens} tokens, finish {finish[0]}: {text!r}")
    assert (home / "metrale.sqlite3").is_file() and (home / "static" / "console" / "sse.js").is_file()


def test_the_front_door_and_static_files_come_from_the_package(served):
    url, _, _ = served
    page = httpx.get(url + "/", headers={"Accept": "text/html"}, timeout=30)  # a browser's (others: Ollama's probe)
    assert page.status_code == 200 and SMOLLM2 in page.text and "max_tokens" in page.text
    assert httpx.get(url + "/static/console/console.css", timeout=30).status_code == 200


def test_sigterm_stops_the_served_package(served):
    _, proc, home = served
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(90) == 0, (home / "serve.log").read_text()[-3000:]
