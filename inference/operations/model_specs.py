"""Which models this server may serve: METRALE_MODELS (or METRALE_MODEL and METRALE_EMBEDDING_MODEL) read into ModelSpecs.

Each item of METRALE_MODELS (comma-separated) is one of:
- a name from `manage.py pull_model`'s catalogue (its folder METRALE_HOME/models/<name>);
- a model folder (an HF folder, imported or pulled; a sentence-transformers folder);
- a GGUF file (a path ending in .gguf), imported on first use into METRALE_HOME/models/<stem>
  (import_model's conversion, GGUF blocks kept) and read from there afterwards.
Its served name is the folder's (or the GGUF file's stem); whether it is a chat or an embedding
model is read from the folder (sentence-transformers' modules.json or 1_Pooling: embedding), or
for a catalogue model not pulled yet from the catalogue (a zipped folder is sentence-transformers').
Without METRALE_MODELS, METRALE_MODEL and METRALE_EMBEDDING_MODEL are the list (one each);
METRALE_SERVED_MODEL_NAME names the first chat model. The first chat model is the default of a
request that names none.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

CHAT = "chat"
EMBEDDING = "embedding"


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One configured model: its served `name`, where it comes from (`source`: the folder, or the
    .gguf file to import into `folder`), its `kind` (CHAT or EMBEDDING) and whether it was a GGUF."""

    name: str
    folder: Path
    kind: str
    gguf: Path | None = None

    @property
    def source(self) -> str:
        return str(self.gguf or self.folder)


def models_home() -> Path:
    return Path(settings.METRALE_HOME) / "models"


def catalogue() -> dict[str, str]:
    """pull_model's catalogue: name -> kind (a zipped folder is sentence-transformers': embedding)."""
    from inference.management.commands.pull_model import ASSEMBLED_MODELS, PULLABLE_MODELS

    kinds = {name: EMBEDDING if member.endswith(".zip") else CHAT for name, (_, member) in PULLABLE_MODELS.items()}
    kinds.update({name: CHAT for name in ASSEMBLED_MODELS})
    return kinds


def folder_kind(folder: Path, default: str = CHAT) -> str:
    """EMBEDDING for a sentence-transformers folder (modules.json or 1_Pooling/), CHAT for another
    existing folder, `default` for a folder that does not exist (yet)."""
    if (folder / "modules.json").is_file() or (folder / "1_Pooling").is_dir():
        return EMBEDDING
    return CHAT if folder.is_dir() else default


def spec_for(item: str, served_name: str | None = None) -> ModelSpec:
    """The ModelSpec of one METRALE_MODELS item (module doc). Raises nothing: a folder that is missing
    is reported when the model loads (its load fails naming the folder)."""
    item = item.strip()
    path = Path(item).expanduser()
    if item.lower().endswith(".gguf"):
        folder = models_home() / path.stem.lower()
        return ModelSpec(served_name or path.stem.lower(), folder, CHAT, gguf=path)
    known = catalogue()
    if not path.exists() and "/" not in item and item in known:
        folder = models_home() / item
        return ModelSpec(served_name or item, folder, folder_kind(folder, known[item]))
    if not path.exists() and "/" not in item:
        path = models_home() / item
    return ModelSpec(served_name or path.name, path, folder_kind(path))


def configured_specs(metrale: dict | None = None) -> list[ModelSpec]:
    """The configured models in order (module doc), each name once (a later duplicate is dropped)."""
    m = settings.METRALE if metrale is None else metrale
    items = m.get("MODELS") or []
    if isinstance(items, str):
        items = [part for part in items.split(",") if part.strip()]
    specs: list[ModelSpec] = []
    if items:
        specs = [spec_for(item) for item in items]
    else:
        if m.get("MODEL"):
            spec = spec_for(str(m["MODEL"]), m.get("SERVED_MODEL_NAME") or None)
            specs.append(ModelSpec(spec.name, spec.folder, CHAT, spec.gguf))
        if m.get("EMBEDDING_MODEL"):
            spec = spec_for(str(m["EMBEDDING_MODEL"]))
            specs.append(ModelSpec(spec.name, spec.folder, EMBEDDING, spec.gguf))
    seen: set[str] = set()
    unique = []
    for spec in specs:
        if spec.name not in seen:
            seen.add(spec.name)
            unique.append(spec)
    return unique
