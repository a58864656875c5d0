"""The narrower instruction-set builds of the kernel library this machine can run, for the tests that
compare every path bit for bit (a CI machine may be any of them)."""
from inference.engine.kernels.build import cpu_flags_text


def narrower_builds() -> list[tuple[str, ...]]:
    """build() extra flags for this CPU's narrower paths: ("-mno-avx512f",) for the AVX2 path where
    the CPU has AVX-512, ("-mno-avx2",) for the portable path where it has AVX2; [] otherwise."""
    flags = set(cpu_flags_text().split())
    out = []
    if "avx512f" in flags:
        out.append(("-mno-avx512f",))
    if "avx2" in flags:
        out.append(("-mno-avx2",))
    return out
