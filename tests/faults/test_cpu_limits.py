"""A server started on fewer CPUs than the machine has runs a team that fits them: an affinity mask of
one CPU, or a cgroup CPU quota of one CPU (engine/core_share.py). Each test starts the server that way,
reads the team's size and cap from /metrics and the start-up log, and streams a completion."""
from __future__ import annotations

import os
import re
from pathlib import Path

import httpx
import pytest

from inference.bench.live_server import LiveServer

from .live import model_env

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def threads_metrics(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    return {name: float(value) for name, value in
            re.findall(r"^metrale:(engine_threads(?:_max)?)\{[^}]*\} (\S+)$", text, re.M)}


def decodes(url: str) -> int:
    body = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "Count to twenty."}],
            "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    answer = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    return answer.json()["usage"]["completion_tokens"]


def writable_cpu_cgroup() -> Path | None:
    """A cgroup directory where a CPU quota can be set (v1's cpu controller or v2 with cpu enabled)."""
    for base, quota in ((Path("/sys/fs/cgroup/cpu"), "cpu.cfs_quota_us"), (Path("/sys/fs/cgroup/cpu,cpuacct"),
                                                                           "cpu.cfs_quota_us"),
                        (Path("/sys/fs/cgroup"), "cpu.max")):
        if (base / quota).exists() and os.access(base, os.W_OK):
            return base
    return None


def test_a_server_with_an_affinity_mask_of_one_cpu_runs_one_thread_and_decodes(smollm2_dir, tmp_path):
    cpu = min(os.sched_getaffinity(0))
    with LiveServer(model_env(smollm2_dir), tmp_path, preexec=lambda: os.sched_setaffinity(0, {cpu})) as server:
        assert decodes(server.url) == 24
        assert threads_metrics(server.url) == {"engine_threads": 1.0, "engine_threads_max": 1.0}
        assert re.search(r"engine threads: 1 threads at most \(affinity 1 of \d+ CPUs", server.log())


def test_a_server_under_a_cgroup_quota_of_one_cpu_runs_one_thread_and_decodes(smollm2_dir, tmp_path):
    base = writable_cpu_cgroup()
    if base is None or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("no writable cgroup CPU controller here (or one CPU only): a quota cannot be set")
    group = base / f"metrale-test-{os.getpid()}"
    group.mkdir()
    try:
        if base.name == "cgroup":  # v2
            (group / "cpu.max").write_text("100000 100000")
        else:
            (group / "cpu.cfs_period_us").write_text("100000")
            (group / "cpu.cfs_quota_us").write_text("100000")

        def enter():
            (group / "cgroup.procs").write_text(str(os.getpid()))

        with LiveServer(model_env(smollm2_dir), tmp_path, preexec=enter) as server:
            assert decodes(server.url) == 24
            assert threads_metrics(server.url) == {"engine_threads": 1.0, "engine_threads_max": 1.0}
            assert re.search(r"engine threads: 1 threads at most \(affinity \d+ of \d+ CPUs, cgroup quota 1 CPUs",
                             server.log())
    finally:
        group.rmdir()
