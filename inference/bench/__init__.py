"""Benchmarks run by `manage.py bench` (scripts, not tests)."""
