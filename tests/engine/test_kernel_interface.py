"""The kernels' interface: every function Python binds is declared in a header (the compiler then checks each
definition against it), and every struct Python passes is checked at load against the compiler's own layout
(layout.c): a field added, moved or retyped on either side is refused."""
from __future__ import annotations

import ctypes
import importlib
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from inference.engine import kernels
from inference.engine.kernels import layout
from inference.engine.kernels.layout import KernelLayoutError

build = importlib.import_module("inference.engine.kernels.build")  # the module (the package exports its build())
KERNELS = Path(kernels.__file__).parent
ENGINE = KERNELS.parent


def declared_functions() -> set[str]:
    text = "".join(h.read_text() for h in build.HEADERS)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return set(re.findall(r"\b(metrale_\w+)\s*\(", text))


def bound_functions() -> set[str]:
    names = set()
    for source in ENGINE.rglob("*.py"):
        names |= set(re.findall(r"\blib\.(metrale_\w+)", source.read_text()))
    return names


def test_every_function_bound_from_python_is_declared_in_a_header():
    bound = bound_functions()
    assert {"metrale_decode_layers", "metrale_sample", "metrale_struct_layout"} <= bound
    assert bound - declared_functions() == set()


def test_every_exported_function_has_a_prototype():
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    proc = subprocess.run([cc, *[f for f in build.FLAGS if f not in ("-shared", "-fPIC")], "-fsyntax-only",
                           "-Werror=missing-prototypes", f"-I{KERNELS}", *map(str, build.SOURCES)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.fixture(scope="module")
def lib():
    if not kernels.available():
        pytest.skip("the CPU kernels are unavailable here")
    return kernels.library()


def test_the_loaded_library_agrees_with_every_struct(lib):
    layout.check_layouts(lib)  # what every load does; raises on a difference
    size, _, fields = layout.c_layout(lib, "metrale_step")
    assert size == ctypes.sizeof(layout.structures()["metrale_step"])
    assert [f for f, *_ in fields] == [f for f, *_ in layout.py_layout(layout.structures()["metrale_step"])[2]]
    assert set(layout.structures()) == {"metrale_weight", "metrale_layer", "metrale_view", "metrale_step",
                                        "metrale_lora_part", "metrale_lora_layer"}


def view_fields():
    return list(layout.structures()["metrale_view"]._fields_)


@pytest.mark.parametrize("change, message", [
    (lambda f: f + [("extra", ctypes.c_long)], "metrale_view.extra: in "),
    (lambda f: [f[1], f[0]] + f[2:], "metrale_view.cos: offset 0 size 8 in C, offset 8 size 8"),
    (lambda f: f[:-1] + [("width", ctypes.c_int)], "metrale_view.width: offset 48 size 8 in C, offset 48 size 4"),
    (lambda f: f[:-1], "metrale_view.width: in C, not in"),
])
def test_a_python_struct_that_differs_is_refused(lib, change, message):
    changed = type("_View", (ctypes.Structure,), {"_fields_": change(view_fields())})
    with pytest.raises(KernelLayoutError, match=re.escape(message)):
        layout.check_layouts(lib, {"metrale_view": changed})


def test_a_c_struct_that_differs_is_refused(tmp_path):
    """decode_layer.h with a field added to metrale_view (not listed in layout.c): layout.c built alone from it
    reports the new size and offsets, and the check refuses Python's unchanged _View and _Step."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    for name in ("layout.c", "kernels.h", "lora.h", "decode_layer.h"):
        shutil.copy(KERNELS / name, tmp_path / name)
    header = tmp_path / "decode_layer.h"
    text = header.read_text()
    assert "    const float *cos, *sin;" in text
    header.write_text(text.replace("    const float *cos, *sin;", "    const float *cos, *sin;\n    long rope_rows;"))
    so = tmp_path / "layout.so"
    subprocess.run([cc, "-O1", "-shared", "-fPIC", "-std=c11", str(tmp_path / "layout.c"), "-o", str(so)],
                   check=True, timeout=60)
    changed = ctypes.CDLL(str(so))
    layout.bind(changed)
    with pytest.raises(KernelLayoutError) as caught:
        layout.check_layouts(changed)
    assert "metrale_view: sizeof 64" in str(caught.value) and "metrale_view.slots: offset 24" in str(caught.value)
    assert "metrale_step: sizeof" in str(caught.value)


def test_a_refused_library_is_refused_on_every_load(monkeypatch):
    """_load raises KernelLayoutError (not a silent fallback to torch), and again on the next call."""
    if not kernels.available():
        pytest.skip("the CPU kernels are unavailable here")
    bad = type("_View", (ctypes.Structure,), {"_fields_": view_fields() + [("extra", ctypes.c_long)]})
    real = layout.structures
    monkeypatch.setattr(layout, "structures", lambda: {**real(), "metrale_view": bad})
    monkeypatch.setattr(kernels, "_lib", None)
    monkeypatch.setattr(kernels, "_tried", False)
    monkeypatch.setattr(kernels, "_layout_error", None)
    for _ in range(2):
        with pytest.raises(KernelLayoutError, match="metrale_view.extra"):
            kernels.available()
