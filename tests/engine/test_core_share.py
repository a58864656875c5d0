"""engine/core_share.py: the CPUs a process may use (affinity, cgroup quota, a configured count) and the team
that follows the cores other runnable tasks hold, step by step."""
from __future__ import annotations

import os
import threading

import pytest

from inference.engine.core_share import ThreadTeam, cgroup_cpu_quota, cpu_cap, runnable_tasks


def cgroup_tree(tmp_path, files: dict[str, str]):
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_it_reads_a_cgroup_v2_quota_and_the_smallest_along_the_ancestors(tmp_path):
    root = cgroup_tree(tmp_path, {"cpu.max": "max 100000\n", "a/cpu.max": "150000 100000\n",
                                  "a/b/cpu.max": "max 100000\n"})
    assert cgroup_cpu_quota(root, "0::/a/b\n") == 1.5
    root2 = cgroup_tree(tmp_path / "two", {"cpu.max": "max 100000\n", "a/cpu.max": "300000 100000\n",
                                           "a/b/cpu.max": "50000 100000\n"})
    assert cgroup_cpu_quota(root2, "0::/a/b\n") == 0.5


def test_it_reads_a_cgroup_v1_cfs_quota_and_none_where_unlimited(tmp_path):
    root = cgroup_tree(tmp_path, {"cpu,cpuacct/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n",
                                  "cpu,cpuacct/pod/cpu.cfs_quota_us": "200000\n",
                                  "cpu,cpuacct/pod/cpu.cfs_period_us": "100000\n"})
    assert cgroup_cpu_quota(root, "4:memory:/pod\n3:cpu,cpuacct:/pod\n") == 2.0
    assert cgroup_cpu_quota(root, "3:cpu,cpuacct:/\n") is None
    assert cgroup_cpu_quota(tmp_path / "missing", "0::/\n") is None


def test_the_cap_is_the_affinity_mask_here_and_never_more_than_a_configured_count():
    cap = cpu_cap()
    assert 1 <= cap.cpus <= cap.affinity == len(os.sched_getaffinity(0))
    assert cpu_cap(configured=1).cpus == 1
    assert "threads at most" in cap.describe()


def test_runnable_tasks_counts_at_least_the_calling_thread(tmp_path):
    assert runnable_tasks() >= 1
    (tmp_path / "loadavg").write_text("0.50 0.40 0.30 3/345 12345\n")
    assert runnable_tasks(str(tmp_path / "loadavg")) == 3
    (tmp_path / "bad").write_text("nonsense\n")
    assert runnable_tasks(str(tmp_path / "bad")) is None


class Scripted:
    """A clock advanced by hand and a scripted run-queue count."""

    def __init__(self, running: int):
        self.now, self.running, self.applied = 100.0, running, []

    def team(self, cpus: int, **kw) -> ThreadTeam:
        team = ThreadTeam(cpus, sample=lambda: self.running, clock=lambda: self.now, apply=self.applied.append, **kw)
        team.cap = type(team.cap)(cpus, cpus, None, cpus, cpus)  # a machine of `cpus` CPUs, whatever this one has
        team.size = 0
        self.applied.clear()
        team.adjust()
        return team

    def steps(self, team: ThreadTeam, n: int, every_s: float = 0.005) -> list[int]:
        sizes = []
        for _ in range(n):
            self.now += every_s
            sizes.append(team.adjust())
        return sizes


def test_a_neighbour_that_keeps_a_core_busy_shrinks_the_team_and_its_leaving_restores_it():
    s = Scripted(running=1)  # only the engine's thread
    team = s.team(2)
    assert s.steps(team, 5) == [2] * 5
    s.running = 2  # a busy neighbour
    sizes = s.steps(team, 20)
    assert sizes[-1] == 1 and sizes.count(2) <= 10  # once the window holds only its samples
    s.running = 1
    assert s.steps(team, 1) == [2]  # the first sample without it
    assert s.applied == [2, 1, 2] and team.changes == 2


def test_a_passing_task_does_not_shrink_the_team():
    s = Scripted(running=1)
    team = s.team(4)
    sizes = []
    for i in range(40):  # a task runnable at every third step: the window's minimum stays 0
        s.running = 2 if i % 3 else 1
        sizes += s.steps(team, 1)
    assert set(sizes) == {4}


def test_three_neighbours_on_four_cpus_leave_one_thread_and_never_fewer():
    s = Scripted(running=4)
    team = s.team(4)
    assert s.steps(team, 30)[-1] == 1
    s.running = 9
    assert s.steps(team, 30)[-1] == 1


def test_a_team_that_does_not_adapt_keeps_its_cap():
    s = Scripted(running=5)
    team = s.team(2, adaptive=False)
    assert set(s.steps(team, 20)) == {2}


def test_the_size_is_applied_again_on_another_thread():
    """OpenMP's number of threads is each thread's own: a team stepped from a new thread sets it there."""
    s = Scripted(running=1)
    team = s.team(2)
    before = len(s.applied)
    t = threading.Thread(target=team.adjust)
    t.start()
    t.join()
    assert len(s.applied) == before + 1 and s.applied[-1] == 2


def test_the_torch_threads_follow_the_team_on_the_calling_thread():
    import torch

    seen = []

    def run():
        team = ThreadTeam(1)
        seen.append((team.size, torch.get_num_threads()))

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert seen == [(1, 1)]
