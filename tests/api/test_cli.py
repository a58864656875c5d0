"""The `metrale` command (metrale_site/cli.py) in this process: --help on each command, and the one-line errors with
a non-zero status for what a user can fix, each found before anything is pulled, migrated or served.
(tests/e2e/test_wheel_install.py runs the installed command itself.)"""
from __future__ import annotations

import socket

import pytest

from inference.bench.live_server import free_port
from metrale_site import __version__, cli


def run(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = cli.main(list(argv))
    except SystemExit as exc:  # argparse's --help, --version and usage errors
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("command, shows", [
    ([], "any Django command"),
    (["serve"], "--embedding-model"),
    (["pull"], "smollm2-135m-instruct"),
    (["import"], "FILE.gguf"),
])
def test_help_on_each_command(capsys, command, shows):
    code, out, _ = run(capsys, *command, "--help")
    assert code == 0 and out.startswith("usage: metrale") and shows in out


def test_manage_and_bench_pass_through_to_django(capsys):
    code, out, _ = run(capsys, "manage", "help", "create_api_key")
    assert code == 0 and "--admin" in out and "metrale manage create_api_key" in out
    code, out, _ = run(capsys, "bench", "--help")
    assert code == 0 and "--llama-cpp-url" in out


def test_version_is_the_package_version(capsys):
    code, out, _ = run(capsys, "--version")
    assert code == 0 and out.strip() == f"metrale {__version__}"


def one_line_error(capsys, *argv: str) -> str:
    code, out, err = run(capsys, *argv)
    assert code == 1 and out == "" and err.startswith("metrale: ") and err.count("\n") == 1, (code, out, err)
    return err


def test_unknown_model_names_the_catalogue(capsys):
    err = one_line_error(capsys, "serve", "--model", "no-such-model", "--port", str(free_port()))
    assert "no-such-model: unknown model" in err and "smollm2-135m-instruct" in err


def test_missing_model_folder_and_a_gguf_given_to_serve(capsys, tmp_path):
    err = one_line_error(capsys, "serve", "--model", str(tmp_path / "nowhere"), "--port", str(free_port()))
    assert f"{tmp_path / 'nowhere'}: no such folder" in err
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    err = one_line_error(capsys, "serve", "--model", str(gguf), "--port", str(free_port()))
    assert f"metrale import {gguf}" in err
    err = one_line_error(capsys, "serve", "--model", str(tmp_path), "--port", str(free_port()))
    assert "holds no config.json" in err


def test_missing_gguf_file_to_import(capsys, tmp_path):
    err = one_line_error(capsys, "import", str(tmp_path / "absent.gguf"))
    assert f"{tmp_path / 'absent.gguf'}: no such file" in err


def test_unknown_name_to_pull(capsys):
    assert "unknown model 'gpt-9'" in one_line_error(capsys, "pull", "gpt-9")


def test_port_in_use(capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        err = one_line_error(capsys, "serve", "--port", str(port))
    assert f"port {port} on 127.0.0.1 is in use" in err and "--port" in err


def test_a_data_directory_that_cannot_be_written_is_named(capsys, monkeypatch, tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("a file where the data directory would be")
    monkeypatch.setattr(cli, "data_dir", lambda: blocked / "data")
    err = one_line_error(capsys, "manage", "check")
    assert f"the data directory {blocked / 'data'} is not writable" in err and "METRALE_HOME" in err


def test_a_missing_catalogue_model_is_pulled_and_a_pulled_or_imported_one_served(monkeypatch, tmp_path):
    monkeypatch.setenv("METRALE_HOME", str(tmp_path))
    assert cli.resolve_model("gemma-3-270m") == (tmp_path / "models" / "gemma-3-270m", "gemma-3-270m")
    imported = tmp_path / "models" / "my-import"
    imported.mkdir(parents=True)
    (imported / "config.json").write_text("{}")
    assert cli.resolve_model("my-import") == (imported, None)
    assert cli.resolve_model(str(imported)) == (imported.resolve(), None)
