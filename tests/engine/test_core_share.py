"""engine/core_share.py: the CPUs a process may use (affinity, cgroup quota, a configured count) and the team
that gives up the cores other processes keep busy, step by step."""
from __future__ import annotations

import os
import threading
import weakref

import pytest

from inference.engine.core_share import WINDOW_S, CpuCap, CpuSample, ThreadTeam, cgroup_cpu_quota, cpu_cap


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


def test_the_machine_s_busy_seconds_come_from_proc_stat_and_grow(tmp_path):
    from inference.engine.core_share import machine_cpu_seconds

    first = machine_cpu_seconds()
    sum(i * i for i in range(300_000))
    assert first is not None and machine_cpu_seconds() >= first
    ticks = os.sysconf("SC_CLK_TCK")
    (tmp_path / "stat").write_text(f"cpu  {ticks} 0 {ticks} 999 5 0 0 {ticks} 0 0\ncpu0 1 2 3\n")
    assert machine_cpu_seconds(str(tmp_path / "stat")) == 3.0  # user + system + steal; idle and iowait not
    (tmp_path / "bad").write_text("cpu  x\n")
    assert machine_cpu_seconds(str(tmp_path / "bad")) is None


class Scripted:
    """A clock advanced by hand and a machine whose other processes use `others` CPUs while this one
    uses `ours`: the readings ThreadTeam samples."""

    def __init__(self, others: float, ours: float = 1.0):
        self.now, self.others, self.ours = 100.0, others, ours
        self.machine_s = self.process_s = 0.0
        self.applied: list[int] = []
        self.peers = weakref.WeakSet()  # this test's process

    def sample(self):
        return CpuSample(self.now, self.machine_s, self.process_s)

    def team(self, cpus: int, **kw) -> ThreadTeam:
        team = ThreadTeam(cpus, sample=self.sample, clock=lambda: self.now, apply=self.applied.append,
                          peers=self.peers, **kw)
        team.cap = CpuCap(cpus, cpus, None, cpus, cpus)  # a machine of `cpus` CPUs, whatever this one has
        team.adjust(stepping=False)
        self.applied.clear()
        return team

    def steps(self, team: ThreadTeam, seconds: float, every_s: float = 0.01) -> list[int]:
        """Steps of every_s seconds for `seconds`; the sizes they ran at."""
        sizes = []
        for _ in range(round(seconds / every_s)):
            sizes.append(team.adjust())
            self.now += every_s
            self.machine_s += (self.others + self.ours) * every_s
            self.process_s += self.ours * every_s
        return sizes


def test_a_busy_neighbour_shrinks_the_team_within_the_window_and_its_leaving_restores_it():
    s = Scripted(others=0.05)  # a quiet machine: the bench client's few percent
    team = s.team(2)
    assert set(s.steps(team, 2.0)) == {2}
    s.others = 0.67  # one busy process competing with a team of two on two cores
    sizes = s.steps(team, 1.0)
    assert sizes[-1] == 1 and sizes.index(1) * 0.01 <= 2 * WINDOW_S
    s.others = 1.0  # now it has its core: the team stays at one
    assert set(s.steps(team, 2.0)) == {1}
    s.others = 0.0
    sizes = s.steps(team, 1.0)
    assert sizes[-1] == 2 and sizes.index(2) * 0.01 <= 2 * WINDOW_S
    assert s.applied == [1, 2] and team.changes == 2


def test_this_process_s_own_threads_never_shrink_it():
    s = Scripted(others=0.1, ours=2.0)  # the engine's team and the event loop: all ours
    team = s.team(2)
    assert set(s.steps(team, 2.0)) == {2}


def test_half_a_core_of_hysteresis_either_way():
    s = Scripted(others=0.4)
    team = s.team(2)
    assert set(s.steps(team, 1.0)) == {2}
    s.others = 0.6
    assert s.steps(team, 1.0)[-1] == 1
    s.others = 0.6  # between 0.5 and 1.5: no change either way
    assert set(s.steps(team, 1.0)) == {1}


def test_three_busy_neighbours_on_four_cpus_leave_one_thread_and_never_fewer():
    s = Scripted(others=3.0)
    team = s.team(4)
    assert s.steps(team, 1.0)[-1] == 1
    s.others = 9.0
    assert s.steps(team, 1.0)[-1] == 1
    s.others = 1.0
    assert s.steps(team, 1.0)[-1] == 3


def test_engines_stepping_in_one_process_share_its_cores():
    s = Scripted(others=0.0)
    a, b = s.team(4), s.team(4)
    assert a.adjust() == 4  # b has not stepped: a has them all
    assert b.adjust() == 2 and a.adjust() == 2
    s.now += 1.0  # b went idle
    assert a.adjust() == 4


def test_a_team_that_does_not_adapt_keeps_its_cap():
    s = Scripted(others=5.0)
    team = s.team(2, adaptive=False)
    assert set(s.steps(team, 1.0)) == {2}


def test_the_size_is_applied_again_on_another_thread():
    """OpenMP's number of threads is each thread's own: a team stepped from a new thread sets it there."""
    s = Scripted(others=0.0)
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


def test_an_idle_engine_that_observes_starts_its_next_step_already_fitted():
    s = Scripted(others=0.0, ours=0.0)
    team = s.team(2)
    s.others = 1.0  # a neighbour starts while the engine waits for requests
    for _ in range(10):
        s.now += 0.05
        s.machine_s += s.others * 0.05
        team.observe()
    assert team.adjust() == 1


def test_a_unit_too_small_for_a_second_thread_runs_alone_and_the_next_big_one_on_the_team():
    s = Scripted(others=0.0)
    team = s.team(2)
    assert team.adjust(alone=True) == 1 and team.adjust() == 2 and team.adjust() == 2
    assert s.applied == [1, 2]  # applied only when the count changes
    assert team.size == 2 and team.changes == 0  # running alone is not a change of the team


class Pauses:
    """Stands in for core_share.pause_openmp_workers: counts its calls."""

    def __init__(self):
        self.calls = 0

    def __call__(self) -> bool:
        self.calls += 1
        return True


def test_an_idle_team_ends_its_workers_once_per_idle_spell():
    s, pauses = Scripted(others=0.0), Pauses()
    team = s.team(2, pause=pauses)
    team.adjust()
    team.rest()
    team.rest()  # the idle loop wakes every IDLE_WAKE_S: still the same spell
    team.observe()
    assert pauses.calls == 1 and team.resting
    team.adjust()  # a step: the workers start again
    team.rest()
    assert pauses.calls == 2 and team.rests == 2


def test_pausing_ends_the_calling_threads_openmp_workers():
    """libgomp (torch's OpenMP runtime) keeps a pool of workers per thread that ran a parallel region; the
    pause joins them (where the runtime has OpenMP 5.0's pause), and the next region starts them again."""
    import torch

    from inference.engine.core_share import pause_openmp_workers

    counts = []

    def run():
        torch.set_num_threads(2)
        x = torch.ones(1 << 20)
        for _ in range(3):
            x.add_(1.0)  # a parallel region of two threads (at::parallel_for over 2^20 elements)
            counts.append(len(os.listdir("/proc/self/task")))
            counts.append(pause_openmp_workers())
            counts.append(len(os.listdir("/proc/self/task")))

    t = threading.Thread(target=run)
    t.start()
    t.join()
    ran, paused, after = counts[0], counts[1], counts[2]
    assert paused is True and after == ran - 1  # the one worker joined
    assert counts[3:] == counts[:3] * 2  # started again by the next region, ended again


def test_a_short_prefill_with_nothing_decoding_runs_alone_and_anything_bigger_on_the_team():
    from inference.engine.llm_engine import solo_step
    from inference.engine.scheduler import ScheduledBatch

    def batch(decodes: int, *chunks: int) -> ScheduledBatch:  # solo_step reads the counts alone
        return ScheduledBatch(items=[(None, 1)] * decodes + [(None, n) for n in chunks], num_decodes=decodes)

    assert solo_step(batch(0, 3), 16) and solo_step(batch(0, 9, 7), 16)
    assert not solo_step(batch(0, 17), 16) and not solo_step(batch(0, 9, 8), 16)
    assert not solo_step(batch(1), 16) and not solo_step(batch(1, 2), 16)  # a running batch's decode: the team
    assert not solo_step(batch(0, 1), 0)  # 0: never alone
