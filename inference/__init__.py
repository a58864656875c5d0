"""The engine and the OpenAI chat/completions surface."""
import os

# Intel OpenMP (torch's CPU threads) spins for 200 ms after each parallel region by default. On a
# 2-core machine shared with the event loop, a spinning worker starves the thread that holds the
# other core and a decode step can take 10x longer; 0 makes idle workers sleep at once. It must be
# set before torch starts its thread pool: this package is imported before any of its modules
# (and so before they import torch).
os.environ.setdefault("KMP_BLOCKTIME", "0")
