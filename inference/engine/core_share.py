"""How many threads the engine's parallel regions use: the CPUs this process may run on, less the
cores other processes are using right now.

A team of threads meets at a barrier after every loop of a step (about six a layer). When another
process takes one of the team's cores, the thread the kernel descheduled holds every barrier up
until its next time slice, and decoding falls tenfold (a SmolLM2 batch-1 step 4.2 -> 44.6 ms beside
one busy process on two cores). A team that fits the cores left runs at the speed of those cores
instead. Two rules, both re-applied while the engine runs:

- The cap: the CPUs this process may use at all. The affinity mask (sched_getaffinity), the cgroup's
  CPU quota (cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us / cpu.cfs_period_us`, the smallest along the
  cgroup's ancestors, rounded up to whole CPUs), and EngineConfig.num_threads when it is set.
  Read at start and again every CAP_REFRESH_S (a container's quota can be resized while it runs).
- The others' load: over the last WINDOW_S, the CPU time the machine spent busy or stolen by its
  hypervisor (/proc/stat's first line) less this process's own (its every thread: the event loop,
  the tokenizer, other engines), in CPUs. The team gives up one core for each whole core the
  others use, with half a core of hysteresis each way (it shrinks by one when the others use half a
  core more than it has given up, and grows back when they use half a core less), at least one
  thread. A busy neighbour competing with a full team still gets about cap / (cap + 1) of a core
  (three runnable threads on two cores), above the half that shrinks the team; this process's own
  threads never count, so its event loop writing a step's chunks does not shrink it.
- Engines in one process (several models) share the team's cores: each engine that stepped within
  ACTIVE_S gets an equal share of them, at least one thread. An embedding model's runner on a thread of
  its own (no chat engine hosts its passes) is such an engine: its team joins the process's while the
  thread runs and leaves with it (embedding_runner.EmbeddingRunner.start_thread).

The team size is applied with torch.set_num_threads on the calling (engine) thread: every compiled
kernel reads torch.get_num_threads() at its call (the decode step, prefill, the encoder, the
sampler's draw), and torch's own intra-op pool follows the same count, so the whole process computes
under one rule. OpenMP's number-of-threads setting is the calling thread's own, so two engines on two
threads each apply their own share.

What a team costs beyond its work: after each parallel region libgomp's workers spin-wait for the next
one (GOMP_SPINCOUNT, 300,000 pauses by default: about 10 ms of a core on the 2-vCPU EPYC, measured after
a lone 256x256 matmul), and that is the process's CPU. Between the steps of a running batch the spin is what keeps the next step's start
fast (a 1,000-pause spin made decode through HTTP 7-20% slower), so it stays. Two other places it
buys nothing:

- A unit too small for a second thread to pay (the callers' rules, from measured speedups: llm_engine's
  solo_step for a prefill of a token or two with nothing decoding, EmbeddingRunner's solo_rows for a
  pass of a short text or two while chat is idle) runs alone (`adjust(alone=True)`): one thread, no parallel region, no worker woken.
- When the engine goes idle (`rest()`), the calling thread's OpenMP workers are ended at once
  (OpenMP 5.0's omp_pause_resource_all, soft: libgomp joins the thread's pool) instead of spinning
  out their count; the next parallel region starts them again (a thread creation, once per busy
  period).
"""
from __future__ import annotations

import math
import os
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass
from pathlib import Path

# The others' load is measured over this many seconds, sampled at most every SAMPLE_EVERY_S.
WINDOW_S = 0.25
SAMPLE_EVERY_S = 0.05
# The half core of hysteresis either way (see the module's rule).
HYSTERESIS_CPUS = 0.5
# Seconds between re-reads of the affinity mask and the cgroup's quota.
CAP_REFRESH_S = 5.0
# An engine that stepped within this many seconds takes a share of the process's cores.
ACTIVE_S = 0.1

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


def machine_cpu_seconds(path: str = "/proc/stat") -> float | None:
    """CPU-seconds the machine has spent busy or stolen since boot, summed over its CPUs: /proc/stat's
    first line's user, nice, system, irq, softirq and steal (USER_HZ ticks, as proc(5) documents
    them; guest time is inside user), or None where it cannot be read."""
    try:
        with open(path, "rb") as f:
            fields = f.readline().split()
        ticks = os.sysconf("SC_CLK_TCK")
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
        return (user + nice + system + irq + softirq + steal) / ticks
    except (OSError, ValueError, IndexError):
        return None


@dataclass(frozen=True, slots=True)
class CpuSample:
    """One reading: monotonic seconds, the machine's busy CPU-seconds, this process's CPU-seconds."""

    at: float
    machine_s: float
    process_s: float


def cpu_sample(clock=time.monotonic) -> CpuSample | None:
    """The machine's busy CPU-seconds and this process's (time.process_time: every thread) now."""
    machine = machine_cpu_seconds()
    return None if machine is None else CpuSample(clock(), machine, time.process_time())


class ThreadTeam:
    """The engine thread's team size, followed step by step (see the module's rule).

    `adjust()` before each unit of work (a step, an embedding unit) returns the threads it runs on (the
    team size, or 1 when `alone`) and applies them with torch.set_num_threads when they changed (or when
    called from another thread than last); `rest()` when the thread goes idle. `adaptive=False` keeps
    the cap and measures nothing. Not thread-safe: one engine thread owns it. sample / clock / apply /
    pause replace the readings, torch's setter and the OpenMP workers' ending, peers the set of the
    process's teams (tests)."""

    teams: "weakref.WeakSet[ThreadTeam]" = weakref.WeakSet()  # every engine's team in this process

    def __init__(self, configured: int | None = None, adaptive: bool = True,
                 sample=cpu_sample, clock=time.monotonic, apply=None, peers=None, pause=None):
        self.configured = configured
        self.adaptive = adaptive
        self._sample = sample
        self._clock = clock
        self._apply = apply or _set_torch_threads
        self._pause = pause or pause_openmp_workers
        self.cap = cpu_cap(configured)
        self._cap_at = clock()
        self._samples: deque[CpuSample] = deque()
        self.given_up = 0  # cores left to the others
        self.others_cpus = 0.0  # the others' load over the window, in CPUs (metrics)
        self.last_step_at = -math.inf
        self.size = 0  # the team: the threads a unit that is not alone runs on
        self.threads = 0  # the threads the last unit ran on (1 when alone), as applied
        self._thread = None  # the thread they were last applied on (OpenMP's setting is per thread)
        self.changes = 0  # how many times the team changed size (metrics, tests)
        self.resting = False  # rest() ended the workers and no unit has run since
        self.rests = 0  # how many times rest() ended them (tests)
        self._peers = ThreadTeam.teams if peers is None else peers
        self._peers.add(self)
        self.adjust(stepping=False)

    def others_load(self) -> float | None:
        """The other processes' CPU use over the window, in CPUs (None: fewer than two samples)."""
        if len(self._samples) < 2:
            return None
        first, last = self._samples[0], self._samples[-1]
        wall = last.at - first.at
        if wall <= 0:
            return None
        return max(0.0, (last.machine_s - first.machine_s) - (last.process_s - first.process_s)) / wall

    def adjust(self, stepping: bool = True, alone: bool = False) -> int:
        """Sample the load (at most every SAMPLE_EVERY_S), size the team and apply the threads the next
        unit runs on: the team, or 1 when `alone` (a unit too small for a second thread to pay: the
        module's rule). Returns them. stepping: this engine is about to compute (it counts among the
        process's active engines)."""
        now = self._clock()
        if stepping:
            self.last_step_at = now
            self.resting = False
        self.observe(now)
        self.given_up = min(self.given_up, self.cap.cpus - 1)
        peers = self._peers  # iterating a WeakSet costs more than the rest of adjust(): not for a team alone
        active = 1 if len(peers) <= 1 else sum(1 for t in list(peers) if t is self or now - t.last_step_at <= ACTIVE_S)
        size = max(1, (self.cap.cpus - self.given_up) // max(1, active))
        if self.size and size != self.size:
            self.changes += 1
        self.size = size
        threads = 1 if alone else size
        thread = threading.get_ident()
        if threads != self.threads or thread != self._thread:
            self.threads, self._thread = threads, thread
            self._apply(threads)
        return threads

    def rest(self) -> None:
        """The calling (engine) thread has nothing to compute: end its OpenMP workers now rather than let
        them spin out their wait (the module's rule). Once per idle spell: a no-op until a unit runs."""
        if self.resting:
            return
        self.resting = True
        if self._pause():
            self.rests += 1

    def leave(self) -> None:
        """Stop counting among the process's teams (the thread that stepped with it has ended)."""
        self._peers.discard(self)

    def observe(self, now: float | None = None) -> None:
        """Re-read the cap when due and sample the others' load (at most every SAMPLE_EVERY_S), without
        sizing the team: the engine thread calls it while idle too, so the first step after a pause
        already knows a neighbour that started meanwhile."""
        now = self._clock() if now is None else now
        if now - self._cap_at >= CAP_REFRESH_S:
            self.cap, self._cap_at = cpu_cap(self.configured), now
        if self.adaptive and self.cap.cpus > 1:
            self._follow_load(now)

    def _follow_load(self, now: float) -> None:
        if self._samples and now - self._samples[-1].at < SAMPLE_EVERY_S:
            return
        sample = self._sample()
        if sample is None:
            return
        if self._samples and sample.at - self._samples[-1].at > 4 * WINDOW_S:
            self._samples.clear()  # an idle gap: the old readings say nothing of now
        self._samples.append(sample)
        while len(self._samples) > 2 and sample.at - self._samples[1].at >= WINDOW_S:
            self._samples.popleft()
        load = self.others_load()
        if load is None or sample.at - self._samples[0].at < WINDOW_S / 2:
            return
        self.others_cpus = load
        if load >= self.given_up + HYSTERESIS_CPUS and self.given_up < self.cap.cpus - 1:
            self.given_up = min(self.cap.cpus - 1, int(load + 1 - HYSTERESIS_CPUS))
        elif self.given_up and load <= self.given_up - HYSTERESIS_CPUS:
            self.given_up = max(0, int(math.ceil(load - 1 + HYSTERESIS_CPUS)))


def _set_torch_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)


_omp_pause = None  # OpenMP 5.0's omp_pause_resource_all of the runtime torch loaded (False: none found)
OMP_PAUSE_SOFT = 1  # omp_pause_soft (omp.h's omp_pause_resource_t)


def pause_openmp_workers() -> bool:
    """End the calling thread's OpenMP worker threads (omp_pause_resource_all(omp_pause_soft): libgomp
    frees the thread's pool, joining its workers; Intel's and LLVM's runtimes put theirs to sleep); the
    next parallel region starts them again. Returns whether the runtime did it: False where no OpenMP
    runtime with OpenMP 5.0's pause is loaded, or it refused (e.g. inside a parallel region)."""
    global _omp_pause
    if _omp_pause is None:
        import ctypes

        import torch  # noqa: F401  (its OpenMP runtime is loaded with torch, its symbols global)

        try:
            _omp_pause = ctypes.CDLL(None).omp_pause_resource_all
            _omp_pause.argtypes, _omp_pause.restype = [ctypes.c_int], ctypes.c_int
        except (AttributeError, OSError):
            _omp_pause = False
    return bool(_omp_pause) and _omp_pause(OMP_PAUSE_SOFT) == 0


PR_SET_NAME = 15  # prctl(2): the calling thread's name (comm), at most 15 bytes


def name_this_thread(name: str) -> None:
    """Give the calling thread `name` (its first 15 bytes) as the OS shows it (/proc/<pid>/task/<tid>/comm,
    top -H): threads it creates later, its OpenMP workers among them, start with the same name, so a
    per-thread reading groups an engine thread with its team (manage.py bench_overhead). Linux only; a
    no-op elsewhere or where prctl fails."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None).prctl(PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)
    except (AttributeError, OSError):
        pass
