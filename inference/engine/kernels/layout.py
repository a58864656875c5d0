"""The structs Python passes to the kernels, checked against the compiled library's own layout at every load.

Each ctypes Structure below mirrors a C struct (kernels.h, lora.h, decode_layer.h). layout.c reports, as the
compiler laid it out, each struct's size and alignment and each field's name, offset and size in declaration
order; `check_layouts` compares them with the Structure's and raises KernelLayoutError naming every difference,
so a field added, moved, retyped or renamed on one side stops the load instead of corrupting memory.
"""
from __future__ import annotations

import ctypes


class KernelLayoutError(RuntimeError):
    """A ctypes Structure differs from the compiled struct it stands for; str() lists the differences."""


def structures() -> dict[str, type[ctypes.Structure]]:
    """C struct name -> the ctypes Structure passed as it (every struct Python hands the kernels)."""
    from ..layers import fused_decode, lora
    from . import KernelWeight

    return {"metrale_weight": KernelWeight.Struct, "metrale_layer": fused_decode._Layer,
            "metrale_view": fused_decode._View, "metrale_step": fused_decode._Step,
            "metrale_lora_part": lora._CPart, "metrale_lora_layer": lora._CLayer}


def bind(lib: ctypes.CDLL) -> None:
    """Declare layout.c's two functions' argument and result types on `lib` (kernels.h)."""
    lib.metrale_struct_layout.argtypes = [ctypes.c_char_p, ctypes.c_char_p] + [ctypes.POINTER(ctypes.c_long)] * 3
    lib.metrale_struct_layout.restype = ctypes.c_int
    lib.metrale_struct_field.argtypes = [ctypes.c_char_p, ctypes.c_long]
    lib.metrale_struct_field.restype = ctypes.c_char_p


def c_layout(lib: ctypes.CDLL, name: str) -> tuple[int, int, list[tuple[str, int, int]]] | None:
    """(size, alignment, [(field, offset, size), ...] in declaration order) of C struct `name` as the library was
    compiled, or None when layout.c does not report it. `lib` must have been `bind`-ed."""
    offset, size, align = ctypes.c_long(), ctypes.c_long(), ctypes.c_long()
    if not lib.metrale_struct_layout(name.encode(), None, ctypes.byref(offset), ctypes.byref(size),
                                     ctypes.byref(align)):
        return None
    total, alignment, fields = size.value, align.value, []
    while (field := lib.metrale_struct_field(name.encode(), len(fields))) is not None:
        lib.metrale_struct_layout(name.encode(), field, ctypes.byref(offset), ctypes.byref(size), ctypes.byref(align))
        fields.append((field.decode(), offset.value, size.value))
    return total, alignment, fields


def py_layout(struct: type[ctypes.Structure]) -> tuple[int, int, list[tuple[str, int, int]]]:
    """The same triple for a ctypes Structure."""
    fields = [(name, getattr(struct, name).offset, getattr(struct, name).size) for name, *_ in struct._fields_]
    return ctypes.sizeof(struct), ctypes.alignment(struct), fields


def differences(lib: ctypes.CDLL, name: str, struct: type[ctypes.Structure]) -> list[str]:
    """Every way `struct` differs from C struct `name` in the library (empty when they agree)."""
    c = c_layout(lib, name)
    if c is None:
        return [f"{name}: the library does not report this struct (layout.c)"]
    py = py_layout(struct)
    out = []
    if (c[0], c[1]) != (py[0], py[1]):
        out.append(f"{name}: sizeof {c[0]} and alignment {c[1]} in C, {py[0]} and {py[1]} in {struct.__qualname__}")
    c_fields, py_fields = dict((f, (o, s)) for f, o, s in c[2]), dict((f, (o, s)) for f, o, s in py[2])
    for field in [f for f, *_ in c[2] if f not in py_fields]:
        out.append(f"{name}.{field}: in C, not in {struct.__qualname__}")
    for field in [f for f, *_ in py[2] if f not in c_fields]:
        out.append(f"{name}.{field}: in {struct.__qualname__}, not in C")
    for field, (offset, size) in c_fields.items():
        if field in py_fields and py_fields[field] != (offset, size):
            out.append(f"{name}.{field}: offset {offset} size {size} in C, offset {py_fields[field][0]} size "
                       f"{py_fields[field][1]} in {struct.__qualname__}")
    if not out and [f for f, *_ in c[2]] != [f for f, *_ in py[2]]:
        out.append(f"{name}: fields in another order in C than in {struct.__qualname__}")
    return out


def check_layouts(lib: ctypes.CDLL, structs: dict[str, type[ctypes.Structure]] | None = None) -> None:
    """Raise KernelLayoutError listing every difference between `structs` (default: `structures()`) and the
    library's own layouts. `lib` must have been `bind`-ed."""
    problems = [p for name, struct in (structs or structures()).items() for p in differences(lib, name, struct)]
    if problems:
        raise KernelLayoutError("the compiled kernels' structs differ from Python's (kernels/layout.py): "
                                + "; ".join(problems))
