"""How many threads the engine's parallel regions use: the CPUs this process may run on, less those
that other runnable tasks hold right now.

A team of threads meets at a barrier after every loop of a step (about six a layer). When another
process takes one of the team's cores, the thread the kernel descheduled holds every barrier up
until its next time slice, and decoding falls tenfold (a SmolLM2 batch-1 step 4.2 -> 44.6 ms beside
one busy process on two cores). A team that fits the cores left runs at the speed of those cores
instead. Two rules, both re-applied while the engine runs:

- The cap: the CPUs this process may use at all. The affinity mask (sched_getaffinity), the cgroup's
  CPU quota (cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us / cpu.cfs_period_us`, the smallest along the
  cgroup's ancestors, rounded up to whole CPUs), and EngineConfig.num_threads when it is set.
  Read at start and again every CAP_REFRESH_S (a container's quota can be resized while it runs).
- The pressure: before each step, /proc/loadavg's count of runnable tasks (every runnable thread of
  the machine, the calling thread included, sampled by the kernel's own count). The others are that
  count less this thread and less the CPUs outside the cap; the team is the cap less the fewest
  others seen over the last WINDOW_S (and at least WINDOW_SAMPLES samples), at least one thread. A
  neighbour that keeps a core busy holds the minimum up; this process's own short bursts (the event
  loop writing a step's chunks) and passing tasks do not.

The team size is applied with torch.set_num_threads on the calling (engine) thread: every compiled
kernel reads torch.get_num_threads() at its call (the decode step, prefill, the encoder, the
sampler's draw), and torch's own intra-op pool follows the same count, so the whole process computes
under one rule. OpenMP's number-of-threads setting is the calling thread's own, so two engines on two
threads (two models in one process) each size their own team, and each counts the other as pressure.

The threads' waits are short spins then a futex sleep (inference/__init__.py sets GOMP_SPINCOUNT), so
a thread that waits for a descheduled teammate gives its core back instead of spinning through the
time slice.
"""
from __future__ import annotations

import math
import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

# Seconds of samples the team follows the minimum over (and at least this many samples).
WINDOW_S = 0.05
WINDOW_SAMPLES = 4
# At most one /proc/loadavg sample per this many seconds (a read costs ~10 us).
SAMPLE_EVERY_S = 0.002
# Seconds between re-reads of the affinity mask and the cgroup's quota.
CAP_REFRESH_S = 5.0

CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True, slots=True)
class CpuCap:
    """The CPUs this process may use: `cpus` (at least 1) and where each bound came from.

    affinity: CPUs in the affinity mask; quota: the cgroup quota in CPUs (None: no quota found);
    configured: EngineConfig.num_threads (None: not set); online: CPUs the machine has online."""

    cpus: int
    affinity: int
    quota: float | None
    configured: int | None
    online: int

    def describe(self) -> str:
        """One line for the start-up log: the cap and each bound."""
        quota = "none" if self.quota is None else f"{self.quota:g} CPUs"
        configured = "" if self.configured is None else f", num_threads {self.configured}"
        return (f"{self.cpus} threads at most (affinity {self.affinity} of {self.online} CPUs, "
                f"cgroup quota {quota}{configured})")


def _quota_file(directory: Path) -> float | None:
    """The CPU quota in CPUs that one cgroup directory sets (v2 cpu.max or v1 cfs files), or None."""
    try:
        text = (directory / "cpu.max").read_text().split()
        if text and text[0] != "max":
            return int(text[0]) / int(text[1])
        if text:
            return None
    except (OSError, ValueError, IndexError):
        pass
    try:
        quota = int((directory / "cpu.cfs_quota_us").read_text())
        period = int((directory / "cpu.cfs_period_us").read_text())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


def _cgroup_dirs(proc_cgroup: str, root: Path) -> list[Path]:
    """The cgroup directories that may bound this process's CPU time: for each line of
    /proc/self/cgroup naming the cpu controller (v1 `N:cpu,cpuacct:/path`) or the unified
    hierarchy (v2 `0::/path`), the directory and its ancestors up to the mount's root."""
    dirs: list[Path] = []
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        names = controllers.split(",")
        if controllers == "":
            mounts = [root, root / "unified"]
        elif "cpu" in names:
            mounts = [root / controllers, root / "cpu", root / "cpu,cpuacct"]
        else:
            continue
        for mount in mounts:
            if not mount.is_dir():
                continue
            here = mount / path.lstrip("/")
            while True:
                dirs.append(here)
                if here == mount:
                    break
                here = here.parent
            break
    return dirs


def cgroup_cpu_quota(root: Path = CGROUP_ROOT, proc_cgroup: str | None = None) -> float | None:
    """The smallest CPU quota, in CPUs (e.g. 1.5), that this process's cgroups and their ancestors
    set (cgroup v2 cpu.max "QUOTA PERIOD", v1 cpu.cfs_quota_us / cpu.cfs_period_us, as the kernel's
    CFS bandwidth control documents them); None where none is set or none can be read."""
    if proc_cgroup is None:
        try:
            proc_cgroup = Path("/proc/self/cgroup").read_text()
        except OSError:
            return None
    quotas = [q for q in map(_quota_file, _cgroup_dirs(proc_cgroup, root)) if q is not None]
    return min(quotas) if quotas else None


def cpu_cap(configured: int | None = None) -> CpuCap:
    """The CPUs this process may use (CpuCap.cpus >= 1): its affinity mask, its cgroup quota rounded
    up, and `configured` (EngineConfig.num_threads) when set, whichever is least."""
    online = os.cpu_count() or 1
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = online
    quota = cgroup_cpu_quota()
    cpus = affinity
    if quota is not None:
        cpus = min(cpus, max(1, math.ceil(quota - 1e-9)))
    if configured:
        cpus = min(cpus, configured)
    return CpuCap(max(1, cpus), affinity, quota, configured, online)


def runnable_tasks(path: str = "/proc/loadavg") -> int | None:
    """The machine's runnable tasks right now (the kernel's count, /proc/loadavg's fourth field
    "RUNNING/TOTAL", the calling thread included), or None where it cannot be read."""
    try:
        with open(path, "rb") as f:
            return int(f.read().split()[3].split(b"/")[0])
    except (OSError, ValueError, IndexError):
        return None


class ThreadTeam:
    """The engine thread's team size, followed step by step (see the module's rule).

    `adjust()` before each unit of work (a step, an embedding unit) returns the team size and
    applies it with torch.set_num_threads when it changed. `adaptive=False` keeps the cap (the
    affinity / quota / configured bound) and never reads the pressure. Not thread-safe: one
    engine thread owns it."""

    def __init__(self, configured: int | None = None, adaptive: bool = True,
                 sample=runnable_tasks, clock=time.monotonic, apply=None):
        self.configured = configured
        self.adaptive = adaptive
        self._sample = sample
        self._clock = clock
        self._apply = apply or _set_torch_threads
        self.cap = cpu_cap(configured)
        self._cap_at = clock()
        self._samples: deque[tuple[float, int]] = deque()
        self._sampled_at = -math.inf
        self.size = 0
        self._thread = None  # the thread the size was last applied on (OpenMP's setting is per thread)
        self.changes = 0  # how many times the team changed size (metrics, tests)
        self.adjust()

    def others(self) -> int:
        """The fewest other runnable tasks seen on this process's CPUs over the window (0: none)."""
        return min((n for _, n in self._samples), default=0)

    def adjust(self) -> int:
        """Sample the pressure (at most every SAMPLE_EVERY_S), then size the team: the cap less the
        window's fewest others, at least 1. Applies a new size at once; returns it."""
        now = self._clock()
        if now - self._cap_at >= CAP_REFRESH_S:
            self.cap = cpu_cap(self.configured)
            self._cap_at = now
        size = self.cap.cpus
        if self.adaptive and size > 1:
            if now - self._sampled_at >= SAMPLE_EVERY_S:
                self._sampled_at = now
                running = self._sample()
                if running is not None:
                    outside = max(0, self.cap.online - self.cap.cpus)
                    self._samples.append((now, max(0, running - 1 - outside)))
                while (len(self._samples) > WINDOW_SAMPLES and now - self._samples[0][0] > WINDOW_S):
                    self._samples.popleft()
            size = max(1, size - self.others())
        thread = threading.get_ident()
        if size != self.size or thread != self._thread:
            if self.size and size != self.size:
                self.changes += 1
            self.size, self._thread = size, thread
            self._apply(size)
        return size


def _set_torch_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)
