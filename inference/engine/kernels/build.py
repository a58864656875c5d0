"""Compile the kernel sources (cpu_kernels.c, int8_gemm.c, block_gemm.c, kquant_gemm.c, amx_gemm.c, decode_layer.c, lora.c, sample.c, encoder.c, layout.c) into a shared library once per source version and machine.

The library is cached under `$METRALE_HOME/kernels/<hash>/` (default
~/.cache/metrale), the hash covering the source, the compiler command and the CPU
flags (it is built with -march=native). A build goes to a temporary name and is
renamed into place, so concurrent processes never load a half-written file.
Raises KernelBuildError when no C compiler is found or the compile fails.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sysconfig
import tempfile
from pathlib import Path

import torch

from ..home import metrale_home

HERE = Path(__file__).parent
SOURCES = [HERE / "cpu_kernels.c", HERE / "int8_gemm.c", HERE / "block_gemm.c", HERE / "kquant_gemm.c",
           HERE / "amx_gemm.c", HERE / "decode_layer.c", HERE / "lora.c", HERE / "sample.c", HERE / "encoder.c",
           HERE / "layout.c"]
HEADERS = [HERE / "kernels.h", HERE / "lora.h", HERE / "codes512.h", HERE / "decode_layer.h"]
FLAGS = ["-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-fPIC", "-shared", "-std=c11"]


class KernelBuildError(RuntimeError):
    """The C kernels could not be compiled here (no compiler, or it failed)."""


def _compiler() -> str:
    for name in (os.environ.get("CC"), (sysconfig.get_config_var("CC") or "").split(" ")[0], "cc", "gcc"):
        if name and shutil.which(name):
            return shutil.which(name)
    raise KernelBuildError("no C compiler (cc or gcc) on PATH")


def cpuinfo_field(name: str) -> str:
    """The value of the first `name` line of /proc/cpuinfo (e.g. "flags", "model name"), or "" where
    there is none (no such file or field)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, sep, value = line.partition(":")
                if sep and key.strip() == name:
                    return value.strip()
    except OSError:
        pass
    return ""


def cpu_flags_text() -> str:
    """The CPU's instruction-set flags as /proc/cpuinfo lists them (space-separated), or ""."""
    return cpuinfo_field("flags")


def _gomp() -> list[str]:
    """Link torch's own libgomp so the kernels share torch's OpenMP runtime (one thread pool)."""
    lib = Path(torch.__file__).parent / "lib"
    found = sorted(lib.glob("libgomp*.so*"))
    return [str(found[0]), f"-Wl,-rpath,{lib}"] if found else []


def cache_dir() -> Path:
    """Where built libraries are kept: $METRALE_HOME/kernels (default ~/.cache/metrale/kernels)."""
    return metrale_home() / "kernels"


def build(extra_flags: tuple[str, ...] = ()) -> Path:
    """Return the path of the compiled library, compiling it first if needed (~2 s on 2 cores).

    extra_flags are appended to FLAGS (the tests use them to build the narrower
    instruction-set paths of this machine, e.g. "-mno-avx512f" for the AVX2 kernels).
    Raises KernelBuildError when there is no C compiler or the compile fails.
    """
    cc = _compiler()
    command = [cc, *FLAGS, *extra_flags]
    text = b"".join(p.read_bytes() for p in SOURCES + HEADERS)
    digest = hashlib.sha256(text + " ".join(command).encode() + cpu_flags_text().encode()).hexdigest()[:16]
    target = cache_dir() / digest / "libmetrale_kernels.so"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        proc = subprocess.run([*command, f"-I{HERE}", *map(str, SOURCES), "-o", tmp, "-lm", *_gomp()], capture_output=True, text=True,
                              timeout=300)
        if proc.returncode != 0:
            raise KernelBuildError(f"{cc} failed: {proc.stderr.strip()[-2000:]}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    except (OSError, subprocess.SubprocessError) as exc:
        raise KernelBuildError(f"compiling the CPU kernels failed: {exc}") from exc
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target
