"""Import of other checkpoint formats into HF-format folders (GGUF for now)."""

from .gguf import GGUFImportError, import_gguf

__all__ = ["GGUFImportError", "import_gguf"]
