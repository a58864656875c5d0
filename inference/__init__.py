"""The engine and the OpenAI chat/completions surface."""
import os

# Intel OpenMP (torch's CPU threads) spins for 200 ms after each parallel region by default. On a
# 2-core machine shared with the event loop, a spinning worker starves the thread that holds the
# other core and a decode step can take 10x longer; 0 makes idle workers sleep at once. It must be
# set before torch starts its thread pool: this package is imported before any of its modules
# (and so before they import torch).
os.environ.setdefault("KMP_BLOCKTIME", "0")

# GNU OpenMP (libgomp: torch's threads and the compiled kernels' teams) spins ~3 ms at a barrier
# before it sleeps. A thread that waits there for a teammate another process has descheduled spins
# through its own time slice and keeps the teammate off the free core; a short spin (~10 us, 1000
# pause loops) then a futex sleep gives the core back at once, and an idle machine's barriers still
# meet within the spin. It also keeps the pool's idle threads off the run queue that
# engine/core_share.py reads. An explicit OMP_WAIT_POLICY or GOMP_SPINCOUNT wins.
if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", "1000")
