"""The Dockerfile (README, "The package and the `metrale` command") builds the wheel, installs that wheel with pip
and runs `metrale serve`; building the image itself is not tested here."""
from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def stages() -> list[list[tuple[str, str]]]:
    """The Dockerfile's stages, each a list of (INSTRUCTION, arguments), continuation lines joined."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    out: list[list[tuple[str, str]]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, args = line.partition(" ")
        if keyword.upper() == "FROM":
            out.append([])
        out[-1].append((keyword.upper(), args.strip()))
    return out


def test_the_image_installs_the_wheel_and_runs_metrale_serve():
    build, final = stages()[0], stages()[-1]
    name = build[0][1].split()[-1]  # FROM image AS name
    assert any(k == "RUN" and "pip wheel" in a and "/dist" in a for k, a in build), build
    assert any(k == "COPY" and a.startswith(f"--from={name} /dist") for k, a in final), final
    install = [a for k, a in final if k == "RUN" and "pip install" in a and ".whl" in a]
    assert install and "metrale-*.whl" in install[0]
    assert any(k == "RUN" and "gcc" in a for k, a in final)  # the kernels compile at first start
    assert ("ENV", "METRALE_HOME=/data") in final
    entry = json.loads(dict(final)["ENTRYPOINT"]) + json.loads(dict(final)["CMD"])
    assert entry[:2] == ["metrale", "serve"] and "--host" in entry and entry[entry.index("--host") + 1] == "0.0.0.0"


def test_the_build_context_leaves_out_what_the_wheel_does_not_need():
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", "var", "tests"} <= set(ignored)
