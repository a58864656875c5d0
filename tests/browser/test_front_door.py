"""The front door in Chromium: its copy-paste examples (openai, anthropic, curl), taken from the page as shown,
run against the server."""
from __future__ import annotations

import json
import os
import subprocess
import sys


def test_its_openai_and_curl_examples_run_as_shown(page, auth_server, tmp_path):
    page.goto(auth_server.url + "/")
    assert page.inner_text("#state") == "ready"
    page.screenshot(path=str(tmp_path / "front_door.png"), full_page=True)
    key = auth_server.keys["owner"]

    python = page.inner_text("#example-openai")
    assert f'base_url="{auth_server.url}/v1"' in python
    script = tmp_path / "example.py"
    script.write_text(python.replace("YOUR_KEY", key))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip(), "the streamed example printed nothing"

    anthropic = page.inner_text("#example-anthropic")  # the Messages routes are served here
    script.write_text(anthropic.replace("YOUR_KEY", key))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip(), "the Messages example printed nothing"

    curl = page.inner_text("#example-curl")
    run = subprocess.run(["bash", "-c", curl], capture_output=True, text=True, timeout=180,
                         env={**os.environ, "METRALE_API_KEY": key})
    assert run.returncode == 0, run.stderr
    answer = json.loads(run.stdout)
    assert answer["object"] == "chat.completion" and answer["choices"][0]["message"]["content"]


def test_its_links_lead_to_the_console(page, auth_server):
    page.goto(auth_server.url + "/")
    page.click("text=Playground")
    page.wait_for_url(auth_server.url + "/playground")
    assert page.is_visible("#composer")
    page.click("header.bar >> text=Admin")
    page.wait_for_url("**/admin/login/**")
