"""`manage.py import_model PATH.gguf OUT_DIR`: import a GGUF file into an HF-format model folder."""

from django.core.management.base import BaseCommand, CommandError

from inference.engine.checkpoints import GGUFImportError, import_gguf
from inference.engine.checkpoints.gguf import IMPORT_DTYPES


class Command(BaseCommand):
    help = "Import a Llama-family GGUF file into an HF-format folder the engine can serve."

    def add_arguments(self, parser):
        parser.add_argument("gguf_path", help="the .gguf file")
        parser.add_argument("out_dir", help="the folder to create")
        parser.add_argument(
            "--dtype",
            choices=IMPORT_DTYPES,
            default="blocks",
            help="blocks (default): keep the Q4_0 / Q4_1 / Q8_0 tensors as shipped, the rest float32; "
            "float32 or bfloat16: dequantize every tensor (a folder transformers reads too)",
        )
        parser.add_argument("--force", action="store_true", help="replace OUT_DIR if it exists")

    def handle(self, *args, **options):
        try:
            out = import_gguf(
                options["gguf_path"],
                options["out_dir"],
                dtype=options["dtype"],
                overwrite=options["force"],
                progress=options["verbosity"] > 0,
            )
        except GGUFImportError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(self.style.SUCCESS(f"Imported {options['gguf_path']} -> {out}"))
